"""PyTorch's side of `clnet bench`: the zoo model's PyTorch twin holding clnet's weights, the agreement of one
training step in clnet, PyTorch float32 and PyTorch float64, and the same timed protocol in PyTorch (eager, its CUDA
graph, per-module times from hooks, peak device memory from its allocator). PyTorch is imported only here, and only
when a comparison is asked for."""
import contextlib
import copy
import functools
import statistics
import sys
import time
import warnings

import click
import numpy as np

from .. import models, nn
from ..tensor import tensor
from .runner import median_phases

AGREEMENT_TOLERANCE = 1e-3
RANDOM_MODULES = {"Dropout", "Dropout1d", "Dropout2d", "AlphaDropout", "StochasticDepth"}  # by class name, either library


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


@contextlib.contextmanager
def without_random_layers(*nets):
    """Dropout and stochastic depth in eval mode (identity) for the duration, every other module as it was: two
    engines draw different masks, so a step with them on cannot be compared (mobilenet_v2 at batch 2 on PoCL: 2.1
    relative error between clnet and PyTorch float32, 1e9 between PyTorch's float32 and float64 runs)."""
    switched = [m for net in nets for m in net.modules() if type(m).__name__ in RANDOM_MODULES and m.training]
    for m in switched:
        m.training = False
    try:
        yield
    finally:
        for m in switched:
            m.training = True


def check_agreement(model, dev, tm, tdev, x, labels):
    """One forward and backward from the same weights and batch in clnet, in PyTorch float32, and in PyTorch float64,
    every model in the mode it is in (training: batch norm normalises by the batch's statistics in all three), with
    dropout and stochastic depth switched off in all three (`without_random_layers`).

    Returns, per quantity (the output and every parameter's gradient; buffers are state, not gradients), the relative
    error of clnet against PyTorch float32 ('vs_torch'), and of each float32 engine against float64 ('clnet_vs_fp64',
    'torch_vs_fp64'): a long reduction (the first layer's weight gradient sums N*OH*OW terms) legitimately differs
    between two float32 engines, and float64 says which is closer.
    """
    import torch
    t64_model = copy.deepcopy(tm).double()  # before tm's step moves its running statistics
    flips = _follow_relu_decisions(model, t64_model)
    with without_random_layers(model, tm, t64_model):
        model.zero_grad()
        out = model(tensor(x, dev))
        flips.stop_recording()
        nn.CrossEntropyLoss()(out, labels).backward()
        ours = {"output": out.numpy()}
        ours.update({"grad " + k: p.grad.numpy() for k, p in model.named_parameters()})
        t32 = _torch_grads(tm, tdev, x, labels, torch.float32)
        t64 = _torch_grads(t64_model, tdev, x, labels, torch.float64)
    missing = set(ours) ^ set(t32)
    if missing:
        raise RuntimeError(f"check_agreement: clnet and PyTorch name different quantities: {sorted(missing)}")
    flips.check()
    return {k: dict(vs_torch=_rel_err(ours[k], t32[k]), clnet_vs_fp64=_rel_err(ours[k], t64[k]),
                    torch_vs_fp64=_rel_err(t32[k], t64[k])) for k in ours}


KINK_TOL = 1e-4  # a ReLU decision of clnet's may differ from float64's within this much of the call's largest input


class _follow_relu_decisions:
    """clnet's ReLU/ReLU6 inputs, recorded per module and call by forward pre-hooks, imposed on the float64 twin's
    modules of the same names: there, y = x where clnet's input was on and 0 (or 6) where it was off. A float32 ReLU
    input within rounding of zero can go either way, and one such flip moves every gradient below it by 5e-3 to 1e-2
    (shufflenet_v2_x1_0 at 224x224: one of conv5's 100352 inputs, 3e-5 from zero), past AGREEMENT_TOLERANCE although
    no op is wrong. Each decision that differs from float64's is counted with its distance from the kink; one farther
    than KINK_TOL of that call's largest input is a real error, which check() raises. The hooks keep nn.Sequential
    from fusing those ReLUs into their Conv2d or Linear for this one forward (the same results, bit for bit)."""

    def __init__(self, model, t64_model):
        import torch
        self.seen, self.calls, self.flips, self.worst = {}, {}, 0, 0.0
        self.handles = [m.register_forward_pre_hook(
            lambda m_, a, name=name: self.seen.setdefault(name, []).append(a[0].numpy()))
            for name, m in model.named_modules() if type(m).__name__ in ("ReLU", "ReLU6")]

        def follow(name, m, args, out):
            v = args[0]
            ours = torch.from_numpy(next(self.calls.setdefault(name, iter(self.seen[name])))).to(v.device, v.dtype)
            top = 6.0 if type(m).__name__ == "ReLU6" else float("inf")
            on, high = (ours > 0) & (ours < top), ours >= top
            d = v.detach()
            differ = (on != ((d > 0) & (d < top))) | (high != (d >= top))
            if differ.any():
                self.flips += int(differ.sum())
                gap = torch.minimum(d.abs(), (d - top).abs())[differ].max() / d.abs().max()
                self.worst = max(self.worst, float(gap))
            return torch.where(on, v, torch.where(high, torch.full_like(v, 6.0), torch.zeros_like(v)))
        for name, m in t64_model.named_modules():
            if type(m).__name__ in ("ReLU", "ReLU6"):
                m.register_forward_hook(functools.partial(follow, name))

    def stop_recording(self):
        for h in self.handles:
            h.remove()

    def check(self):
        if self.worst > KINK_TOL:
            raise RuntimeError(f"check_agreement: {self.flips} ReLU decisions of clnet's differ from float64's, one "
                               f"{self.worst:.2e} of its call's largest input from the kink (rounding reaches "
                               f"{KINK_TOL:.0e}): a ReLU computes the wrong side")


