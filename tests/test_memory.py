"""Device out-of-memory, wherever it surfaces: a tensor past the device's largest allocation is refused before any
launch; a launch that fails to allocate (drivers allocate lazily, at the first launch that touches a buffer) frees
the pool's cached buffers and retries once, then raises clnet.OutOfMemory naming the op and the device's memory; the
process, the device and the model stay usable. The launch failure is injected (PoCL does not enforce a limit on the
sum of its buffers)."""
import numpy as np
import pyopencl as cl
import pytest
from pyopencl import _cl

import clnet
from clnet import kernels, nn, ops
from clnet.tensor import pool

from conftest import assert_close, no_launch


def allocation_failure():
    return cl.MemoryError(_cl._ErrorRecord("injected", cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE,
                                           "clEnqueueNDRangeKernel"))


@pytest.fixture(autouse=True)
def through_pyopencl(monkeypatch):
    """These tests inject failures into pyopencl's enqueue, which eager launches then take (they go without events,
    through ctypes, otherwise: test_a_refused_event_free_launch_is_made_again_through_pyopencl covers that path)."""
    monkeypatch.setattr(kernels, "event_free_launches", False)


class FailingEnqueue:
    """Replaces pyopencl's enqueue in kernels.py: fails the first `failures` calls, then enqueues."""

    def __init__(self, failures):
        self.failures, self.calls = failures, 0
        self.real = cl.enqueue_nd_range_kernel

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls <= self.failures:
            raise allocation_failure()
        return self.real(*args, **kwargs)


def small_model(dev):
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5 * 5, 3)).to(dev)


def test_a_tensor_past_the_largest_allocation_is_refused_before_any_launch(dev, monkeypatch):
    monkeypatch.setattr(pool(dev), "max_alloc", 2**20)  # the real limits (PoCL 2 GiB, Intel 12 GiB) need RAM we lack
    pool(dev).release_cached()  # a buffer cached by earlier tests was allocatable then; this size must be new here
    n = 2**18 + 1024
    with no_launch(), pytest.raises(clnet.OutOfMemory, match=rf"allocates at once .* shape \({n},\)"):
        ops.empty((n,), dev)
    assert isinstance(clnet.OutOfMemory("x"), MemoryError)


def test_a_failed_launch_frees_the_cache_and_retries_once(dev, rng, monkeypatch):
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    model = small_model(dev)
    expected = model(clnet.tensor(x, dev)).numpy()
    junk = [ops.zeros((1000 + i,), dev) for i in range(4)]
    del junk  # the pool now caches free buffers
    assert any(pool(dev).free.values())
    failing = FailingEnqueue(failures=1)
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", failing)
    out = model(clnet.tensor(x, dev)).numpy()
    assert failing.calls >= 2
    assert_close(out, expected, "output after a retried launch", tol=1e-6)


def test_persistent_failure_raises_out_of_memory_and_leaves_the_model_usable(dev, rng, monkeypatch):
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    model = small_model(dev)
    expected = model(clnet.tensor(x, dev)).numpy()
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", FailingEnqueue(failures=10**9))
    with pytest.raises(clnet.OutOfMemory) as info:
        model(clnet.tensor(x, dev))
    message = str(info.value)
    assert dev.name in message and "MiB" in message and "smaller batch" in message
    assert "in Conv2d(3, 4, kernel_size=(3, 3)" in message, message  # the layer, whichever algorithm it runs
    monkeypatch.undo()
    assert_close(model(clnet.tensor(x, dev)).numpy(), expected, "output after the failure", tol=1e-6)
    loss = nn.CrossEntropyLoss()(model(clnet.tensor(x, dev)), clnet.tensor(np.array([0, 2], np.int32), dev))
    loss.backward()
    assert np.all(np.isfinite(model[0].weight.grad.numpy()))


def test_a_refused_event_free_launch_is_made_again_through_pyopencl(dev, rng, monkeypatch):
    """An eager launch goes without an event, through ctypes; a status it returns has the launch made again through
    pyopencl, whose failure is handled as every launch's: an allocation failure frees the pool's cache and retries."""
    if kernels._enqueue_raw is None:
        pytest.skip("no event-free entry point here")
    monkeypatch.setattr(kernels, "event_free_launches", True)
    refused = []

    def raw(*args):
        refused.append(args[1])
        return cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE

    a = rng.standard_normal(37).astype(np.float32)
    x = clnet.tensor(a, dev)
    junk = [ops.zeros((1000 + i,), dev) for i in range(4)]
    del junk
    held = pool(dev).allocated_bytes
    failing = FailingEnqueue(failures=1)
    monkeypatch.setattr(kernels, "_enqueue_raw", raw)
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", failing)
    y = x * 3.0
    monkeypatch.undo()
    assert len(refused) == 2 and failing.calls == 2  # raw refused, pyopencl failed; again: raw refused, pyopencl ran
    assert pool(dev).allocated_bytes < held, "the pool's cached buffers were not released before the retry"
    np.testing.assert_array_equal(y.numpy(), a * np.float32(3))


