"""Data-parallel training over MPI: one model, one rank per OpenCL device, on one host or many.

    mpiexec -n 4 clnet train resnet8 --batch 256 --device gpu

    import clnet.distributed as dist
    world = dist.init()                      # rank, size, local rank (ranks sharing this host's memory)
    dev = dist.device("gpu")                 # this rank's device: the local-rank-th GPU of its host
    model = dist.DataParallel(model.to(dev)) # rank 0's weights and buffers everywhere; gradients averaged

The transport is MPI (mpi4py over MPICH or Open MPI), through host buffers: each rank reads its gradients back from
the device, all-reduces them and writes the average back before the optimizer's step.

Gradients travel in buckets of about `bucket_mb` (parameters in reverse order, the order backward finishes them). A
post-accumulate-grad hook (clnet.autograd) tells a bucket when each of its gradients is complete; the bucket's
device-to-host copies are queued right then, and a communication thread waits for the copies and runs the bucket's
all-reduce while the main thread goes on queueing the rest of backward. Buckets are reduced strictly in index order
on every rank, so ranks never pair different buckets. The last bucket's hook waits for all of them and queues the
averages back to the device: after `loss.backward()` every `.grad` holds the global average, as with PyTorch's DDP.
`DataParallel.close()` removes the hooks and ends the communication thread.

Semantics (what `clnet.fit` builds on):

- The global batch B is split into contiguous shares, rank r taking its share of every global batch in the order one
  process would use (`clnet.data.share`). The loss of a rank is the mean over its share of n_r examples; each rank
  weights its gradients by n_r / n before the sum, so the sum is the gradient of the global mean over n examples,
  exactly one process's gradient up to float32 rounding. With B a multiple of the world size every share is B / size
  (weight 1 / size); the last, smaller batch of an epoch splits as evenly as it can (shares differ by one) and the
  weights keep it exact; a rank whose share is empty (fewer examples than ranks) contributes zeros (`skip_step`).
- Batch norm's running statistics stay per rank during an epoch (each rank's from its own shares; no SyncBatchNorm).
  `end_epoch()`, which `fit` calls at the end of each epoch before testing and checkpointing, gives every rank
  rank 0's, so every rank evaluates and saves the same model (and rank 0's weights too, with a warning, should
  the ranks' weights have drifted apart: devices of different kinds may round an update differently). A
  batch-norm layer normalises in train mode with its share's statistics, so a network with batch norm (or dropout,
  whose masks each rank draws alike from the same stream) does not reproduce one process's numbers; networks
  without them do, to float32 rounding. With them, the ranks match one process that runs each global batch's shares
  in turn, each with its rank's random stream, and keeps rank 0's statistics (tests/mpi_train.py's `run_shares`).
- A `clnet.Graph` capture cannot hold the all-reduce (host copies and MPI calls a replay would not repeat): a
  backward that reaches it inside a capture is refused with CaptureError; train data-parallel steps eagerly.
- A failure ends every rank: `init()` makes an uncaught exception in any thread print the traceback and a line naming
  the rank, then call MPI_Abort, which the launcher turns into the end of every rank. Every collective here waits with
  a deadline (`CLNET_MPI_TIMEOUT`, default 600 s, generous for first-run kernel builds and rank 0's tuning) and aborts
  when it passes, so a rank that hangs instead of dying is caught too, and named: a rank that has waited a while in
  a collective tells the others so (a small message), and the rank whose deadline passes names the ranks that never
  said they reached it. An error every rank meets alike at the same point (a device that does not exist) is no
  failure of one rank: rank 0 reports it as one process would, and every rank exits with status 1.
- `init()` refuses a launch whose MPI disagrees with its launcher (an mpiexec of one MPI, an mpi4py built against
  another: every rank would be rank 0 of 1 and train alone).
"""
import contextlib
import json
import os
import socket
import sys
import threading
import time
import traceback
import warnings
import zlib

import click
import numpy as np

try:
    from mpi4py import MPI
except ImportError as e:  # mpi4py is optional: clnet runs on one device without it
    raise ImportError("clnet.distributed needs mpi4py and an MPI library: pip install 'clnet[mpi]' (mpi4py and "
                      "MPICH from PyPI; an MPI installed on the system, with mpi4py built against it, works as "
                      f"well). The import failed: {e}") from e

import pyopencl as cl

from . import devices as device_mod
from . import nn, optim, tuning
from .autograd import register_post_accumulate_grad_hook
from .elementwise import zeros
from .errors import Error
from .graph import refuse_in_capture
from .nn.module import Module
from .tensor import tensor

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_BUCKET_MB = 25.0  # PyTorch DDP's default
NOTICE_TAG = 1  # "I wait in collective k", on World.notices
CLOSE_JOIN_S = 10.0  # close() waits this long for the idle communication thread to end


