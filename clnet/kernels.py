"""Finds cl_kernels/*.cl, builds programs with -D defines, caches them per (context, file, defines), launches them.

Every launch goes through `launch`, which converts arguments, pads the global size to the work-group size, records
profiling events when a profiler is attached (the benchmark's per-layer times), and turns OpenCL failures into
messages that name the operation and its sizes. That error handling (`failed`, and `enqueue` around a call) is the
one every launch, replay, host copy, device copy and pool allocation goes through: an allocation failure frees the
pool's cached buffers and retries once, then is an OutOfMemory; any other failure a KernelError naming what ran.

What a thread is doing (capturing a graph, paused set-up, an attached profiler, autograd's grad mode) is held per
thread in one object, `context`; `kernels.capturing`, `kernels.profiler` and `kernels._paused` read and set it.

Setting arguments costs far more than enqueueing (PoCL: 208 us of a 266 us GEMM launch, its 30 arguments, against
7 us for the enqueue; bench/NOTES.md, v3b), and a training step repeats the same launches with the same pooled
buffers every iteration. So each kernel keeps a few clones with their arguments already set, keyed by the argument
values: a repeated launch builds the key, looks it up and enqueues (14 us on PoCL). The enqueue goes without an
event, through ctypes (pyopencl's makes an Event object per launch: about 7 us of NVIDIA's driver), unless a profiler
wants the events; bench/eager_cost.py measures what an eager op costs.

Threads: grad mode and the capture state are each thread's, the caches shared. Builds run under one lock (a program
is built once), and each launch holds another from its clone's look-up to its enqueue (a clone taken back for another
argument set, or a Live argument set again, between the two would launch another thread's arguments).

While a `clnet.Graph` captures, each launch is also recorded with a clone of the graph's own, so replay is a loop of
enqueues. A scalar that changes from step to step travels as a `Live` argument (set again at every enqueue, eager or
replayed), and the host work that updates it runs through `per_step`, which a replay repeats in order.
"""
import atexit
import ctypes
import os
import statistics
import sys
import threading
import types
import warnings
from collections import OrderedDict

import numpy as np
import pyopencl as cl
from .errors import Error
from .sources import KernelError, kernel_dir, source  # noqa: F401  (kernels.KernelError, kernel_dir: public)


# Elements one launch may index: the kernels' indices and sizes are 32-bit ints. An op over a larger tensor splits
# its launches into runs that each fit (tensor.chunks; each run's part of a large tensor a window, which a launch
# runs on a copy of: tensor._Window), or refuses before it launches (tensor.TooLarge). Below 2**31
# by a margin for the indices a work-item forms just past the end (a float4's last lanes, a padded work-group).
# Tests set it to a few thousand, to run the split paths on small tensors.
INDEX_LIMIT = 2**31 - 2**16


class OutOfMemory(Error, MemoryError):
    """The device has no memory left for a tensor or a launch, even after the pool released its cached buffers.
    `fitting_batch(batch)` estimates the largest batch that would fit, from what clnet held when it ran out."""

    def __init__(self, message, dev=None, wanted=0, largest=None):
        super().__init__(message)
        self.device_bytes = dev.global_mem_size if dev is not None else None
        self.held_bytes = (held_bytes(dev) + wanted) if dev is not None else None
        # a buffer past the most the device allocates at once (largest): its share of the batch must shrink too
        self.buffer_share = largest / wanted if largest and wanted else None

    def fitting_batch(self, batch):
        """At most this batch should fit: memory grows with the batch, and at the failure clnet held held_bytes (a
        lower bound of what the batch needs) of the device's device_bytes; a single buffer too large for the device
        shrinks with the batch as well. None when nothing is known."""
        if not self.device_bytes or not self.held_bytes:
            return None
        fits = batch * 0.9 * self.device_bytes / self.held_bytes
        if self.buffer_share:
            fits = min(fits, batch * self.buffer_share)
        return max(1, min(batch - 1, int(fits)))


_ALLOCATION_FAILURES = (cl.status_code.MEM_OBJECT_ALLOCATION_FAILURE, cl.status_code.OUT_OF_RESOURCES,
                        cl.status_code.OUT_OF_HOST_MEMORY)


