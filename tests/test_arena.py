"""The buffer pool's arena (clnet/arena.py, tensor.BufferPool): large tensors are blocks of shared segments, placed
by best fit, split and joined again. Checked against a byte map of its own (no two blocks in use overlap, free
neighbours are always joined, the same requests give the same blocks), then on every device: tensors in blocks keep
their values among many others made and freed, regions and copies of a block reach its own bytes, a step's peak
memory comes back to its use, and a captured step's blocks stay out of other hands while it replays."""
import gc
import importlib
import random

import numpy as np
import pytest

import clnet
from clnet import arena, ops
from clnet.tensor import pool

tensor = importlib.import_module("clnet.tensor")  # the module, which clnet.tensor (the function) hides

import test_graph


def check_whole(a):
    """The arena's lists agree with each other: each segment tiled by its blocks, no two free neighbours, the free
    list exactly the free blocks."""
    listed = set()
    for seg in a.segments.values():
        assert seg.starts == sorted(seg.blocks)
        at, was_free = 0, False
        for start in seg.starts:
            size, free = seg.blocks[start]
            assert start == at and size > 0
            assert not (free and was_free), "two free neighbours were not joined"
            if free:
                listed.add((size, seg.number, start))
            at, was_free = start + size, free
        assert at == seg.size
    assert listed == set(a.free) and len(a.free) == len(listed)


def run_sequence(seed, steps=400):
    """Random requests, releases and carves against a byte map; the placements made, in order."""
    rnd = random.Random(seed)
    a = arena.Arena(align=16, split_min=64)
    owner = {}  # segment number -> bytearray: 0 free, else the id of the block holding the byte
    live, placed, next_id = {}, [], 1
    for _ in range(steps):
        action = rnd.random()
        if action < 0.55 or not live:
            size = rnd.choice([16, 64, 80, 256, 1024, 4096]) * rnd.randint(1, 3)
            got = a.place(size)
            if got is None:
                seg = a.add_segment(max(size, rnd.choice([4096, 16384])), None)
                owner[seg.number] = bytearray(seg.size)
                got = a.place(size, seg)
            seg, offset, have = got
            assert have >= size and offset % 16 == 0 and offset + have <= seg.size
            mem = owner[seg.number]
            assert not any(mem[offset:offset + have]), "a block in use was handed out again"
            mem[offset:offset + have] = bytes([next_id % 255 + 1]) * have
            live[next_id] = (seg, offset, have)
            placed.append((seg.number, offset, have))
            next_id += 1
        elif action < 0.95:
            key = rnd.choice(sorted(live, key=str))
            seg, offset, have = live.pop(key)
            owner[seg.number][offset:offset + have] = bytes(have)
            a.release(seg, offset)
        else:  # a captured graph withdrawing what is free of a range
            seg = a.segments[rnd.choice(sorted(a.segments))]
            offset = rnd.randrange(0, seg.size, 16)
            size = rnd.randrange(16, seg.size - offset + 16, 16)
            pieces = a.carve(seg, offset, size)
            mem = owner[seg.number]
            for at, n in pieces:
                assert offset <= at and at + n <= offset + size
                assert not any(mem[at:at + n]), "carve took bytes in use"
                mem[at:at + n] = bytes([255]) * n
                live[("carved", seg.number, at)] = (seg, at, n)
        check_whole(a)
    for key in sorted(live, key=str):
        seg, offset, _ = live.pop(key)
        a.release(seg, offset)
    check_whole(a)
    assert all(seg.is_free() for seg in a.segments.values()), "releasing every block left a segment split"
    return placed


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_arena_bookkeeping_against_a_byte_map(seed):
    assert run_sequence(seed) == run_sequence(seed), "the same requests were placed differently"


def test_best_fit_and_split():
    a = arena.Arena(align=16, split_min=64)
    big, small = a.add_segment(1024, None), a.add_segment(256, None)
    seg, offset, have = a.place(200)
    assert (seg, offset, have) == (small, 0, 256), "the smallest free block that fits is the 256-byte segment"
    seg, offset, have = a.place(320)
    assert (seg, offset, have) == (big, 0, 320)
    assert a.free == [(704, big.number, 320)]
    assert a.place(1000) is None
    a.release(big, 0)
    assert a.free == [(1024, big.number, 0)]
    seg, offset, have = a.place(992)  # a rest under split_min stays with its block
    assert have == 1024


