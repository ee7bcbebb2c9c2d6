"""`clnet bench`: time training iterations of a zoo model the way convnet-benchmarks did, optionally beside PyTorch.

Protocol: warm-up iterations first (kernel builds never counted), then N timed iterations. Each phase (forward,
backward, update) is timed by wall clock with the queue finished, and reported as the median. Per-module times come
from OpenCL profiling events of extra profiled iterations, the only ones with module hooks installed: forward hooks
on every module (containers too) tag each launch with the path of the innermost module running (its name in
`named_modules()`: `layer3.0.conv2`, `inception4a.b2.1`, `0` in a Sequential), and autograd tags each op's backward
with the path its forward ran under. So a container's own ops (an Inception module's concatenation, a residual
block's add) land in the container's row. FLOPs are counted from the shapes the hooks saw.
"""
import copy
import datetime
import functools
import json
import math
import platform
import statistics
import sys
import time
import warnings

import click
import numpy as np

from . import autograd, kernels, models, nn, optim, rng, tuning
from .devices import DeviceNotFound, device as get_device
from .graph import Graph
from .ops import zeros
from .tensor import Tensor, reset_transfer_stats, tensor, transfer_stats
from .train import mpi_world
from .tune import buffers_kept, tune_first
from .version import __version__

LOSS, UPDATE, OTHER = "(loss)", "(update)", "(other)"  # tags of launches outside the model (no path has parentheses)


