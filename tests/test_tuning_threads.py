"""tuning's recorders are each thread's own, as grad mode and the capture state are (kernels.context): the choices a
thread's ops make land in that thread's `tuning.used` (the benchmark's kernel column) and `tuning.recorder` (the
autotuner's sites) only. The threads take turns, so each records while the other is inside its own recording."""
import threading

import numpy as np

import clnet
from clnet import tuning
from clnet.gemm import Mat, gemm, gemm_key


def product(dev, M, N, K):
    """Runs one matrix product of shape M x N x K; returns its tuning key."""
    a, b, c = Mat(rs=K, cs=1), Mat(rs=N, cs=1), Mat(rs=N, cs=1)
    r = np.random.default_rng(M)
    A = clnet.tensor(r.standard_normal((M, K)).astype(np.float32), dev)
    B = clnet.tensor(r.standard_normal((K, N)).astype(np.float32), dev)
    gemm(M, N, K, A, a, B, b, clnet.tensor(np.zeros((M, N), np.float32), dev), c)
    return gemm_key(M, N, K, 1, a, b, c)


def test_two_threads_record_their_own_choices(dev):
    main_turn, other_turn = threading.Event(), threading.Event()
    seen, errors = {}, []

    def other():
        try:
            tuning.used, tuning.recorder = {}, tuning.Recorder()
            seen["other key"] = product(dev, 37, 300, 33)
            main_turn.set()  # the main thread records now, while this thread's recorders are set
            assert other_turn.wait(60), "the main thread never gave the turn back"
            seen["other used"] = {k for tag in tuning.used.values() for k in tag}
            seen["other sites"] = set(tuning.recorder.sites)
        except BaseException as e:
            errors.append(e)
        finally:
            tuning.used = tuning.recorder = None
            main_turn.set()

    # the shapes' first runs (kernel builds) happen before the threads record
    product(dev, 37, 300, 33)
    product(dev, 41, 310, 35)
    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert main_turn.wait(120), "the other thread never reached its turn"
        assert tuning.used is None and tuning.recorder is None  # the other thread's are not this one's
        tuning.used, tuning.recorder = {}, tuning.Recorder()
        try:
            mine = product(dev, 41, 310, 35)
            used = {k for tag in tuning.used.values() for k in tag}
            sites = set(tuning.recorder.sites)
        finally:
            tuning.used = tuning.recorder = None
    finally:
        other_turn.set()
        thread.join(120)
    if errors:
        raise errors[0]
    theirs = seen["other key"]
    assert mine != theirs
    assert used == {mine} and seen["other used"] == {theirs}
    assert sites == {mine} and seen["other sites"] == {theirs}  # each product is a site the autotuner would time