# The buffer pool (tensor.py, which builds on this module) registers itself here when it is imported, so that the
# error handling below reaches it without importing it: each function of memory_holders takes a device and returns
# what holds memory on it, with `allocated_bytes` and `release_cached()` (which frees what is held only for reuse,
# before an allocation is retried): tensor.pool.
memory_holders = []


def held_bytes(dev):
    return sum(holder(dev).allocated_bytes for holder in memory_holders)


def memory_note(dev):
    return (f"{dev.name} has {dev.global_mem_size / 2**20:.0f} MiB, clnet's tensors hold "
            f"{held_bytes(dev) / 2**20:.0f} MiB")


_programs = {}
build_count = 0
# Builds and the caches of programs and kernels are shared by threads: a miss is built under _build_lock (looked up
# again there, so a program is built once); a hit takes no lock (one dictionary read).
_build_lock = threading.RLock()


def build_options(dev):
    """Options every build of dev gets after the -D defines.

    The kernels are OpenCL C 1.2, said so wherever the device compiles 1.2 (an OpenCL 3.0 compiler otherwise may take
    3.0 as the default). Oclgrind 21.10's interpreter has no `llvm.experimental.noalias.scope.decl`, which LLVM emits
    where it inlines a helper with `restrict` parameters (gemm_common.h's epilogue, winograd.cl's input_tile), so its
    builds drop `restrict` (a promise the kernels keep anyway); other devices' builds keep it.
    """
    options = ["-I", kernel_dir(), "-cl-mad-enable"]
    if getattr(dev, "opencl_c_version", (1, 0)) >= (1, 2):
        options.append("-cl-std=CL1.2")
    if getattr(dev, "is_simulator", False):
        options.append("-Drestrict=")
    return options


def program_options(dev, items):
    """The build options of a program with defines `items` ((name, value) pairs, sorted): -D each, then dev's own."""
    return [f"-D{k}={int(v) if isinstance(v, bool) else v}" for k, v in items] + build_options(dev)


verbose = bool(os.environ.get("CLNET_VERBOSE"))  # `clnet --verbose`: show the OpenCL compilers' own output


def _quiet_builds():
    """A build that succeeds with a non-empty log (PoCL's AVX ABI notes, clang's "1 warning generated.") makes
    pyopencl issue a CompilerWarning, which is not the user's concern (`verbose` writes the log itself). One filter,
    added before a build where it is missing (a warnings.catch_warnings block that ended since, as pytest's around
    each test, takes it away): warnings.catch_warnings around each build would swap the process's filter list under
    other threads. Output a driver writes straight to descriptor 2 is left where it goes: redirecting the descriptor
    around a build swallowed every other thread's output meanwhile."""
    if not any(f[0] == "ignore" and f[2] is cl.CompilerWarning for f in warnings.filters):
        warnings.filterwarnings("ignore", category=cl.CompilerWarning)


def _build_log(prog, dev):
    try:
        return prog.get_build_info(dev.cl_device, cl.program_build_info.LOG) or ""
    except cl.Error:
        return ""


def program(dev, filename, defines=None):
    """The built program for (device, file, defines); built once per process."""
    global build_count
    items = tuple(sorted((defines or {}).items()))
    key = (dev.context.int_ptr, filename, items)
    prog = _programs.get(key)
    if prog is not None:
        return prog
    with _build_lock:
        prog = _programs.get(key)
        if prog is not None:
            return prog
        options = program_options(dev, items)
        _quiet_builds()
        try:
            prog = cl.Program(dev.context, source(filename)).build(options=options)
        except cl.RuntimeError as e:  # pyopencl's message holds the build log
            raise KernelError(f"building {filename} with {' '.join(options)} failed on {dev.name}:\n{e}") from e
        if verbose:
            log = _build_log(prog, dev).strip()
            if log:
                sys.stderr.write(f"clnet: building {filename} on {dev.name}:\n{log}\n")
        build_count += 1
        _programs[key] = prog
    return prog


class Kernel:
    """A built kernel and its clones with arguments set, most recently used last; `queue`, the handle of its device's
    queue (a ctypes.c_void_p: the event-free enqueue's first argument)."""
    __slots__ = ("program", "name", "clones", "queue")

    def __init__(self, prog, name, queue=None):
        self.program, self.name, self.clones, self.queue = prog, name, OrderedDict(), queue


