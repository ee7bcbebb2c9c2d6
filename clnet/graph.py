"""Capture and replay of a whole step: `g = clnet.Graph()`, `with g.capture(): ...`, then `g.replay()` per batch.

A small network at a small batch spends more time in Python (an eager op's checks, autograd, the kernel's argument
key: bench/eager_cost.py) than on the device. A captured step is replayed as a loop of enqueues of clones whose
arguments were set at capture, as CUDA graphs replay a recorded stream. Unlike CUDA's capture, clnet's runs the step
once while recording it: the capture is an ordinary step whose launches are also kept.

What a replay repeats: every kernel launch and device-to-device copy of the captured code, in order, on the same
buffers, and the host actions that ops registered through `kernels.per_step` (Adam's step count and bias
corrections, each dropout layer's fresh seed drawn from clnet's random stream, batch norm's `num_batches_tracked`,
the optimizer's current learning rate). So replays give what eager steps would have given, bit for bit.

Gradients: a zero_grad inside the capture is part of the step (its replays overwrite the gradients, as the eager
step's backward does after it); a zero_grad before the capture is not, so a captured backward adds to the gradients
(autograd.settle_grad) and replays without a zero_grad accumulate, as eager micro-steps do. An eager zero_grad
between replays is honoured (Graph.replay fills the gradients it marked), unless the step's own zero_grad marked
them first: the step then overwrites them before any read, so the mark is only cleared. A zero_grad after the step's
last use of a gradient (PyTorch's optimizer-in-backward order) is such a mark too: each replay ends by making it
again, as each eager step ends, where it used to record a fill of the gradient.

Failures: a launch or copy the driver refuses goes through the one enqueue wrapper (kernels.failed): an allocation
failure is retried once after the pool releases its cache, then is an OutOfMemory. A replay that raises midway has
run part of the step's host actions and launches, so the graph refuses to replay again (CaptureError).

Threads: a capture records the launches of the thread that runs it (kernels.context), not another thread's.

What it does not repeat: anything else done on the host. Inputs are static tensors: write the next batch into the
tensors the capture read (`x.write(batch)`, or `x.copy_from(t)`) before each replay, and read the outputs the capture
produced (the loss, the metrics) after it. Reading a tensor back or writing one from the host inside a capture is
refused, since a replay could not repeat it. Shapes are fixed: a batch of another size needs its own graph.

Fusion: at the end of a capture, each run of consecutive element-wise launches (clnet/pointwise.py's unary, binary,
comparison, where and cast launches, and unary backward; clnet/elementwise.py's axpby, affine, mul and activations
with their gradients; each tells the graph what it is as a chain.ChainStep when it launches) becomes one launch of
cl_kernels/chain.cl, which runs the steps per element in order through the same
formula text and still writes every step's output; `_Chain` holds the rules (one element count; a buffer the chain
wrote read again only where it was written; no output over what an earlier step read elsewhere; at most 16 steps
and 12 buffers). `launches` counts what a replay enqueues after fusion, `fused` the launches merged away, `chains`
each fused launch's length. By default a GPU fuses runs of up to 2^19 elements and a CPU none
(tuning.fused_chain_elements: the chain is an interpreter, slower than the separate launches on large tensors, and
on CPUs at every size); `Graph(fuse=True)` fuses every run, `Graph(fuse=False)` or CLNET_FUSE=0 none. Eager steps and
the capture itself never fuse: the capture runs the step unfused, as an eager step.

Memory: every buffer a recorded launch touches belongs to the graph until the graph goes: buffers freed during the
capture are taken out of the pool (no later allocation can be handed one that a replay writes), and tensors still
alive are kept alive. Within the capture, the pool reuses buffers as an eager step does, so a graph holds what one
step needs.
"""
import contextlib
import ctypes
import os
import warnings
import weakref

import pyopencl as cl

from . import kernels, tuning
from .errors import Error


