"""The autotuner: times every choice the ops of one training iteration can make, on the device in hand, and stores
the fastest in the persistent cache (tuning.py) keyed by platform, device, driver and shape.

The first candidate of every site is the device class's default. A choice is timed by its kernels' profiling events
(device time, summed over the launches it makes), as the median of a few runs after one untimed run that builds the
kernels; a candidate that cannot run on this device (a build failure, too many registers) is dropped. Buffers are the
ones the recorded iteration used, so the timing sees real layouts and real sizes. The recorded sites keep those
buffers alive until tuning ends: tuning needs more device memory than a training step. The model's weights and
buffers are left as they were; its gradients are left undefined (call zero_grad before training, as every step
does).
"""
import contextlib
import time

import numpy as np

from . import kernels, models, rng, tuning
from .tensor import tensor


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


def tune_sites(dev, sites, budget_s=300.0, repeats=3, retune=False, progress=None, t0=None):
    """Times every candidate of every site (products before the algorithms that contain them) and stores winners."""
    t0 = time.perf_counter() if t0 is None else t0
    known = tuning.entries(dev)
    order = sorted(sites, key=lambda k: not k.startswith("gemm"))
    todo = [k for k in order if retune or k not in known]
    report = dict(device=tuning.device_key(dev), sites=len(sites), cached=len(sites) - len(todo), tuned={},
                  left=[])
    for i, key in enumerate(todo):
        if time.perf_counter() - t0 > budget_s:
            report["left"] = todo[i:]
            break
        candidates, run = sites[key]
        runnable = []
        for j, choice in enumerate(candidates):  # build every candidate first, so that timing never includes a build
            try:
                run(choice)
                dev.synchronize()
                runnable.append(j)
            except (kernels.KernelError, MemoryError) as e:
                if j == 0:
                    raise  # the default itself fails: that is an error the user must see
                if progress:
                    progress(f"    {tuning.describe(choice)} cannot run here, skipped ({str(e).splitlines()[0]})")
        timed = [(kernels.device_ms(dev, lambda: run(candidates[j]), repeats), j) for j in runnable]
        best_ms, best = min(timed)  # ties go to the earlier candidate, the default first
        tuning.store(dev, {key: candidates[best]})
        report["tuned"][key] = dict(choice=tuning.describe(candidates[best]), ms=best_ms, default_ms=timed[0][0])
        if progress:
            progress(f"[{i + 1}/{len(todo)}] {key}: {tuning.describe(candidates[best])} {best_ms:.3f} ms "
                     f"(default {tuning.describe(candidates[0])} {timed[0][0]:.3f} ms)")
    report["seconds"] = time.perf_counter() - t0
    return report


def tune_first(model, input_shape, dev, flag, budget_s, echo, progress=None):
    """What `clnet bench` and `clnet train` do before they start: tune the shapes missing from the cache when flag
    says so (None: on GPUs, where it takes seconds), and say what it did through echo. Out of device memory (tuning
    holds a whole iteration's buffers) the run keeps the defaults. Returns the report, or None."""
    if not (flag or (flag is None and dev.is_gpu)):
        return None
    try:
        report = tune_module(model, input_shape, dev, budget_s=budget_s, progress=progress)
    except MemoryError:
        echo("tuning: skipped, out of device memory (default kernel choices used; `clnet tune` with a smaller "
             "--batch may fit)")
        return None
    echo(f"tuning: {len(report['tuned'])} shapes tuned, {report['cached']} cached, {len(report['left'])} left at "
         f"defaults, {report['seconds']:.1f} s (cache {tuning.cache_path()})")
    return report


def autotune(model, input_shape, device=None, budget_s=300.0, progress=None):
    """Public entry (`clnet.autotune`): tunes a training iteration of `model` on inputs of `input_shape` (batch
    included) on `device` (default: the model's), storing the winners in the cache that every later run reads.

    The model's weights are untouched; its gradients and saved activations are left undefined (zero_grad before the
    next step, as every training step does). Tuning holds one iteration's buffers at once: it needs more device
    memory than a step. Returns the report of `tune_module` (shapes tuned, cached, left; seconds; each winner and its
    default's time).
    """
    from .devices import device as _device
    dev = _device(device if device is not None else (model.device or "auto"))
    return tune_module(model, tuple(input_shape), dev, budget_s=budget_s, progress=progress)


def tune_model(name, dev, batch=None, **kwargs):
    """Tunes a zoo model (models.MODELS) at its paper batch size, or `batch`."""
    entry = models.MODELS[name]
    rng.manual_seed(0)
    net = models.build(name)
    return tune_module(net, ((batch or entry["batch"]),) + tuple(entry["input_shape"]), dev, **kwargs)