_kernels = {}  # (id(device), file, name, sorted defines) -> Kernel
_kernel_keys = {}  # the same with the defines in a caller's order -> that Kernel (kernel's look-up)
# Held from a launch's look-up of its clone to its enqueue: threads share the clones, and one taken back for another
# argument set (or a Live argument set again) between another thread's look-up and enqueue would launch that thread's
# kernel on the wrong arguments.
_launch_lock = threading.RLock()
CLONES_PER_KERNEL = 4096  # argument sets kept per kernel: every launch of one kernel in a step fits, since a cycle
# longer than the cache misses always, and a miss costs NVIDIA's driver about 55 us of host time (clSetKernelArg on
# each argument). densenet121 copies into its concatenations 1186 times a step (copy2d), densenet201 about 3800;
# ResNet-50 launches its batch-norm and element-wise kernels 50-150 times.


def kernel(dev, filename, name, defines=None):
    """The kernel `name` of (device, file, defines); one dictionary lookup once built, since this runs per launch:
    keyed by the defines in the caller's order (sorting them cost 0.15-0.2 us for two, 0.85 us for a GEMM's fifteen),
    each such key naming the one Kernel of the sorted defines (_kernels), so that a set of defines given in two
    orders shares its Kernel and its kept argument sets."""
    key = (id(dev), filename, name, tuple(defines.items()) if defines else ())
    k = _kernel_keys.get(key)
    if k is None:
        canonical = (id(dev), filename, name, tuple(sorted(defines.items())) if defines else ())
        with _build_lock:
            k = _kernels.get(canonical)
            if k is None:
                k = _kernels[canonical] = Kernel(program(dev, filename, defines), name,
                                                 ctypes.c_void_p(dev.queue.int_ptr))
            _kernel_keys[key] = k
    return k


def forget_arguments():
    """Drops every kept argument set (their buffers are about to be released). The clones go before the buffers
    their arguments name: a set is keyed by its buffers' ids (tensor._Storage.key), which a buffer made after the
    release may take again, and NVIDIA's driver (580) crashed releasing clones whose sub-buffer arguments were gone.
    At exit too, before the interpreter tears its objects down in no particular order."""
    with _build_lock, _launch_lock:
        for k in list(_kernels.values()):
            k.clones.clear()


atexit.register(forget_arguments)


class Profiler:
    """Collects (tag, kernel name, event, the launch's `what`) for every launch while attached; times read after the
    queue finishes."""

    def __init__(self):
        self.records = []
        self.tag = None

    def times_ms(self):
        """(tag, kernel name, device ms) of each launch."""
        return [(tag, name, _event_ms(ev)) for tag, name, ev, _ in self.records]

    def launches_ms(self):
        """(kernel name, what launched it, device ms) of each launch, in launch order."""
        return [(name, what, _event_ms(ev)) for _, name, ev, what in self.records]


def _event_ms(ev):
    return (ev.profile.end - ev.profile.start) * 1e-6


def device_ms(dev, fn, repeats=1):
    """Median over `repeats` calls of fn() of the summed device time (ms) of every kernel one call launches (a GEMM
    may launch a transpose, a product and a split-K sum), read from profiling events."""
    times = []
    for _ in range(repeats):
        prof = Profiler()
        saved, context.profiler = context.profiler, prof
        context.paused += 1
        try:
            fn()
            dev.synchronize()
        finally:
            context.profiler = saved
            context.paused -= 1
        times.append(sum(ms for _, _, ms in prof.times_ms()))
    return statistics.median(times)


launch_count = 0
arguments_set = 0  # launches that found no clone with their arguments and set them (each costs NVIDIA ~55 us; v30)


