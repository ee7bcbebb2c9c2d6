"""The one class that owns device memory, its buffer pool, and every host<->device copy (counted)."""
import heapq
import math
import threading
import weakref

import numpy as np
import pyopencl as cl

from . import arena, kernels
from .graph import copy_buffer, refuse_in_capture
from .devices import Device
from .devices import device as _device
from .errors import Error

_stats = dict(host_to_device_bytes=0, host_to_device_count=0, device_to_host_bytes=0, device_to_host_count=0)

# In-place writes (an in-place op, x[...] = value, write()): a count of them, and for each storage written the count
# at its last write. An op's backward compares these with the count when it saved its tensors (autograd): a saved
# tensor written since would give a gradient of the new values, which PyTorch's version counters refuse too. Nothing
# on the path of an op that writes nothing in place.
in_place_writes = [0]
_last_written = weakref.WeakKeyDictionary()


def note_in_place(t):
    """Records an in-place write to t's memory; the value range t remembered (int32 labels) is no longer known."""
    t.value_range = None
    if t.storage is not None:
        in_place_writes[0] += 1
        _last_written[t.storage] = in_place_writes[0]


def written_since(t, count):
    """Whether t's memory took an in-place write after the write count was `count`."""
    return t.storage is not None and _last_written.get(t.storage, 0) > count


def transfer_stats():
    """Copies between host and device since the last reset: counts and bytes each way."""
    return dict(_stats)


def reset_transfer_stats():
    for k in _stats:
        _stats[k] = 0


# Requests of ARENA_MIN to ARENA_MAX bytes are blocks of shared segments (arena.py), which kernels take as the
# segment and a byte offset (kernels.cl_arguments; no sub-buffer): a block freed by the forward's activations serves
# the backward's gradients of other sizes. Smaller requests keep whole buffers per rounded size (their bytes are few).
# ARENA_MAX also bounds a segment (joins stop there).
ARENA_MIN = 1 << 20
ARENA_MAX = 1 << 31  # and the largest segment: joining free segments stops there
# A request under SHARED_SEGMENT / 2 opens a segment of SHARED_SEGMENT bytes for others to share; a larger one a
# segment of its own size rounded up to SEGMENT_ROUND (PyTorch's caching allocator: 20 MiB and 2 MiB).
SHARED_SEGMENT = 20 << 20
SEGMENT_ROUND = 2 << 20