event_free = kernels.event_free  # the raw entry points live with the one enqueue wrapper (kernels.py)
ENQUEUE_ARGS = kernels.ENQUEUE_ARGS
_enqueue_raw = kernels._enqueue_raw
_copy_raw = event_free("clEnqueueCopyBuffer", [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                               ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_void_p,
                                               ctypes.c_void_p])


def copy_buffer(dev, dst, src, nbytes, dst_offset=0, src_offset=0):
    """Queue a device copy on dev of nbytes from src at src_offset into dst at dst_offset, without an event. A copy
    the driver refuses is made again through pyopencl, under the one enqueue wrapper (kernels.enqueue: an allocation
    failure retried once after the pool releases its cache, then OutOfMemory; anything else a KernelError)."""
    queue = dev.queue
    if _copy_raw is None or _copy_raw(queue.int_ptr, src.int_ptr, dst.int_ptr, src_offset, dst_offset, nbytes, 0,
                                      None, None):
        kernels.enqueue(dev, f"a device copy of {nbytes} bytes", cl.enqueue_copy, queue, dst, src, byte_count=nbytes,
                        dst_offset=dst_offset, src_offset=src_offset)


FUSE = os.environ.get("CLNET_FUSE", "1") != "0"  # CLNET_FUSE=0: graphs replay every launch as it was recorded


class CaptureError(Error, RuntimeError):
    """Something inside `Graph.capture()` that a replay could not repeat."""


