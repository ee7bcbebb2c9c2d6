"""Grad mode, capture state and the profiler are each thread's own (kernels.context), as PyTorch's grad mode is:
no_grad in one thread leaves another's ops recorded, a capture in one thread records none of another's launches, and
a profiler attached in one thread collects only that thread's. The threads take turns through events, so each check
happens while the other thread is inside its block."""
import sys
import threading

import numpy as np
import pytest

import clnet
from clnet import autograd, kernels, ops


class Turns:
    """Runs body(pause) on a thread of its own; pause() hands the turn to the main thread until resume()."""

    def __init__(self, body):
        self.paused, self.resumed, self.errors = threading.Event(), threading.Event(), []
        self.thread = threading.Thread(target=self._run, args=(body,))

    def _run(self, body):
        try:
            body(self.pause)
        except BaseException as e:  # reported by finish(), on the main thread
            self.errors.append(e)
        finally:
            self.paused.set()

    def pause(self):
        self.paused.set()
        assert self.resumed.wait(30), "the main thread never gave the turn back"

    def __enter__(self):
        self.thread.start()
        assert self.paused.wait(30), "the other thread never reached its pause"
        return self

    def __exit__(self, *exc):
        self.resumed.set()
        self.thread.join(30)
        if self.errors and exc[0] is None:
            raise self.errors[0]


def test_no_grad_in_one_thread_leaves_another_recording(dev, rng):
    w = clnet.tensor(rng.standard_normal(7), dev, requires_grad=True)
    seen = {}

    def other(pause):
        with clnet.no_grad():
            seen["inside"] = clnet.is_grad_enabled(), (w * 2.0).grad_fn
            pause()
            seen["inside, later"] = clnet.is_grad_enabled(), (w * 2.0).grad_fn
        seen["after"] = clnet.is_grad_enabled()

    with Turns(other):
        assert clnet.is_grad_enabled() and autograd._enabled  # the name other modules read
        assert (w * 3.0).grad_fn is not None
        with clnet.no_grad():  # the main thread's own no_grad: the other thread's mode is its own
            assert not clnet.is_grad_enabled()
        assert clnet.is_grad_enabled()
    assert seen == {"inside": (False, None), "inside, later": (False, None), "after": True}


def test_a_capture_in_one_thread_records_none_of_another_threads_launches(dev, rng):
    a = rng.standard_normal(37).astype(np.float32)
    x = clnet.tensor(a, dev)
    other_out = ops.empty((37,), dev)
    launches = kernels.launch_count
    y = x * 2.0
    per_step = kernels.launch_count - launches
    g = clnet.Graph()
    box = {}

    def capture(pause):
        with g.capture():
            box["y"] = x * 2.0
            pause()  # the main thread launches now
            box["z"] = box["y"] * 0.5
        box["capturing after"] = kernels.capturing

    with Turns(capture):
        assert kernels.capturing is None and kernels.recording() is None
        for _ in range(3):
            ops.fill(other_out, 5.0)
        y.numpy()  # a host read here is not inside any capture of this thread's
    assert g.captured and box["capturing after"] is None
    assert g.launches == 2 * per_step, "the graph recorded launches of the main thread"
    ops.fill(other_out, 7.0)
    x.write(a + 1)
    g.replay()
    np.testing.assert_array_equal(box["z"].numpy(), (2 * (a + 1)) * np.float32(0.5))
    np.testing.assert_array_equal(other_out.numpy(), np.full(37, 7.0, np.float32))


def test_a_profiler_collects_only_its_own_threads_launches(dev):
    t = ops.empty((11,), dev)
    prof = kernels.Profiler()

    def other(pause):
        ops.fill(t, 1.0)
        pause()
        ops.fill(t, 2.0)

    kernels.profiler = prof
    try:
        with Turns(other):
            ops.fill(t, 3.0)
    finally:
        kernels.profiler = None
    assert [name for _, name, *_ in prof.records] == ["fill"]


def test_a_capture_in_another_thread_does_not_refuse_this_threads_host_copies(dev):
    x = clnet.tensor(np.arange(5, dtype=np.float32), dev)
    g = clnet.Graph()

    def capture(pause):
        with g.capture():
            x * 2.0
            pause()

    with Turns(capture):
        np.testing.assert_array_equal(x.numpy(), np.arange(5, dtype=np.float32))
        x.write(np.ones(5, np.float32))
    with pytest.raises(clnet.CaptureError, match="inside Graph.capture"):
        with clnet.Graph().capture():
            x.numpy()