class Live:
    """A scalar kernel argument whose value is read at every enqueue: Adam's bias corrections, a dropout seed, the
    learning rate. `value` must already be the kernel's type (np.float32, np.int32, np.uint32)."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class _Context(threading.local):
    """What a thread is doing, as PyTorch keeps its grad mode: one object, each thread seeing its own attributes (the
    class's values until it sets them). A capture in one thread records none of another's launches, and no_grad in
    one leaves another's ops recorded."""
    capturing = None  # the clnet.Graph recording this thread's launches, or None
    paused = 0  # > 0 while launches are not part of the step being captured (set_up; the tuner timing candidates)
    profiler = None  # a Profiler collecting this thread's launches (the benchmark); None costs nothing
    grad_enabled = True  # autograd records ops (autograd.no_grad turns it off)


context = _Context()


class _Module(types.ModuleType):
    """kernels.capturing, kernels.profiler and kernels._paused, the names other modules have always read and set,
    are this thread's (context's)."""
    capturing = property(lambda m: context.capturing, lambda m, v: setattr(context, "capturing", v))
    profiler = property(lambda m: context.profiler, lambda m, v: setattr(context, "profiler", v))
    _paused = property(lambda m: context.paused, lambda m, v: setattr(context, "paused", v))


sys.modules[__name__].__class__ = _Module


_captures = set()  # the graphs being captured now, in any thread (Graph.capture adds and removes itself)


class _AnyCapture:
    @staticmethod
    def uses(buf):
        return any(g.uses(buf) for g in list(_captures))


def held_by_capture(buf):
    """Whether a capture in progress, other than the one this thread is recording into now, has used buf: a free
    buffer the pool must not hand out here (BufferPool._unheld). A capture's own temporaries may reuse its buffers,
    since every replay repeats their writes in the order of the capture; set-up inside it (paused) may not."""
    own = context.capturing if not context.paused else None
    return any(g is not own and g.uses(buf) for g in list(_captures))


def capture_in_progress():
    """For the pool's release of its cached buffers: an object whose uses(buf) says whether a capture in progress in
    any thread has used buf (those buffers must stay), or None when no thread captures."""
    return _AnyCapture if _captures else None


class set_up:
    """A block of one-time set-up (an optimizer laying out its flat buffers): run, never recorded by a capture."""

    def __enter__(self):
        context.paused += 1

    def __exit__(self, *exc):
        context.paused -= 1


def recording():
    """The graph that records the launch being made now in this thread, or None."""
    return context.capturing if not context.paused else None


def per_step(action):
    """Run the host action now; a graph being captured runs it again, in order, at every replay (it updates the
    `Live` arguments of the launches after it)."""
    action()
    graph = recording()
    if graph is not None:
        graph.record_action(action)


def _arg(a):
    if a is None:
        return None
    if type(a) is Live:
        return a.value
    if isinstance(a, (bool, np.bool_)):
        return np.int32(a)
    if isinstance(a, (int, np.integer)):
        return np.int32(a)
    if isinstance(a, (float, np.floating)):
        return np.float32(a)
    return a


tensor_types = set()  # tensor.py's Tensor classes (kernels cannot import them): their buffer keys them
int_types = {int}  # and its Numel: an int's value keys it


def _key_arg(a):
    """What identifies an argument's bits: a tensor's memory (its storage's key); a float's exact bits (0.0 and -0.0
    differ, and 2.0 must not find a clone made for the integer 2: _with_args keys a float that is not zero as (None,
    value), which no int equals); a Live argument only by its place (its value is set at each enqueue); anything else
    by type and value."""
    storage = getattr(a, "storage", None)
    if storage is not None:
        return storage.key
    if type(a) is float:
        return a.hex()
    if type(a) is int:
        return a
    if type(a) is Live:
        return Live
    return (type(a), a)


_NO_OFFSET = np.uint64(0)


def cl_arguments(args):
    """(the values clSetKernelArg gets, in order; the index among them of each launch argument). Every __global
    pointer parameter of a kernel is followed by its byte offset (common.h's OFFSET_PARAM, in each signature): a
    tensor gives its buffer and its offset there, a (buffer, byte offset) pair the two, None (NULL) and a bare buffer
    an offset of 0."""
    values, at = [], []
    for a in args:
        at.append(len(values))
        storage = getattr(a, "storage", None)
        if storage is not None:
            values += (storage.buffer, np.uint64(storage.at))
        elif a is None or isinstance(a, cl.MemoryObjectHolder):
            values += (a, _NO_OFFSET)
        elif type(a) is tuple:  # (buffer, byte offset): a fused chain's slot
            values += (a[0], np.uint64(a[1]))
        else:
            values.append(_arg(a))
    return values, at


def _with_args(k, args):
    """(clone of k whose arguments are args, the indices of its Live arguments, its handle): set now unless a clone
    already holds them; the Live ones are set at each enqueue, from that launch's arguments. Called with _launch_lock
    held."""
    # One entry an argument (_key_arg), the common kinds inline, in one comprehension (no call an argument): this runs
    # at every launch. A float that is not zero (nor NaN) is (None, value), as _key_arg's a.hex() at a tenth its cost.
    key = tuple([a.storage.key if type(a) in tensor_types else a if type(a) in int_types else
                 (None, a) if type(a) is float and a and a == a else _key_arg(a) for a in args])
    clones = k.clones
    entry = clones.get(key)
    if entry is not None:
        clones.move_to_end(key)
        return entry
    global arguments_set
    arguments_set += 1
    clone = clones.popitem(last=False)[1][0] if len(clones) >= CLONES_PER_KERNEL else cl.Kernel(k.program, k.name)
    values, at = cl_arguments(args)
    clone.set_args(*values)
    entry = clones[key] = (clone, tuple((i, at[i]) for i, a in enumerate(key) if a is Live),
                           ctypes.c_void_p(clone.int_ptr))
    return entry


def own_clone(k, args):
    """A clone of k with args set that no launch cache shares (a captured graph's), and the index of each argument
    among its kernel's (cl_arguments)."""
    clone = cl.Kernel(k.program, k.name)
    values, at = cl_arguments(args)
    clone.set_args(*values)
    return clone, at


def event_free(name, argtypes, hold_gil=False):
    """The OpenCL entry point `name` of the library pyopencl itself links (looked up through its extension module, so
    the handles it made go to the implementation that made them), to be called through ctypes with no event:
    pyopencl's enqueues make an Event object each, which the callers of these never wait on (NVIDIA's driver takes
    about 7 us more per launch with one). hold_gil: call it without releasing the GIL (ctypes.PyDLL), which
    bench/replay_cost.py measures against releasing it. None where it cannot be found (pyopencl's enqueue is used
    then)."""
    try:
        fn = getattr((ctypes.PyDLL if hold_gil else ctypes.CDLL)(cl._cl.__file__), name)
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int32
    fn.argtypes = argtypes
    return fn


_size_p = ctypes.POINTER(ctypes.c_size_t)
ENQUEUE_ARGS = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, _size_p, _size_p,
                ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p]