class Graph:
    """A recorded step: its launches, copies and host actions in order, replayed by `replay()`. fuse: merge runs of
    element-wise launches into one launch each at the end of the capture (None, the default: as the device does,
    runs of up to tuning.fused_chain_elements(dev) elements, none on CPUs; True: every run; CLNET_FUSE=0: none)."""

    def __init__(self, fuse=None):
        self._items = []  # (clone, global size, local size, live args) launches; callables (copies, host actions)
        self._queue = self._device = None  # bound at the first recorded launch
        self._seen = {}  # storage key (a buffer's id, a block's (its segment's id, offset)) -> [buffer, its pool,
        # [weak references to its storages], its block, bytes of the largest of them]
        self._regions = {}  # id -> region, window or set-up storage a launch touched, kept alive (a region: its parent)
        self._kept = []  # storages alive at the end of capture, kept alive for the graph's lifetime
        self._taken = []  # (pool, its withdraw's entry): freed during capture, out of the pool until the graph goes
        self._grads = {}  # id -> leaf whose .grad the step writes or reads (note_grad)
        self._own_marks = set()  # ids of those whose first use in the step is its own zero_grad's mark
        self._leaves = ()  # (leaf, its storage, its .grad) at the end of capture: what replays check has not moved
        self.launches = 0  # launches a replay enqueues (after fusion)
        # merge runs of element-wise launches at the end of capture (None: as the device does, decided then)
        self.fuse = (None if FUSE else False) if fuse is None else bool(fuse)
        self.fused = 0  # launches that fusion merged into others (launches + fused: what the capture recorded)
        self.chains = []  # the number of launches each fused launch replaced
        self.fusion_refused = None  # why this graph's chains stayed unfused (chain.cl did not build), or None
        self._offered = None  # (kernel, arguments, ChainStep, element count) of the launch being made now (offer)
        self._steps = {}  # index in _items -> (ChainStep, operands, n) of a recorded launch that may fuse
        self._programs = []  # the fused launches' code tensors, alive as long as the graph
        # enqueue without events through ctypes (see event_free); False: through pyopencl
        self.event_free = _enqueue_raw is not None
        self.captured = False
        self.failed = False  # its capture raised: nothing to replay
        self.broken = None  # why this graph replays no more: a replay failed midway, or a parameter moved (replay)

    # -- capture ---------------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self):
        """Run the block once, recording what a replay repeats."""
        if self.captured or self.failed:
            raise CaptureError("this Graph was captured already; make a new clnet.Graph() for another step")
        context = kernels.context  # this thread's: a capture records the launches of the thread that runs it
        if context.capturing is not None:
            raise CaptureError("a Graph is being captured already; captures do not nest")
        context.capturing = self
        kernels._captures.add(self)  # another thread's release of the pool's cache keeps what this one used
        try:
            yield self
            self._fill_late_marks()
        except BaseException:  # a half-recorded step must never replay: forget it, hold nothing
            context.capturing = None
            kernels._captures.discard(self)
            self._items, self._seen, self._regions, self._grads, self.launches = [], {}, {}, {}, 0
            self._steps = {}
            self.failed = True
            raise
        context.capturing = None
        try:  # sealed while still listed: no other thread's release of the pool's cache takes what it withdraws
            self._seal()
        finally:
            kernels._captures.discard(self)

    def _fill_late_marks(self):
        """A .grad that zero_grad marked after the step's last use of it (PyTorch's order: backward, step, zero_grad)
        is still marked when the capture ends. Only the next step's backward would read that mark, and no replay makes
        it again, so the second replay on would add to the gradient of the one before. Filled here, recorded, every
        replay ends as the eager step does: with that gradient reading as zeros. Where the step's own zero_grad marked
        the .grad before any use, no replay reads it before writing it (note_grad), so each replay ends by
        marking it again instead (a host action), as the eager step leaves it, and the fill is not recorded."""
        marked = []
        for leaf in list(self._grads.values()):
            if not leaf._grad_zeroed:
                continue
            if id(leaf) in self._own_marks:  # no replay reads it before writing it (note_grad): a mark will do
                marked.append((leaf, leaf._grad_none))  # (None where no use followed zero_grad(set_to_none=True))
            else:
                leaf._fill_marked()  # filled with zeros (autograd.fill_marked), recorded here
        if marked:
            self._items.append(lambda: _mark_zero(marked))

    def _note(self, storage):
        if hasattr(storage, "parent"):  # a region or window: keep it (and so its parent) alive
            self._regions[id(storage)] = storage
            return
        if storage.set_up:
            # Made in set-up (a cached layout or constant): kept alive too, or a cache letting it go during the
            # capture would hand its buffer, whose contents no replay writes again, to a temporary of the step
            self._regions[id(storage)] = storage
        buf, key = storage.buffer, storage.key
        entry = self._seen.get(key)
        if entry is None:
            self._seen[key] = [buf, storage.pool, [weakref.ref(storage)], storage.block, storage.size]
            return
        if not any(r() is storage for r in entry[2]):
            entry[2].append(weakref.ref(storage))
        # A block freed in the capture and placed again at the same offset for a smaller tensor: replays still
        # write the larger one's bytes
        entry[4] = max(entry[4], storage.size)

    def uses(self, buf):
        """Whether a recorded launch touches this buffer."""
        return id(buf) in self._seen

    def offer(self, k, args, step, n):
        """The launch of kernel k with args about to be made is `step` (a chain.ChainStep) over n elements of a chain
        that may fuse; offer(None, None, None, None) after it. Only the launch that matches k and args by identity takes
        it."""
        self._offered = (k, args, step, n) if k is not None else None

    def record_launch(self, dev, k, args, global_size, local_size, any_work_group=False):
        """A launch as kernels.launch enqueued it; any_work_group: its kernel took any work-group (kernels.ANY_GROUP),
        as a chain step must."""
        for a in args:
            storage = getattr(a, "storage", None)
            if storage is not None:
                self._note(storage)
        self._bind_queue(dev)
        offered, self._offered = self._offered, None
        if self.fuse is not False and offered is not None and offered[0] is k and len(offered[1]) == len(args) and \
                all(x is y for x, y in zip(offered[1], args)) and (local_size is None or any_work_group) and \
                len(global_size) == 1:
            operands = _operands(args)
            if operands is not None:
                self._steps[len(self._items)] = (offered[2], operands, offered[3])
        self._items.append(_item(k, args, global_size, local_size))
        self.launches += 1

    def record_copy(self, dst, src, copy):
        """A device copy from src into dst, which copy() enqueues again."""
        self._note(dst.storage)
        self._note(src.storage)
        self._bind_queue(dst.device)
        self._items.append(copy)

    def record_action(self, action):
        self._items.append(action)

    def note_grad(self, leaf, marks=False):
        """The step writes, reads or marks (marks: zero_grad) leaf's .grad; True the first time in this capture.
        zero_grad only marks a .grad (Tensor.grad), and a replay does not look at marks: one made since the capture
        (an eager zero_grad) is filled before a replay, since the recorded kernels may add to that memory or read it,
        unless the step's own zero_grad marked it before any other use: no use after a mark reads the .grad before
        writing all of it (backward's overwrite, a fill; a deferred gradient never reads it), so the mark is only
        cleared. A mark older than the capture is settled at
        the step's first use of the .grad (autograd.settle_grad)."""
        if id(leaf) in self._grads:
            return False
        self._grads[id(leaf)] = leaf
        if marks:
            self._own_marks.add(id(leaf))
        return True

    def _bind_queue(self, dev):
        if self._queue is None:
            self._queue, self._device = dev.queue, dev
        elif dev.queue is not self._queue:
            raise CaptureError("a Graph records one device's work; this capture launched on two devices")

    def _seal(self):
        """Keep every buffer a replay touches out of other hands: alive storages stay alive, dead ones' buffers leave
        the pool."""
        for buf, p, refs, block, size in self._seen.values():
            alive = [s for s in (r() for r in refs) if s is not None]
            self._kept.extend(alive)
            if alive and block is None:  # a whole buffer: in use, so out of the pool
                continue
            # A block: what of its bytes is free now (an alive storage there may be smaller than a dead one the
            # replays also write: the rest went back to the arena, and a tensor made after the capture could be
            # placed over it; evaluate() read a block of test images so overwritten)
            entry = p.withdraw(buf, block, size)
            if entry is None:
                raise CaptureError("internal: a buffer the capture used is neither alive nor in the pool")
            self._taken.append((p, entry))
        self._seen.clear()
        limit = None  # fuse=True: runs of any size
        if self.fuse is None:
            limit = tuning.fused_chain_elements(self._device) if self._device is not None else 0
            self.fuse = limit > 0
        if self.fuse and len(self._steps) > 1:
            self._fuse(limit)  # after the withdrawals: the code tensors it allocates cannot be buffers the step uses
        self._steps = {}
        self._leaves = tuple((t, t.storage, t._grad) for t in self._grads.values())
        self.captured = True

    def _fuse(self, limit=None):
        """Merge each run of consecutive recorded pointwise launches that _Chain admits into one launch of
        cl_kernels/chain.cl, which runs their steps per element in order and still writes every step's output."""
        items, chain = [], None

        def close():
            if chain is None:
                return
            if len(chain.steps) == 1:
                items.append(chain.items[0])
                return
            step = chain.steps[0][0]
            if self.fusion_refused is None:
                try:
                    k, args, program = step.chain_launch(self._device, chain.buffers, chain.steps, chain.n)
                except kernels.KernelError as e:  # a compiler that cannot build chain.cl: the step replays unfused
                    self.fusion_refused = str(e)
                    warnings.warn(f"clnet.Graph: fusion is off for this graph, chain.cl did not build: {e}",
                                  RuntimeWarning, stacklevel=4)
            if self.fusion_refused is not None:
                items.extend(chain.items)
                return
            self._programs.append(program)
            items.append(_item(k, args, *kernels.any_group(self._device, (chain.n,))))
            self.fused += len(chain.steps) - 1
            self.chains.append(len(chain.steps))

        for index, item in enumerate(self._items):
            entry = self._steps.get(index)
            if entry is not None and limit is not None and entry[2] > limit:
                entry = None  # a run this large runs faster as its separate launches
            if entry is not None and chain is not None and chain.admit(item, *entry):
                continue
            close()
            chain = None
            if entry is not None:
                chain = _Chain(entry[2])
                if not chain.admit(item, *entry):  # its own output overlaps what it reads otherwise than at i
                    chain = None
            if chain is None:
                items.append(item)
        close()
        self._items = items
        self.launches = sum(1 for item in items if type(item) is tuple)

    # -- replay ----------------------------------------------------------------------------------------------------
    def replay(self):
        """Enqueue the recorded step again (returns at once; the queue runs it). One thread at a time per graph: a
        replay sets its kernels' per-step arguments.

        A replay that raises midway (a launch the driver refuses, out of memory after the retry, an interrupt) has
        run the host actions before that point (Adam's step count, dropout's seeds, batch norm's count) and queued
        the launches before it: host and device no longer match what any number of whole steps would give, so the
        graph refuses further replays (CaptureError, naming the failure)."""
        if not self.captured:
            raise CaptureError(self._why_not())
        if kernels.context.capturing is not None:
            raise CaptureError("replay() inside another Graph's capture: graphs do not nest")
        for t, storage, grad in self._leaves:
            if t.storage is not storage or t._grad is not grad:
                self.captured = False
                self.broken = ("replay(): a parameter or its .grad moved since the capture (an optimizer laid out its "
                               "flat buffers, or the model moved), and the recorded launches would use the old copies; "
                               "capture the step again in a new clnet.Graph, after the optimizer's first zero_grad() "
                               "or step()")
                raise CaptureError(self.broken)
            if t._grad_zeroed and id(t) in self._own_marks:  # the replay reads it only after writing it (note_grad)
                t._grad_zeroed, t._grad_pending, t._grad_none = False, None, False  # (a deferred gradient under a
                # mark is never written)
            elif t._grad_zeroed:  # marked by an eager zero_grad since: filled (see note_grad); the replay writes it
                t._fill_marked()
                t._grad_none = False
        queue = self._queue
        try:
            if self.event_free:
                raw, handle, none = _enqueue_raw, ctypes.c_void_p(queue.int_ptr), kernels._NO_EVENTS
                for item in self._items:
                    if type(item) is tuple:
                        clone, _, _, live, kernel, dims, sizes, local = item
                        for i, box in live:
                            clone.set_arg(i, box.value)
                        status = raw(handle, kernel, dims, None, sizes, local, none, None, None)
                        if status:
                            self._failed_launch(item, status)
                    else:
                        item()
            else:
                enqueue = cl.enqueue_nd_range_kernel
                for item in self._items:
                    if type(item) is tuple:
                        clone, gsize, lsize, live = item[:4]
                        for i, box in live:
                            clone.set_arg(i, box.value)
                        try:
                            enqueue(queue, clone, gsize, lsize)
                        except cl.Error as e:
                            self._failed_launch(item, e)
                    else:
                        item()
        except BaseException as e:
            said = f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__
            self.captured = False
            self.broken = (f"replay() of a graph whose last replay failed midway ({said}): the host state its steps "
                           "advance (Adam's step count, dropout's seeds, batch norm's count) ran ahead of the "
                           "device's; capture the step again in a new clnet.Graph")
            raise
        kernels.launch_count += self.launches

    def _why_not(self):
        if self.broken is not None:
            return self.broken
        if self.failed:
            return "replay() of a graph whose capture raised: capture the step again in a new Graph"
        return "replay() before capture(): record the step first with `with graph.capture():`"

    def _failed_launch(self, item, error):
        """A launch the driver refused (the status the raw enqueue returned, or pyopencl's error): through the one
        enqueue wrapper's handler, which retries an allocation failure once (through pyopencl) and raises otherwise.
        Returns when the retry ran it."""
        clone, gsize, lsize = item[:3]
        kernels.failed(self._device, error, f"a replayed launch of {clone.function_name}",
                       lambda: cl.enqueue_nd_range_kernel(self._queue, clone, gsize, lsize),
                       sizes=f" (global size {gsize}, work-group {lsize})")

    def __del__(self):
        try:
            for p, entry in self._taken:
                p.put_back(entry)
        except Exception:  # interpreter shutdown
            pass