class MPIMismatch(Error, RuntimeError):
    """The launcher started this process as one of several ranks, and MPI says the job has one: the mpiexec belongs
    to another MPI than the one mpi4py was built against."""


# What launchers put in each rank's environment: variables holding the number of ranks (in the job, or on this host),
# and variables holding this rank's number (above 0: there are more). Hydra (MPICH, Intel MPI), Open MPI, PMIx,
# Slurm's PMI and MVAPICH.
LAUNCHER_SIZES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "MPI_LOCALNRANKS",
                  "OMPI_COMM_WORLD_LOCAL_SIZE")
LAUNCHER_RANKS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "MPI_LOCALRANKID",
                  "OMPI_COMM_WORLD_LOCAL_RANK")


class World:
    """This process's place in the MPI job. ``rank`` and ``size`` in COMM_WORLD; ``local_rank`` and ``local_size``
    among the ranks that share this host's memory; ``timeout`` the seconds any collective waits before aborting."""

    def __init__(self, comm, local, timeout):
        self.comm = comm  # a duplicate of COMM_WORLD: clnet's collectives never mix with the user's
        self.notices = comm.Dup()  # the waiting ranks' notices, apart from the collectives
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.local_rank, self.local_size = local.Get_rank(), local.Get_size()
        self.host = socket.gethostname()
        self.timeout = float(timeout)
        # Notices from a thread while the communication thread sits in an all-reduce need MPI_THREAD_MULTIPLE
        self.concurrent = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._entered = 0  # collectives this rank has entered: every rank enters them in one order
        self._entered_lock = threading.Lock()
        self._reached = {}  # rank -> the latest collective it told us it waits in
        self._sends = []  # (request, buffer) of notices not yet known to be sent

    @property
    def is_main(self):
        return self.rank == 0

    def __repr__(self):
        return (f"World(rank {self.rank} of {self.size}, local rank {self.local_rank} of {self.local_size} on "
                f"{self.host})")

    # -- collectives, each with a deadline -----------------------------------------------------------------------
    def enter(self):
        """Number the collective this rank starts now (1, 2, ...): the k-th of every rank is the same one."""
        with self._entered_lock:
            self._entered += 1
            return self._entered

    def announce_after(self):
        """Seconds a rank waits in a collective before it tells the others it is there."""
        return min(1.0, self.timeout / 4)

    def wait(self, request, what):
        """Wait for a non-blocking MPI request, driving MPI's progress; abort every rank past the deadline."""
        def pause(waited):  # MPI progresses only inside its calls: poll at once for 2 ms, then every 0.2 ms
            time.sleep(0 if waited < 2e-3 else 2e-4)
        self.watch(request.Test, what, self.enter(), pause)

    def watch(self, done, what, collective, pause=None, concurrent=False):
        """Poll ``done()`` until it is true: after `announce_after` seconds tell the other ranks that this one waits in
        collective number ``collective`` (an int, or a function giving it, None while unknown); past the deadline,
        abort naming the ranks that never said they reached it. ``concurrent``: another thread of this rank is
        inside MPI meanwhile (notices need MPI_THREAD_MULTIPLE then)."""
        number = collective if callable(collective) else (lambda: collective)
        talk = self.size > 1 and (self.concurrent or not concurrent)
        start, told = time.monotonic(), False
        while not done():
            waited = time.monotonic() - start
            if talk and not told and waited > self.announce_after() and number() is not None:
                self._announce(number())
                told = True
            if waited > self.timeout:
                self.timed_out(what, number() if talk else None, known=talk)
            if pause is not None:
                pause(waited)

    def _announce(self, collective):
        note = np.array([collective], np.int64)
        for r in range(self.size):
            if r != self.rank:
                self._sends.append((self.notices.Isend(note, dest=r, tag=NOTICE_TAG), note))
        self._read_notices()

    def _read_notices(self):
        status = MPI.Status()
        while self.notices.Iprobe(source=MPI.ANY_SOURCE, tag=NOTICE_TAG, status=status):
            source, got = status.Get_source(), np.empty(1, np.int64)
            self.notices.Recv(got, source=source, tag=NOTICE_TAG)
            self._reached[source] = max(self._reached.get(source, 0), int(got[0]))
        self._sends = [(r, b) for r, b in self._sends if not r.Test()]

    def behind(self, collective):
        """The other ranks that have not told this one they reached collective number ``collective``."""
        self._read_notices()
        return [r for r in range(self.size) if r != self.rank and self._reached.get(r, 0) < collective]

    def timed_out(self, what, collective=None, known=False):
        """Abort every rank: ``what`` waited past the deadline. With the collective's number (and ``known``: the
        notices were listened to), name the ranks that never reached it."""
        if collective is not None:
            late, grace = self.behind(collective), time.monotonic() + self.announce_after()
            while late and time.monotonic() < grace:  # a rank that came in just now tells us within this
                time.sleep(0.05)
                late = self.behind(collective)
            if late:
                names = ("rank " if len(late) == 1 else "ranks ") + ", ".join(map(str, late))
                detail = (f"for {names}, which never reached it (stopped, hanging, or busy elsewhere); "
                          + ("the other ranks wait in it too" if len(late) < self.size - 1 else "no other rank did"))
            else:
                detail = "with every other rank waiting in it too (MPI or the network stalled)"
        elif known:
            detail = "before it could start (this rank's device had not finished the data it sends)"
        else:
            detail = ("for the other ranks: one of them stopped responding (which one, this MPI cannot say: its "
                      "thread level is below MPI_THREAD_MULTIPLE)")
        abort(f"{what} waited more than {self.timeout:g} s {detail} (CLNET_MPI_TIMEOUT sets the limit)")

    def allreduce(self, array, what="an all-reduce", op="sum"):
        """Sum (or "min", "max") a NumPy array over the ranks, in place (every rank gets the same bits)."""
        if self.size > 1:
            self.wait(self.comm.Iallreduce(MPI.IN_PLACE, array, op=_OPS[op]), what)
        return array

    def broadcast(self, array, what="a broadcast"):
        """Rank 0's contents of a NumPy array on every rank, in place; returns it."""
        if self.size > 1:
            self.wait(self.comm.Ibcast(array, root=0), what)
        return array

    def broadcast_json(self, value, what="a broadcast"):
        """Rank 0's JSON-able value on every rank."""
        if self.size == 1:
            return value
        raw = json.dumps(value).encode() if self.rank == 0 else b""
        n = self.broadcast(np.array([len(raw)], np.int64), what)[0]
        buf = np.frombuffer(raw, np.uint8).copy() if self.rank == 0 else np.empty(n, np.uint8)
        return json.loads(self.broadcast(buf, what).tobytes().decode())

    def barrier(self, what="a barrier"):
        if self.size > 1:
            self.wait(self.comm.Ibarrier(), what)


