"""clnet's side of `clnet bench`: the model's modules and their FLOPs, the timed training iterations (eager and
replayed), the per-module kernel times from profiling events, and the device memory the step holds.

Per-module times come from OpenCL profiling events of extra profiled iterations, the only ones with module hooks
installed: forward hooks on every module (containers too) tag each launch with the path of the innermost module
running (its name in `named_modules()`: `layer3.0.conv2`, `inception4a.b2.1`, `0` in a Sequential), and autograd
tags each op's backward with the path its forward ran under. So a container's own ops (an Inception module's
concatenation, a residual block's add) land in the container's row. FLOPs are counted from the shapes the hooks saw.
"""
import functools
import math
import statistics
import sys
import time

import click

from .. import autograd, kernels, nn, optim, tuning
from ..graph import Graph
from ..ops import zeros
from ..tensor import Tensor, pool, reset_transfer_stats, tensor, transfer_stats
from ..tune import buffers_kept

LOSS, UPDATE, OTHER = "(loss)", "(update)", "(other)"  # tags of launches outside the model (no path has parentheses)


def module_flops(module, in_shape, key_shape=None):
    """Forward multiply-adds x 2 of one call of a convolution, dense layer or attention on an input of in_shape (an
    attention's query; key_shape its key's, the query's when None); 0 for every other module. An attention counts its
    packed q, k, v projection and both products with the keys (q k^T, then the weights times v); its out_proj is a
    Linear of its own, counted there."""
    if isinstance(module, nn.Conv2d):
        return module.conv_shape(in_shape).flops
    if isinstance(module, nn.Linear):
        return 2 * math.prod(in_shape[:-1]) * module.in_features * module.out_features
    if isinstance(module, nn.MultiheadAttention):
        key_shape = in_shape if key_shape is None else key_shape
        queries, keys, e = math.prod(in_shape[:-1]), math.prod(key_shape[:-1]), module.embed_dim
        per_sample = key_shape[1] if module.batch_first else key_shape[0]  # S: the keys each query attends to
        return 2 * e * e * (queries + 2 * keys) + 2 * 2 * queries * per_sample * e
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
        key = args[1] if len(args) > 1 and isinstance(args[1], Tensor) else None  # an attention's keys
        row = self.modules.get(path)
        if row is None:
            leaf = next(module.children(), None) is None
            row = self.modules[path] = dict(path=path, module=type(module).__name__, leaf=leaf,
                                            repr=repr(module) if leaf else f"{type(module).__name__}(...)",
                                            input=list(shape) if shape is not None else None, output=None, calls=0,
                                            forward_flop=0, backward_flop=0)
        row["calls"] += 1
        flop = module_flops(module, shape, key.shape if key is not None else None) if shape is not None else 0
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


def median_phases(samples, phases):
    return {p: statistics.median(s[p] for s in samples) for p in phases}


def run_clnet(model, dev, x, labels, iterations, warmup, forward_only, progress=True, started=None):
    """Warm-up, timed eager iterations, timed replays of the captured iteration, then a few profiled iterations.

    started: perf_counter() when the command began, for the time to the first finished iteration.

    Memory: every device buffer clnet holds comes from its buffer pool, which keeps a released buffer for reuse
    and gives memory back to the device only when an allocation fails. So the pool's bytes after an iteration
    (buffers in use and cached) are the high-water mark of the iteration: `memory["eager_peak_bytes"]` is their
    largest value over the eager iterations, counted after the buffers cached by earlier work (the shape pass,
    tuning) are released, and `memory["with_graph_bytes"]` what the pool holds once the iteration is captured
    and replayed (the graph keeps its buffers). NVIDIA's OpenCL reports no memory use of its own to compare with.
    """
    runner = ClnetRunner(model, dev, x, labels)
    phases = ["forward"] if forward_only else ["forward", "backward", "update"]
    held = pool(dev)
    held.release_cached()
    peak = held.allocated_bytes
    t_warmup = time.perf_counter()
    first_step_s = None
    with click.progressbar(range(warmup), label=f"clnet warm-up ({dev.name})", file=sys.stderr,
                           hidden=not progress) as bar:
        for _ in bar:
            runner.iteration(forward_only)
            peak = max(peak, held.allocated_bytes)
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
            peak = max(peak, held.allocated_bytes)
            if first_step_s is None:  # no warm-up
                first_step_s = time.perf_counter() - (started or t_warmup)
    launches = (kernels.launch_count - launches) / iterations
    transfers = {k: v / iterations for k, v in transfer_stats().items()}
    graph_ms, graph_launches = time_replays(runner, iterations, forward_only)
    memory = dict(eager_peak_bytes=peak, with_graph_bytes=held.allocated_bytes,
                  measure="clnet's buffer pool: buffers in use and cached for reuse")
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
    return dict(phases=median_phases(samples, phases), layer_ms=layer_ms, launches_per_iteration=launches,
                graph_ms=graph_ms, graph_launches=graph_launches, transfers_per_iteration=transfers,
                warmup_s=warmup_s, first_step_s=first_step_s, memory=memory,
                choices={tag: sorted(set(c.values())) for tag, c in choices.items() if tag}, kernel_ms=per_kernel)