def _item(k, args, global_size, local_size):
    """A replay's entry for one launch: its own clone with args set, and what the raw enqueue takes."""
    clone, at = kernels.own_clone(k, args)
    live = tuple((at[i], v) for i, v in enumerate(args) if type(v) is kernels.Live)
    dims = len(global_size)
    sizes = (ctypes.c_size_t * dims)(*global_size)
    local = (ctypes.c_size_t * dims)(*local_size) if local_size is not None else None
    return (clone, global_size, local_size, live, ctypes.c_void_p(clone.int_ptr), kernels._DIMS[dims], sizes, local)


def _operands(args):
    """{argument index: ((cl buffer, byte offset there): the chain slot a launch passes, memory it lies in, byte
    offset there, bytes, dtype)} of a launch's tensor arguments, or None where one has no buffer of its own (a window)
    or an argument is Live."""
    out = {}
    for i, a in enumerate(args):
        if type(a) is kernels.Live:
            return None
        storage = getattr(a, "storage", None)
        if storage is None:
            continue
        try:
            slot = (storage.buffer, storage.at)
        except kernels.NeedsStaging:
            return None
        root, offset = storage.whole()
        out[i] = (slot, root.int_ptr, offset, a.size * a.dtype.itemsize, a.dtype)
    return out


class _Chain:
    """A run of pointwise launches being merged, and the rules that keep the merged launch's results those of the
    separate launches. Every work-item of the merged launch runs all steps at its own flat index i before another's
    may run any, so a step may read memory an earlier step of the chain writes only where the writer wrote it: the
    same region (buffer, offset, size and type), read at i (it then takes the value from the earlier step, as it
    would have read it from memory). A step's output may overlap what an earlier step read only if that read was of
    the same region at i. Regions are compared by the memory they lie in (a tensor's region by its parent's), so two
    storages of one buffer, or a region and its parent, are seen to overlap. Anything else ends the chain."""

    def __init__(self, n):
        self.n = n
        self.items, self.steps, self.buffers = [], [], []
        self.slot_of = {}  # (cl buffer handle, byte offset) -> slot
        self.written = []  # (memory, start, end, dtype, step index)
        self.read = []  # (memory, start, end, dtype, at i)

    def admit(self, item, step, operands, n):
        """Add the launch `item` (its ChainStep and _operands) if the rules allow; False leaves the chain as it was."""
        if n != self.n or len(self.steps) >= step.most_steps:
            return False
        if self.steps and type(self.steps[0][0]) is not type(step):  # one family encodes a chain
            return False
        sources, reads, new = [], [], []
        for index, layout in step.reads:
            buf, memory, start, size, dtype = operands[index]
            end, source = start + size, None
            for w_memory, w_start, w_end, w_dtype, w_step in reversed(self.written):
                if w_memory == memory and w_start < end and start < w_end:  # the last writer of this memory
                    if layout is not None or (w_start, w_end, w_dtype) != (start, end, dtype):
                        return False
                    source = -(w_step + 1)
                    break
            if source is None:
                source = self._slot(buf, new)
            sources.append(source)
            reads.append((memory, start, end, dtype, layout is None))
        buf, memory, start, size, dtype = operands[step.out]
        end = start + size
        if size != n * dtype.itemsize:
            return False
        # over what was read or written: only the same bytes, element for element (a pooled buffer the step reuses
        # for another type of one size included), read at i; a read elsewhere would see this step's value too soon
        for r_memory, r_start, r_end, r_dtype, at_i in self.read + reads:
            if r_memory == memory and r_start < end and start < r_end and not (
                    at_i and (r_start, r_end, r_dtype.itemsize) == (start, end, dtype.itemsize)):
                return False
        for w_memory, w_start, w_end, w_dtype, _ in self.written:
            if w_memory == memory and w_start < end and start < w_end and \
                    (w_start, w_end, w_dtype.itemsize) != (start, end, dtype.itemsize):
                return False
        out_slot = self._slot(buf, new)
        if len(self.buffers) + len(new) > step.most_buffers:
            return False
        for b in new:
            self.slot_of[(b[0].int_ptr, b[1])] = len(self.buffers)
            self.buffers.append(b)
        self.read += reads
        self.written.append((memory, start, end, dtype, len(self.steps)))
        self.steps.append((step, {i: o[4] for i, o in operands.items()}, out_slot, sources))
        self.items.append(item)
        return True

    def _slot(self, buf, new):
        """buf's slot: its own if the chain has it, else the one it gets when the step is admitted (new buffers are
        appended in order)."""
        slot = self.slot_of.get((buf[0].int_ptr, buf[1]))
        if slot is not None:
            return slot
        for j, b in enumerate(new):
            if (b[0].int_ptr, b[1]) == (buf[0].int_ptr, buf[1]):
                return len(self.buffers) + j
        new.append(buf)
        return len(self.buffers) + len(new) - 1