class BufferPool:
    """Device memory kept for reuse, so a training loop allocates only in its first step: buffers whole, keyed by
    rounded size; large ones as blocks of shared segments instead (`arena`, above).

    Each size's free buffers are handed out lowest creation number first, and blocks by a deterministic best fit. A
    training step then gets the same memory for the same tensor every step (its allocations and releases repeat in
    the same order, from the same free set), and a block the same offset, so every launch finds its kernel with
    those arguments already set (kernels.py). A last-in-first-out list would permute the buffers from
    step to step instead, and a branched network's launches would miss for dozens of steps."""

    def __init__(self, dev):
        self.device = dev
        self.free = {}  # rounded size -> heap of (creation number, buffer): the small buffers
        self.allocated_bytes = 0
        self.created = 0
        self.max_alloc = dev.cl_device.max_mem_alloc_size  # the largest single buffer the device allows
        # Oclgrind checks reads past a buffer's end, not past a block's: it keeps whole buffers. (With sub-buffers for
        # blocks, an H100 paid at every launch for those that overlap and crashed releasing them: bench/NOTES.md v33,
        # v34; offsets need none.)
        self.arena = arena.Arena(max(512, region_alignment(dev)), ARENA_MIN) if not dev.is_simulator else None
        # Threads share the pool. Reentrant: a storage freed by the garbage collector while this thread holds the
        # lock (an allocation inside take can start a collection) gives its buffer back from inside the lock; a
        # block so freed waits in `deferred` until the arena's bookkeeping is whole again.
        self.lock = threading.RLock()
        self.busy = False
        self.deferred = []

    @staticmethod
    def rounded(nbytes):
        # Round to 1/8 of the next power of two: at most 12.5% waste, few distinct sizes.
        nbytes = max(int(nbytes), 4)
        step = max(256, 1 << max(0, nbytes.bit_length() - 4))
        return -(-nbytes // step) * step

    def in_arena(self, nbytes):
        """Whether a request of nbytes is a block of the arena rather than a whole buffer."""
        return ARENA_MIN <= nbytes <= ARENA_MAX and nbytes <= self.max_alloc and self.arena is not None

    def take(self, nbytes):
        """(whole buffer, its creation number, rounded size) for a request not in_arena."""
        size = _rounded.get(nbytes)
        if size is None:  # a new size: remembered (few distinct sizes; this runs for every tensor made)
            size = self.rounded(nbytes)
            if len(_rounded) >= SIZES_KEPT:
                _rounded.clear()
            _rounded[nbytes] = size
        with self.lock:
            bucket = self.free.get(size)
            if bucket:
                entry = heapq.heappop(bucket) if not kernels._captures else self._unheld(bucket)
                if entry is not None:
                    return entry[1], entry[0], size
        limit = self.max_alloc
        if size > limit >= nbytes:  # the rounding alone would pass the device's largest buffer: take it exact
            size = nbytes
        if size > limit:
            raise kernels.OutOfMemory(f"clnet: {size / 2**20:.1f} MiB is more than {self.device.name} allocates at "
                                      f"once ({limit / 2**20:.0f} MiB): use a smaller batch", self.device, nbytes,
                                      largest=limit)
        try:
            buf = cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, size)
        except cl.Error as e:  # the one wrapper's handler: released cache and one retry, or OutOfMemory/KernelError
            buf = kernels.failed(self.device, e, f"allocating {size / 2**20:.1f} MiB",
                                 lambda: cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, size), wanted=size)
        with self.lock:
            self.allocated_bytes += size
            self.created += 1
            return buf, self.created, size

    def take_block(self, nbytes):
        """(segment, offset, size given) of a block of the arena for a request in_arena."""
        arena_ = self.arena
        size = -(-nbytes // arena_.align) * arena_.align
        with self.lock:
            self.busy = True  # the arena's lists are being changed: blocks the garbage collector frees wait
            try:
                # While another thread captures, or this one sets up inside its capture, a free block may hold what a
                # capture's replays write (kernels.held_by_capture): such a request takes a segment of its own.
                placed = arena_.place(size) if not _captures or _own_capture() else None
                if placed is None and not _captures and arena_.free_segments():
                    placed = arena_.place(size, self._join_free_segments(size))
                if placed is None:
                    grow = size if _captures or size >= SHARED_SEGMENT // 2 else SHARED_SEGMENT
                    grow = max(size, min(-(-grow // SEGMENT_ROUND) * SEGMENT_ROUND, self.max_alloc))
                    placed = arena_.place(size, self._segment(grow))
                return placed
            finally:
                self.busy = False
                if self.deferred:
                    self._release_deferred()

    def _segment(self, size):
        """A new segment of the arena (called with the lock held)."""
        try:
            buf = cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, size)
        except cl.Error as e:  # the one wrapper's handler: released cache and one retry, or OutOfMemory/KernelError
            buf = kernels.failed(self.device, e, f"allocating {size / 2**20:.1f} MiB",
                                 lambda: cl.Buffer(self.device.context, cl.mem_flags.READ_WRITE, size), wanted=size)
        self.allocated_bytes += size
        return self.arena.add_segment(size, buf)

    def _join_free_segments(self, size):
        """One segment in place of every segment that is all free, at least `size` bytes (called with the lock held,
        no capture in progress). Blocks of several free segments are not contiguous, so a request larger than each
        would take a new segment beside them; in a step's first run, where each phase asks for other sizes, that
        left resnet50 holding 1.2x its peak use where joining gave 1.02x (bench/NOTES.md, v33). Later steps ask for
        what the first got, and nothing is joined again."""
        joined, cap = 0, min(ARENA_MAX, self.max_alloc)  # no segment past ARENA_MAX
        kernels.forget_arguments()  # kept argument sets name these segments: they go first
        for seg in self.arena.free_segments():
            if joined + seg.size <= cap:
                joined += seg.size
                self._drop_segment(seg)
        return self._segment(max(-(-size // SEGMENT_ROUND) * SEGMENT_ROUND, joined))

    def _drop_segment(self, seg):
        """Give a free segment's memory back (called with the lock held)."""
        self.arena.drop(seg)
        self.allocated_bytes -= seg.size
        seg.handle.release()

    def release_block(self, block):
        """A block of the arena is free again (a storage's __del__). The garbage collector may run this in the middle
        of another change to the arena (in this thread, under the lock): it then waits for that change's end."""
        with self.lock:
            if self.busy:
                self.deferred.append(block)
                return
            self.busy = True
            try:
                self.arena.release(*block)
            finally:
                self.busy = False
            if self.deferred:
                self._release_deferred()

    def _release_deferred(self):
        self.busy = True
        try:
            while self.deferred:
                self.arena.release(*self.deferred.pop())
        finally:
            self.busy = False

    @staticmethod
    def _unheld(bucket):
        """The first free (creation number, buffer) of the bucket that no capture in progress holds for itself, or
        None. While a graph is captured, the buffers its recorded launches used stay in the pool when freed, for the
        capture's own later temporaries (it replays them in the same order); anything else (set-up inside the capture,
        which no replay repeats: a layout, a constant; another thread's tensors) taking one would be overwritten by
        every replay (kernels.held_by_capture)."""
        aside, found = [], None
        while bucket:
            entry = heapq.heappop(bucket)
            if not kernels.held_by_capture(entry[1]):
                found = entry
                break
            aside.append(entry)
        for entry in aside:
            heapq.heappush(bucket, entry)
        return found

    def give(self, buf, number, size):
        with self.lock:
            heapq.heappush(self.free.setdefault(size, []), (number, buf))

    def withdraw(self, buf, block=None, size=None):
        """Take a free buffer, or the free bytes of a block (segment, offset) of `size` bytes, out of the pool (a
        captured graph keeps them): an entry for `put_back`, or None when the buffer is not free. A block's bytes
        may have been joined with others' since, or handed out again: what is free of them now is taken."""
        if block is not None:
            seg, offset = block
            with self.lock:
                self.busy = True
                try:
                    return seg, self.arena.carve(seg, offset, size)
                finally:
                    self.busy = False
                    self._release_deferred()
        size = buf.size
        with self.lock:
            bucket = self.free.get(size, [])
            for i, (number, b) in enumerate(bucket):
                if b is buf:
                    bucket[i] = bucket[-1]
                    bucket.pop()
                    heapq.heapify(bucket)
                    return number, buf, size
        return None

    def put_back(self, entry):
        """What withdraw took, free again."""
        if type(entry[0]) is arena.Segment:
            seg, pieces = entry
            for offset, _ in pieces:
                self.release_block((seg, offset))
        else:
            self.give(entry[1], entry[0], entry[2])

    def release_cached(self):
        kernels.forget_arguments()  # kept argument sets may name these buffers
        graph = kernels.capture_in_progress()  # a capture in progress keeps the free buffers its launches used
        with self.lock:
            # Segments all free go back (none while a graph is captured: its replays may write a block of one)
            if self.arena is not None and graph is None:
                self.busy = True
                try:
                    for seg in self.arena.free_segments():
                        self._drop_segment(seg)
                finally:
                    self.busy = False
                    self._release_deferred()
            kept = {}
            for size, bucket in self.free.items():
                for number, buf in bucket:
                    if graph is not None and graph.uses(buf):
                        kept.setdefault(size, []).append((number, buf))
                    else:
                        self.allocated_bytes -= buf.size
                        buf.release()
            for bucket in kept.values():
                heapq.heapify(bucket)
            self.free = kept


_rounded = {}  # bytes asked for -> BufferPool.rounded(bytes)
_pools = {}
_pools_lock = threading.Lock()


def pool(dev):
    p = _pools.get(dev)
    if p is None:
        with _pools_lock:
            p = _pools.get(dev)
            if p is None:
                p = _pools[dev] = BufferPool(dev)
    return p


kernels.memory_holders.append(pool)  # an allocation failure anywhere frees the pool's cached buffers (kernels.failed)


# kernels' per-thread context and the set of captures in progress, read at every tensor made (one object each, made
# once: a module attribute of kernels costs a look-up through its module class's properties)
_context, _captures = kernels.context, kernels._captures


def _own_capture():
    """Whether a capture in progress is this thread's alone, outside its set-up: its own temporaries may reuse what
    its launches used (every replay repeats their writes in the order of the capture)."""
    c = _context
    return not c.paused and all(g is c.capturing for g in _captures)


class _Storage:
    """A pooled buffer, or a block of the pool's arena, shared by a tensor and its reshaped views; back to the pool
    when the last one goes.

    `set_up`: made in set-up (kernels.set_up: a cached layout or constant, an optimizer's flat buffers), whose
    contents no replay writes again. A graph whose launches use one keeps it alive (Graph._note), so that it cannot
    return to the pool (for a temporary of a step to overwrite) while the graph may replay."""
    # at: the byte offset in `buffer` where this memory starts, which a launch passes beside it (kernels.cl_arguments:
    # a block of the arena is its segment and an offset there, no sub-buffer); key: what identifies the memory in a
    # kernel's kept argument sets and a graph's records: the buffer's id, or a block's (its segment's id, offset). An
    # id hashes in C where a pyopencl Buffer's hash and equality are Python-level calls (0.3 us of an eager launch's
    # look-up); the pool holds every buffer until kernels.forget_arguments has dropped the kept sets, so no id is
    # reused while a kept set names it.
    __slots__ = ("buffer", "at", "key", "number", "size", "block", "pool", "set_up", "__weakref__")

    def __init__(self, dev, nbytes):
        self.pool = p = _pools.get(dev) or pool(dev)
        size = _rounded.get(nbytes)  # BufferPool.take's commonest case inline: a small size seen before, one free
        entry = None
        if size is not None and not _captures:
            p.lock.acquire()  # acquire and release rather than `with`: 0.05 us less on every tensor made and freed
            try:
                bucket = p.free.get(size)
                if bucket:
                    entry = heapq.heappop(bucket)
            finally:
                p.lock.release()
        if entry is not None:
            self.number, self.buffer = entry
            self.size, self.block, self.at, self.key = size, None, 0, id(self.buffer)
        elif p.in_arena(nbytes):
            seg, at, self.size = p.take_block(nbytes)
            self.buffer, self.number, self.block, self.at = seg.handle, 0, (seg, at), at
            self.key = (id(self.buffer), at)
        else:
            self.buffer, self.number, self.size = p.take(nbytes)
            self.block, self.at, self.key = None, 0, id(self.buffer)
        c = _context
        self.set_up = c.paused > 0
        # the graph must know every buffer the step allocates (a thread's capture looked up only while one exists)
        if _captures and c.capturing is not None and not self.set_up:
            c.capturing._note(self)

    def whole(self):
        """(the buffer that holds this memory, the byte offset there): a block's segment and its offset."""
        return self.buffer, self.at

    def __del__(self):
        try:  # BufferPool.give, inline: every op's temporaries come here
            p = self.pool
            if self.block is not None:
                p.release_block(self.block)
                return
            p.lock.acquire()
            try:
                heapq.heappush(p.free.setdefault(self.size, []), (self.number, self.buffer))
            finally:
                p.lock.release()
        except Exception:  # interpreter shutdown: the context goes anyway
            pass


class _Window:
    """Part of another tensor's storage (which it keeps alive), with no buffer of its own: the parent's buffer and an
    offset, which copies use (`whole`). A launch given a window runs on a copy of it (`staged_launch`). Regions of
    tensors past kernels.INDEX_LIMIT are windows (as when regions were sub-buffers, which NVIDIA's driver (580)
    mishandled in buffers past 8 GiB: writes through them failed, releasing kernels that named them crashed; offsets
    that far into a buffer are not measured on a GPU yet), and so are regions at offsets that are not a multiple of
    region_alignment (kernels' vector loads assume it). A region of a region is one of its parent."""
    __slots__ = ("size", "parent", "offset", "__weakref__")

    def __init__(self, parent, offset_bytes, nbytes):
        if hasattr(parent, "parent"):
            parent, offset_bytes = parent.parent, parent.offset + offset_bytes
        self.parent, self.offset, self.size = parent, offset_bytes, nbytes

    @property
    def buffer(self):
        raise kernels.NeedsStaging(staged_launch)

    key = at = buffer

    def whole(self):
        root, offset = self.parent.whole()
        return root, offset + self.offset


class _Region(_Window):
    """A window that kernels take as it is: the buffer that holds the parent's memory and the byte offset there
    (kernels.cl_arguments); never pooled itself."""
    __slots__ = ("buffer", "at", "key")

    def __init__(self, parent, offset_bytes, nbytes):
        super().__init__(parent, offset_bytes, nbytes)
        self.buffer, self.at = self.whole()
        self.key = (id(self.buffer), self.at)


def staged_launch(dev, k, global_size, local_size, args, what):
    """kernels.launch of arguments among which are windows: each distinct window is copied into a tensor of its own
    before the launch and back after it (a window a kernel only reads comes back unchanged)."""
    temps, staged = {}, []
    for a in args:
        st = getattr(a, "storage", None)
        if type(st) is _Window:
            key = (id(st.parent), st.offset, st.size)
            if key not in temps:
                for (p, o, n), _ in temps.items():
                    if p == key[0] and o < key[1] + key[2] and key[1] < o + n:  # copied back, one would undo the other
                        raise ValueError(f"{what or k.name}: two of its arguments are overlapping parts of one tensor "
                                         f"of more than {kernels.INDEX_LIMIT} elements (kernels.INDEX_LIMIT); copy "
                                         "one of them into a tensor of its own first")
                temps[key] = (a, Tensor(a.shape, a.dtype, dev).copy_from(a))
            a = temps[key][1]
        staged.append(a)
    kernels.launch(dev, k, global_size, local_size, *staged, what=what)
    for window, temp in temps.values():
        window.copy_from(temp)


class Numel(int):
    """A tensor's element count, `t.size` in clnet's own code, that is also PyTorch's method: `t.size()` is the
    shape and `t.size(dim)` one dimension's size."""

    def __call__(self, dim=None):
        if dim is None:
            return self.shape
        if not self.shape:
            raise IndexError(f"size({dim}): a 0-d tensor has no dimensions")
        if not -len(self.shape) <= dim < len(self.shape):
            raise IndexError(f"size({dim}): dim out of range for a tensor of shape {self.shape}")
        return self.shape[dim]


_sizes = {}  # shape -> its Numel (which holds the shape as a tuple of ints), shared by the tensors of that shape
SIZES_KEPT = 4096  # shapes remembered; past that the memory starts afresh


def _size_of(shape):
    """The Numel of a shape given as any sequence of integers (remembered in _sizes)."""
    ints = tuple(int(s) for s in shape)
    size = _sizes.get(ints)
    if size is None:
        if len(_sizes) >= SIZES_KEPT:
            _sizes.clear()
        size = Numel(math.prod(ints))
        size.shape = ints
        _sizes[ints] = size
    return size


_FLOAT32, _INT32, _BOOL = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.bool_)
DTYPES = {_FLOAT32, _INT32, _BOOL}  # bool: one byte an element (uchar in the kernels)


def _shape_arg(shape):
    return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)


class Tensor:
    """A float32, int32 or bool array in device memory, with PyTorch's autograd attributes.

    Attributes: ``shape``, ``dtype``, ``device``; ``requires_grad``, ``grad`` (a device tensor after backward, for
    leaves), ``grad_fn`` (the op that computed it, while its graph is recorded). ``numpy()`` is the way back to the
    host. Integer tensors made from host data remember their value range, so a loss can check labels without reading
    them back. A tensor made from host data before any device is chosen (a parameter of a new module) keeps it on the
    host until it is placed (``Module.to``).
    """

    __array_priority__ = 1000  # numpy scalars on the left defer to Tensor's operators
    # What a new tensor starts with, read from the class until set on the tensor (five stores fewer per tensor made)
    requires_grad, _grad, grad_fn, value_range, _host = False, None, None, None, None
    # (the op, whether PyTorch's view would be contiguous) where this tensor is a copy and PyTorch's result a view of
    # another tensor's memory (x[0], x.t(), narrow, chunk, expand: views.py materialises them): in-place writes to it
    # are refused, since they would not reach the original as PyTorch's do
    copy_for_view = None

    def __init__(self, shape, dtype=np.float32, device=None, _storage=None, _host=None):
        # Every op makes tensors (bench/eager_cost.py): a shape seen before finds its element count, and the canonical
        # tuple of ints, in one dictionary look-up; the common dtypes skip np.dtype()'s parsing.
        size = _sizes.get(shape) if type(shape) is tuple else None
        if size is None:
            size = _size_of(shape)
        self.shape, self.size = size.shape, size
        if dtype is np.float32 or dtype is _FLOAT32:
            dtype = _FLOAT32
        elif dtype is np.int32 or dtype is _INT32:
            dtype = _INT32
        else:
            dtype = np.dtype(dtype)
            if dtype not in DTYPES:
                raise TypeError(f"clnet tensors hold float32, int32 or bool, not {dtype}")
        self.dtype = dtype
        if _host is not None:
            self._host, self.device, self.storage = _host, None, None
            return
        self.device = device = device if type(device) is Device else _device(device if device is not None else "auto")
        if _storage is None:
            try:
                _storage = _Storage(device, size * dtype.itemsize)
            except kernels.OutOfMemory as e:
                e.args = (f"{e} (a tensor of shape {self.shape})",)
                raise
        self.storage = _storage

    @property
    def buffer(self):
        if self.storage is None:
            raise RuntimeError(f"clnet: a tensor of shape {self.shape} is not on a device yet: move its module with "
                               ".to(device) (or call it once on an input, which moves it)")
        return self.storage.buffer

    def numel(self):
        return self.size

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    @property
    def ndim(self):
        return len(self.shape)

    def dim(self):
        return len(self.shape)

    @property
    def is_leaf(self):
        return self.grad_fn is None

    # zero_grad marks a .grad as zero instead of filling it: the next backward's kernels then write it without reading
    # it (beta 0, Function.grad_sink), and any other read of .grad fills it here first. A batch-1 step of lenet-wide
    # on a CPU spent 2.4 ms of 15 filling 20 MB of gradients (bench/NOTES.md, v16). The `grad` property that fills
    # it, and `backward`, are autograd's, which installs them on this class (autograd builds on this module).
    _grad_zeroed = False
    # zero_grad(set_to_none=True), PyTorch's default, and an optimizer's layout of a parameter that had no .grad: the
    # .grad reads as None (its buffer kept, marked zero) until a backward writes it, and a step passes over it
    _grad_none = False
    _grad_pending = None  # a gradient an op deferred for the leaf's post-accumulate hooks (autograd.deferral)

    def _settle_pending(self):
        """Writes the gradient an op deferred (autograd.deferral) into .grad, unless a zero_grad has marked it since:
        then nothing reads what it would have written. Run at every read of .grad, when the leaf's hooks are done,
        and before anything else uses the gradient's buffer."""
        pending, self._grad_pending = self._grad_pending, None
        if pending is not None and not self._grad_zeroed:
            pending.write(self._grad)

    def _mark_grad_zero(self, to_none=False):
        """What zero_grad does to each parameter: its .grad (if any) reads as zeros from now on, or as None (to_none)
        until a backward writes it."""
        if self._grad is not None:
            self._grad_zeroed = True
            self._grad_none = self._grad_none or to_none
            if kernels.capturing is not None:
                kernels.capturing.note_grad(self, marks=True)

    # -- placement -----------------------------------------------------------------------------------------------
    def _place(self, dev):
        """Moves this tensor to dev in place (its identity kept: modules hold their parameters by reference)."""
        if self.device is dev:
            return self
        host = self._host if self.storage is None else self.numpy()
        self.device, self.storage, self._host = dev, _Storage(dev, self.nbytes), None
        self.write(host)
        if self._grad is not None:  # a .grad marked zero stays marked: what it holds is not read
            self._settle_pending()
            self._grad._place(dev)
        return self

    def to(self, dev):
        """This tensor on dev: itself when it is there, else a copy (through the host)."""
        dev = _device(dev)
        if self.device is dev:
            return self
        out = Tensor(self.shape, self.dtype, dev)
        out.write(self._host if self.storage is None else self.numpy())
        return out

    def new_empty(self, *size, dtype=None, device=None):
        """A new tensor of shape `size`, uninitialised, with this tensor's dtype and device unless given (as
        torch.Tensor.new_empty)."""
        return Tensor(_shape_arg(size), self.dtype if dtype is None else dtype,
                      self.device if device is None else device)

    # -- views and autograd (reshape and view, differentiable through ops.Reshape, are installed by methods.py) ----
    def _alias(self, shape, copy_for_view=False):
        view = Tensor(shape, self.dtype, self.device, _storage=self.storage)
        view.value_range = self.value_range
        if copy_for_view is False:  # a reshape: PyTorch's of a contiguous view is a view, and so is one that only
            # adds or drops dimensions of 1 (unsqueeze, squeeze); another is a copy
            mark = self.copy_for_view
            keeps = mark is not None and (mark[1] or [n for n in shape if n != 1] == [n for n in self.shape if n != 1])
            copy_for_view = mark if keeps else None
        view.copy_for_view = copy_for_view
        return view

    def _resolve_shape(self, shape):
        shape = list(_shape_arg(shape))
        if shape.count(-1) > 1:
            raise ValueError(f"cannot reshape a tensor of shape {self.shape} to {tuple(shape)}: at most one -1")
        if shape.count(-1) == 1:
            known = math.prod(s for s in shape if s != -1)
            if known == 0 or self.size % known:
                raise ValueError(f"cannot reshape a tensor of shape {self.shape} to {tuple(shape)}")
            shape[shape.index(-1)] = self.size // known
        if math.prod(shape) != self.size or min(shape, default=0) < 0:
            raise ValueError(f"cannot reshape a tensor of shape {self.shape} ({self.size} elements) to "
                             f"{tuple(shape)}")
        return tuple(shape)

    def flatten(self, start_dim=0, end_dim=-1):
        n = max(self.ndim, 1)
        s, e = start_dim % n, end_dim % n
        if s > e:
            raise ValueError(f"flatten: start_dim {start_dim} is after end_dim {end_dim} for shape {self.shape}")
        if not self.shape:
            return self.reshape(1)
        return self.reshape(self.shape[:s] + (math.prod(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def detach(self):
        """The same memory, cut from the graph: no grad_fn, requires_grad False."""
        return self._alias(self.shape)

    @property
    def data(self):
        return self.detach()

    @data.setter
    def data(self, value):
        """t.data = v: t takes v's values (`p.data -= lr * p.grad` ends with this, its in-place result being t's own
        memory already). PyTorch's t takes v's memory; clnet copies, keeping t's place in an optimizer's flat buffer,
        and refuses another shape or dtype."""
        if not isinstance(value, Tensor):
            raise TypeError(f"t.data = v: v must be a clnet tensor, got {type(value).__name__}")
        if value.storage is self.storage:
            return
        if value.shape != self.shape or value.dtype != self.dtype:
            raise ValueError(f"t.data = v: v has shape {value.shape} and dtype {value.dtype}, t {self.shape} and "
                             f"{self.dtype}; clnet keeps a tensor's shape and dtype (write a new tensor instead)")
        self.copy_from(value)
        note_in_place(self)

    def requires_grad_(self, flag=True):
        if self.grad_fn is not None and not flag:
            raise RuntimeError("requires_grad_(False) is only for leaves; use detach() on a computed tensor")
        if flag and self.dtype != np.float32:
            raise TypeError(f"only float32 tensors can require gradients, not {self.dtype}")
        self.requires_grad = bool(flag)
        return self

    # -- host copies (counted) -----------------------------------------------------------------------------------
    def copy_from(self, other, offset=None):
        """Device-to-device copy of a tensor of the same size, or, given `offset`, of this tensor's size from that
        element of a larger one (queued, without an event; no host memory involved)."""
        if (other.size != self.size if offset is None else not 0 <= offset <= other.size - self.size) \
                or other.dtype != self.dtype:
            raise ValueError(f"cannot copy a tensor of shape {other.shape}" + (
                f" from element {offset}" if offset is not None else "") + f" into one of shape {self.shape}")
        if self.size:
            (dst, dst_offset), (src, src_offset) = self.storage.whole(), other.storage.whole()
            dev, nbytes = self.device, self.nbytes
            src_offset += (offset or 0) * self.dtype.itemsize
            copy_buffer(dev, dst, src, nbytes, dst_offset, src_offset)
            graph = kernels.recording()
            if graph is not None:
                graph.record_copy(self, other, lambda: copy_buffer(dev, dst, src, nbytes, dst_offset, src_offset))
        return self

    def numpy(self):
        if self.storage is None:
            return self._host.copy()
        out = np.empty(self.shape, self.dtype)
        if out.size:
            self.read_into(out, blocking=True)
        return out

    def read_into(self, out, blocking=False):
        """Queue a copy of this tensor into the host array `out` (counted); the event (wait on it before reading out
        when not blocking). Refused inside a capture, which a replay could not repeat."""
        refuse_in_capture(f"reading a tensor of shape {self.shape} back")
        buf, offset = self.storage.whole()
        event = kernels.enqueue(self.device, f"reading a tensor of shape {self.shape} back", cl.enqueue_copy,
                                self.device.queue, out, buf, src_offset=offset, is_blocking=blocking)
        _stats["device_to_host_bytes"] += out.nbytes
        _stats["device_to_host_count"] += 1
        return event

    def write(self, array, blocking=True):
        """Copy a host array of the same size into this tensor.

        With blocking=False the copy is only queued (pyopencl keeps the host array alive until it is done), so a
        feeder can upload the next batch while the device still computes the current one.
        """
        array = np.ascontiguousarray(array, dtype=self.dtype)
        if array.size != self.size:
            raise ValueError(f"cannot write an array of shape {array.shape} into a tensor of shape {self.shape}")
        if self.storage is None:
            self._host = array.reshape(self.shape).copy()
        elif array.size:
            refuse_in_capture(f"writing a host array into a tensor of shape {self.shape}")
            buf, offset = self.storage.whole()
            event = kernels.enqueue(self.device, f"writing a host array into a tensor of shape {self.shape}",
                                    cl.enqueue_copy, self.device.queue, buf, array, dst_offset=offset,
                                    is_blocking=blocking)
            # Held, not dropped: pyopencl's event for a non-blocking copy waits for the copy when it is destroyed
            # (keeping the host array safe), holding the GIL, so a dropped one would make the upload blocking.
            self._upload = None if blocking else event
            note_in_place(self)
            _stats["host_to_device_bytes"] += array.nbytes
            _stats["host_to_device_count"] += 1
        if self.dtype == np.int32 and array.size:
            self.value_range = (int(array.min()), int(array.max()))
        return self

    def region(self, offset, shape):
        """A tensor of `shape` over elements [offset, offset + size) of this one's memory: a region (`_Region`),
        which kernels take as the parent's buffer and a byte offset, where it starts at a multiple of
        `region_alignment(device)` bytes in a tensor within kernels.INDEX_LIMIT elements; otherwise a window
        (`_Window`), which copies and launches stage through the parent's buffer."""
        nbytes = offset * self.dtype.itemsize
        window = (type(self.storage) is _Window or self.size > kernels.INDEX_LIMIT
                  or (getattr(self.storage, "offset", 0) + nbytes) % region_alignment(self.device))
        kind = _Window if window else _Region
        return Tensor(shape, self.dtype, self.device,
                      _storage=kind(self.storage, nbytes, max(math.prod(shape), 1) * self.dtype.itemsize))

    def item(self):
        if self.size != 1:
            raise ValueError(f"only a one-element tensor converts to a Python number, not shape {self.shape}")
        return self.numpy().reshape(()).item()

    def __float__(self):
        return float(self.item())

    def __int__(self):  # a float one truncated, as int() of PyTorch's
        return int(self.item())

    def __format__(self, spec):  # f"{loss:.3f}" of a one-element tensor formats its number, as PyTorch's
        return format(self.item(), spec) if spec and self.size == 1 else format(str(self), spec)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self):
        where = self.device.name if self.device is not None else "host, not yet placed"
        grad = f", grad_fn={self.grad_fn!r}" if self.grad_fn is not None else \
            (", requires_grad=True" if self.requires_grad else "")
        return f"Tensor(shape={self.shape}, dtype={self.dtype.name}, device={where!r}{grad})"


def _host_array(data):
    array = np.asarray(data)
    if array.dtype.kind == "b":
        return array.astype(np.bool_)
    if array.dtype.kind in "iu":
        if array.size and (array.min() < -2**31 or array.max() >= 2**31):
            raise ValueError("integer data does not fit in int32")
        return array.astype(np.int32)
    if array.dtype.kind == "f":
        return array.astype(np.float32)
    raise TypeError(f"clnet.tensor takes numeric data, not {array.dtype}")


def tensor(data, device=None, requires_grad=False):
    """Copy host data to the device: floats become float32, integers int32, booleans bool. A clnet tensor comes back
    as it is (moved to `device` when another is named)."""
    if isinstance(data, Tensor):
        out = data if device is None else data.to(device)
    else:
        array = _host_array(data)
        out = Tensor(array.shape, array.dtype, device).write(array)
    if requires_grad:
        out.requires_grad_(True)
    return out


class Parameter(Tensor):
    """A trainable tensor (requires_grad True), as torch.nn.Parameter. Made from host data it stays on the host until
    its module is moved to a device."""

    def __init__(self, data, requires_grad=True):
        if isinstance(data, Tensor):
            if data.storage is None:
                super().__init__(data.shape, data.dtype, _host=data._host)
            else:
                super().__init__(data.shape, data.dtype, data.device, _storage=data.storage)
        else:
            array = _host_array(data)
            super().__init__(array.shape, array.dtype, _host=array.copy())
        self.requires_grad = bool(requires_grad)

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()


kernels.tensor_types.update((Tensor, Parameter))  # a launch keys these by their buffer, and a Numel as an int
kernels.int_types.add(Numel)


def region_alignment(dev):
    """Bytes a region's start must be a multiple of on dev: a buffer's own base alignment, which kernels' vector
    loads assume of every pointer they are given."""
    return max(dev.cl_device.mem_base_addr_align // 8, 4)


class TooLarge(Error, ValueError):
    """An op that cannot split a tensor past kernels.INDEX_LIMIT elements into launches that fit; raised before it
    launches anything."""


WINDOW_RUN = 2**28  # elements a split run covers at most: its windows are staged through copies of that size (1 GiB)


def run_limit():
    """Elements one run of a split op may cover: kernels.INDEX_LIMIT, and WINDOW_RUN for the staging copies."""
    return min(kernels.INDEX_LIMIT, WINDOW_RUN)


def chunks(what, shape, count, unit_sizes, unit="image", multiple=1):
    """Runs [(start, n)] of whole units covering `count` of them (images, planes, rows), for an op whose tensors
    are too large for one launch: each tensor of each run (unit_sizes: its elements per unit) holds at most
    kernels.INDEX_LIMIT (and WINDOW_RUN) elements and starts at a multiple of `multiple` elements. Each run's part of
    a tensor is its `region` (a window where it cannot be a region). TooLarge, naming `what`, `shape` and the fix,
    when not even one run fits."""
    limit = max(run_limit(), min(kernels.INDEX_LIMIT, max(unit_sizes)))  # a unit past WINDOW_RUN: one unit a run
    step = 1
    for u in unit_sizes:
        step = math.lcm(step, multiple // math.gcd(u, multiple))
    per = limit // max(max(unit_sizes), 1) // step * step
    if per == 0:
        biggest = max(unit_sizes) * step
        raise TooLarge(f"{what}: a tensor of shape {tuple(shape)} has more than {limit} elements (kernels.INDEX_LIMIT: "
                       f"what one launch indexes with 32-bit integers), and its smallest run of whole {unit}s takes "
                       f"{biggest} elements; use smaller {unit}s (at most {limit // step} elements each)")
    return [(s, min(per, count - s)) for s in range(0, count, per)]


def too_large(what, shape, fix):
    """TooLarge for an op that runs only tensors within kernels.INDEX_LIMIT elements."""
    return TooLarge(f"{what}: a tensor of shape {tuple(shape)} has {math.prod(shape)} elements, more than the "
                    f"{kernels.INDEX_LIMIT} one launch indexes with 32-bit integers (kernels.INDEX_LIMIT), and "
                    f"{what} does not split its launches; {fix}")


def empty(shape, device, dtype=np.float32):
    return Tensor(shape, dtype, device)
