"""The record and the report of `clnet bench`: the JSON record's parts (environment, clnet's figures, PyTorch's),
the per-module rows, and the table with its summary lines (plain or Markdown)."""
import datetime
import platform

from ..version import __version__
from .runner import LOSS, UPDATE


def environment(dev):
    """Where the figures were measured."""
    return dict(device=dev.name, platform=dev.platform_name, driver=dev.driver_version, opencl=dev.version,
                device_type=dev.kind, compute_units=dev.compute_units, clnet=__version__,
                python=platform.python_version(), host=platform.node(),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


def clnet_record(cl_res, modules, tune_report, kernel_builds):
    """The record's "clnet" part from run_clnet's result: medians, replay, launches, copies, memory, tuning, and the
    kernel time outside the modules (the loss, the update, and launches no module's tag covers, which should be
    none)."""
    described = {m["path"] for m in modules}
    layer_ms = cl_res["layer_ms"]
    return dict(
        phases=cl_res["phases"], total_ms=sum(cl_res["phases"].values()),
        graph_ms=cl_res["graph_ms"], graph_launches=cl_res["graph_launches"], first_step_s=cl_res["first_step_s"],
        launches_per_iteration=cl_res["launches_per_iteration"],
        transfers_per_iteration=cl_res["transfers_per_iteration"], memory=cl_res["memory"],
        kernel_builds=kernel_builds, warmup_s=cl_res["warmup_s"],
        tuning=tune_report and dict(seconds=tune_report["seconds"], tuned=tune_report["tuned"],
                                    cached=tune_report["cached"], left=tune_report["left"]),
        loss_and_update_ms={
            "loss_forward": layer_ms.get((LOSS, "forward")), "loss_backward": layer_ms.get((LOSS, "backward")),
            "zero_grad": layer_ms.get((UPDATE, "zero_grad")), "update": layer_ms.get((UPDATE, "update")),
            "unattributed": sum(v for (where, _), v in layer_ms.items()
                                if where not in described and where not in (LOSS, UPDATE)) or None})


def compare_record(engine, torch_info, t_res, agreement, tolerance, clnet_total_ms):
    """The record's "compare" part: PyTorch's medians, CUDA graph, memory and the agreement check."""
    total = sum(t_res["phases"].values())
    return dict(engine=engine, **torch_info, tf32=False, phases=t_res["phases"], total_ms=total,
                graph_ms=t_res.get("graph_ms"), graph_error=t_res.get("graph_error"), memory=t_res["memory"],
                agreement=agreement, tolerance=tolerance, ratio_time=clnet_total_ms / total)


def add_torch_rows(layers, t_res):
    """PyTorch's per-module times beside clnet's; containers get None (PyTorch times leaves only)."""
    for L in layers:
        L["torch_forward_ms"] = t_res["layer_ms"].get((L["path"], "forward")) if L["leaf"] else None
        L["torch_backward_ms"] = t_res["layer_ms"].get((L["path"], "backward")) if L["leaf"] else None


def _gb(nbytes):
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def memory_line(result):
    """Peak device memory of the eager step for each side, naming each measure."""
    mem = result["clnet"]["memory"]
    line = (f"peak device memory of the eager step: clnet {_gb(mem['eager_peak_bytes'])} (its buffer pool's "
            f"high-water mark: buffers in use and cached for reuse; {_gb(mem['with_graph_bytes'])} with the step "
            "captured)")
    cmp = result.get("compare")
    tmem = cmp and cmp["memory"]
    if tmem:
        line += (f"; {cmp['engine']} {_gb(tmem['eager_peak_reserved_bytes'])} held by PyTorch's caching allocator "
                 f"(torch.cuda.max_memory_reserved, the measure like clnet's), {_gb(tmem['eager_peak_bytes'])} in "
                 f"tensors at most (max_memory_allocated)")
        if "with_graph_reserved_bytes" in tmem:
            line += f"; {_gb(tmem['with_graph_reserved_bytes'])} held with its CUDA graph"
    return line


def _fmt(v, digits=3):
    return "-" if v is None else f"{v:.{digits}f}"


def _row_name(path):
    return path if path else "(model)"  # the root's own ops (a network's forward calling ops directly)


def render_table(result, markdown=False):
    cmp = result.get("compare")
    head = ["#", "module", "type", "output", "fwd ms", "bwd ms", "fwd GFLOP/s", "bwd GFLOP/s", "kernels fwd",
            "kernels bwd"]
    if cmp:
        head += [f"{cmp['engine']} fwd ms", f"{cmp['engine']} bwd ms"]
    rows = []
    for L in result["layers"]:
        f, b = L["clnet_forward_ms"], L["clnet_backward_ms"]
        gf = L["forward_flop"] / (f * 1e6) if f and L["forward_flop"] else None
        gb = L["backward_flop"] / (b * 1e6) if b and L["backward_flop"] else None
        kinds = [", ".join(L["clnet_choices"].get(p, [])) or "-" for p in ("forward", "backward")]
        kind = L["module"] + (f" x{L['calls']}" if L["calls"] > 1 else "")
        out = "x".join(map(str, L["output"][1:])) if L["output"] else "-"
        row = [str(L["index"]), _row_name(L["path"]), kind, out, _fmt(f), _fmt(b), _fmt(gf, 0), _fmt(gb, 0)] + kinds
        if cmp:
            row += [_fmt(L.get("torch_forward_ms")), _fmt(L.get("torch_backward_ms"))]
        rows.append(row)
    c = result["clnet"]["phases"]
    total = sum(c.values())
    lines = []
    if markdown:
        def cells(values):
            return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"
        lines.append(cells(head))
        lines.append("|" + "---|" * len(head))
        lines += [cells(r) for r in rows]
    else:
        widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip())
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.append("")
    n = result["batch"]
    summary = [f"{result['model']} batch {n}, clnet on {result['env']['device']}: "
               + ", ".join(f"{k} {v:.3f} ms" for k, v in c.items())
               + f"; total {total:.3f} ms; {n / total * 1e3:.0f} images/s; "
               f"{result['clnet']['launches_per_iteration']:.0f} kernel launches per iteration"]
    summary.append(f"whole iteration replayed as a clnet.Graph ({result['clnet']['graph_launches']} launches): "
                   f"{result['clnet']['graph_ms']:.3f} ms, {n / result['clnet']['graph_ms'] * 1e3:.0f} images/s"
                   + (f"; {cmp['engine']} as a CUDA graph: {cmp['graph_ms']:.3f} ms"
                      if cmp and cmp.get("graph_ms") else "")
                   + (f"; {cmp['engine']}'s CUDA graph failed ({cmp['graph_error']})"
                      if cmp and cmp.get("graph_error") else "")
                   + f"; first iteration done {result['clnet']['first_step_s']:.1f} s after the command started "
                   f"(tuning and kernel builds included)")
    summary.append(memory_line(result))
    lu = result["clnet"]["loss_and_update_ms"]
    summary.append("outside the modules (kernel ms): " + ", ".join(f"{k.replace('_', ' ')} {_fmt(v)}"
                                                                   for k, v in lu.items()))
    t = result["clnet"]["transfers_per_iteration"]
    summary.append(f"host<->device per iteration: {t['host_to_device_bytes']:.0f} B up in "
                   f"{t['host_to_device_count']:.0f} copies (the batch stays on the device, as PyTorch's), "
                   f"{t['device_to_host_bytes']:.0f} B down in {t['device_to_host_count']:.0f} copies (the loss)")
    if cmp:
        tp = cmp["phases"]
        ttotal = sum(tp.values())
        summary.append(f"{cmp['engine']}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in tp.items())
                       + f"; total {ttotal:.3f} ms; {n / ttotal * 1e3:.0f} images/s")
        summary.append(f"clnet / {cmp['engine']} time ratio: {total / ttotal:.2f} "
                       f"(clnet speed is {ttotal / total:.2f}x {cmp['engine']}'s)")
        if any(not L["leaf"] for L in result["layers"]):
            summary.append(f"{cmp['engine']} times only leaf modules: a container's row ('-') holds clnet's time "
                           "for its own ops (a residual add, a concatenation), which PyTorch runs outside any module")
        ag = cmp["agreement"]
        worst = max(ag, key=lambda k: ag[k]["clnet_vs_fp64"])
        summary.append(f"agreement: largest relative error against float64 {ag[worst]['clnet_vs_fp64']:.2e} for clnet, "
                       f"{ag[worst]['torch_vs_fp64']:.2e} for PyTorch float32 ({worst}); clnet vs PyTorch float32 "
                       f"at most {max(v['vs_torch'] for v in ag.values()):.2e}; tolerance {cmp['tolerance']:.0e}")
    lines += [("- " if markdown else "") + s for s in summary]
    return "\n".join(lines)


def profile_rows(modules, cl_res):
    """The table's rows: every module that launched kernels, in first-call order, with its profile and choices."""
    rows = []
    for m in modules:
        p = m["path"]
        ms = {ph: cl_res["layer_ms"].get((p, ph)) for ph in ("forward", "backward")}
        if ms["forward"] is None and ms["backward"] is None:
            continue
        row = dict(m, index=len(rows), clnet_forward_ms=ms["forward"], clnet_backward_ms=ms["backward"],
                   clnet_choices={ph: cl_res["choices"][(p, ph)] for ph in ("forward", "backward")
                                  if (p, ph) in cl_res["choices"]},
                   clnet_kernel_ms={ph: cl_res["kernel_ms"][(p, ph)] for ph in ("forward", "backward")
                                    if (p, ph) in cl_res["kernel_ms"]})
        rows.append(row)
    return rows


def out_of_memory_message(model, batch, e):
    fits = e.fitting_batch(batch)
    return f"{model} at --batch {batch}: {e}" + (f"; at most about --batch {fits} should fit" if fits else "")