def refuse_in_capture(what):
    """A host copy inside a capture: refused, since a replay would not repeat it."""
    if kernels.recording() is not None:
        raise CaptureError(f"{what} inside Graph.capture(): a replay would not repeat it; write the static inputs "
                           "before replay() and read the outputs after it")


class StepReplayer:
    """Runs a training step through a graph: `replayer(x, y)` runs `step(x, y)` eagerly until a batch shape comes twice
    in a row (the first step builds kernels and lays out the optimizer), captures that second step into input tensors
    of its own, and from then on copies each batch of that shape into those and replays. One graph only: another
    shape (an epoch's last, smaller batch) runs eagerly, since a second graph would hold a second step's memory for one
    step an epoch. Returns what the step returned; for a replayed step, the capture's outputs, which the replay has
    overwritten."""

    def __init__(self, step, enabled=True):
        self.step = step
        self.enabled = enabled
        self.previous = None  # the last call's batch shape: a shape seen twice in a row gets the graph
        self.key = None  # the batch shape that has the graph
        self.graph = None  # (graph, static x, static y, outputs)

    def inputs(self, x_shape, y_shape):
        """The static inputs (x, y) of the graph for batches of these shapes, or None: a loader delivers batches
        straight into them (data.Loader's `into`), which saves the copies here."""
        if self.graph is not None and (tuple(x_shape), tuple(y_shape)) == self.key:
            return self.graph[1], self.graph[2]
        return None

    def __call__(self, x, y):
        key, previous = (x.shape, y.shape), self.previous
        self.previous = key
        if self.graph is not None and key == self.key:
            graph, sx, sy, out = self.graph
            if x is not sx:
                sx.copy_from(x)
            if y is not sy:
                sy.copy_from(y)
                sy.value_range = y.value_range  # what the replayed loss checks, as an eager step's would
            graph.replay()
            return out
        if not self.enabled or self.graph is not None or key != previous:
            return self.step(x, y)
        self.key = key
        sx, sy = x.new_empty(x.shape).copy_from(x), y.new_empty(y.shape).copy_from(y)
        sy.value_range = y.value_range
        graph = Graph()
        try:
            with graph.capture():
                out = self.step(sx, sy)
        except CaptureError:  # the step does host work of the user's (a read-back in forward): eager from now on.
            # The capture ran the step up to that point, and it runs again whole: where the update comes last (fit's
            # step) no weight moved, but a batch norm before that point counted this batch in its running statistics.
            self.enabled, self.key = False, None
            return self.step(x, y)
        self.graph = (graph, sx, sy, out)
        return out


def _mark_zero(leaves):
    """A replay's last host action where the captured step ended with these .grads marked zero
    (Graph._fill_late_marks): marked again, as each eager step leaves them."""
    for leaf, none in leaves:
        leaf._grad_zeroed, leaf._grad_none = True, none
