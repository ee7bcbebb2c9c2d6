import contextlib
import math
import os
import tempfile

import numpy as np
import pytest

# Tests see the device-class defaults, never a tuning cache the user's `clnet tune` left behind.
os.environ["CLNET_CACHE_DIR"] = tempfile.mkdtemp(prefix="clnet-test-cache-")

import clnet  # noqa: E402

# Oclgrind (a simulator, far too slow for the whole suite) runs only tests/test_oclgrind.py's kernels.
# CLNET_TEST_DEVICES ("pocl", "intel,nvidia"): only the devices whose name, platform or version holds one of the words.
_only = [w.strip().lower() for w in os.environ.get("CLNET_TEST_DEVICES", "").split(",") if w.strip()]
# A device whose compiler cannot build a kernel (PoCL 3.0 from PyPI on a CPU its LLVM 14 does not know) is left out:
# clnet itself never picks one (clnet.devices.build_problem), and CI installs a PoCL that builds there.
DEVICES = [d for d in clnet.list_devices() if not d["simulator"] and d["usable"]
           and (not _only or any(w in f"{d['name']} {d['platform']} {d['version']}".lower() for w in _only))]
# Two builds of one runtime on one CPU (PoCL's wheel and Debian's PoCL, 3.0 and 3.1, both build on Intel machines) run
# the same compiler on the same cores: the suite runs on the first of them only, so every CI machine runs the same
# tests (the second PoCL ran 2,185 device tests more, to 7,494 in all). Naming devices in CLNET_TEST_DEVICES runs each
# one named.
if not _only:
    DEVICES = [d for i, d in enumerate(DEVICES)
               if not any(e["platform"] == d["platform"] and e["type"] == d["type"] for e in DEVICES[:i])]


# The other class's kernels (GPU-shaped ones on a CPU, forced by kernel_shape and gemm_variant) run on the first
# device of each class only: no device of that class picks them, and a second CPU runtime building them again checked
# the same source with another compiler (Intel's runtime: 114 builds, 150 s of a cold run for the GEMM tiles alone).
# PoCL still runs every one, and Oclgrind (tests/test_oclgrind.py) each kernel family.
_FIRST_OF_CLASS = {}
for _d in DEVICES:
    _FIRST_OF_CLASS.setdefault("GPU" in _d["type"], _d["index"])


def skip_other_class_unless_first(dev, what):
    """Skip the test of the other class's kernels (`what`) on dev unless dev is the first device of its class."""
    first = _FIRST_OF_CLASS.get(dev.is_gpu)
    if first is not None and dev.index != first:
        pytest.skip(f"{what}: the other device class's kernels are checked on device {first}, the first of its class")


@pytest.fixture(params=[d["index"] for d in DEVICES], ids=[f"{d['index']}-{d['name'][:24]}" for d in DEVICES])
def dev(request):
    """Every test that takes `dev` runs on every OpenCL device present (PoCL in CI)."""
    return clnet.device(request.param)