def test_another_threads_release_of_the_pool_keeps_what_a_capture_used(dev, rng):
    """Out of memory in one thread releases the pool's cached buffers; a buffer that a capture in progress in another
    thread used for a temporary (freed, so cached) must stay: the graph's replays write it."""
    from clnet.tensor import pool
    a = rng.standard_normal(41).astype(np.float32)
    x = clnet.tensor(a, dev)
    g = clnet.Graph()
    box = {}

    def capture(pause):
        with g.capture():
            tmp = x * 2.0
            box["y"] = tmp * 3.0
            del tmp  # back to the pool's cache, and used by a recorded launch
            pause()  # the main thread releases the cache now

    with Turns(capture):
        pool(dev).release_cached()
    assert g.captured
    x.write(a + 1)
    g.replay()
    np.testing.assert_array_equal(box["y"].numpy(), ((a + 1) * np.float32(2)) * np.float32(3))


def test_threads_launching_the_same_kernel_each_get_their_own_arguments(dev, rng, monkeypatch):
    """Threads share each kernel's clones with arguments set (kernels._with_args) and the buffer pool. With one
    clone a kernel, every launch takes the clone back from another argument set and sets it again: without a lock, a
    thread's launch could be enqueued with the arguments another thread had just set, or two threads could take one
    pooled buffer. Each thread's results must be its own."""
    monkeypatch.setattr(kernels, "CLONES_PER_KERNEL", 1)
    threads, rounds, n = 4, 200, 33
    data = [rng.standard_normal(n).astype(np.float32) for _ in range(threads)]
    inputs = [clnet.tensor(a, dev) for a in data]
    errors, results = [], [None] * threads
    start = threading.Barrier(threads)

    def work(i):
        try:
            start.wait(30)
            x, out = inputs[i], []
            for r in range(rounds):
                out.append(x * float(i + 1) + float(r))  # one kernel, every thread, new buffers and scalars each round
            results[i] = [t.numpy() for t in out]
        except BaseException as e:
            errors.append(e)

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads change turns between nearly any two bytecodes
    try:
        pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join(120)
    finally:
        sys.setswitchinterval(previous)
    assert not errors, errors[0]
    for i in range(threads):
        for r in range(rounds):
            np.testing.assert_array_equal(results[i][r], data[i] * np.float32(i + 1) + np.float32(r),
                                          err_msg=f"thread {i}, round {r}")


def test_a_release_of_the_pool_and_another_threads_free_take_turns(dev):
    """One thread releases the pool's cached buffers while another frees a tensor: the freed buffer must end up in
    the pool, usable, whatever point of the release the free comes at (unguarded, it went into the dictionary the
    release was replacing, lost, or changed that dictionary's size under the release's loop)."""
    from clnet.tensor import pool
    p = pool(dev)
    cached = [ops.empty((7,), dev) for _ in range(3)]
    del cached  # free buffers for the release to walk through
    box = [ops.empty((123457,), dev)]  # freed by a third thread, mid-release
    freed = box[0].storage.buffer

    class Stall:
        """A capture in progress, as the pool's release sees one: at its first question it hands the turn over."""
        def __init__(self):
            self.pause = None

        def uses(self, buf):
            if self.pause is not None:
                pause, self.pause = self.pause, None
                pause()
            return False

    stall = Stall()

    def release(pause):
        stall.pause = pause
        kernels._captures.add(stall)
        try:
            p.release_cached()
        finally:
            kernels._captures.discard(stall)

    freeing = threading.Thread(target=box.pop)
    with Turns(release):
        freeing.start()
        freeing.join(0.5)  # guarded, it waits for the release to finish
    freeing.join(30)
    assert not freeing.is_alive()
    assert any(b is freed for bucket in p.free.values() for _, b in bucket), "the freed buffer left the pool"
    t = ops.full((123457,), dev, 3.0)  # the pool hands it out again, and it works
    np.testing.assert_array_equal(t.numpy(), np.full(123457, 3.0, np.float32))
