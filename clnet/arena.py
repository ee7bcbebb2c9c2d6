"""Where the buffer pool's large blocks lie: best-fit placement in segments, a block split where it is larger than
asked for and joined with its free neighbours when it is released. The scheme is that of PyTorch's CUDA caching
allocator for its large pool; this module is its bookkeeping in byte offsets alone (no OpenCL: tensor.BufferPool
holds the buffers, one per segment; kernels take a block as its segment's buffer and the block's byte offset).

Why: a pool of whole buffers kept per rounded size holds, for each size, the most buffers of that size a step ever
had in use at once, and those maxima fall at different moments (the forward's activations, the backward's
gradients and column buffers). resnet50 at batch 4 on PoCL held 526 MiB of step buffers for an in-use peak of
346 MiB (bench/NOTES.md, v24 and v33).

Placement is deterministic: the smallest free block that fits, ties broken by segment number and then offset. A
training step that asks and releases in the same order every step then gets the same blocks every step, so every
launch finds its kernel's arguments already set (kernels.py).
"""
import bisect


class Segment:
    """One buffer's bytes: `blocks` maps each block's offset to [size, free], `starts` lists the offsets in order;
    `handle` is whatever the pool keeps for it (its buffer)."""
    __slots__ = ("number", "size", "starts", "blocks", "handle")

    def __init__(self, number, size, handle):
        self.number, self.size, self.handle = number, size, handle
        self.starts = [0]
        self.blocks = {0: [size, True]}

    def is_free(self):
        return len(self.starts) == 1 and self.blocks[0][1]


class Arena:
    """Blocks in segments. Sizes and offsets are multiples of `align` (the caller rounds its requests); a block is
    split only where the rest is at least `split_min` bytes (smaller rests stay with the block they came from)."""

    def __init__(self, align, split_min):
        self.align, self.split_min = align, split_min
        self.segments = {}  # number -> Segment
        self.free = []  # (size, segment number, offset) of every free block, in order: the best fit is a bisection
        self.created = 0

    def add_segment(self, size, handle):
        """A new segment of `size` bytes, all free."""
        self.created += 1
        seg = self.segments[self.created] = Segment(self.created, size, handle)
        bisect.insort(self.free, (size, seg.number, 0))
        return seg

    def place(self, size, segment=None):
        """(segment, offset, size given) of the best free block for `size` bytes (in `segment` only, if given), now
        in use; None where none fits."""
        i = bisect.bisect_left(self.free, (size,))
        if segment is not None:
            while i < len(self.free) and self.free[i][1] != segment.number:
                i += 1
        if i == len(self.free):
            return None
        have, number, offset = self.free.pop(i)
        seg = self.segments[number]
        block = seg.blocks[offset]
        block[1] = False
        if have - size >= self.split_min:
            rest, left = offset + size, have - size
            block[0] = have = size
            seg.blocks[rest] = [left, True]
            bisect.insort(seg.starts, rest)
            bisect.insort(self.free, (left, number, rest))
        return seg, offset, have

    def release(self, seg, offset):
        """The block at `offset` is free again, joined with free neighbours."""
        block = seg.blocks[offset]
        size = block[0]
        block[1] = True
        following = offset + size
        after = seg.blocks.get(following)
        if after is not None and after[1]:
            self._unlist(seg, following, after[0])
            size += after[0]
            del seg.blocks[following]
            seg.starts.pop(bisect.bisect_left(seg.starts, following))
        i = bisect.bisect_left(seg.starts, offset)
        if i > 0:
            before = seg.starts[i - 1]
            prior = seg.blocks[before]
            if prior[1]:
                self._unlist(seg, before, prior[0])
                size += prior[0]
                del seg.blocks[offset]
                seg.starts.pop(i)
                offset = before
        seg.blocks[offset] = [size, True]
        bisect.insort(self.free, (size, seg.number, offset))

    def _unlist(self, seg, offset, size):
        i = bisect.bisect_left(self.free, (size, seg.number, offset))
        del self.free[i]

    def carve(self, seg, offset, size):
        """Marks the free bytes of [offset, offset + size) in seg as in use; returns them as [(offset, size)] blocks
        (each to `release` later). Bytes there already in use are left as they are."""
        end, taken = offset + size, []
        i = max(bisect.bisect_right(seg.starts, offset) - 1, 0)
        while i < len(seg.starts) and seg.starts[i] < end:
            start = seg.starts[i]
            have, free = seg.blocks[start]
            if not free or start + have <= offset:
                i += 1
                continue
            self._unlist(seg, start, have)
            lo, hi = max(start, offset), min(start + have, end)
            pieces = [(start, lo - start, True), (lo, hi - lo, False), (hi, start + have - hi, True)]
            for at, n, is_free in pieces:
                if n <= 0:
                    continue
                if at not in seg.blocks:
                    bisect.insort(seg.starts, at)
                seg.blocks[at] = [n, is_free]
                if is_free:
                    bisect.insort(self.free, (n, seg.number, at))
            taken.append((lo, hi - lo))
            i = bisect.bisect_right(seg.starts, hi - 1)
        return taken

    def drop(self, seg):
        """Forget a segment that is all free (its buffer goes back to the device)."""
        assert seg.is_free()
        self._unlist(seg, 0, seg.size)
        del self.segments[seg.number]

    def free_segments(self):
        return [seg for seg in self.segments.values() if seg.is_free()]