def module_flops(module, in_shape):
    """Forward multiply-adds x 2 of one call of a convolution or dense layer on an input of in_shape; 0 otherwise."""
    if isinstance(module, nn.Conv2d):
        s = module.conv_shape(in_shape)
        return 2 * s.N * s.O * s.OH * s.OW * (s.C // s.G) * s.KH * s.KW
    if isinstance(module, nn.Linear):
        return 2 * math.prod(in_shape[:-1]) * module.in_features * module.out_features
    return 0


def _first_tensor(value):
    if isinstance(value, Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((t for t in map(_first_tensor, value) if t is not None), None)
    return None


class ModuleHooks:
    """Forward pre- and post-hooks on every module of a model (containers too), for the duration of a `with`.

    While a profiler is attached, each module's launches are tagged (its path, "forward"), and the caller's tag comes
    back when it returns. With `record`, each module's first call (in execution order) is kept with its input and
    output shapes and its FLOPs summed over its calls (`modules`: path -> dict); `batch` is the model's input, whose
    gradient training never computes (a layer that takes it does only the weight half of its backward)."""

    def __init__(self, model, record=False, batch=None):
        self.model, self.record, self.batch = model, record, batch
        self.modules = {}
        self._restore, self._handles = [], []

    def __enter__(self):
        for path, m in self.model.named_modules():
            self._handles.append(m.register_forward_pre_hook(functools.partial(self._enter, path)))
            self._handles.append(m.register_forward_hook(functools.partial(self._leave, path)))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._restore.clear()

    def _enter(self, path, module, args):
        prof = kernels.profiler
        self._restore.append(prof.tag if prof is not None else None)
        if prof is not None:
            prof.tag = (path, "forward")
        if not self.record:
            return
        x = _first_tensor(args)
        shape = x.shape if x is not None else None
        row = self.modules.get(path)
        if row is None:
            leaf = next(module.children(), None) is None
            row = self.modules[path] = dict(path=path, module=type(module).__name__, leaf=leaf,
                                            repr=repr(module) if leaf else f"{type(module).__name__}(...)",
                                            input=list(shape) if shape is not None else None, output=None, calls=0,
                                            forward_flop=0, backward_flop=0)
        row["calls"] += 1
        flop = module_flops(module, shape) if shape is not None else 0
        row["forward_flop"] += flop
        row["backward_flop"] += flop if x is self.batch else 2 * flop  # data and weight gradients

    def _leave(self, path, module, args, out):
        previous = self._restore.pop()
        if kernels.profiler is not None:
            kernels.profiler.tag = previous
        if self.record and self.modules[path]["output"] is None:
            y = _first_tensor(out)
            self.modules[path]["output"] = list(y.shape) if y is not None else None


def describe(model, in_shape, dev):
    """Every module that one forward of `model` on a batch of in_shape calls, in the order of first call: path,
    module type and repr, whether it is a leaf, input and output shapes of its first call, calls, and forward and
    backward FLOPs summed over its calls (backward: twice the forward, data and weight gradients; once for a layer
    fed the batch itself, whose gradient no training step computes). Runs that forward on the device, under no_grad,
    in the model's own mode (a network may call some modules only in training), its buffers put back afterwards."""
    model.to(dev)
    x = zeros(tuple(in_shape), dev)
    with ModuleHooks(model, record=True, batch=x) as hooks, autograd.no_grad(), buffers_kept(model):
        model(x)
    return list(hooks.modules.values())


def _tag(where, phase):
    """Attribute the following launches to `where` in the per-module profile."""
    if kernels.profiler is not None:
        kernels.profiler.tag = (where, phase)


class ClnetRunner:
    def __init__(self, model, dev, x, labels):
        # The batch stays on the device, as PyTorch's does in run_torch: both engines time the same work.
        self.model, self.dev = model.to(dev), dev
        self.x, self.labels = tensor(x, dev), tensor(labels, dev)
        self.loss_fn = nn.CrossEntropyLoss()
        self.opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def iteration(self, forward_only=False):
        """One training iteration; returns per-phase wall ms with the queue finished after each phase. The batch does
        not require a gradient, so no d loss / d input is computed (as in PyTorch's timed iterations)."""
        q, t = self.dev.queue, {}
        t0 = time.perf_counter()
        out = self.model(self.x)
        _tag(LOSS, "forward")
        loss = self.loss_fn(out, self.labels)
        q.finish()
        t1 = time.perf_counter()
        t["forward"] = (t1 - t0) * 1e3
        if not forward_only:
            _tag(UPDATE, "zero_grad")
            self.opt.zero_grad()
            loss.backward()  # each op's backward launches are tagged with its module's path
            q.finish()
            t2 = time.perf_counter()
            _tag(UPDATE, "update")
            self.opt.step()
            q.finish()
            t3 = time.perf_counter()
            t["backward"], t["update"] = (t2 - t1) * 1e3, (t3 - t2) * 1e3
        t["loss"] = float(loss)
        return t

    def step(self, forward_only=False):
        """The iteration's work alone (no timing, no read-back): what a graph captures."""
        loss = self.loss_fn(self.model(self.x), self.labels)
        if not forward_only:
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()


def time_replays(runner, iterations, forward_only):
    """(median ms of a replayed whole iteration, launches it replays): the iteration captured once as a clnet.Graph,
    then replayed with the queue finished after each."""
    graph = Graph()
    with graph.capture():
        runner.step(forward_only)
    runner.dev.synchronize()
    samples = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        graph.replay()
        runner.dev.queue.finish()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), graph.launches


def _median_phases(samples, phases):
    return {p: statistics.median(s[p] for s in samples) for p in phases}


def run_clnet(model, dev, x, labels, iterations, warmup, forward_only, progress=True, started=None):
    """started: perf_counter() when the command began, for the time to the first finished iteration."""
    runner = ClnetRunner(model, dev, x, labels)
    phases = ["forward"] if forward_only else ["forward", "backward", "update"]
    t_warmup = time.perf_counter()
    first_step_s = None
    with click.progressbar(range(warmup), label=f"clnet warm-up ({dev.name})", file=sys.stderr,
                           hidden=not progress) as bar:
        for _ in bar:
            runner.iteration(forward_only)
            if first_step_s is None:
                first_step_s = time.perf_counter() - (started or t_warmup)
    dev.synchronize()
    warmup_s = time.perf_counter() - t_warmup
    reset_transfer_stats()
    launches = kernels.launch_count
    samples = []
    with click.progressbar(range(iterations), label="clnet timed", file=sys.stderr, hidden=not progress) as bar:
        for _ in bar:
            samples.append(runner.iteration(forward_only))
            if first_step_s is None:  # no warm-up
                first_step_s = time.perf_counter() - (started or t_warmup)
    launches = (kernels.launch_count - launches) / iterations
    transfers = {k: v / iterations for k, v in transfer_stats().items()}
    graph_ms, graph_launches = time_replays(runner, iterations, forward_only)
    # Per-module kernel times from profiling events, over a few extra eager iterations with the module hooks on.
    prof = kernels.Profiler()
    tuning.used = choices = {}
    profiled = min(iterations, 5)
    with ModuleHooks(runner.model):
        kernels.profiler = prof
        try:
            for _ in range(profiled):
                runner.iteration(forward_only)
        finally:
            kernels.profiler = None
            tuning.used = None
    per_kernel = {}  # (path, phase) -> kernel name -> ms per iteration
    for tag, name, ms in prof.times_ms():
        key = tag if tag else (OTHER, "other")
        per_kernel.setdefault(key, {}).setdefault(name, 0.0)
        per_kernel[key][name] += ms / profiled
    layer_ms = {k: sum(v.values()) for k, v in per_kernel.items()}
    return dict(phases=_median_phases(samples, phases), layer_ms=layer_ms, launches_per_iteration=launches,
                graph_ms=graph_ms, graph_launches=graph_launches, transfers_per_iteration=transfers,
                warmup_s=warmup_s, first_step_s=first_step_s,
                choices={tag: sorted(set(c.values())) for tag, c in choices.items() if tag}, kernel_ms=per_kernel)


# ---- PyTorch side -------------------------------------------------------------------------------------------------

def torch_twin(name, model):
    """The PyTorch build of zoo model `name` (the same definition, so the same structure and state_dict keys) holding
    `model`'s parameters and buffers (integer buffers as int64, as PyTorch keeps them)."""
    import torch
    tm = models.build(name, lib=torch)
    tm.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in model.state_dict().items()})
    return tm


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _torch_grads(tm, tdev, x, labels, dtype):
    """PyTorch's output and parameter gradients for one batch, computed in dtype, returned in float64."""
    import torch
    tm.zero_grad()
    out = tm(torch.from_numpy(x).to(tdev, dtype))
    torch.nn.functional.cross_entropy(out, torch.from_numpy(labels.astype(np.int64)).to(tdev)).backward()
    grads = {"output": out.detach().cpu().double().numpy()}
    grads.update({"grad " + k: p.grad.detach().cpu().double().numpy() for k, p in tm.named_parameters()})
    return grads