@pytest.fixture(autouse=True)
def accuracy_first(monkeypatch):
    """Each test starts with the tuner's accuracy rule in force and no memoised choice; a test (or a command it runs)
    that allows less accurate algorithms does so for itself alone."""
    from clnet import tuning
    monkeypatch.setattr(tuning, "allow_less_accurate", False)
    tuning.forget_choices()  # none memoised under another test's patches (cpu_shaped, conv_default)
    yield
    tuning.forget_choices()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A tuning cache of the test's own, empty at the start, and no shipped table (on a device the table knows, the
    cache would not start empty)."""
    from clnet import tuning
    monkeypatch.setenv("CLNET_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuning, "SHIPPED_TABLE", str(tmp_path / "no-shipped-table.json"))
    tuning.forget()
    yield tmp_path
    tuning.forget()


@pytest.fixture(params=["own-shape", "other-shape"])
def kernel_shape(request, monkeypatch, dev):
    """Data-movement kernels (lowering, pooling, bias gradient) run with the device's own kernel shape and with the
    other class's (on the first device of the class), so the GPU-shaped kernels are checked on a CPU too (CI has no
    GPU)."""
    if request.param == "other-shape":
        skip_other_class_unless_first(dev, "other-shape")
        from clnet import tuning
        default = tuning.cpu_shaped
        monkeypatch.setattr(tuning, "cpu_shaped", lambda dev: not default(dev))
    return request.param


@pytest.fixture
def rng():
    """Fresh random data per test (the seed is printed on failure; CLNET_TEST_SEED=that seed replays it)."""
    seed = int(os.environ.get("CLNET_TEST_SEED") or np.random.SeedSequence().entropy % 2**32)
    print(f"random seed {seed}")
    return np.random.default_rng(seed)


def assert_close(actual, expected, name, tol=2e-5):
    """Compare a clnet float32 result with a float64 reference: normwise relative error and the worst element."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape}, expected {expected.shape}"
    assert np.all(np.isfinite(actual)), f"{name}: non-finite values in the result"
    scale = max(np.abs(expected).max(initial=0.0), 1e-30)
    worst = np.abs(actual - expected).max(initial=0.0) / scale
    norm = np.linalg.norm(actual - expected) / max(np.linalg.norm(expected), 1e-30)
    assert worst < 20 * tol and norm < tol, \
        f"{name}: relative error {norm:.2e} (worst element {worst:.2e} of the largest magnitude), tolerance {tol:.0e}"


def close_to_largest(got, want, name, tol=2e-5):
    """Every element of got within tol of the largest magnitude in want (a float64 reference, torch's here)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{name}: shape {got.shape}, torch {want.shape}"
    scale = max(np.abs(want).max(initial=0.0), 1e-30)
    assert np.abs(got - want).max(initial=0.0) <= tol * scale, \
        f"{name}: largest error {np.abs(got - want).max() / scale:.2e} of the largest magnitude"


def assert_close_to_terms(actual, expected, terms, name, tol):
    """Compare each element's error with the size of the terms it sums (|a| |b| summed as the result sums a b): the
    scale of float32's error bound. For results of a few elements, which can cancel to far below their terms."""
    actual = np.asarray(actual, dtype=np.float64)
    assert actual.shape == np.shape(expected), f"{name}: shape {actual.shape}, expected {np.shape(expected)}"
    assert np.all(np.isfinite(actual)), f"{name}: non-finite values in the result"
    worst = np.max(np.abs(actual - expected) / np.maximum(terms, 1e-30), initial=0.0)
    assert worst < tol, f"{name}: error {worst:.2e} of the terms' size, tolerance {tol:.0e}"