def test_kernel_failures_name_the_op(dev, monkeypatch):
    def invalid(*args, **kwargs):
        raise cl.LogicError(_cl._ErrorRecord("injected", cl.status_code.INVALID_WORK_GROUP_SIZE,
                                             "clEnqueueNDRangeKernel"))
    t = ops.zeros((5,), dev)
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", invalid)
    with pytest.raises(kernels.KernelError, match="fill could not run on"):
        ops.fill(t, 1.0)


def test_a_build_leaves_descriptor_2_to_other_threads(dev, capfd, monkeypatch):
    """A kernel build does not redirect the process's stderr: what another thread writes meanwhile (the MPI abort
    line) reaches the terminal. A failed build's error holds the build log pyopencl returns; with CLNET_VERBOSE /
    --verbose a successful build's log is shown too."""
    import os
    import threading
    logs = []

    def build(self, *args, **kwargs):  # another thread writes while the driver compiles
        t = threading.Thread(target=os.write, args=(2, b"another thread's line\n"))
        t.start()
        t.join()
        if not logs:
            raise cl.RuntimeError(_cl._ErrorRecord("injected build failure: 1 error generated",
                                                   cl.status_code.BUILD_PROGRAM_FAILURE, "clBuildProgram"))
        return self
    monkeypatch.setattr(cl.Program, "build", build)
    with pytest.raises(kernels.KernelError, match="(?s)building elementwise.cl .*injected build failure: 1 error"):
        kernels.program(dev, "elementwise.cl", dict(UNUSED_DEFINE=1))
    assert "another thread's line" in capfd.readouterr().err
    logs.append("1 warning generated.")
    monkeypatch.setattr(kernels, "_build_log", lambda prog, dev: logs[0])
    monkeypatch.setattr(kernels, "verbose", True)
    monkeypatch.setattr(kernels, "_programs", {})  # the programs built here (unbuilt stand-ins) are forgotten after
    kernels.program(dev, "elementwise.cl", dict(UNUSED_DEFINE=2))
    err = capfd.readouterr().err
    assert "another thread's line" in err and "building elementwise.cl" in err and "1 warning generated." in err
    monkeypatch.setattr(kernels, "verbose", False)
    kernels.program(dev, "elementwise.cl", dict(UNUSED_DEFINE=3))
    assert "warning generated" not in capfd.readouterr().err


def test_an_allocation_the_driver_refuses_for_another_reason_is_not_out_of_memory(dev, monkeypatch):
    """The pool's allocation shares the launches' error handling: an allocation failure frees the cache and retries
    once; any other refusal is a KernelError naming it, not a misleading OutOfMemory."""
    p = pool(dev)
    real, calls = cl.Buffer, []

    def buffer(*args, code):
        calls.append(code)
        if len(calls) == 1 or code != cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE:
            raise (cl.MemoryError if code == cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE else cl.LogicError)(
                _cl._ErrorRecord("injected", code, "clCreateBuffer"))
        return real(*args)
    n = 2**16 + 3 * 257  # a size no earlier test left in the pool
    monkeypatch.setattr(cl, "Buffer", lambda *a: buffer(*a, code=cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE))
    t = ops.zeros((n,), dev)
    assert len(calls) == 2
    del t
    p.release_cached()
    calls.clear()
    monkeypatch.setattr(cl, "Buffer", lambda *a: buffer(*a, code=cl.status_code.INVALID_BUFFER_SIZE))
    with pytest.raises(kernels.KernelError, match=r"allocating 0\.3 MiB could not run on .*INVALID_BUFFER_SIZE"):
        ops.empty((n,), dev)
    assert calls == [cl.status_code.INVALID_BUFFER_SIZE]


def test_clnet_bench_out_of_memory_is_one_line_with_a_batch_that_fits(dev, monkeypatch):
    from click.testing import CliRunner
    from clnet import cli
    monkeypatch.setattr(cl, "enqueue_nd_range_kernel", FailingEnqueue(failures=10**9))
    r = CliRunner().invoke(cli.main, ["bench", "lenet", "--device", str(dev.index), "--batch", "8",
                                      "--iterations", "1", "--warmup", "1"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    line, = [s for s in r.output.splitlines() if s.startswith("Error:")]
    assert "lenet at --batch 8: clnet: out of memory on" in line and "should fit" in line, line


def test_fitting_batch_scales_with_the_memory_held():
    e = clnet.OutOfMemory("x")
    e.device_bytes, e.held_bytes = 1000, 4000  # at batch 64 clnet held 4x the device's memory when it failed
    assert e.fitting_batch(64) == 14
    e.held_bytes = 990  # failed just short of the limit: one image less at most
    assert e.fitting_batch(64) == 58
    assert clnet.OutOfMemory("no device").fitting_batch(64) is None


def test_a_tensor_past_the_largest_buffer_gets_a_batch_whose_share_fits(dev):
    from clnet.tensor import empty
    limit = dev.cl_device.max_mem_alloc_size
    row = limit // 100 // 4 + 1024  # floats per batch item: 100 items are a little more than one buffer holds
    held = pool(dev).allocated_bytes
    with pytest.raises(clnet.OutOfMemory, match="allocates at once") as info:
        empty((100, row), dev)
    assert pool(dev).allocated_bytes == held  # refused before anything was allocated
    fits = info.value.fitting_batch(100)
    # that many rows fit one buffer, even where the pool's rounding of their size would not
    assert 90 < fits < 100 and fits * row * 4 <= limit, fits
