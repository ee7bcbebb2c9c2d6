"""The autotuner: times every choice the ops of one training iteration can make, on the device in hand, and stores
the fastest in the persistent cache (tuning.py) keyed by platform, device, driver and shape.

The first candidate of every site is the device class's default. A choice is timed by its kernels' profiling events
(device time, summed over the launches it makes), as the median of a few runs after one untimed run that builds the
kernels, plus the host's cost of each of its launches (tuning.LAUNCH_COST_MS: small layers are bound by launches).
A candidate that cannot run on this device (a build failure, too many registers) is dropped, and so is one whose
output disagrees with the default's (checked before timing, as CLTune does: a kernel that a driver miscompiles must
not become the choice there). Buffers are the ones the recorded iteration used, so the timing sees real layouts
and real sizes. The recorded sites keep those buffers alive until tuning ends: tuning needs more device memory than a
training step. The model's weights and buffers are left as they were; its gradients are left undefined (call
zero_grad before training, as every step does).
"""
import contextlib
import hashlib
import math
import time

import numpy as np

from . import kernels, models, rng, tuning
from .devices import device as _device
from .tensor import Tensor, tensor


@contextlib.contextmanager
def buffers_kept(model):
    """Runs the body, then puts every buffer of the model (batch norm's running statistics and counter) back as it
    was: a training-mode forward that only measures (tuning, the benchmark's shape pass) leaves no trace."""
    saved = [(b, b.numpy()) for b in model.buffers()]
    try:
        yield
    finally:
        for b, host in saved:
            b.write(host)


def _record(model, dev, x_host, retune):
    """Runs one iteration (forward, then backward from a random output gradient) with the recorder on: every op's
    key, candidates and runner. The model's buffers are put back afterwards."""
    known = tuning.entries(dev)

    def iteration():
        out = model(tensor(x_host, dev))  # the input wants no gradient, as in a training step
        dy = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
        out.backward(tensor(dy, dev))
        # Algorithms with products inside (Winograd's batched GEMM): run each candidate once while recording, so
        # that their products are tuned as well (not for algorithms already tuned).
        for key, (candidates, run) in list(tuning.recorder.sites.items()):
            if not key.startswith("gemm") and (retune or key not in known):
                for choice in candidates:
                    run(choice)
        dev.synchronize()

    with buffers_kept(model):
        return record(iteration)


def tune_module(model, input_shape, dev, budget_s=300.0, repeats=3, retune=False, progress=None):
    """Tunes every op of a training iteration of `model` on inputs of `input_shape` (batch included).

    Products are tuned before the algorithms that contain them. Keys already in the cache are skipped unless
    `retune`. Stops starting new keys once `budget_s` seconds have passed (the rest keep their defaults).
    Returns a report: keys tuned, skipped and left, seconds, and per key the winner and its speed-up over the default.
    """
    t0 = time.perf_counter()
    saved_rng = rng.get_state()  # dropout draws during the timed runs must not shift the caller's random stream
    try:
        return _tune(model, input_shape, dev, budget_s, repeats, retune, progress, t0)
    finally:
        rng.set_state(saved_rng)


def _tune(model, input_shape, dev, budget_s, repeats, retune, progress, t0):
    if repeats < 1:
        raise ValueError(f"tune: repeats must be at least 1, got {repeats}")
    if model.device is not None and model.device is not dev:
        raise ValueError(f"tune: the model is on {model.device.name}, not on {dev.name}; move it with .to(device) "
                         "first (tuning never moves a model)")
    model.to(dev)
    x = np.random.default_rng(0).standard_normal(input_shape).astype(np.float32)
    return tune_sites(dev, _record(model, dev, x, retune), budget_s, repeats, retune, progress, t0)


def record(fn):
    """Runs fn() with the recorder on and returns the sites its ops met (key -> (candidates, runner))."""
    tuning.recorder = rec = tuning.Recorder()
    try:
        fn()
    finally:
        tuning.recorder = None
    return rec.sites


def _outputs(result):
    """The tensors a site's run returned: its output, or a tuple of outputs; () for a run that returns nothing."""
    if isinstance(result, Tensor):
        return (result,)
    return tuple(r for r in result if isinstance(r, Tensor)) if isinstance(result, (tuple, list)) else ()


