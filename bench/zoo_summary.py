"""The zoo runs of bench/run_h200_zoo.sh: merge each `clnet bench --json` record (or, where a run wrote none, its exit
status and the end of its error output) into one file, and print the summary table (times, ratios, memory) or one
model's slowest modules beside PyTorch's.

    python3 bench/zoo_summary.py add MERGED.json MODEL EXIT WALL_S COMMAND RECORD.json STDERR.txt
    python3 bench/zoo_summary.py table MERGED.json [--markdown]
    python3 bench/zoo_summary.py layers MERGED.json MODEL [--top 15]
"""
import argparse
import json
import os
import re


def _read(path):
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {}


def add(merged_path, model, exit_status, wall_s, command, record_path, stderr_path):
    merged = _read(merged_path)
    entry = _read(record_path)
    with open(stderr_path, errors="replace") as f:  # progress bars redraw with carriage returns: one line each
        lines = [line.rstrip() for line in re.split(r"[\r\n]+", f.read()) if line.strip()]
    entry["run"] = dict(exit=int(exit_status), wall_s=float(wall_s), command=command,
                        tuning=[line for line in lines if line.startswith("tuning:")],
                        errors=[line for line in lines if line.startswith("ERROR")])
    if int(exit_status) not in (0, 1):  # 1: it ran and printed its disagreements; anything else: the whole end
        entry["run"]["stderr_tail"] = lines[-40:]
    merged[model] = entry
    with open(merged_path, "w") as f:
        json.dump(merged, f, indent=1)


def _ms(v):
    return "-" if v is None else f"{v:.1f}"


def _ratio(a, b):
    return "-" if not a or not b else f"{a / b:.2f}x"


def _gb(nbytes):
    return "-" if nbytes is None else f"{nbytes / 1e9:.2f}"


def table(merged_path, markdown=False):
    """One row per model: clnet eager and replayed, PyTorch eager and CUDA graph (ms), clnet's speed as a fraction
    of PyTorch's (eager against eager, replay against graph), peak memory (GB: clnet's pool, PyTorch's reserved and
    allocated), launches, exit status and wall seconds."""
    head = ["model", "batch", "clnet eager", "clnet replay", "PyTorch eager", "PyTorch graph", "speed eager",
            "speed replay", "clnet GB", "PyTorch GB reserved", "PyTorch GB allocated", "launches", "exit", "wall s"]
    rows = []
    for model, d in _read(merged_path).items():
        run = d.get("run", {})
        if "clnet" not in d:
            rows.append([model, "-", "failed"] + ["-"] * 9 + [str(run.get("exit")), f"{run.get('wall_s', 0):.0f}"])
            continue
        c, t = d["clnet"], d.get("compare") or {}
        tm = t.get("memory") or {}
        rows.append([model, str(d["batch"]), _ms(c["total_ms"]), _ms(c["graph_ms"]), _ms(t.get("total_ms")),
                     _ms(t.get("graph_ms")), _ratio(t.get("total_ms"), c["total_ms"]),
                     _ratio(t.get("graph_ms"), c["graph_ms"]), _gb(c["memory"]["eager_peak_bytes"]),
                     _gb(tm.get("eager_peak_reserved_bytes")), _gb(tm.get("eager_peak_bytes")),
                     f"{c['launches_per_iteration']:.0f}", str(run.get("exit")), f"{run.get('wall_s', 0):.0f}"])
    _print(head, rows, markdown)


def layers(merged_path, model, top=15, markdown=False):
    """The modules of MODEL where clnet spends most kernel time (forward + backward), beside PyTorch's, with the
    share of clnet's profiled total and the FLOP rate."""
    d = _read(merged_path)[model]
    rows_in = [L for L in d["layers"] if (L["clnet_forward_ms"] or 0) + (L["clnet_backward_ms"] or 0) > 0]
    total = sum((L["clnet_forward_ms"] or 0) + (L["clnet_backward_ms"] or 0) for L in rows_in)
    lu = d["clnet"]["loss_and_update_ms"]
    outside = sum(v or 0 for v in lu.values())
    by_type = {}
    for L in rows_in:
        ms = (L["clnet_forward_ms"] or 0) + (L["clnet_backward_ms"] or 0)
        torch_ms = (L.get("torch_forward_ms") or 0) + (L.get("torch_backward_ms") or 0)
        kind = L["module"] if L["leaf"] else L["module"] + " (own ops)"
        agg = by_type.setdefault(kind, [0, 0.0, 0.0, 0])
        agg[0] += 1
        agg[1] += ms
        agg[2] += torch_ms
        agg[3] += L["forward_flop"] + L["backward_flop"]
    print(f"{model} batch {d['batch']}: clnet kernel time in modules {total:.1f} ms per iteration (profiled), "
          f"outside them {outside:.1f} ms (loss, zero_grad, update); eager step {d['clnet']['total_ms']:.1f} ms")
    head = ["module type", "rows", "clnet ms", "share", "PyTorch ms", "clnet GFLOP/s"]
    rows = [[k, str(n), f"{ms:.2f}", f"{ms / total:.0%}", f"{tms:.2f}", f"{flop / (ms * 1e6):.0f}" if flop else "-"]
            for k, (n, ms, tms, flop) in sorted(by_type.items(), key=lambda kv: -kv[1][1])]
    _print(head, rows, markdown)
    print()
    head = ["module", "type", "output", "clnet fwd", "clnet bwd", "PyTorch fwd", "PyTorch bwd", "kernels"]
    ranked = sorted(rows_in, key=lambda L: -((L["clnet_forward_ms"] or 0) + (L["clnet_backward_ms"] or 0)))[:top]
    rows = [[L["path"] or "(model)", L["module"], "x".join(map(str, L["output"][1:])) if L["output"] else "-",
             _ms3(L["clnet_forward_ms"]), _ms3(L["clnet_backward_ms"]), _ms3(L.get("torch_forward_ms")),
             _ms3(L.get("torch_backward_ms")),
             "; ".join(", ".join(v) for v in L["clnet_choices"].values()) or "-"] for L in ranked]
    _print(head, rows, markdown)


def _ms3(v):
    return "-" if v is None else f"{v:.3f}"


def _print(head, rows, markdown):
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("add")
    for name in ("merged", "model", "exit", "wall_s", "command", "record", "stderr"):
        a.add_argument(name)
    t = sub.add_parser("table")
    t.add_argument("merged")
    t.add_argument("--markdown", action="store_true")
    L = sub.add_parser("layers")
    L.add_argument("merged")
    L.add_argument("model")
    L.add_argument("--top", type=int, default=15)
    L.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    if args.what == "add":
        add(args.merged, args.model, args.exit, args.wall_s, args.command, args.record, args.stderr)
    elif args.what == "table":
        table(args.merged, args.markdown)
    else:
        layers(args.merged, args.model, args.top, args.markdown)


if __name__ == "__main__":
    main()