_OPS = dict(sum=MPI.SUM, min=MPI.MIN, max=MPI.MAX)
_world = None


def init(timeout=None):
    """Join the MPI job (once; later calls return the same World). Under mpiexec every rank calls it; without
    mpiexec it is a job of one. With more than one rank, an uncaught exception in any thread of any rank stops them
    all (see `abort`). ``timeout``: seconds a collective may wait (default $CLNET_MPI_TIMEOUT, else 600).

    Raises MPIMismatch when the launcher's environment says this process is one of several ranks and MPI says the job
    has one (an mpiexec from another MPI than mpi4py's)."""
    global _world
    if _world is None:
        if timeout is None:
            timeout = float(os.environ.get("CLNET_MPI_TIMEOUT", DEFAULT_TIMEOUT_S))
        comm = MPI.COMM_WORLD
        if comm.Get_size() == 1:
            check_launcher_agrees()
        local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        _world = World(comm.Dup(), local, timeout)
        local.Free()
        if _world.size > 1:
            _install_abort_hooks()
            if MPI.Query_thread() < MPI.THREAD_SERIALIZED:  # the all-reduces run on a thread of their own
                abort(f"this MPI gives thread level {MPI.Query_thread()}; clnet.distributed needs "
                      "MPI_THREAD_SERIALIZED or more (mpi4py asks for MPI_THREAD_MULTIPLE unless mpi4py.rc says "
                      "otherwise)")
    return _world


def world():
    """The World of `init()`, which it calls if nobody has."""
    return init()


def launcher_ranks():
    """(variable, value, ranks) of the first launcher variable in the environment that says there are more ranks than
    one (ranks: how many at least), else None."""
    for name in LAUNCHER_SIZES + LAUNCHER_RANKS:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            ranks = int(value) if name in LAUNCHER_SIZES else int(value) + 1
            if ranks > 1:
                return name, value, ranks
    return None


def check_launcher_agrees():
    """Refuse (MPIMismatch) a job of one rank that the launcher started as one of several."""
    said = launcher_ranks()
    if said is None:
        return
    name, value, ranks = said
    words = MPI.Get_library_version().splitlines()[0].split(",")[0].split()
    library = " ".join(w for w in words if not w.endswith(":"))  # "MPICH 5.0.2", "Open MPI v4.1.5"
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")  # where pip's mpich puts its launcher
    example = f" ({beside})" if os.path.exists(beside) else ""
    raise MPIMismatch(f"clnet.distributed: the launcher started this process as one of "
                      f"{'at least ' if name in LAUNCHER_RANKS else ''}{ranks} ranks ({name}={value}), but MPI says "
                      f"the job has 1 rank (MPI.COMM_WORLD size 1): the mpiexec is not from the MPI that mpi4py was "
                      f"built against ({library}), so each process would train alone; launch with {library}'s "
                      f"mpiexec{example}, or install an mpi4py built against the MPI of this mpiexec")