def check_agreement(model, dev, tm, tdev, x, labels):
    """One forward and backward from the same weights and batch in clnet, in PyTorch float32, and in PyTorch float64,
    every model in the mode it is in (training: batch norm normalises by the batch's statistics in all three).

    Returns, per quantity (the output and every parameter's gradient; buffers are state, not gradients), the relative
    error of clnet against PyTorch float32 ('vs_torch'), and of each float32 engine against float64 ('clnet_vs_fp64',
    'torch_vs_fp64'): a long reduction (the first layer's weight gradient sums N*OH*OW terms) legitimately differs
    between two float32 engines, and float64 says which is closer.
    """
    import torch
    t64_model = copy.deepcopy(tm).double()  # before tm's step moves its running statistics
    model.zero_grad()
    out = model(tensor(x, dev))
    nn.CrossEntropyLoss()(out, labels).backward()
    ours = {"output": out.numpy()}
    ours.update({"grad " + k: p.grad.numpy() for k, p in model.named_parameters()})
    t32 = _torch_grads(tm, tdev, x, labels, torch.float32)
    t64 = _torch_grads(t64_model, tdev, x, labels, torch.float64)
    missing = set(ours) ^ set(t32)
    if missing:
        raise RuntimeError(f"check_agreement: clnet and PyTorch name different quantities: {sorted(missing)}")
    return {k: dict(vs_torch=_rel_err(ours[k], t32[k]), clnet_vs_fp64=_rel_err(ours[k], t64[k]),
                    torch_vs_fp64=_rel_err(t32[k], t64[k])) for k in ours}


def disagreements(agreement, tolerance):
    """Quantities where clnet is off by more than float32 allows: beyond the tolerance against float64 and also
    clearly worse than PyTorch's own float32 result."""
    return {k: v for k, v in agreement.items()
            if v["clnet_vs_fp64"] > tolerance and v["clnet_vs_fp64"] > 2 * v["torch_vs_fp64"]}