class _Reference:
    """The default's output for one site, against which every candidate is checked before it is timed.

    A run may write into tensors it was given rather than new ones (a product into C, with beta = 1 adding to it; a
    weight gradient added into .grad, or written over it), so what those held is kept, and put back before each
    candidate runs: every candidate then computes from the same state as the default did."""

    def __init__(self, dev, run, choice):
        self.dev = dev
        first = _outputs(run(choice))  # builds the default's kernels
        dev.synchronize()
        self.before = [t.numpy() for t in first]
        again = _outputs(run(choice))
        self.in_place = [a is b for a, b in zip(first, again)]
        self.before = [host if in_place else None for host, in_place in zip(self.before, self.in_place)]
        self.outputs = [t.numpy() for t in again]
        self.written = first

    def disagreement(self, run, choice):
        """Runs choice from the default's starting state; returns (normwise relative difference from the default's
        output, largest element's difference over the largest output), the worst over its outputs; None when the
        site's run returns no output to check."""
        for t, host, in_place in zip(self.written, self.before, self.in_place):
            if in_place:
                t.write(host)
        got = _outputs(run(choice))
        self.dev.synchronize()
        if not self.outputs:
            return None
        if len(got) != len(self.outputs):
            return (float("inf"), float("inf"))
        worst = (0.0, 0.0)
        for t, want in zip(got, self.outputs):
            worst = max(worst, _difference(t.numpy(), want))
        return worst


def _difference(got, want):
    """(normwise relative difference, largest element difference over the largest magnitude) of two float32 arrays;
    infinite where their shapes differ or where a value is finite in one and not in the other. Differences are taken
    in float32 (two close values subtract exactly) and norms summed in float64 without a float64 copy: a layer's output
    can hold 2e8 values, read back once per candidate."""
    inf = (float("inf"), float("inf"))
    if got.shape != want.shape:
        return inf
    got, want = got.reshape(-1), want.reshape(-1)
    finite = np.isfinite(want)
    if not finite.all() or not np.isfinite(got).all():
        if not np.array_equal(np.isfinite(got), finite) or \
                not np.array_equal(got[~finite], want[~finite], equal_nan=True):
            return inf
        got, want = got[finite], want[finite]
    diff = got - want
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-30)
    return (math.sqrt(_sum_of_squares(diff) / max(_sum_of_squares(want), 1e-60)),
            float(np.abs(diff).max(initial=0.0)) / scale)


def _sum_of_squares(x):
    return float(np.einsum("i,i->", x, x, dtype=np.float64))  # cast and summed in buffered chunks


def _cost_ms(dev, fn, repeats):
    """What a candidate costs a step: its kernels' device time, plus the host's cost of each launch it makes
    (tuning.LAUNCH_COST_MS), which at small sizes is the larger part. The launches are counted during the timed
    runs themselves."""
    before = kernels.launch_count
    ms = kernels.device_ms(dev, fn, repeats)
    return ms + (kernels.launch_count - before) / repeats * tuning.launch_cost_ms(dev)


def _tuning_order(key):
    """A site's place: products (gemm.gemm_key: "gemm MxNxKxbatch ...") by their multiply-adds, largest first, then
    the rest as recorded (sorted is stable)."""
    if not key.startswith("gemm "):
        return (1, 0)
    return (0, -math.prod(int(v) for v in key.split()[1].split("x")))


def tune_sites(dev, sites, budget_s=300.0, repeats=3, retune=False, progress=None, t0=None):
    """Times every candidate of every site (products, the largest first, before the algorithms that contain them)
    and stores winners.

    Before timing, each candidate's output is compared with the default's (tuning.agreement_tolerance: the float32
    rounding of the site's sum length); one that disagrees is skipped, reported under report["rejected"][key] (and
    through progress), and never stored. Keys whose runs return no output to compare are listed under
    report["unchecked"]."""
    t0 = time.perf_counter() if t0 is None else t0
    known = tuning.entries(dev)
    # products first (the algorithms' sites run them with their tuned choices), the largest first: a budget that runs
    # out has tuned the products that cost the step most
    todo = sorted((k for k in sites if retune or k not in known), key=_tuning_order)
    report = dict(device=tuning.device_key(dev), sites=len(sites), cached=len(sites) - len(todo), tuned={},
                  left=[], rejected={}, unchecked=[])
    for i, key in enumerate(todo):
        if time.perf_counter() - t0 > budget_s:
            report["left"] = todo[i:]
            break
        candidates, run = sites[key]
        tolerance = tuning.agreement_tolerance(key)
        runnable, reference, over = [], None, False
        # build every candidate first, so that timing never includes a build; check each against the default's output
        for j, choice in enumerate(candidates):
            if j and time.perf_counter() - t0 > budget_s:  # a build can take seconds: check between candidates too
                over = True
                break
            try:
                if j == 0:
                    reference = _Reference(dev, run, choice)
                    if not reference.outputs:
                        report["unchecked"].append(key)
                else:
                    worst = reference.disagreement(run, choice)
                    if worst is not None and (worst[0] > tolerance or worst[1] > 20 * tolerance):
                        report["rejected"].setdefault(key, []).append(
                            dict(choice=tuning.describe(choice), error=worst[0], worst=worst[1], tolerance=tolerance))
                        if progress:
                            progress(f"    {tuning.describe(choice)} disagrees with the default "
                                     f"{tuning.describe(candidates[0])} (relative difference {worst[0]:.1e}, worst "
                                     f"element {worst[1]:.1e}; tolerance {tolerance:.0e}), skipped")
                        continue
                runnable.append(j)
            except (kernels.KernelError, MemoryError) as e:
                if j == 0:
                    raise  # the default itself fails: that is an error the user must see
                if progress:
                    progress(f"    {tuning.describe(choice)} cannot run here, skipped ({str(e).splitlines()[0]})")
        if over:  # a site left half-built keeps its default, as the sites after it do
            report["left"] = todo[i:]
            break
        timed = [(_cost_ms(dev, lambda: run(candidates[j]), repeats), j) for j in runnable]
        best_ms, best = min(timed)  # ties go to the earlier candidate, the default first
        tuning.store(dev, {key: candidates[best]})
        report["tuned"][key] = dict(choice=tuning.describe(candidates[best]), ms=best_ms, default_ms=timed[0][0])
        if progress:
            progress(f"[{i + 1}/{len(todo)}] {key}: {tuning.describe(candidates[best])} {best_ms:.3f} ms "
                     f"(default {tuning.describe(candidates[0])} {timed[0][0]:.3f} ms)")
    report["seconds"] = time.perf_counter() - t0
    return report


