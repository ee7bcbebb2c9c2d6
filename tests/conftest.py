import contextlib
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