def run_torch(tm, tdev, x, labels, iterations, warmup, forward_only, progress=True):
    """Same protocol in PyTorch: CUDA events on a GPU, wall clock with synchronisation on the CPU. Per-module times
    come from forward and full backward hooks on the leaf modules (keyed by the paths clnet's rows use, summed over
    the calls of a module in one iteration), installed only for the extra per-module iterations. Containers get no
    time: their own ops (an add, a concatenation) run outside any PyTorch module."""
    import torch
    cuda = tdev.type == "cuda"
    xt = torch.from_numpy(x).to(tdev)
    yt = torch.from_numpy(labels.astype(np.int64)).to(tdev)
    opt = torch.optim.SGD(tm.parameters(), lr=0.01, momentum=0.9)
    leaves = [(path, m) for path, m in tm.named_modules() if next(m.children(), None) is None]
    started, spans = {}, []  # (path, phase) -> open marks; (path, phase, start, end)

    def clock():
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed(a, b):
        return a.elapsed_time(b) if cuda else (b - a) * 1e3

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def start(key, *_):
        started.setdefault(key, []).append(clock())

    def stop(key, *_):
        if started.get(key):
            spans.append((key, started[key].pop(), clock()))

    def install():
        hooks = []
        for path, m in leaves:
            hooks.append(m.register_forward_pre_hook(functools.partial(start, (path, "forward"))))
            hooks.append(m.register_forward_hook(functools.partial(stop, (path, "forward"))))
            if not forward_only:
                hooks.append(m.register_full_backward_pre_hook(functools.partial(start, (path, "backward"))))
                hooks.append(m.register_full_backward_hook(functools.partial(stop, (path, "backward"))))
        return hooks

    def iteration(per_module):
        started.clear()
        spans.clear()
        t0 = clock()
        # Neither engine computes d loss / d input in the timed iterations. PyTorch's full backward hooks only time
        # a module's backward when its input wants a gradient, so the per-module iterations ask for it: PyTorch's
        # first layer's backward time in the table includes it, its totals do not.
        out = tm(xt.detach().requires_grad_(True) if per_module else xt)
        loss = torch.nn.functional.cross_entropy(out, yt)
        t1 = clock()
        if forward_only:
            sync()
            res = {"forward": elapsed(t0, t1)}
        else:
            opt.zero_grad()
            with warnings.catch_warnings():  # a leaf fed no tensor that wants a gradient: its backward is not timed
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                loss.backward()
            t2 = clock()
            opt.step()
            t3 = clock()
            sync()
            res = {"forward": elapsed(t0, t1), "backward": elapsed(t1, t2), "update": elapsed(t2, t3)}
        per = {}
        for key, a, b in spans:
            per[key] = per.get(key, 0.0) + elapsed(a, b)
        return res, per

    phases = ["forward"] if forward_only else ["forward", "backward", "update"]
    with click.progressbar(range(warmup), label=f"PyTorch warm-up ({tdev})", file=sys.stderr,
                           hidden=not progress) as bar:
        for _ in bar:
            iteration(False)
    samples, per_module = [], []
    with click.progressbar(range(iterations), label="PyTorch timed", file=sys.stderr, hidden=not progress) as bar:
        for _ in bar:
            samples.append(iteration(False)[0])
    hooks = install()
    try:
        for _ in range(min(iterations, 5)):
            per_module.append(iteration(True)[1])
    finally:
        for h in hooks:
            h.remove()
    keys = {k for p in per_module for k in p}
    layer_ms = {k: statistics.median(p[k] for p in per_module if k in p) for k in keys}
    result = dict(phases=_median_phases(samples, phases), layer_ms=layer_ms)
    if cuda:
        try:
            result["graph_ms"] = torch_graph_ms(tm, opt, xt, yt, iterations, forward_only)
        except Exception as e:  # the eager comparison stands on its own; say why the graph's is missing
            result["graph_error"] = f"{type(e).__name__}: {e}"
    return result


