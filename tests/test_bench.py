"""`clnet bench`: runs, reports every field, counts exactly the expected transfers, and compares with PyTorch."""
import json

import numpy as np
from click.testing import CliRunner

from clnet.cli import main

from conftest import HAVE_TORCH, needs_torch


def run(args):
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    return result


def test_bench_lenet_json(tmp_path, dev):
    path = tmp_path / "lenet.json"
    r = run(["bench", "lenet", "--device", str(dev.index), "--batch", "8", "--iterations", "2", "--warmup", "1",
             "--json", str(path)])
    assert r.exit_code == 0, r.output
    assert "images/s" in r.output and "kernel launches per iteration" in r.output
    d = json.loads(path.read_text())
    for key in ("model", "batch", "iterations", "env", "clnet", "layers", "expected_transfer_bytes"):
        assert key in d
    for key in ("device", "platform", "driver", "opencl", "clnet", "date"):
        assert d["env"][key]
    assert set(d["clnet"]["phases"]) == {"forward", "backward", "update"}
    assert all(v > 0 for v in d["clnet"]["phases"].values())
    assert len(d["layers"]) == 8 and d["layers"][0]["forward_flop"] == 2 * 8 * 20 * 24 * 24 * 25
    assert d["layers"][0]["clnet_forward_ms"] > 0 and d["layers"][0]["clnet_backward_ms"] > 0
    t = d["clnet"]["transfers_per_iteration"]
    # The batch is uploaded once, as PyTorch's is: an iteration copies only the 4-byte loss back.
    assert t == dict(host_to_device_bytes=0, host_to_device_count=0, device_to_host_bytes=4, device_to_host_count=1)


def test_bench_list():
    r = run(["bench", "--list"])
    assert r.exit_code == 0
    for name, batch in (("lenet", 64), ("alexnet", 128), ("overfeat", 128), ("vgg-a", 64)):
        assert any(line.startswith(name) and f"batch {batch:4d}" in line for line in r.output.splitlines())


def test_bench_unknown_model():
    r = run(["bench", "resnet-9000"])
    assert r.exit_code == 2 and "unknown model" in r.output


def test_compare_cuda_without_cuda_exits_2():
    if HAVE_TORCH:
        import torch
        if torch.cuda.is_available():
            import pytest
            pytest.skip("a CUDA device is present")
    r = run(["bench", "lenet", "--iterations", "1", "--compare", "cuda"])
    assert r.exit_code == 2
    assert ("needs a CUDA device" in r.output) or ("needs PyTorch" in r.output)
    assert "Traceback" not in r.output


@needs_torch
def test_compare_torch_cpu_agrees(tmp_path, dev):
    path = tmp_path / "cmp.json"
    r = run(["bench", "lenet", "--device", str(dev.index), "--batch", "4", "--iterations", "2", "--warmup", "1",
             "--compare", "torch-cpu", "--json", str(path), "--markdown"])
    assert r.exit_code == 0, r.output
    d = json.loads(path.read_text())
    agreement = d["compare"]["agreement"]
    assert set(agreement) == {"output"} | {f"grad {k}" for k in ("0.weight", "0.bias", "2.weight", "2.bias",
                                                                   "5.weight", "5.bias", "7.weight", "7.bias")}
    assert max(v["clnet_vs_fp64"] for v in agreement.values()) < 1e-4
    assert max(v["vs_torch"] for v in agreement.values()) < 1e-4
    assert d["compare"]["total_ms"] > 0 and np.isfinite(d["compare"]["ratio_time"])
    assert "| # | layer |" in r.output