FIRST_RUN_BUDGET_S = 10.0  # tuning before `clnet bench` and `clnet train` start: a first run should not wait a
# minute (a fresh H200 spent 68 s tuning lenet's 21 shapes, builds included); `clnet tune` finishes the job


def tune_first(model, input_shape, dev, flag, echo, progress=None, budget_s=FIRST_RUN_BUDGET_S):
    """What `clnet bench` and `clnet train` do before they start: tune the shapes missing from the cache when flag
    says so (None: on GPUs, where it takes seconds), and say what it did through echo. Out of device memory (tuning
    holds a whole iteration's buffers) the run keeps the defaults. Returns the report, or None."""
    if not (flag or (flag is None and dev.is_gpu)):
        return None
    # A first run spends the budget once per model and shape: later runs start at once, with what it tuned
    spent = tuning.FIRST_RUN_MARK + hashlib.sha1(f"{model!r} {tuple(input_shape)}".encode()).hexdigest()[:16]
    if flag is None and spent in tuning.own_entries(dev):
        echo("tuning: none (an earlier run spent this model's first-run budget; `clnet tune` tunes the shapes it "
             "left at defaults)")
        return None
    try:
        report = tune_module(model, input_shape, dev, budget_s=budget_s, progress=progress)
    except MemoryError:
        echo("tuning: skipped, out of device memory (default kernel choices used; `clnet tune` with a smaller "
             "--batch may fit)")
        return None
    if report["left"]:
        tuning.store(dev, {spent: True})
    rejected = sum(len(v) for v in report["rejected"].values())
    echo(f"tuning: {len(report['tuned'])} shapes tuned, {report['cached']} cached, {len(report['left'])} left at "
         f"defaults, {report['seconds']:.1f} s (cache {tuning.cache_path()})"
         + (f"; the {budget_s:.0f} s budget ran out: `clnet tune` tunes the rest" if report["left"] else "")
         + (f"; {rejected} kernel choices skipped: their results disagreed with the default's" if rejected else ""))
    return report


def autotune(model, input_shape, device=None, budget_s=300.0, progress=None):
    """Public entry (`clnet.autotune`): tunes a training iteration of `model` on inputs of `input_shape` (batch
    included) on `device` (default: the model's), storing the winners in the cache that every later run reads.

    The model's weights are untouched; its gradients and saved activations are left undefined (zero_grad before the
    next step, as every training step does). Tuning holds one iteration's buffers at once: it needs more device
    memory than a step. Returns the report of `tune_module` (shapes tuned, cached, left; seconds; each winner and its
    default's time).
    """
    dev = _device(device if device is not None else (model.device or "auto"))
    return tune_module(model, tuple(input_shape), dev, budget_s=budget_s, progress=progress)


def tune_model(name, dev, batch=None, **kwargs):
    """Tunes a zoo model (models.MODELS) at its paper batch size, or `batch`."""
    entry = models.MODELS[name]
    rng.manual_seed(0)
    net = models.build(name)
    return tune_module(net, ((batch or entry["batch"]),) + tuple(entry["input_shape"]), dev, **kwargs)