def torch_graph_ms(tm, opt, xt, yt, iterations, forward_only):
    """Median ms of PyTorch's whole iteration captured as a CUDA graph and replayed (what a PyTorch user who cares
    about small batches runs), warmed up on a side stream as torch.cuda.graphs asks."""
    import torch

    def step():
        loss = torch.nn.functional.cross_entropy(tm(xt), yt)
        if not forward_only:
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    samples = []
    for _ in range(iterations):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        samples.append(a.elapsed_time(b))
    return statistics.median(samples)


# ---- reporting ----------------------------------------------------------------------------------------------------

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


AGREEMENT_TOLERANCE = 1e-3


def out_of_memory_message(model, batch, e):
    fits = e.fitting_batch(batch)
    return f"{model} at --batch {batch}: {e}" + (f"; at most about --batch {fits} should fit" if fits else "")


@click.command()
@click.argument("model", required=False)
@click.option("--device", "device_spec", default="auto", show_default=True, help="auto, gpu, cpu, an index or a name")
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help="batch size [default: the model's, as convnet-benchmarks]")
@click.option("--iterations", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True,
              help="untimed iterations first (kernel builds; the buffer pool settles in 3-5)")
@click.option("--forward-only", is_flag=True, help="time the forward pass (and the loss) only")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write every figure to this file")
@click.option("--markdown", is_flag=True, help="print the table as Markdown")
@click.option("--compare", type=click.Choice(["cuda", "torch-cpu"]), help="run PyTorch beside clnet")
@click.option("--tf32", is_flag=True, help="with --compare cuda: also time PyTorch with its TF32 defaults")
@click.option("--list", "list_models", is_flag=True, help="list the models and their default batch sizes")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--tune/--no-tune", default=None,
              help="autotune shapes missing from the cache first [default: on GPUs, where it takes seconds]")
@click.option("--less-accurate", is_flag=True,
              help="let the tuner pick algorithms with a larger float32 error than the default's (Winograd "
                   "F(4x4,3x3): 4-5x per layer), as cudnn.benchmark does")