# Called with ctypes objects only (handles as c_void_p, counts as c_uint32: _DIMS, _NO_EVENTS), so no argtypes: their
# conversion was a third of the call's cost (0.35 of 1.0 us on this CPU); one with ENQUEUE_ARGS takes them as well.
_enqueue_raw = event_free("clEnqueueNDRangeKernel", None)
_DIMS = tuple(ctypes.c_uint32(n) for n in range(4))  # work dimensions 0..3
_NO_EVENTS = ctypes.c_uint32(0)
_grids = {}  # global or local size -> its ctypes array, for the event-free enqueue
event_free_launches = _enqueue_raw is not None  # eager launches without events (False: through pyopencl's enqueue)


def _grid(size):
    arr = _grids.get(size)
    if arr is None:
        if len(_grids) >= 4096:
            _grids.clear()
        arr = _grids[size] = (ctypes.c_size_t * len(size))(*size)
    return arr


class NeedsStaging(Exception):
    """Raised by a window of a tensor past INDEX_LIMIT (tensor._Window) where a kernel argument wants a buffer; it
    carries the window's way to launch anyway, `stage(dev, k, global_size, local_size, args, what)` (which copies
    each window into a tensor of its own and back: tensor.staged_launch)."""

    def __init__(self, stage):
        super().__init__("a window of a tensor is not a buffer: its launch is staged")
        self.stage = stage


# The local size of a launch whose kernel checks its global ids in dimension 0 against its sizes and needs no
# particular work-group: `any_group` picks it (a padded global size) where the device has a padded_group, else the
# driver does (None).
ANY_GROUP = "any work-group"


