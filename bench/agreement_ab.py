"""Does nn.Sequential's ReLU fusion change a zoo model's agreement with float64? (h200-v15d: overfeat's gradients
were 5e-3 off float64 against PyTorch's 2e-3, its first dense layer's 4.7e-3 against 1e-6 in v12.) Runs
`clnet bench MODEL --compare cuda` with the fusion off, then on, in one process (so with the same tuning choices),
and prints each quantity's error against float64 side by side.

    python3 bench/agreement_ab.py --device gpu --model overfeat
"""
import json
import os
import sys
import tempfile

import click

import clnet
from clnet import cli


@click.command()
@click.option("--device", "device_spec", default="gpu")
@click.option("--model", "name", default="overfeat")
@click.option("--compare", default="cuda", help="cuda, or torch-cpu where there is no GPU")
def main(device_spec, name, compare):
    rows = {}
    for fuse in (False, True):
        clnet.nn.Sequential.fuse_relu = fuse
        path = os.path.join(tempfile.mkdtemp(), "bench.json")
        try:
            cli.main(["bench", name, "--device", device_spec, "--compare", compare, "--iterations", "3", "--json",
                      path], standalone_mode=False)
        except (SystemExit, click.exceptions.Exit):  # the bench exits 1 on a disagreement: that is what we compare
            pass
        agreement = json.load(open(path))["compare"]["agreement"]
        for k, v in agreement.items():
            rows.setdefault(k, {})[fuse] = (v["clnet_vs_fp64"], v["torch_vs_fp64"])
    print(f"{'quantity':24s} {'unfused':>9s} {'fused':>9s} {'PyTorch':>9s}  (relative error against float64)")
    for k, r in sorted(rows.items()):
        print(f"{k:24s} {r[False][0]:9.2e} {r[True][0]:9.2e} {r[True][1]:9.2e}")
    sys.exit(0)


if __name__ == "__main__":
    main()