def bench(model, device_spec, batch, iterations, warmup, forward_only, json_path, markdown, compare, tf32,
          list_models, seed, tune, less_accurate):
    """Time training iterations of MODEL (forward, backward, update), module by module.

    Under `mpiexec -n N`: the data-parallel step instead, each rank on its own batch of --batch images (weak
    scaling): per-rank and aggregate images/s, the scaling efficiency and where the all-reduce's time goes.
    """
    started = time.perf_counter()
    world = mpi_world()
    if list_models or model is None:
        for name, entry in models.MODELS.items():
            shape, doc = "x".join(map(str, entry["input_shape"])), " ".join((entry["doc"] or "").split())
            click.echo(f"{name:12s} batch {entry['batch']:4d}  input {shape:9s}  {doc}")
        if model is None and not list_models:
            raise click.UsageError("name a MODEL (see --list)")
        return
    onnx_file = model.lower().endswith(".onnx")
    if not onnx_file and model not in models.MODELS:
        raise click.BadParameter(f"unknown model {model!r}; known: {', '.join(models.MODELS)} or a file.onnx",
                                 param_hint="MODEL")
    tdev = None
    if compare:
        try:
            import torch
        except ImportError:
            click.echo(f"clnet bench: --compare {compare} needs PyTorch, which is not installed "
                       "(pip install torch)", err=True)
            sys.exit(2)
        if compare == "cuda":
            if not torch.cuda.is_available():
                click.echo("clnet bench: --compare cuda needs a CUDA device, and PyTorch sees none", err=True)
                sys.exit(2)
            tdev = torch.device("cuda")
            torch.backends.cudnn.benchmark = True
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        else:
            tdev = torch.device("cpu")
    try:
        if world is not None:
            from . import distributed
            dev = distributed.device(device_spec)
        else:
            dev = get_device(device_spec)
    except DeviceNotFound as e:
        raise click.ClickException(str(e))
    rng.manual_seed(seed)
    zoo_name = model
    if onnx_file:  # the file's network and input shape; a zoo name where PyTorch can rebuild it (for --compare)
        from . import onnx as onnx_mod
        try:
            net, in_shape, zoo_name = onnx_mod.bench_setup(model, batch)
        except (onnx_mod.OnnxImportError, ImportError, FileNotFoundError) as e:
            raise click.ClickException(str(e)) from None
        batch = in_shape[0]
    else:
        entry = models.MODELS[model]
        batch = batch or entry["batch"]
        net = models.build(model)
        in_shape = (batch,) + tuple(entry["input_shape"])
    try:
        modules = describe(net, in_shape, dev)
    except kernels.OutOfMemory as e:
        raise click.ClickException(out_of_memory_message(model, batch, e)) from None
    except ValueError as e:  # a batch too large for 32-bit indexing
        raise click.ClickException(f"{model} at --batch {batch}: {e}") from None
    data_rng = np.random.default_rng(seed)
    x = data_rng.standard_normal(in_shape).astype(np.float32)
    classes = modules[0]["output"][1]  # the model's own output (the root is called first)
    labels = data_rng.integers(0, classes, batch).astype(np.int32)
    if world is not None:
        tuning.allow_less_accurate = less_accurate
        with distributed.stop_all_on_failure():
            distributed.tune_on_rank0(lambda: tune_first(net, in_shape, dev, tune,
                                                         lambda line: click.echo(line, err=True)), dev)
            timing = distributed.time_data_parallel(net, dev, x, labels, iterations, warmup)
        if timing is not None:  # rank 0
            click.echo(distributed.format_timing(timing))
            if json_path:
                with open(json_path, "w") as f:
                    json.dump(dict(model=model, batch_per_rank=batch, iterations=iterations, warmup=warmup,
                                   timing=timing), f, indent=1)
        return
    click.echo(f"clnet bench {model}: batch {batch}, {iterations} iterations after {warmup} warm-up, on "
               f"{dev.name} ({dev.platform_name}, driver {dev.driver_version})", err=True)
    tuning.allow_less_accurate = less_accurate
    tune_report = tune_first(net, in_shape, dev, tune, lambda line: click.echo(line, err=True),
                             progress=lambda line: click.echo("tune " + line, err=True))
    builds = kernels.build_count
    try:
        cl_res = run_clnet(net, dev, x, labels, iterations, warmup, forward_only, progress=True, started=started)
    except kernels.OutOfMemory as e:
        raise click.ClickException(out_of_memory_message(model, batch, e)) from None
    layers = profile_rows(modules, cl_res)
    result = dict(
        model=model, batch=batch, iterations=iterations, warmup=warmup, forward_only=forward_only,
        less_accurate=less_accurate,
        env=dict(device=dev.name, platform=dev.platform_name, driver=dev.driver_version, opencl=dev.version,
                 device_type=dev.kind, compute_units=dev.compute_units, clnet=__version__,
                 python=platform.python_version(), host=platform.node(),
                 date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")),
        clnet=dict(phases=cl_res["phases"], total_ms=sum(cl_res["phases"].values()),
                   graph_ms=cl_res["graph_ms"], graph_launches=cl_res["graph_launches"],
                   first_step_s=cl_res["first_step_s"],
                   launches_per_iteration=cl_res["launches_per_iteration"],
                   transfers_per_iteration=cl_res["transfers_per_iteration"],
                   kernel_builds=kernels.build_count - builds, warmup_s=cl_res["warmup_s"],
                   tuning=tune_report and dict(seconds=tune_report["seconds"], tuned=tune_report["tuned"],
                                               cached=tune_report["cached"], left=tune_report["left"])),
        expected_transfer_bytes=dict(input=0, labels=0, loss=4),
        layers=layers)
    described = {m["path"] for m in modules}
    result["clnet"]["loss_and_update_ms"] = {
        "loss_forward": cl_res["layer_ms"].get((LOSS, "forward")),
        "loss_backward": cl_res["layer_ms"].get((LOSS, "backward")),
        "zero_grad": cl_res["layer_ms"].get((UPDATE, "zero_grad")),
        "update": cl_res["layer_ms"].get((UPDATE, "update")),
        # launches under no module's tag, or under a module the describing forward did not call (should be none)
        "unattributed": sum(v for (where, _), v in cl_res["layer_ms"].items()
                            if where not in described and where not in (LOSS, UPDATE)) or None}
    status = 0
    if compare and onnx_file:
        fresh = onnx_mod.load(model, device=dev)
        result["onnxruntime_error"] = err = onnx_mod.onnxruntime_agreement(model, fresh, x)
        click.echo(f"agreement with ONNX Runtime (CPU) on the output: largest relative error {err:.2e}, tolerance "
                   f"{AGREEMENT_TOLERANCE:.0e}", err=True)
        status = int(err > AGREEMENT_TOLERANCE)
        if zoo_name is None:
            click.echo(f"{model}: PyTorch cannot rebuild this network (its weights match no zoo model): clnet "
                       "alone is timed", err=True)
            compare = None
    if compare:
        import torch
        # Agreement on fresh weights: both engines start from one new state, untouched by the timed steps above.
        rng.manual_seed(seed + 1)
        if onnx_file:  # the zoo twin with the file's weights (ONNX carries no num_batches_tracked)
            tm = models.build(zoo_name, lib=torch)
            tm.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in fresh.state_dict().items()},
                               strict=False)
            tm = tm.to(tdev)
        else:
            fresh = models.build(model).to(dev)
            tm = torch_twin(model, fresh).to(tdev)
        agreement = check_agreement(fresh, dev, tm, tdev, x, labels)
        t_res = run_torch(tm, tdev, x, labels, iterations, warmup, forward_only)
        result["compare"] = dict(engine="cuDNN" if compare == "cuda" else "torch-cpu", torch=torch.__version__,
                                 cudnn=torch.backends.cudnn.version() if compare == "cuda" else None,
                                 torch_device=torch.cuda.get_device_name() if compare == "cuda" else "cpu",
                                 tf32=False, phases=t_res["phases"], total_ms=sum(t_res["phases"].values()),
                                 graph_ms=t_res.get("graph_ms"), graph_error=t_res.get("graph_error"),
                                 agreement=agreement, tolerance=AGREEMENT_TOLERANCE,
                                 ratio_time=result["clnet"]["total_ms"] / sum(t_res["phases"].values()))
        if compare == "torch-cpu":
            result["compare"]["threads"] = torch.get_num_threads()
        for L in layers:  # containers: None (PyTorch times leaves only)
            L["torch_forward_ms"] = t_res["layer_ms"].get((L["path"], "forward")) if L["leaf"] else None
            L["torch_backward_ms"] = t_res["layer_ms"].get((L["path"], "backward")) if L["leaf"] else None
        if tf32 and compare == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            t32 = run_torch(tm, tdev, x, labels, iterations, warmup, forward_only, progress=False)
            result["compare"]["tf32_phases"] = t32["phases"]
            result["compare"]["tf32_total_ms"] = sum(t32["phases"].values())
        if disagreements(agreement, AGREEMENT_TOLERANCE):
            status = 1
    click.echo(render_table(result, markdown))
    if compare and "tf32_total_ms" in result["compare"]:
        click.echo(f"PyTorch with TF32 allowed: total {result['compare']['tf32_total_ms']:.3f} ms")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        click.echo(f"wrote {json_path}", err=True)
    if result.get("onnxruntime_error", 0) > AGREEMENT_TOLERANCE:
        click.echo(f"ERROR: clnet disagrees with ONNX Runtime on the output: relative error "
                   f"{result['onnxruntime_error']:.2e}, tolerance {AGREEMENT_TOLERANCE:.0e}", err=True)
    if status and "compare" not in result:
        sys.exit(1)
    if status:
        for k, v in disagreements(result["compare"]["agreement"], AGREEMENT_TOLERANCE).items():
            click.echo(f"ERROR: clnet disagrees with the float64 reference on {k}: relative error "
                       f"{v['clnet_vs_fp64']:.2e} (PyTorch float32: {v['torch_vs_fp64']:.2e}), tolerance "
                       f"{AGREEMENT_TOLERANCE:.0e}", err=True)
        sys.exit(1)
