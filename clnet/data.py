"""Data sets and the batch feeder: an IDX reader (MNIST, Fashion-MNIST), where the files are found, and a
double-buffered loader that shuffles, normalises and uploads the next batch while the device computes the current one.

Nothing is downloaded: the files come from ``--data-dir``, ``$CLNET_DATA`` or, for Fashion-MNIST, Debian's
``dataset-fashion-mnist`` package.
"""
import gzip
import math
import os
import queue
import threading
import time
import zlib

import numpy as np

from . import kernels
from .tensor import Tensor
from .errors import Error

# IDX element types by their code in the third magic byte; multi-byte types are big-endian.
IDX_DTYPES = {0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
              0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}

SYSTEM_DIRS = {"fashion-mnist": "/usr/share/datasets/fashion-mnist"}
FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
# Mean and standard deviation of the training images scaled to [0, 1].
NORMALISATION = {"mnist": (0.1307, 0.3081), "fashion-mnist": (0.2860, 0.3530)}
CLASSES = {"mnist": tuple(str(i) for i in range(10)),
           "fashion-mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                             "Bag", "Ankle boot")}
DATASETS = tuple(NORMALISATION)


class IDXError(Error, ValueError):
    """A file that is not a valid IDX file; the message names the file and what is wrong."""


class DataNotFound(Error, FileNotFoundError):
    """The data set's files are in none of the places searched; the message says which files and how to get them."""


def read_idx(path):
    """Read an IDX file (gzip-compressed or raw) into a NumPy array of its own dtype and dimensions.

    The magic number, element type, dimensions and file length are checked; any problem raises IDXError naming the
    file.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise IDXError(f"{path}: cannot read: {e.strerror or e}") from e
    compressed = raw[:2] == b"\x1f\x8b"
    if compressed:
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:  # zlib.error: a flipped byte in the deflate stream
            raise IDXError(f"{path}: damaged gzip data ({e}); the file is truncated or corrupt") from e
    if len(raw) < 4:
        raise IDXError(f"{path}: {len(raw)} bytes is too short for an IDX header (4 bytes of magic number)")
    if raw[0] != 0 or raw[1] != 0:
        raise IDXError(f"{path}: bad magic number 0x{raw[:4].hex()}; an IDX file starts with two zero bytes, "
                       "a type code and the number of dimensions")
    code, ndim = raw[2], raw[3]
    if code not in IDX_DTYPES:
        raise IDXError(f"{path}: unknown IDX element type 0x{code:02x}; expected one of "
                       f"{', '.join(f'0x{c:02x}' for c in IDX_DTYPES)}")
    if ndim == 0:
        raise IDXError(f"{path}: the header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IDXError(f"{path}: truncated header: {ndim} dimensions need {header} bytes, the file has {len(raw)}")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    dtype = IDX_DTYPES[code]
    expected = header + math.prod(dims) * dtype.itemsize  # Python's integers: 4 dimensions of 2^16 overflow int64
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "has trailing bytes"
        raise IDXError(f"{path}: {what}: dimensions {dims} of {dtype.name} need {expected} bytes, "
                       f"the {'decompressed ' if compressed else ''}data has {len(raw)}")
    return np.frombuffer(raw, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def write_idx(path, array):
    """Write an array as an IDX file (gzip-compressed when the name ends in .gz); the inverse of read_idx."""
    array = np.asarray(array)
    codes = {v.newbyteorder("="): k for k, v in IDX_DTYPES.items()}
    native = array.dtype.newbyteorder("=")
    if native not in codes:
        raise TypeError(f"write_idx: IDX holds uint8, int8, int16, int32, float32 or float64, not {array.dtype}")
    code = codes[native]
    body = (bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
            + np.ascontiguousarray(array, IDX_DTYPES[code]).tobytes())
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(body)


def search_dirs(name, data_dir=None):
    """Directories searched for a data set, in order: --data-dir, else $CLNET_DATA, else the system location.

    A given directory is searched itself and then its subdirectory named after the data set, so one
    ``$CLNET_DATA`` can hold both ``mnist/`` and ``fashion-mnist/``.
    """
    if data_dir is not None:
        roots = [str(data_dir)]
    elif os.environ.get("CLNET_DATA"):
        roots = [os.environ["CLNET_DATA"]]
    else:
        roots = [SYSTEM_DIRS[name]] if name in SYSTEM_DIRS else []
    return [d for r in roots for d in (r, os.path.join(r, name))]


def _how_to_get(name):
    needed = ", ".join(f"{f}[.gz]" for split in ("train", "test") for f in FILES[split])
    ways = []
    if name == "fashion-mnist":
        ways.append(f"install Debian's data package (`sudo apt-get install dataset-fashion-mnist`, which puts them "
                    f"in {SYSTEM_DIRS[name]})")
    ways.append(f"place the official {name} IDX files in a directory and pass --data-dir DIR or set CLNET_DATA=DIR")
    return f"{name} needs the files {needed}. To get them, " + ", or ".join(ways) + "."


def find_files(name, split, data_dir=None):
    """(images path, labels path) of a split ('train' or 'test'), or DataNotFound saying what is needed."""
    if name not in NORMALISATION:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    dirs = search_dirs(name, data_dir)
    for d in dirs:
        found = []
        for base in FILES[split]:
            for candidate in (base + ".gz", base):
                if os.path.isfile(os.path.join(d, candidate)):
                    found.append(os.path.join(d, candidate))
                    break
        if len(found) == 2:
            return tuple(found)
    where = ", ".join(dirs) if dirs else "nowhere (no --data-dir, no $CLNET_DATA and no system location)"
    raise DataNotFound(f"the {name} {split} files were not found (searched {where}). {_how_to_get(name)}")


class Dataset:
    """Images (N, H, W) or (N, C, H, W) and labels (N,) of one split, with the normalisation of its data set; uint8
    images are scaled to [0, 1] before it. Features (N, F) serve a network of dense layers."""

    def __init__(self, images, labels, name="custom", mean=0.0, std=1.0, classes=None):
        images, labels = np.asarray(images), np.asarray(labels)
        if images.ndim == 3:
            images = images[:, None]
        if images.ndim not in (2, 4) or labels.shape != (len(images),):
            raise ValueError(f"Dataset: expected images (N, H, W) or (N, C, H, W), or features (N, F), and labels "
                             f"(N,), got {images.shape} and {labels.shape}")
        if images.dtype.kind not in "fiu":
            raise TypeError(f"Dataset: images must be real numbers, got {images.dtype}; pass uint8 or float arrays")
        if labels.dtype.kind not in "iuf" or (labels.dtype.kind == "f" and not np.all(labels == np.round(labels))):
            raise TypeError(f"Dataset: labels must be whole-number class indices, got {labels.dtype} "
                            + (f"{labels[labels != np.round(labels)][:1]}" if labels.dtype.kind == "f" else ""))
        if labels.size and (labels.min() < 0 or labels.max() > np.iinfo(np.int32).max):
            raise ValueError(f"Dataset: labels are class indices from 0, got values {labels.min()} to {labels.max()}")
        if not (np.isfinite(mean) and np.isfinite(std) and std > 0):
            raise ValueError(f"Dataset: the normalisation needs a finite mean and a positive finite std, got mean "
                             f"{mean}, std {std}")
        self.images, self.labels = images, labels.astype(np.int32)
        self.name, self.mean, self.std = name, float(mean), float(std)
        self.classes = tuple(classes) if classes is not None else tuple(str(c) for c in range(self.num_classes))

    @property
    def num_classes(self):
        return int(self.labels.max()) + 1 if len(self.labels) else 0

    def __len__(self):
        return len(self.labels)

    def subset(self, n):
        """The first n examples (the IDX files are already in random order)."""
        if n is None or n >= len(self):
            return self
        if n <= 0:
            raise ValueError(f"subset: need a positive number of examples, got {n}")
        return Dataset(self.images[:n], self.labels[:n], self.name, self.mean, self.std, self.classes)

    def batch(self, indices):
        """Normalised float32 images (B, C, H, W) and int32 labels (B,) for the given indices."""
        x = self.images[indices].astype(np.float32)
        if self.images.dtype == np.uint8:
            x *= 1.0 / 255.0
        x -= self.mean
        x *= 1.0 / self.std
        return x, self.labels[indices]

    def __repr__(self):
        return f"Dataset({self.name!r}, {len(self)} images of shape {self.images.shape[1:]})"


def as_dataset(data, what="data"):
    """``data`` as something fit and evaluate can feed: a Dataset (or any object with ``batch`` and ``__len__``) as
    it is, a pair of arrays (images, labels) wrapped in a Dataset without normalisation; anything else is refused
    with a TypeError naming ``what``."""
    if hasattr(data, "batch") and hasattr(data, "__len__"):
        return data
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(a, np.ndarray) for a in data):
        try:
            return Dataset(*data)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{what}: {e}") from e
    kind = (f"a {type(data).__name__} of {len(data)} items" if isinstance(data, (tuple, list))
            else f"a {type(data).__name__}")
    raise TypeError(f"{what}: expected a clnet.data.Dataset or a pair of NumPy arrays (images, labels), got {kind}")


def load(name, split="train", data_dir=None):
    """Load a split ('train' or 'test') of 'mnist' or 'fashion-mnist' as a Dataset; both files are validated."""
    images_path, labels_path = find_files(name, split, data_dir)
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise IDXError(f"{images_path}: expected uint8 images of 3 dimensions, got {images.dtype.name} with "
                       f"dimensions {images.shape}")
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise IDXError(f"{labels_path}: expected uint8 labels of 1 dimension, got {labels.dtype.name} with "
                       f"dimensions {labels.shape}")
    if len(images) != len(labels):
        raise IDXError(f"{labels_path}: {len(labels)} labels for {len(images)} images in {images_path}")
    if labels.size and labels.max() >= len(CLASSES[name]):
        raise IDXError(f"{labels_path}: label {labels.max()} is out of range for {len(CLASSES[name])} classes")
    mean, std = NORMALISATION[name]
    return Dataset(images, labels, name, mean, std, CLASSES[name])


def epoch_order(n, seed, epoch, shuffle=True):
    """The example order of one epoch: a permutation drawn from (seed, epoch) alone, so a resumed run repeats it."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([int(seed), int(epoch)]).permutation(n)


def share(n, rank, size):
    """(start, stop) of rank's contiguous share of n items split over size ranks: the shares differ by at most one
    item, the first n % size ranks taking the extra one, so equal shares whenever size divides n."""
    if not 0 <= rank < size:
        raise ValueError(f"share: rank {rank} is not one of {size} ranks")
    q, r = divmod(int(n), int(size))
    start = rank * q + min(rank, r)
    return start, start + q + (rank < r)


def check_global_batch(batch, size):
    """A global batch that splits evenly over size ranks, or ValueError saying what to pass."""
    if batch % size:
        below, above = batch // size * size, -(-batch // size) * size
        raise ValueError(f"the batch {batch} is the global batch and must split evenly over the {size} ranks: use "
                         f"a multiple of {size} (" + (f"{below} or " if below else "") + f"{above})")


class Loader:
    """Batches of one epoch on the device, double-buffered.

    A background thread gathers and normalises the next host batches while the device works.  Small batches come in
    blocks of up to BLOCK_BYTES (at batch 1 a hand-off between threads and two host copies per batch cost more than
    the step itself), where the data set is a `Dataset` whose `batch` is not overridden: the thread gathers a block's
    batches at once, the block is uploaded in one non-blocking copy, and each batch is then copied out of it on the
    device (one launch for its images and labels).  Larger batches are uploaded one at a time, each straight into
    the tensors it is delivered in.  Either way the copies are queued on the device's in-order queue into one of
    two buffer pairs (slot i % 2), so a loop that takes batch i + 1 right after enqueueing step i, and only then reads
    step i's results, keeps the device fed: the copy runs behind step i and before step i + 1 without the host
    waiting.  Step i - 1, the last user of the other slot, is already ahead of it in the queue.  ``wait_s`` is the
    time the loop waited for the host side: the stall.

    Iterating yields (x, y, labels): the batch's device tensors and its labels on the host.

    ``into(x_shape, y_shape)``: tensors (x, y) to deliver a batch of those shapes into instead of the loader's own
    slots, or None; a captured training step's static inputs (`graph.StepReplayer.inputs`), which a loop replays
    right after taking the batch.

    ``shard=(rank, size)``: each batch is rank's contiguous share (`share`) of the global batch of that size, the
    batches taken in the order one process takes them; a share can be empty (a last batch smaller than size).
    """

    BLOCK_BYTES = 4 << 20
    MAX_BLOCK = 256  # batches a block holds at most

    def __init__(self, data, batch, device, order, start=0, prefetch=2, shard=None, into=None):
        self.data, self.batch, self.device = data, int(batch), device
        self.order = order
        self.shard = shard
        self.into = into
        self.start = int(start)
        self.starts = list(range(start * self.batch, len(order), self.batch))
        self.prefetch = prefetch
        self.wait_s = 0.0
        self.nonfinite = []  # the epoch's batch numbers (from 0) whose inputs held NaN or inf, in order
        self._slots = {}
        # Blocks only where Dataset.batch is clnet's own: a subclass's batch() (augmentation, its own statistics)
        # sees the batches it always saw.
        images = getattr(data, "images", None) if type(data).batch is Dataset.batch else None
        # Integer images normalised by a finite mean and a positive std cannot produce NaN: only others are checked
        self._check_finite = images is None or images.dtype.kind == "f"
        example = 4 * (int(np.prod(images.shape[1:])) + 1) if images is not None else None
        self.per_block = 1 if example is None or shard is not None else \
            max(1, min(self.MAX_BLOCK, self.BLOCK_BYTES // (example * self.batch)))

    def __len__(self):
        return len(self.starts)

    def _produce(self, out, stop):
        def deliver(item):  # False once the consumer has gone (it stopped early): then nothing more is put
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            for b in range(0, len(self.starts), self.per_block):
                runs = [self.order[s:s + self.batch] for s in self.starts[b:b + self.per_block]]
                if self.shard is not None:
                    runs = [r[slice(*share(len(r), *self.shard))] for r in runs]
                x, y = self.data.batch(np.concatenate(runs) if len(runs) > 1 else runs[0])
                if self._check_finite and not np.isfinite(x).all():  # named if training diverges (train.fit)
                    at = np.cumsum([0] + [len(r) for r in runs])
                    self.nonfinite += [self.start + b + j for j in range(len(runs))
                                       if not np.isfinite(x[at[j]:at[j + 1]]).all()]
                if not deliver((x, y, [len(r) for r in runs])):
                    return
            deliver(None)  # a blocking put here would hang the consumer's join when it stops at the last batch
        except BaseException as e:  # handed to the consumer, which re-raises it
            deliver(e)

    def _destination(self, i, x_shape, y_shape):
        """The tensors batch i goes into: `into`'s for its shapes, else slot i % 2's."""
        dest = self.into(x_shape, y_shape) if self.into is not None else None
        if dest is not None:
            return dest
        key = (i % 2, x_shape, y_shape)
        if key not in self._slots:
            self._slots[key] = (Tensor(x_shape, np.float32, self.device), Tensor(y_shape, np.int32, self.device))
        return self._slots[key]

    def _batches(self, b, x, y, sizes):
        """Block b's batches (x, y, labels), each copied into its tensors as it is taken (so after the step before
        it has been queued). The host arrays stay alive with their uploads' events."""
        if len(sizes) == 1:
            tx, ty = self._destination(b * self.per_block, x.shape, y.shape)
            yield tx.write(x, blocking=False), ty.write(y, blocking=False), y
            return
        key = ("block", b % 2, x.shape)
        if key not in self._slots:
            self._slots[key] = (Tensor(x.shape, np.float32, self.device), Tensor(y.shape, np.int32, self.device))
        bx, by = self._slots[key]
        bx.write(x, blocking=False)
        by.write(y, blocking=False)
        starts = np.cumsum([0] + list(sizes[:-1]))
        lows, highs = np.minimum.reduceat(y, starts).tolist(), np.maximum.reduceat(y, starts).tolist()
        example = int(np.prod(x.shape[1:]))
        for j, (at, n) in enumerate(zip(starts.tolist(), sizes)):
            labels = y[at:at + n]
            tx, ty = self._destination(b * self.per_block + j, (n,) + x.shape[1:], labels.shape)
            kernels.launch(self.device, kernels.kernel(self.device, "elementwise.cl", "copy_batch"),
                           (tx.size + ty.size,), kernels.ANY_GROUP, bx, at * example, tx.size, by, at, ty.size, tx,
                           ty, what="a batch out of the loader's block")
            ty.value_range = (lows[j], highs[j])
            yield tx, ty, labels

    def __iter__(self):
        out, stop = queue.Queue(maxsize=self.prefetch), threading.Event()
        worker = threading.Thread(target=self._produce, args=(out, stop), daemon=True)
        worker.start()

        def take():
            t0 = time.perf_counter()
            item = out.get()
            self.wait_s += time.perf_counter() - t0
            if isinstance(item, BaseException):
                raise item
            return item

        try:
            b = 0
            while True:
                item = take()
                if item is None:
                    return
                yield from self._batches(b, *item)
                b += 1
        finally:
            stop.set()
            worker.join()