def launched_by_mpi():
    """True when the environment is that of an MPI launcher's rank (MPICH's hydra, Open MPI, PMIx, Slurm's PMI)."""
    return any(k in os.environ for k in LAUNCHER_SIZES + LAUNCHER_RANKS)


# -- stopping every rank ---------------------------------------------------------------------------------------------
ABORT_GRACE_S = 0.5  # for the launcher to forward the last lines before MPI_Abort tears the job down


def abort(message, status=1, exc_info=None):
    """Print a line naming this rank (then the traceback of ``exc_info``, a (type, value, traceback) triple), then
    end every rank of the job (MPI_Abort): no rank is left waiting."""
    w = _world
    who = f"rank {w.rank} of {w.size} (host {w.host})" if w is not None else "a rank"
    try:
        sys.stdout.flush()
        # the line first: the launcher forwards output asynchronously, and what comes last can be lost in the
        # abort (seen with MPICH's hydra: the traceback arrived, a line written after it did not)
        sys.stderr.write(f"clnet.distributed: {who}: {message}; stopping every rank\n")
        if exc_info is not None:
            traceback.print_exception(*exc_info)
            sys.stderr.write(f"clnet.distributed: {who}: stopping every rank\n")
        sys.stderr.flush()
        time.sleep(ABORT_GRACE_S)
    finally:
        MPI.COMM_WORLD.Abort(status)
        # MPICH's MPI_Abort returns at once (the launcher kills the ranks a moment later): nothing of this process
        # may run on meanwhile (a second report, a step more)
        os._exit(status)


def _install_abort_hooks():
    def on_exception(kind, value, tb):
        if _on_every_rank(value):  # every rank stops here alike: rank 0 tells, as one process would; no abort
            if _world.rank == 0:
                sys.__excepthook__(kind, value, tb)
            return
        abort(f"failed with {kind.__name__}: {value}", exc_info=(kind, value, tb))

    def on_thread_exception(args):
        abort(f"thread {args.thread.name if args.thread else '?'} failed with {args.exc_type.__name__}: "
              f"{args.exc_value}", exc_info=(args.exc_type, args.exc_value, args.exc_traceback))

    sys.excepthook = on_exception
    threading.excepthook = on_thread_exception