def test_arena_tensors_keep_their_values(dev, rng):
    """Tensors of 1-3 MiB made and freed in a random order among each other, each filled with its own value: a block
    handed out twice, or a launch given the wrong offset, shows as another tensor's value."""
    live = {}
    for i in range(60):
        if live and rng.random() < 0.4:
            live.pop(int(rng.choice(sorted(live))))
            continue
        n = int(rng.integers(tensor.ARENA_MIN // 4, 3 * tensor.ARENA_MIN // 4))
        t = ops.full((n,), dev, float(i))
        assert (t.storage.block is not None) == (pool(dev).arena is not None)
        live[i] = t
    for i, t in live.items():
        got = t.numpy()
        assert (got == i).all(), f"tensor {i} holds {np.unique(got)[:5]}"


def test_regions_and_copies_of_a_block(dev, rng):
    """A block is its segment and its offset there, as kernels take it (no sub-buffer); a region of it the same
    segment at the block's offset plus its own; copies go through the segment at that offset."""
    filler = ops.full((tensor.ARENA_MIN // 4 + 333,), dev, -1.0)  # the next block starts past the segment's start
    data = rng.standard_normal(tensor.ARENA_MIN // 4 + 4096).astype(np.float32)
    t = clnet.tensor(data, dev)
    align = tensor.region_alignment(dev) // 4
    part = t.region(3 * align, (1000,))
    if pool(dev).arena is not None:
        assert t.storage.buffer is filler.storage.buffer and t.storage.at >= filler.nbytes
        assert part.storage.buffer is t.storage.buffer and part.storage.at == t.storage.at + 3 * align * 4
    np.testing.assert_array_equal(part.numpy(), data[3 * align:3 * align + 1000])
    np.testing.assert_array_equal((part * 2.0).numpy(), 2 * data[3 * align:3 * align + 1000])
    copy = ops.empty((500,), dev)
    copy.copy_from(t, offset=777)
    np.testing.assert_array_equal(copy.numpy(), data[777:1277])
    window = t.region(3, (7,))  # not at a region's alignment: a window over the block's bytes, staged
    np.testing.assert_array_equal(window.numpy(), data[3:10])
    np.testing.assert_array_equal(filler.numpy()[-3:], [-1, -1, -1])


def test_memory_freed_by_one_phase_serves_another(dev):
    """A forward's activations of one size, freed, then a backward's gradients of another: whole buffers per size held
    both sets (176 MiB here); the arena joins the activations' free segments into one that the gradients share, and
    holds the larger phase (96 MiB)."""
    if pool(dev).arena is None:
        pytest.skip("whole buffers on this device (Oclgrind: tensor.BufferPool)")
    gc.collect()
    p = pool(dev)
    p.release_cached()
    mib = tensor.ARENA_MIN // 4
    held = p.allocated_bytes

    def step():
        acts = [ops.empty((12 * mib,), dev) for _ in range(8)]
        del acts
        grads = [ops.empty((20 * mib,), dev) for _ in range(4)]
        del grads

    step()
    first = p.allocated_bytes - held
    step()
    assert p.allocated_bytes - held == first, "a second identical step allocated more"
    assert first <= 98 * 2**20, f"the pool took {first / 2**20:.1f} MiB for a peak of 96 MiB in use"


def test_joined_segments_stay_within_the_largest(dev, monkeypatch):
    """Free segments are joined into one of at most ARENA_MAX bytes: joined without a bound, the trace of resnet50's
    first step at about b128 made a segment of 6 GiB (bench/NOTES.md v33)."""
    if pool(dev).arena is None:
        pytest.skip("whole buffers on this device (Oclgrind: tensor.BufferPool)")
    mib = tensor.ARENA_MIN // 4
    monkeypatch.setattr(tensor, "ARENA_MAX", 48 * tensor.ARENA_MIN)
    gc.collect()
    pool(dev).release_cached()
    acts = [ops.empty((12 * mib,), dev) for _ in range(8)]  # eight free segments of 12 MiB once freed
    del acts
    big = ops.empty((20 * mib,), dev)  # no block fits: joins free segments, at most 48 MiB of them
    assert max(seg.size for seg in pool(dev).arena.segments.values()) <= 48 * tensor.ARENA_MIN
    assert big.storage.block[0].size >= 20 * tensor.ARENA_MIN


def test_a_repeated_step_gets_the_same_blocks(dev):
    """The same requests and releases in the same order give the same blocks (a launch's kept arguments name their
    segment and offset: kernels._with_args)."""
    if pool(dev).arena is None:
        pytest.skip("whole buffers on this device (Oclgrind: tensor.BufferPool)")
    mib = tensor.ARENA_MIN // 4

    def step():
        a = ops.empty((2 * mib + 5,), dev)
        b = ops.empty((7 * mib,), dev)
        c = ops.empty((mib + 1,), dev)
        del a
        d = ops.empty((mib * 3 // 2,), dev)
        return [t.storage.key for t in (b, c, d)]

    step()
    assert step() == step()


@pytest.fixture
def small_arena(monkeypatch):
    """Every request of 1 KiB and up a block (the graph tests' small networks then run in the arena), in segments of
    64 KiB."""
    monkeypatch.setattr(tensor, "ARENA_MIN", 1024)
    monkeypatch.setattr(tensor, "SHARED_SEGMENT", 64 * 1024)
    monkeypatch.setattr(tensor, "SEGMENT_ROUND", 4096)
    yield
    gc.collect()


def test_replayed_steps_in_the_arena_match_eager_ones(dev, rng, small_arena):
    """test_graph's bit-for-bit check of replays against eager steps, with the small network's tensors in blocks."""
    seed = int(rng.integers(0, 2**31))
    data = test_graph.batches(rng, 5, 9)
    replayed, graph = test_graph.run_graphed(dev, seed, "adam", data, lr_at=3)
    test_graph.assert_same(test_graph.run_eager(dev, seed, "adam", data, lr_at=3), replayed)
    assert any(type(entry[0]) is arena.Segment for _, entry in graph._taken) or pool(dev).arena is None


def test_a_graphs_blocks_stay_out_of_other_hands(dev, rng, small_arena):
    """Between replays, eager work takes every free block it can get and fills it with NaN; the replays must still
    give the eager steps' results, and the graph's blocks come back when it goes."""
    if pool(dev).arena is None:
        pytest.skip("whole buffers on this device (Oclgrind: tensor.BufferPool)")
    data, expected, model, opt, loss_fn, x, y = test_graph.fresh(dev, rng, 5)
    g, loss = test_graph.capture_step(model, opt, loss_fn, x, y)
    assert any(type(entry[0]) is arena.Segment and entry[1] for _, entry in g._taken), \
        "the capture freed temporaries in blocks; the graph should hold their bytes"
    losses = [float(loss)]
    p = pool(dev)
    for xb, yb in data[1:]:
        # each free block's size asked for: the best fit is that very block, or one as good
        junk = [ops.full((size // 4,), dev, np.nan) for size, _, _ in list(p.arena.free)]
        x.write(xb)
        y.write(yb)
        g.replay()
        losses.append(float(loss))
        del junk
    test_graph.assert_same(expected, test_graph.state(model, losses))
    free_before = sum(size for size, _, _ in p.arena.free)
    del g
    gc.collect()
    assert sum(size for size, _, _ in p.arena.free) > free_before, "the graph's blocks did not come back"


def test_a_block_placed_again_smaller_in_the_capture_stays_the_graphs(dev, small_arena):
    """A temporary freed in the capture whose offset a smaller tensor of the step then takes, alive after it: every
    replay still writes the temporary's bytes, so the part past the smaller tensor must stay out of other hands too.
    (evaluate() on a GPU read the last block of test images from there, overwritten by each replayed forward.)"""
    p = pool(dev)
    if p.arena is None:
        pytest.skip("whole buffers on this device (Oclgrind: tensor.BufferPool)")
    gc.collect()
    p.release_cached()  # free segments go: x starts a segment of its own, the temporary fills the rest of it
    n = 4096  # 16 KiB: a quarter of a 64 KiB segment
    x = clnet.tensor(np.arange(n, dtype=np.float32), dev)
    g = clnet.Graph()
    with g.capture():
        big = clnet.cat([x, x, x], 0)  # 48 KiB, written by the step's launches
        total = big.sum()
        where = big.storage.key
        del big
        small = x + total  # 16 KiB, placed at the freed block's start: the same key, alive after the capture
    assert small.storage.key == where, "the test's premise: the smaller tensor took the freed block's offset"
    captured = small.numpy()
    np.testing.assert_allclose(captured, np.arange(n) + 3.0 * np.arange(n).sum(), rtol=1e-6)
    junk = [ops.full((size // 4,), dev, 7.0) for size, _, _ in list(p.arena.free)]  # every free block taken
    g.replay()
    np.testing.assert_array_equal(small.numpy(), captured)
    for t in junk:
        assert np.all(t.numpy() == 7.0), "a replay wrote over a tensor made after the capture"


@pytest.mark.parametrize("program", range(6))
def test_replays_write_only_their_own_blocks(dev, rng, small_arena, program):
    """A capture of a random program of tensors made (each written by two launches) and freed in blocks of every
    size, some alive at its end; then every free block filled. A replay leaves the fill alone and remakes the alive
    tensors' values. (The _seal before bc3de18 failed 34 of 40 such programs.)"""
    p = pool(dev)
    if p.arena is None:
        pytest.skip("whole buffers on this device (Oclgrind: tensor.BufferPool)")
    r = random.Random(int(rng.integers(1 << 30)))  # a fresh program each run (the test's seed is printed on failure)
    gc.collect()
    p.release_cached()
    x = clnet.tensor(np.arange(1024, dtype=np.float32), dev)
    g = clnet.Graph()
    with g.capture():
        live = []
        for _ in range(30):
            if live and r.random() < 0.4:
                live.pop(r.randrange(len(live)))
            else:
                n = r.choice([256, 512, 1024, 3000, 5000, 9000, 17000])  # 1 KiB to 66 KiB
                live.append(ops.full((n,), dev, float(r.randrange(100))) + x.sum())
    values = [t.numpy() for t in live]
    junk = [ops.full((size // 4,), dev, -5.0) for size, _, _ in list(p.arena.free)]
    g.replay()
    for t in junk:
        assert np.all(t.numpy() == -5.0), "a replay wrote over a tensor made after the capture"
    for t, v in zip(live, values):
        np.testing.assert_array_equal(t.numpy(), v)