NOISE_FACTOR = 2.0  # clnet may err this many times PyTorch float32's own error before it counts as a disagreement
ZERO_NOISE_FACTOR = 10.0  # the same for a quantity that is zero by construction (below)


def disagreements(agreement, tolerance):
    """Quantities where clnet is off by more than float32 allows: beyond the tolerance against float64 and also
    clearly worse than PyTorch's own float32 result (NOISE_FACTOR times its error).

    A gradient that is zero by construction (a batch norm's bias before a convolution and another training-mode batch
    norm, which removes any per-channel shift) has a float64 reference of about 1e-17, and both float32 engines give
    pure rounding noise: PyTorch float32's own relative error is 1 or more (1e8-4e9 in shufflenet_v2_x1_0 and
    mobilenet_v2 at batch 64 on the H200, `h200-zoo-modern`), and clnet's was up to 3.1 times PyTorch's there. Such a
    quantity is judged by ZERO_NOISE_FACTOR times PyTorch's noise: a wrong value instead of noise would be off by
    many orders of magnitude more."""
    def allowed(v):
        return (ZERO_NOISE_FACTOR if v["torch_vs_fp64"] >= 1.0 else NOISE_FACTOR) * v["torch_vs_fp64"]
    return {k: v for k, v in agreement.items() if v["clnet_vs_fp64"] > tolerance and v["clnet_vs_fp64"] > allowed(v)}


def run_torch(tm, tdev, x, labels, iterations, warmup, forward_only, progress=True):
    """Same protocol in PyTorch: CUDA events on a GPU, wall clock with synchronisation on the CPU. Per-module times
    come from forward and full backward hooks on the leaf modules (keyed by the paths clnet's rows use, summed over
    the calls of a module in one iteration), installed only for the extra per-module iterations. Containers get no
    time: their own ops (an add, a concatenation) run outside any PyTorch module. On a GPU, `memory` holds the peak
    of the eager iterations from PyTorch's allocator (tensors; and what the caching allocator held, the figure like
    clnet's pool) and what it held with the captured graph; None on the CPU."""
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
    if cuda:  # the eager step's own peak, as clnet's: what earlier work left cached is given back first
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    with click.progressbar(range(warmup), label=f"PyTorch warm-up ({tdev})", file=sys.stderr,
                           hidden=not progress) as bar:
        for _ in bar:
            iteration(False)
    samples, per_module = [], []
    with click.progressbar(range(iterations), label="PyTorch timed", file=sys.stderr, hidden=not progress) as bar:
        for _ in bar:
            samples.append(iteration(False)[0])
    memory = None
    if cuda:
        memory = dict(eager_peak_bytes=torch.cuda.max_memory_allocated(),
                      eager_peak_reserved_bytes=torch.cuda.max_memory_reserved(),
                      measure="torch.cuda.max_memory_allocated (tensors in use); max_memory_reserved (held by the "
                              "caching allocator, in use and cached: the measure like clnet's pool)")
    hooks = install()
    try:
        for _ in range(min(iterations, 5)):
            per_module.append(iteration(True)[1])
    finally:
        for h in hooks:
            h.remove()
    keys = {k for p in per_module for k in p}
    layer_ms = {k: statistics.median(p[k] for p in per_module if k in p) for k in keys}
    result = dict(phases=median_phases(samples, phases), layer_ms=layer_ms, memory=memory)
    if cuda:
        torch.cuda.reset_peak_memory_stats()  # from what is held now: the per-module iterations' peak left out
        try:
            result["graph_ms"] = torch_graph_ms(tm, opt, xt, yt, iterations, forward_only)
        except Exception as e:  # the eager comparison stands on its own; say why the graph's is missing
            result["graph_error"] = f"{type(e).__name__}: {e}"
        memory["with_graph_reserved_bytes"] = torch.cuda.max_memory_reserved()  # its graph's private pool too
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