def perturbed(twin, gen):
    """twin (float64) with each leaf module's output multiplied by 1 + 2^-24 * a standard normal draw: float32's
    rounding of every stored result, and nothing else, as an engine-independent witness of what it does to each
    quantity."""
    import torch

    def hook(module, args, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            return out * (1 + 2.0 ** -24 * torch.randn(out.shape, generator=gen, dtype=out.dtype))
    for m in twin.modules():
        if next(m.children(), None) is None:
            m.register_forward_hook(hook)
    return twin


ROUNDING_RUNS = 2  # perturbed float64 runs beside the float32 twin's among float32_witnesses


def float32_witnesses(twin, runs=ROUNDING_RUNS, seed=0):
    """Engine-independent samples of float32's own error for a float64 PyTorch twin: the twin in float32, and `runs`
    float64 copies with float32-sized rounding at every leaf (perturbed). One sample can be small by luck where a
    quantity largely cancels; the largest (float32_error) is not. Copies: make them before any hook is on twin."""
    import copy
    import torch
    gen = torch.Generator().manual_seed(seed)
    return [copy.deepcopy(twin).float()] + [perturbed(copy.deepcopy(twin), gen) for _ in range(runs)]


def float32_error(witnessed, want, key):
    """The largest normwise relative distance from want (float64's) of the witnesses' results at key."""
    return max(np.linalg.norm(r[key] - want) for r in witnessed) / max(np.linalg.norm(want), 1e-30)


KINKS = ("ReLU", "ReLU6", "MaxPool2d")  # the modules whose gradient jumps: clnet's decisions there are the twins' too
KINK_TOL = 1e-4  # a decision may differ from float64's only within this much of the layer's largest input


class Decisions:
    """clnet's decisions at every call of one forward's modules of `kinds` (ReLU and ReLU6: on or off; MaxPool2d: which
    input each window takes), imposed on a PyTorch twin's.

    A ReLU input within rounding of zero can go either way in float32, and so can a pooling window whose two largest
    inputs lie within rounding of each other; where clnet's goes otherwise than float64's every gradient below it
    moves (shufflenet_v2_x1_0 at 224x224, batch 2: one of conv5's 100352 ReLU inputs, 3e-5 from zero, moved every
    gradient of the network by 5e-3; PyTorch's own float32 flips others, as often; test_zoo's inception net on seed
    3744140389: a 3x3 window's two largest inputs, 1.3e-7 apart, moved the input gradient by 2.4e-2). So the twins
    take clnet's decisions: a ReLU gives x where clnet's input was on, 0 (or 6) where off; a max pooling gives x at
    the input clnet took, the first maximum of clnet's own input (as clnet's kernels and PyTorch pick). Each decision
    that differs from the float64 twin's own must lie within KINK_TOL of a kink, relative to the largest input of that
    call (a ReLU input's distance from 0 or 6; the window's maximum less the input taken): a ReLU that switched a
    clearly positive or negative input, or a pooling that took a clearly smaller one, still fails. What remains is
    every op's own arithmetic. A hook keeps nn.Sequential from fusing its module with a neighbour (a ReLU into a
    Conv2d, Linear or MaxPool2d): `kinds` leaves out those whose fused kernels a test means to check."""

    def __init__(self, model, kinds=KINKS):
        self.kinds, self.seen = kinds, {}
        for name, m in model.named_modules():
            if type(m).__name__ in kinds:
                m.register_forward_pre_hook(lambda m_, args, name=name: self.seen.setdefault(name, []).append(
                    args[0].numpy()))

    def impose(self, twin, check):
        """Forward hooks on twin's modules of self.kinds that replace their outputs by clnet's decisions applied to
        the twin's own inputs, in call order; check: also assert each differing decision lies at a kink."""
        calls = {}
        for name, m in twin.named_modules():
            kind = type(m).__name__
            if kind in self.kinds:
                decide = self._argmax if kind == "MaxPool2d" else self._on_off
                m.register_forward_hook(lambda m_, args, out, name=name, decide=decide: decide(
                    name, m_, next(calls.setdefault(name, iter(self.seen[name]))), args[0], out, check))

    @staticmethod
    def _on_off(name, module, ours, x, out, check):
        import torch
        kind = type(module).__name__
        ours = torch.from_numpy(ours).to(x.dtype)
        top = 6.0 if kind == "ReLU6" else math.inf
        on, high = (ours > 0) & (ours < top), ours >= top
        if check:
            v = x.detach()
            own_on, own_high = (v > 0) & (v < top), v >= top
            differ = (on != own_on) | (high != own_high)
            gap = torch.minimum(v.abs(), (v - top).abs())[differ]
            limit = KINK_TOL * float(v.abs().max())
            assert gap.numel() == 0 or float(gap.max()) <= limit, \
                f"{name} ({kind}): {gap.numel()} on/off decisions differ from float64's, up to " \
                f"{float(gap.max()):.2e} from a kink (allowed: rounding, {limit:.2e})"
        return torch.where(on, x, torch.where(high, torch.full_like(x, 6.0), torch.zeros_like(x)))

    @staticmethod
    def _argmax(name, pool, ours, x, out, check):
        import torch
        _, at = torch.nn.functional.max_pool2d(torch.from_numpy(ours), pool.kernel_size, pool.stride, pool.padding,
                                               pool.dilation, pool.ceil_mode, return_indices=True)
        taken = x.flatten(-2).gather(-1, at.flatten(-2)).view_as(out)  # the gradient goes to clnet's argmax alone
        if check:
            gap = (out - taken).detach()  # the window's float64 maximum less the input clnet took: 0 where they agree
            limit = KINK_TOL * float(x.detach().abs().max())
            assert float(gap.max()) <= limit, \
                f"{name} (MaxPool2d): {int((gap > 0).sum())} argmax decisions differ from float64's, up to " \
                f"{float(gap.max()):.2e} below the window's maximum (allowed: rounding, {limit:.2e})"
        return taken


try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError as e:
    import importlib.metadata
    try:  # installed (the test extra brings it) but broken: an error, not 70 comparisons skipped
        importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        HAVE_TORCH = False
    else:
        raise ImportError(f"PyTorch is installed but does not import ({e}); reinstall it: pip install "
                          "--force-reinstall torch") from e

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed; the NumPy reference still runs")


def eager_or_replayed(step, replayed):
    """A call that runs step() eagerly, or (replayed) captures it in a clnet.Graph at its first call and replays the
    graph at every later one."""
    graph = None

    def run():
        nonlocal graph
        if not replayed:
            step()
        elif graph is None:
            graph = clnet.Graph()
            with graph.capture():
                step()
        else:
            graph.replay()
    return run


@contextlib.contextmanager
def launched():
    """The names of the kernels launched inside the block, in order (a list filled as they launch)."""
    from clnet import kernels
    names, saved = [], kernels.launch

    def spy(dev, k, *args, **kwargs):
        names.append(k.name)
        return saved(dev, k, *args, **kwargs)
    kernels.launch = spy
    try:
        yield names
    finally:
        kernels.launch = saved


@contextlib.contextmanager
def no_launch():
    """Fails the test if any kernel is launched inside the block (bad input must be refused before device work)."""
    from clnet import kernels

    def forbidden(*args, **kwargs):
        raise AssertionError(f"a kernel was launched for bad input: {kwargs.get('what') or args[1].name}")
    saved = kernels.launch
    kernels.launch = forbidden
    try:
        yield
    finally:
        kernels.launch = saved


@contextlib.contextmanager
def recorded_launches():
    """Yields a list that receives the `what` (else the kernel name) of every launch inside the block; the kernels
    still run."""
    from clnet import kernels
    names, saved = [], kernels.launch

    def record(dev, k, *args, what=""):
        names.append(what or k.name)
        return saved(dev, k, *args, what=what)
    kernels.launch = record
    try:
        yield names
    finally:
        kernels.launch = saved


def pytest_terminal_summary(terminalreporter):
    """What each OpenCL implementation ran: tests passed, failed and skipped per device (CI runs several)."""
    counts = {}
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", "call") not in ("call", "setup") or \
                    (outcome == "passed" and report.when != "call"):
                continue
            param = report.nodeid.rsplit("[", 1)[-1] if "[" in report.nodeid else ""
            index = param.split("-", 1)[0]
            name = next((f"{d['name']} ({d['platform']})" for d in DEVICES if str(d["index"]) == index), None)
            counts.setdefault(name or "no device parameter", {}).setdefault(outcome, 0)
            counts[name or "no device parameter"][outcome] += 1
    terminalreporter.section("tests per OpenCL device")
    for name, c in counts.items():
        terminalreporter.write_line(f"{name}: " + ", ".join(f"{v} {k}" for k, v in c.items()))


def give_gradients(params):
    """Where a parameter has no .grad, a backward that reaches every one, so each has a .grad (zeros) in its
    optimizer's flat buffer: what a test that writes gradients itself writes into (after zero_grad(set_to_none=False),
    which keeps a .grad that exists and leaves None as None, as PyTorch's)."""
    params = list(params)
    if any(p.grad is None for p in params):
        sum((p * 0.0).sum() for p in params).backward()