def any_group(dev, global_size):
    """(global size, work-group) of an ANY_GROUP launch on dev: (global_size, None), the driver's choice, where dev
    has no padded_group. Else (PoCL, which builds each work-group size it runs; Oclgrind) one of three sizes, so that
    the sizes the tests and the networks meet add few builds. Counting some eight work-groups a compute unit (a
    launch of few heavy work-items, a plane each, must still spread over the cores): a launch too small for groups of
    16 takes groups of 1; a 1-D launch, or one whose first dimension is at least half of padded_group, takes
    padded_group (in dimension 0, then 1s) when it fills eight of them; another 1-D launch takes 16; the rest,
    several dimensions with short rows, takes whole rows (rows_group: nothing padded). Oclgrind always pads, so that
    its checks see every padded work-item."""
    group = dev.padded_group
    if group is None:
        return global_size, None
    first = total = global_size[0]
    for g in global_size[1:]:
        total *= g
    want = total // (8 * dev.compute_units)
    if dev.is_simulator:
        size = group
    elif want < 16:
        size = 1
    elif want >= group and (len(global_size) == 1 or first >= group // 2):
        size = group
    elif len(global_size) == 1:
        size = 16
    else:
        return global_size, rows_group(global_size)
    local_size = (size,) + (1,) * (len(global_size) - 1)
    return tuple(-(-g // l) * l for g, l in zip(global_size, local_size)), local_size


ROWS_GROUP_LIMIT = 512  # a first dimension this long or longer is left to the driver in rows_group's launches


def rows_group(global_size):
    """PoCL's work-group for a launch of several dimensions whose first is shorter than ROWS_GROUP_LIMIT, where the
    driver would pick: whole rows (dimension 0 entire, so nothing is padded and any kernel can take it), and rows
    shorter than 16 in up to 16 rows (a power of two dividing dimension 1). PoCL builds each work-group size it runs
    (125-220 ms each on the 2-core VM), and its own choice, divisors of every dimension, made a size for nearly every
    shape; this one depends on the first dimension alone. Eight ops timed both ways ran 0.90-1.24x as fast, within
    the VM's noise (bench/NOTES.md v26). None (the driver's choice) for a 1-D launch or a longer first dimension."""
    first = global_size[0]
    if len(global_size) == 1 or first >= ROWS_GROUP_LIMIT:
        return None
    rows = 1
    if first < 16:
        rows = 16
        while global_size[1] % rows:
            rows //= 2
    return (first, rows) + (1,) * (len(global_size) - 2)


def launch(dev, k, global_size, local_size, *args, what=""):
    """Enqueue kernel k (a Kernel from `kernel`); global_size is rounded up to a multiple of local_size (ANY_GROUP:
    the work-group `any_group` picks, or the driver's; None: the driver's, or rows_group's on PoCL)."""
    global launch_count
    picked = local_size is ANY_GROUP
    if picked:  # any_group, without the call where the driver picks (every GPU): this runs at every launch
        if dev.padded_group is None:
            local_size = None
        else:  # a pure function of the device and the size, remembered (few distinct sizes)
            grid = _any_groups.get((dev, global_size))
            if grid is None:
                if len(_any_groups) >= 4096:
                    _any_groups.clear()
                grid = _any_groups[(dev, global_size)] = any_group(dev, global_size)
            global_size, local_size = grid
    elif local_size is not None:  # rounded up to whole work-groups (remembered: few distinct pairs)
        padded = _padded.get((global_size, local_size))
        if padded is None:
            if len(_padded) >= 4096:
                _padded.clear()
            padded = _padded[(global_size, local_size)] = tuple(-(-g // l) * l for g, l in zip(global_size, local_size))
        global_size = padded
    elif dev.padded_group is not None and not dev.is_simulator:
        local_size = rows_group(global_size)
    if 0 in global_size:
        return None
    c = context
    profiler = c.profiler
    try:
        _launch_lock.acquire()  # _enqueue, inline; acquire and release rather than `with`: 0.05 us less a launch
        try:
            clone, live, handle = _with_args(k, args)
            for i, j in live:
                clone.set_arg(j, args[i].value)
            if event_free_launches and profiler is None and k.queue is not None and not _enqueue_raw(
                    k.queue, handle, _DIMS[len(global_size)], None, _grids.get(global_size) or _grid(global_size),
                    None if local_size is None else _grids.get(local_size) or _grid(local_size), _NO_EVENTS, None,
                    None):
                ev = None
            else:
                ev = cl.enqueue_nd_range_kernel(dev.queue, clone, global_size, local_size)
        finally:
            _launch_lock.release()
    except NeedsStaging as e:  # a window of a tensor past INDEX_LIMIT, found before anything was queued
        e.stage(dev, k, global_size, local_size, args, what)
        return None
    except cl.Error as e:
        ev = failed(dev, e, what or k.name, lambda: _enqueue(dev, k, args, global_size, local_size),
                    sizes=f" (global size {global_size}, work-group {local_size})")
    launch_count += 1
    if profiler is not None:
        profiler.records.append((profiler.tag, k.name, ev, what))
    if _captures and c.capturing is not None and not c.paused:  # no capture in any thread: no look-up in this one's
        c.capturing.record_launch(dev, k, args, global_size, local_size, picked)
    return ev


_any_groups = {}  # (device, global size) -> any_group(device, global size), for the devices with a padded_group
_padded = {}  # (global size, work-group) -> the global size rounded up to whole work-groups


def _enqueue(dev, k, args, global_size, local_size):
    """The launch (launch makes it inline; this is its retry), made without an event (through ctypes: pyopencl's
    enqueue makes an Event object each time, about 7 us of NVIDIA's driver a launch) unless a profiler wants the
    events. A refused raw enqueue is made again through pyopencl, whose error the caller handles as every launch's
    (`failed`). Returns the event, or None."""
    with _launch_lock:
        clone, live, handle = _with_args(k, args)
        for i, j in live:
            clone.set_arg(j, args[i].value)
        if event_free_launches and k.queue is not None and context.profiler is None:
            if not _enqueue_raw(k.queue, handle, _DIMS[len(global_size)], None, _grid(global_size),
                                None if local_size is None else _grid(local_size), _NO_EVENTS, None, None):
                return None
        return cl.enqueue_nd_range_kernel(dev.queue, clone, global_size, local_size)


# -- the one enqueue and error wrapper -------------------------------------------------------------------------------
_STATUS_NAMES = {v: k for k, v in vars(cl.status_code).items() if isinstance(v, int)}


def enqueue(dev, what, fn, *args, **kwargs):
    """fn(*args, **kwargs), an OpenCL call for dev (a copy, an allocation), with its failures handled as every
    launch's are (`failed`). `what` names it for the messages."""
    try:
        return fn(*args, **kwargs)
    except cl.Error as e:
        return failed(dev, e, what, lambda: fn(*args, **kwargs))


def failed(dev, error, what, again, wanted=0, sizes=""):
    """The error half of the one enqueue wrapper, shared by launches, replays, host and device copies and the pool's
    allocations; their calls stay outside it, so the path without an error costs nothing more. error: the cl.Error
    raised (or the status a raw call returned) by what ran.

    An allocation failure (drivers allocate lazily, at the first launch or copy that touches a buffer) releases the
    pool's cached buffers (which also drops the kept argument sets) and returns again() (the call made once more);
    what still fails to allocate raises OutOfMemory (wanted: bytes the call asked for, for its fitting_batch). Any
    other failure raises KernelError naming what ran (`what`, then `sizes`) and the OpenCL status."""
    code = error if type(error) is int else getattr(error, "code", None)
    cause = error if isinstance(error, BaseException) else None
    if code in _ALLOCATION_FAILURES:
        for holder in memory_holders:
            holder(dev).release_cached()
        try:
            return again()
        except cl.Error as e:
            code, cause = getattr(e, "code", None), e
    if code in _ALLOCATION_FAILURES:
        raise OutOfMemory(f"clnet: out of memory on {dev.name} in {what}{sizes} ({memory_note(dev)}): use a smaller "
                          "batch", dev, wanted) from cause
    said = cause if cause is not None else f"OpenCL status {_STATUS_NAMES.get(code, code)}"
    raise KernelError(f"clnet: {what} could not run on {dev.name}{sizes}: {said}. This is a clnet bug or the "
                      "driver's; please report it with the layer and input shape.") from cause