def _on_every_rank(error):
    """Whether ``error`` (or an exception it was raised from) is one every rank raised alike (see `device`)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if getattr(error, "on_every_rank", False):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def stop_all_on_failure():
    """For command-line code whose errors end in SystemExit (click turns an error into exit status 1, Ctrl-C into
    'Aborted!'): leaving the block by an error or a non-zero exit ends every rank, with a line naming this one. A
    clean exit passes through. An error every rank raised alike (a device that does not exist) is no one rank's
    failure: rank 0 prints its one line, as one process does, and every rank exits with status 1."""
    try:
        yield
    except SystemExit as e:
        if init().size > 1 and e.code not in (None, 0):
            abort(f"exited with status {e.code}")
        raise
    except BaseException as e:
        if init().size > 1:
            if _on_every_rank(e):
                if init().rank != 0:
                    raise SystemExit(1) from None
                if hasattr(e, "format_message"):
                    raise
                raise click.ClickException(str(e)) from e
            if hasattr(e, "format_message"):  # click's errors for the user: the message, no traceback
                abort(f"error: {e.format_message()}")
            abort(f"failed with {type(e).__name__}: {e}", exc_info=sys.exc_info())
        raise


# -- devices ---------------------------------------------------------------------------------------------------------
def device(spec="auto"):
    """This rank's device: of the devices ``spec`` matches on this host ('auto', 'gpu', 'cpu', an index, or a name
    substring, as clnet.device), the local-rank-th, round robin. More ranks than matching devices share them (two
    ranks on one GPU, or on PoCL's one CPU device); an index names the same device for every rank.

    Every rank calls it (a collective). Should ``spec`` match nothing on some rank, every rank raises DeviceNotFound
    with the message one process would give (rank 0's, else that of the first rank that failed, naming it), marked
    ``on_every_rank`` so that neither `stop_all_on_failure` nor the exception hook turn it into an abort."""
    w = init()
    try:
        chosen, failure = _choose_device(spec, w), None
    except device_mod.DeviceNotFound as e:
        chosen, failure = None, e
    if w.size == 1:
        if failure is not None:
            raise failure
        return chosen
    failed = w.allreduce(np.array([failure is not None], np.int64), "the choice of devices")
    if failed[0] == 0:
        return chosen
    lines = gather_json(None if failure is None else [w.host, f"{failure}"], "the choice of devices")
    message = w.broadcast_json(None if lines is None else _first_failure(lines, w), "the choice of devices")
    error = failure if failure is not None and w.rank == 0 else device_mod.DeviceNotFound(message)
    error.on_every_rank = True
    raise error


def _first_failure(lines, w):
    """Of every rank's (host, message) or None, rank 0's message when it failed, else the first failing rank's,
    naming it."""
    if lines[0] is not None:
        return lines[0][1]
    r = next(i for i, line in enumerate(lines) if line is not None)
    host, message = lines[r]
    return f"rank {r} of {w.size} (host {host}): {message}"


def _choose_device(spec, w):
    rows = device_mod.list_devices()
    text = str(spec).strip().lower()
    if text.lstrip("-").isdigit():
        return device_mod.device(int(text))
    real = [r for r in rows if not r["simulator"]]
    gpus = [r for r in real if "GPU" in r["type"].split(" | ")]
    cpus = [r for r in real if "CPU" in r["type"].split(" | ")]
    if text == "auto":
        matches = gpus or cpus or real
    elif text == "gpu":
        matches = gpus
    elif text == "cpu":
        matches = cpus
    else:
        matches = [r for r in rows if text in f"{r['name']} {r['platform']}".lower()]
    if not matches:
        return device_mod.device(spec)  # raises DeviceNotFound with the listing and the fix
    if text == "auto" and gpus:  # auto picks the fastest kind, as clnet.device does
        matches = gpus
    return device_mod.device(matches[w.local_rank % len(matches)]["index"])


# -- tuning ----------------------------------------------------------------------------------------------------------
def tune_on_rank0(tune, dev):
    """Run ``tune()`` (e.g. ``lambda: clnet.tune.tune_first(...)``) on rank 0 alone while the others wait, then hand
    every rank rank 0's tuned choices for its device: the others reread their cache file and take rank 0's entries in
    memory when their device is the same kind (same platform, name and driver), so hosts without a shared cache
    agree as well. Only rank 0 writes the cache file (under its lock). Returns rank 0's result on rank 0, else None.
    Tune before wrapping the model in DataParallel: a tuning pass's backward would start all-reduces."""
    w = init()
    result = tune() if w.rank == 0 else None
    payload = [tuning.device_key(dev), dict(tuning.entries(dev))] if w.rank == 0 else None
    key, entries = w.broadcast_json(payload, "waiting for rank 0's tuning")
    if w.rank != 0:
        tuning.forget()
        if key == tuning.device_key(dev):
            tuning.entries(dev).update(entries)
    return result


# -- data parallelism ------------------------------------------------------------------------------------------------
def _read_async(t, out):
    """Queue a copy of device tensor t into the host array out; the event."""
    refuse_in_capture("DataParallel's all-reduce (gradients read back to the host for MPI)")
    return t.read_into(out)


class _Bucket:
    def __init__(self, index, params):
        self.index, self.params = index, params
        self.offsets = np.cumsum([0] + [p.size for p in params]).tolist()
        self.host = np.zeros(self.offsets[-1], np.float32)
        self.pending = len(params)
        self.events = []
        self.weight = 1.0
        self.queued = False
        self.done = threading.Event()  # all-reduced (set by the communication thread)
        self.collective = None  # the World's number of its all-reduce, once the communication thread starts it
        self.written = False  # its averages queued back to the device

    def view(self, i):
        return self.host[self.offsets[i]:self.offsets[i + 1]]


class DataParallel(Module):
    """Wraps a model placed on this rank's device: rank 0's parameters and buffers are copied to every rank, and the
    gradients of each backward are averaged over the ranks (the gradient of the global batch's mean loss).

    Parameters
    ----------
    module : clnet.nn.Module
        The model, already on this rank's device (``model.to(dist.device(...))``).
    bucket_mb : float
        Megabytes of gradients per all-reduce (25, PyTorch's default): smaller buckets start sooner during backward,
        larger ones cost fewer messages.
    world : World, optional
        Default: `init()`.

    ``state_dict``, ``load_state_dict`` and ``repr`` are the wrapped module's, so a checkpoint of a data-parallel run
    is an ordinary one and resumes under any world size. ``stats`` accumulates seconds spent waiting for device-to-host
    copies, inside all-reduces (communication thread), and blocked at the end of backward (main thread), and steps.
    """

    def __init__(self, module, bucket_mb=DEFAULT_BUCKET_MB, world=None):
        super().__init__()
        if module.device is None:
            raise ValueError("DataParallel: the model is on no device yet; move it first: "
                             "model.to(clnet.distributed.device('gpu'))")
        self.module = module
        d = self.__dict__
        d["device"] = module.device
        d["world"] = world or init()
        d["reduce"] = True
        d["stats"] = dict(copy_wait_s=0.0, allreduce_s=0.0, exposed_s=0.0, steps=0)
        self.broadcast_parameters()
        params = [p for p in module.parameters() if p.requires_grad]
        cap = max(float(bucket_mb), 1e-6) * 2**20
        buckets, current, size = [], [], 0
        for p in reversed(params):  # backward completes the last layers first
            current.append(p)
            size += 4 * p.size
            if size >= cap:
                buckets.append(current)
                current, size = [], 0
        if current:
            buckets.append(current)
        d["_buckets"] = [_Bucket(i, ps) for i, ps in enumerate(buckets)]
        d["_where"] = {id(p): (b, i) for b in self._buckets for i, p in enumerate(b.params)}
        # a job of one has nothing to average: no hooks, no copies
        d["_handles"] = ([register_post_accumulate_grad_hook(p, self._grad_ready) for p in params]
                         if d["world"].size > 1 else [])
        d["_weight"] = None  # this step's n_r / n; None: 1 / size
        d["_next"] = 0  # the next bucket to hand to the communication thread
        d["_active"] = False  # a backward has started reducing and finish() has not run
        d["_work"] = []
        d["_wake"] = threading.Condition()
        d["_thread"] = None
        d["_written"] = None  # marker behind the last write-back of the averages

    # -- the wrapped module's face -------------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self._active:
            missing = [n for n, p in self.module.named_parameters()
                       if p.requires_grad and self._where[id(p)][0].pending > 0]
            raise RuntimeError("DataParallel: the previous backward left gradients unreduced (no gradient reached "
                               f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}); call finish() after "
                               "backward when some parameters get no gradient, on every rank")
        return self.module(*args, **kwargs)

    def _state_items(self):
        return self.module._state_items()

    def __repr__(self):
        return repr(self.module)

    # -- weights and buffers -------------------------------------------------------------------------------------
    def broadcast_parameters(self):
        """Every rank takes rank 0's parameters and buffers."""
        self._broadcast([t for _, t in self.module._state_items()] + self.module.buffers(), "the weights")

    def check_in_sync(self):
        """Whether every rank holds the same parameters, bit for bit (a checksum per tensor, compared over the ranks).
        They should: every rank applies the same averaged gradients with the same optimizer. Ranks on different kinds
        of device can round an update differently and drift apart; `fit` checks at each epoch's end and, if they
        have, warns and gives every rank rank 0's weights. Reads every parameter back: one model's bytes."""
        sums = np.array([zlib.crc32(t.numpy().tobytes()) for t in self.module.parameters()], np.int64)
        low, high = self.world.allreduce(sums.copy(), "the weights' check", "min"), \
            self.world.allreduce(sums.copy(), "the weights' check", "max")
        return bool(np.array_equal(low, high))

    def end_epoch(self):
        """What `fit` does at the end of each epoch, before testing and checkpointing: every rank takes rank 0's
        buffers, and, should the ranks' parameters have drifted apart (`check_in_sync`), rank 0's parameters too,
        with a warning (the optimizer's state, momentum or Adam's moments, stays each rank's own)."""
        self.broadcast_buffers()
        if self.world.size > 1 and not self.check_in_sync():
            if self.world.rank == 0:
                warnings.warn("clnet.distributed: the ranks' weights differ at the end of the epoch (devices that "
                              "round the update differently?); every rank takes rank 0's")
            self.broadcast_parameters()

    def broadcast_buffers(self):
        """Every rank takes rank 0's buffers (batch norm's running statistics and counters)."""
        self._broadcast(self.module.buffers(), "the buffers")

    def _broadcast(self, tensors, what):
        if self.world.size == 1:
            return
        seen = set()
        for t in tensors:
            if id(t) in seen:
                continue
            seen.add(id(t))
            # np.array: a host tensor's 0-d value (batch norm's num_batches_tracked) comes back as a NumPy scalar,
            # whose buffer is read-only, and MPI writes rank 0's value into it
            host = self.world.broadcast(np.array(t.numpy()), f"the broadcast of {what}")
            if self.world.rank != 0:
                t.write(host)

    # -- one step's reduction ------------------------------------------------------------------------------------
    def share(self, n_local, n_global):
        """This step's share: n_local of the n_global examples of the global batch (call before backward). Without
        it every share counts 1 / size, right when the shares are equal."""
        self.__dict__["_weight"] = n_local / n_global if n_global else 0.0

    @contextlib.contextmanager
    def no_sync(self):
        """Backward inside the block leaves each rank's own gradients, unreduced (PyTorch's name). For gradient
        accumulation, and for timing the compute alone."""
        self.__dict__["reduce"] = False
        try:
            yield
        finally:
            self.__dict__["reduce"] = True

    def _grad_ready(self, p):
        if not self.reduce:
            return
        if p._grad_pending is not None:  # the all-reduce reads the gradient buffers themselves (autograd.deferral)
            p._settle_pending()
        bucket, _ = self._where[id(p)]
        if not self._active:
            self._begin()
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch(bucket)
            if self._next == len(self._buckets):  # every bucket is on its way: backward's end for this model
                self.finish()
                return
        self._write_back(wait=False)  # buckets already reduced go back while backward still runs

    def _begin(self):
        self.__dict__["_active"] = True
        if self._thread is None or not self._thread.is_alive():
            self.__dict__["_thread"] = threading.Thread(target=self._communicate, name="clnet-allreduce",
                                                        daemon=True)
            self._thread.start()

    def _launch(self, bucket, zero=False):
        """Queue the bucket's device-to-host copies (zeros for a parameter without a gradient, or for all when
        ``zero``), then hand every bucket whose turn has come to the communication thread."""
        if self._written is not None and (zero or any(p.grad is None for p in bucket.params)):
            self._written.wait()  # the host writes zeros where the last step's averages may still be on their way out
        bucket.events = []
        for i, p in enumerate(bucket.params):
            if p.grad is None or zero:
                bucket.view(i)[:] = 0.0
            else:
                bucket.events.append(_read_async(p.grad, bucket.view(i)))
        bucket.weight = 1.0 / self.world.size if self._weight is None else self._weight
        bucket.pending, bucket.queued = 0, True
        while self._next < len(self._buckets) and self._buckets[self._next].queued:
            with self._wake:
                self._work.append(self._buckets[self._next])
                self._wake.notify()
            self.__dict__["_next"] = self._next + 1

    def _communicate(self):
        """The communication thread: each bucket in index order, its copies waited for, weighted, all-reduced; None
        (from `close`) ends it."""
        while True:
            with self._wake:
                while not self._work:
                    self._wake.wait()
                bucket = self._work.pop(0)
            if bucket is None:
                return
            t0 = time.perf_counter()
            if bucket.events:
                cl.wait_for_events(bucket.events)
            t1 = time.perf_counter()
            if bucket.weight != 1.0:
                bucket.host *= np.float32(bucket.weight)
            if self.world.size > 1:  # blocking, on this thread of its own: MPI drives a large message's many
                # round trips at full speed inside the call, where polling a non-blocking one from Python paid a
                # sleep per round trip (1.7 MB: 5 ms); the main thread keeps the deadline (_write_back)
                bucket.collective = self.world.enter()
                self.world.comm.Allreduce(MPI.IN_PLACE, bucket.host, op=MPI.SUM)
            self.stats["copy_wait_s"] += t1 - t0
            self.stats["allreduce_s"] += time.perf_counter() - t1
            bucket.done.set()

    def skip_step(self):
        """Take part in this step's reduction with no examples (a rank whose share of a small last batch is empty):
        its contribution is zero, and its gradients become the others' weighted sum like everyone's."""
        if not self.reduce or self.world.size == 1:
            return
        if not self._active:
            self._begin()
        self.__dict__["_weight"] = 0.0
        for b in self._buckets:
            if not b.queued:
                self._launch(b, zero=True)
        self.finish()

    def _write_back(self, wait):
        """Queue the averages of every reduced bucket (in index order; with ``wait``, of all, waiting for each)
        back into its gradients. A reduced bucket's gradients are final: no later kernel of this backward touches
        them, and the in-order queue runs the writes after the copies that read them."""
        for b in self._buckets:
            if b.written:
                continue
            if not wait and not b.done.is_set():
                return
            self.world.watch(lambda b=b: self._reduced(b), f"the all-reduce of gradient bucket {b.index}",
                             lambda b=b: b.collective, concurrent=True)
            for i, p in enumerate(b.params):
                # the average overwrites the .grad: one marked None or zero (an optimizer's flat buffer) is written
                # in place, and reads as written
                p.grad = zeros(p.shape, p.device) if p._grad is None else p._grad
                p.grad.write(b.view(i), blocking=False)  # the next step's copies into b.host queue behind these
            b.written = True

    def _reduced(self, bucket):
        if bucket.done.wait(0.1):
            return True
        if not self._thread.is_alive():
            raise RuntimeError("DataParallel: the all-reduce thread ended without finishing the gradients")
        return False

    def finish(self):
        """Wait for every bucket's all-reduce and queue the averages back into the gradients. Runs by itself at the end
        of a backward that reached every parameter; call it (on every rank) after a backward that did not. Nothing to
        do when no reduction is under way."""
        if not self._active:
            return
        for b in self._buckets:
            if not b.queued:  # no gradient reached its parameters in this backward
                self._launch(b)
        t0 = time.perf_counter()
        self._write_back(wait=True)
        self.stats["exposed_s"] += time.perf_counter() - t0
        self.stats["steps"] += 1
        for b in self._buckets:
            b.pending, b.queued, b.events, b.written, b.collective = len(b.params), False, [], False, None
            b.done.clear()
        d = self.__dict__
        d["_written"] = cl.enqueue_marker(self.device.queue)  # before the host writes into b.host again
        d["_next"], d["_active"], d["_weight"] = 0, False, None

    def close(self):
        """Finish a reduction under way (`finish`), remove the gradient hooks (the model trains alone again) and end
        the communication thread. Closing again does nothing."""
        self.finish()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        thread = self._thread
        if thread is not None:
            with self._wake:
                self._work.append(None)
                self._wake.notify()
            thread.join(CLOSE_JOIN_S)  # finish() left it idle: it ends at once
            if thread.is_alive():
                raise RuntimeError(f"DataParallel.close: the communication thread did not end within "
                                   f"{CLOSE_JOIN_S:g} s")
            self.__dict__["_thread"] = None


# -- reporting -------------------------------------------------------------------------------------------------------
def gather_json(value, what="a gather"):
    """Every rank's JSON-able value, as a list on rank 0 (None elsewhere)."""
    w = init()
    if w.size == 1:
        return [value]
    raw = json.dumps(value).encode()
    sizes = np.zeros(w.size, np.int64)
    sizes[w.rank] = len(raw)
    w.allreduce(sizes, what)
    buf = np.zeros(int(sizes.sum()), np.uint8)
    start = int(sizes[:w.rank].sum())
    buf[start:start + len(raw)] = np.frombuffer(raw, np.uint8)
    w.allreduce(buf, what)  # each rank fills its own span: the sum is the concatenation
    if w.rank != 0:
        return None
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [json.loads(buf[bounds[i]:bounds[i + 1]].tobytes().decode()) for i in range(w.size)]


def time_data_parallel(model, dev, x, labels, iterations=10, warmup=5, bucket_mb=DEFAULT_BUCKET_MB):
    """Time a data-parallel training step (forward, backward with the all-reduce, SGD update) of ``model`` on every
    rank, each rank on its own batch ``x`` (host array; weak scaling: the batch is per rank), and the same step under
    ``no_sync()`` (compute alone). Rank 0 gets the summary, other ranks None: per rank the medians of both step
    times and where the all-reduce's time went per step (on the communication thread: waiting for the device, whose
    in-order queue runs the bucket's copies after the backward kernels queued before them, and inside MPI; on the
    main thread: blocked at the end of backward), the aggregate images/s (the slowest
    rank sets the pace) and the scaling efficiency (compute-only time over step time, slowest rank)."""
    w = init()
    dp = model if isinstance(model, DataParallel) else DataParallel(model.to(dev), bucket_mb, w)
    opt = optim.SGD(dp.parameters(), lr=1e-4, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    xt, yt = tensor(x, dev), tensor(labels, dev)

    def step():
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(dp(xt), yt).backward()
        dp.finish()
        opt.step()
        dev.synchronize()
        return time.perf_counter() - t0

    for _ in range(warmup):
        step()
    with dp.no_sync():
        step()
        w.barrier("the timing's barrier")
        compute = float(np.median([step() for _ in range(iterations)]))
    step()
    w.barrier("the timing's barrier")
    before = dict(dp.stats)
    full = float(np.median([step() for _ in range(iterations)]))
    steps = max(dp.stats["steps"] - before["steps"], 1)
    parts = {k: (dp.stats[k] - before[k]) / steps for k in ("copy_wait_s", "allreduce_s", "exposed_s")}
    rows = gather_json(dict(rank=w.rank, host=w.host, device=dev.name, step_s=full, compute_s=compute, **parts),
                       "the gather of the timings")
    if rows is None:
        return None
    slowest = max(rows, key=lambda r: r["step_s"])
    n = len(x)
    for r in rows:
        r["images_per_s"] = n / r["step_s"]
    return dict(ranks=len(rows), batch_per_rank=n, gradient_bytes=4 * sum(p.size for p in dp.parameters()),
                buckets=len(dp._buckets), per_rank=rows, images_per_s=len(rows) * n / slowest["step_s"],
                efficiency=slowest["compute_s"] / slowest["step_s"])


def format_timing(t):
    """Lines for a person: per rank, then the aggregate."""
    lines = [f"data-parallel step over {t['ranks']} ranks, batch {t['batch_per_rank']} per rank, "
             f"{t['gradient_bytes'] / 2**20:.1f} MiB of gradients in {t['buckets']} buckets:"]
    for r in t["per_rank"]:
        lines.append(f"  rank {r['rank']} ({r['host']}, {r['device']}): step {1e3 * r['step_s']:.2f} ms "
                     f"(compute alone {1e3 * r['compute_s']:.2f} ms), {r['images_per_s']:.0f} images/s; per step, "
                     f"on the communication thread {1e3 * r['copy_wait_s']:.2f} ms waiting for the device (the rest "
                     f"of backward's kernels, then the copies out) and {1e3 * r['allreduce_s']:.2f} ms in MPI "
                     f"(waiting for the slowest rank included); the main thread blocked "
                     f"{1e3 * r['exposed_s']:.2f} ms at the end of backward")
    lines.append(f"  aggregate {t['images_per_s']:.0f} images/s, scaling efficiency {100 * t['efficiency']:.0f}%")
    return "\n".join(lines)
