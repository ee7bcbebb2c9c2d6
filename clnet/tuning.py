"""Per-device kernel parameters and algorithm choices.

Every op with a choice to make (a GEMM's tile shape and split-K factor, a convolution's algorithm) asks `choose`
with a key naming its shape. The answer comes from the persistent cache, filled by the autotuner (`clnet tune`,
clnet/tune.py) for this platform, device and driver, or else from the default entry for the device's class. One
entry drives both a kernel's defines and its launch geometry, so the two cannot drift apart.
"""
import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import time
import types
import warnings

from . import kernels
from .files import UnsafeFolder, open_folder, write_atomically

# GPU-shaped matrix product: tiles staged in local memory. Large tiles only pay when they fill the device.
GEMM_TILED_SMALL = dict(kernel="gemm_tiled", TM=64, TN=64, TK=16, WM=4, WN=4)
# 128x128 tiles in 16-deep double-buffered slices: with float4 fetches 42.9 TFLOP/s at SGEMM 4096 on the H200
# whichever way A's k runs, the fastest 128x128 shape with A k-fast and within 4% of the fastest with A m-fast
# (single-buffered, 44.7), with no transposed copy needed (bench/results/h200-v9a, sgemm-variants-h200.json).
GEMM_TILED_LARGE = dict(kernel="gemm_tiled", TM=128, TN=128, TK=16, WM=8, WN=8)
# Products with few rows (a squeeze layer's 16 output channels; a Winograd data gradient over 16 input channels): a
# 64-row tile computes four times the rows it stores, and squeezenet1_1's 16 x 193600 x 128 forward ran at 330 GB/s
# on an H100, a tenth of the memory's speed (bench/NOTES.md, v35).
GEMM_TILED_THIN = dict(kernel="gemm_tiled", TM=16, TN=128, TK=16, WM=4, WN=4)
GEMM_TILED_32 = dict(kernel="gemm_tiled", TM=32, TN=64, TK=16, WM=4, WN=4)
# GPUs: products of at most so many rows, their default tile. The H200's shipped table (tuned over the zoo's networks)
# never chose a 128-row tile for a product of 64 rows or fewer, and chose 32x64 for most of those of 32 or fewer.
THIN_DEFAULTS = ((16, GEMM_TILED_THIN), (32, GEMM_TILED_32), (64, GEMM_TILED_SMALL))
# CPU-shaped: register blocks, wide vector loads, no local memory; B copied per 256-deep slice into a private sliver,
# one work-item per work-group (SGEMM 1024^3 on 2 cores: 0.78-0.79x NumPy, bench/results/pocl-v5 and pocl-v7).
GEMM_BLOCK = dict(kernel="gemm_block", RM=48, KC=256, WG=1)

# What the autotuner tries per GEMM shape (besides split-K factors and, for single-buffered or deep tiles,
# transposed operands). Single-buffered slices (LBUF=1) hold 32-deep slices in 48 KiB, or a 16-deep one in fewer
# registers (158 against 175 per work-item: 44.7 TFLOP/s at SGEMM 4096 with A m-fast, h200-v9a). Dropped after
# measuring on the H200: 128x256 tiles (lost to 128x128 at SGEMM 4096, won some im2col weight-gradient products by
# at most 6%, h200-v8) and 128x128x8 (never chosen by any network in h200-v9a, 0.82-0.86x the 16-deep tile at SGEMM
# 4096).
GEMM_CANDIDATES = dict(
    gpu=[GEMM_TILED_LARGE, GEMM_TILED_SMALL,
         dict(GEMM_TILED_LARGE, LBUF=1),
         dict(GEMM_TILED_LARGE, TK=32, LBUF=1),
         dict(kernel="gemm_tiled", TM=128, TN=64, TK=16, WM=8, WN=4),
         dict(kernel="gemm_tiled", TM=64, TN=128, TK=16, WM=4, WN=8),
         GEMM_TILED_32,
         dict(GEMM_TILED_SMALL, TK=32),
         GEMM_TILED_THIN],
    cpu=[GEMM_BLOCK, dict(kernel="gemm_block", RM=12), dict(kernel="gemm_block", RM=96, KC=128, WG=1),
         dict(kernel="gemm_block", RM=12, KC=256, WG=1)],
)

# One entry per device class: the kernel's defines and its launch geometry. OB output channels per work-item (a
# vector width: 2, 4, 8 or 16). CPU shape: PX pixels per run (PX accumulator vectors), ROWS output rows per work-group
# (None: the driver's choice). GPU shape: LS pixels per work-group, at most WLOCAL_MAX floats of weights staged in
# local memory (else they are read from global memory).
DIRECT_CPU = dict(kernel="conv2d_fwd_direct_rows", OB=8, PX=8, ROWS=4)
DIRECT_GPU = dict(kernel="conv2d_fwd_direct", OB=4, LS=128, WLOCAL_MAX=4096)
# CPU shape: 16 channels per work-item when the window is deep (compute-bound: half the loads of x per multiply-add;
# AlexNet conv1 7 ms against 9.7 with 8) and the group has channels enough to fill the blocks; else 8 (VGG conv1 took
# twice as long with 16, perhaps because its 16 output planes, written together, lie a multiple of 4 KiB apart), and
# narrower blocks for groups of fewer than 8 channels.
DEEP_WINDOW = 64

# Convolution algorithm defaults. H200: the tuner picked F(2x2, 3x3)'s forward and data gradient for every VGG 3x3
# layer. PoCL: direct beat im2col's forward 1.3-2.9x for 1 to 64 input channels per group (first layers, LeNet, 3x3
# 64->64), and im2col's row-per-work-item lowering beats Winograd's transforms. Winograd's weight gradient is slower
# on PoCL; on the H200 it took 0.36-0.45 of im2col's time at every VGG, AlexNet and OverFeat 3x3 layer
# (bench/results/h200-v6). Direct on GPUs, and F(4x4, 3x3) where allowed: only the tuner picks them.
WINOGRAD_MIN_CHANNELS = 16
# Nor below this much work (ConvShape.flops): Winograd's three transform launches cost more host time than
# its products save there. The H200's tuner, which counts each launch's host time (LAUNCH_COST_MS), took im2col for
# every pass of every lenet and lenet-wide layer up to 205 MFLOP (batch 1 and 64), and Winograd's for lenet-wide's
# 2.9 GFLOP layer; the H100's, Winograd's gradients for squeezenet's 3x3 layers of 1.8-3.6 GFLOP (tuning_table.json).
WINOGRAD_MIN_FLOPS = 210e6
DIRECT_MAX_CHANNELS_CPU = 64  # input channels per group up to which direct is PoCL's default forward

# Largest im2col buffer per convolution chunk; the batch is split into chunks that fit.
COL_BYTES = dict(gpu=512 << 20, cpu=64 << 20)

# The most elements a run of element-wise launches of a replayed graph may cover to be fused into one launch of
# chain.cl (graph.py; 0: none fuse). A chain is an interpreter, a loop over its steps for each element: it saves
# launches, and costs arithmetic. bench/chain_cost.py, a chain of 5 steps against its 5 launches (bench/NOTES.md
# v23): on the H200 0.43x at 1K elements, 0.59x at 256K, 1.24x at 1M, 2.30x at 16M; on PoCL and Intel's CPU
# runtime no faster at 1K and 2-27x slower from 4K to 1M (their replayed launches cost little).
FUSED_CHAIN_ELEMENTS = dict(gpu=1 << 19, cpu=0)

# Whether the GEMM and GEMV kernels' epilogue (bias mode, ReLU) is fixed at build time (a program per epilogue) or
# read from kernel arguments (one program for all). The H200 ran SGEMM at 1024 in 0.088 ms with the arguments against
# 0.072 with the epilogue built in (and resnet18's step at batch 128 2% slower); CPUs build slowly and gain nothing
# measurable from it (the test suite built 170 programs of test_device.py per device with it, 64 without).
EPILOGUE_AT_BUILD = dict(gpu=True, cpu=False)

# The host's cost of one kernel launch (ms), which the autotuner adds to a candidate's device time for each launch it
# makes: at small sizes a step is bound by its launches, not its kernels (lenet at batch 1 on the H200: 26 launches,
# 0.24 ms a replayed step, each kernel a few us), and an algorithm of four launches that saves 2 us of device time
# loses there. NVIDIA's clEnqueueNDRangeKernel costs 7.5 us plus 0.4 us a buffer argument, replayed or eager
# (bench/NOTES.md v27); a replayed launch costs PoCL 8-10 us (v23). Against a layer of a millisecond it changes nothing.
LAUNCH_COST_MS = dict(gpu=0.009, cpu=0.009)

# Split-K: slices of at least this depth, and enough work-groups to fill the device this many times over.
SPLIT_K_MIN_DEPTH = 256
SPLIT_K_WAVES = 4


def device_class(dev):
    return "gpu" if dev.is_gpu else "cpu"


def epilogue_at_build(dev):
    return EPILOGUE_AT_BUILD[device_class(dev)]


def launch_cost_ms(dev):
    return LAUNCH_COST_MS[device_class(dev)]


def fused_chain_elements(dev):
    return FUSED_CHAIN_ELEMENTS[device_class(dev)]


def local_bytes(cfg):
    """Local memory a gemm_tiled work-group uses: LBUF (default 2) A and B slices, a float4 of padding per row."""
    return cfg.get("LBUF", 2) * cfg["TK"] * (cfg["TM"] + cfg["TN"] + 8) * 4


def stage_bytes(cfg):
    """What gemm_tiled's C_STAGE adds: a strip of TM / WM rows of the tile, padded by a float4."""
    return cfg["TM"] // cfg["WM"] * (cfg["TN"] + 4) * 4


def fits(dev, cfg):
    if cfg["kernel"] != "gemm_tiled":
        return True
    threads = (cfg["TM"] // cfg["WM"]) * (cfg["TN"] // cfg["WN"])
    return local_bytes(cfg) <= dev.local_mem_size and threads <= dev.max_work_group_size


def gemv_shape(dev, k_fast, n_fast):
    """(LN, LK, KS) of gemv.cl's product of one row on a GPU: consecutive work-items along B's contiguous axis, k where
    its k stride is 1 (a dense layer's forward), n where its n stride is 1 (its input gradient). KS: 64-term stages,
    as short as the tiled kernels' runs."""
    if k_fast:
        return 4, 64, 64
    return (32, 8, 64) if n_fast else (16, 16, 64)


def cpu_shaped(dev):
    """Whether dev runs the CPU-shaped data-movement kernels (a row or plane per work-item, loops inside) rather than
    the GPU-shaped ones (an element per work-item)."""
    return not dev.is_gpu


# Terms per work-item a run of a GPU's channel sums keeps at least. At 64, a sum over 64 images of 14x14 or smaller
# planes stayed in one run: few work-groups for a GPU, batch norm's and bias gradients' sums waiting on their loads.
# At 16 an H100's googlenet b64 replay went 30.34 -> 29.85 ms, squeezenet1_1's 11.48 -> 11.41 (bench/NOTES.md v53).
RUN_TERMS = 16


def reduction_runs(dev, n, groups, lsize):
    """Runs to cut each of `groups` sums of n terms into, so that a GPU gets about 4 work-groups per compute unit
    (each run at least RUN_TERMS terms per work-item); a CPU's few cores are busy with one work-group per sum."""
    if cpu_shaped(dev):
        return 1
    return max(1, min(-(-n // (RUN_TERMS * lsize)), -(-4 * dev.compute_units // groups)))


# 1x1 convolutions (conv1x1.py): rows, a run of NV vectors of PV pixels by OB output channels a work-item, LS runs a
# work-group; weights, OB x CB weights of one image a work-item.
CONV1X1 = dict(rows=dict(PV=16, NV=2, OB=8, LS=4), weights=dict(PV=16, OB=4, CB=4))
# The smallest plane (pixels) on which each pass defaults to them on CPUs. PoCL, mobilenet_v2's layers at batch 16
# (bench/results/pocl-conv1x1/layers-dev0.txt): at 14x14 the rows kernel's forward took 1.9-3.8 ms against im2col +
# GEMM's 2.5-3.5 (even), its data gradient 1.5-1.9 against 2.5-3.5, the weight kernel 4.3-4.6 against 1.9-2.5; at 7x7
# every pass lost (1.4-9.7x).
CONV1X1_MIN_PLANE = dict(conv2d_fwd=196, conv2d_bwd_data=196, conv2d_bwd_weights=784)


# Intel's CPU runtime compiles conv1x1_weights at 16 pixels a vector in 9.4 s and at 8 in 1.1 s (2026-12-03, the
# 2-core AMD EPYC VM), and runs it 0.8-1.0x as fast; its rows kernel stays at 16 (17 s to build, 20-30% faster than
# 8 pixels or a block of 4 channels).
CONV1X1_INTEL = dict(CONV1X1, weights=dict(PV=8, OB=4, CB=4))


def conv1x1_config(dev, which):
    """The 1x1 convolution's kernel entry (which: "rows" for the forward and data gradient, "weights")."""
    return (CONV1X1_INTEL if "Intel" in dev.platform_name else CONV1X1)[which]


def direct_config(dev, s):
    """The default direct-convolution entry for shape s on dev."""
    if not cpu_shaped(dev):
        return DIRECT_GPU
    og = s.O // s.G
    if og >= 32 and (s.C // s.G) * s.KH * s.KW >= DEEP_WINDOW:
        return dict(DIRECT_CPU, OB=16, PX=4, ROWS=1)
    return dict(DIRECT_CPU, OB=min(8, max(2, 1 << (og - 1).bit_length())))


def conv_default(dev, s, options, kind="conv2d_fwd"):
    """The default algorithm, among `options` (those that can run it), for a convolution pass (kind: conv2d_fwd,
    conv2d_bwd_data, conv2d_bwd_weights) of shape s."""
    if "conv1x1" in options and s.H * s.W >= CONV1X1_MIN_PLANE[kind]:
        return "conv1x1"
    if kind == "conv2d_fwd" and not dev.is_gpu and "direct" in options and s.C // s.G <= DIRECT_MAX_CHANNELS_CPU:
        return "direct"  # (its gradients are the tuner's to choose: not measured against im2col's as defaults)
    if dev.is_gpu and "winograd" in options and min(s.C, s.O) >= WINOGRAD_MIN_CHANNELS and \
            s.flops >= WINOGRAD_MIN_FLOPS:
        return "winograd"
    return "im2col"


def gemm_config(dev, M, N, K, batch=1):
    """Default kernel and tile shape for an M x N x K product (times batch) on dev."""
    if not dev.is_gpu:
        return GEMM_BLOCK
    for rows, cfg in THIN_DEFAULTS:
        if M <= rows and fits(dev, cfg):
            return cfg
    large = GEMM_TILED_LARGE
    tiles = -(-M // large["TM"]) * -(-N // large["TN"]) * batch
    if tiles >= 2 * dev.compute_units and fits(dev, large):
        return large
    # a GPU whose work-groups cannot hold the small tile's 256 work-items runs the CPU-shaped kernel, which fits any
    return GEMM_TILED_SMALL if fits(dev, GEMM_TILED_SMALL) else GEMM_BLOCK


def k_splits(dev, cfg, M, N, K, batch=1):
    """Default number of slices to cut K into: products with few output tiles and a deep K (weight gradients) get
    more. Besides filling the device, slicing shortens each float32 running sum, so long reductions stay accurate."""
    if cfg["kernel"] == "gemm_tiled":
        tiles = -(-M // cfg["TM"]) * -(-N // cfg["TN"]) * batch
    else:
        tiles = -(-M // cfg["RM"]) * -(-N // 16) * batch
    want = SPLIT_K_WAVES * dev.compute_units * (1 if dev.is_gpu else 16)
    if tiles >= want or K < 2 * SPLIT_K_MIN_DEPTH:
        return 1
    return max(1, min(-(-want // tiles), K // SPLIT_K_MIN_DEPTH))


def slices(cfg, K, ksplit):
    """(ksplit, kc): K cut into ksplit slices of kc terms each (the last may be shorter), kc a whole number of the
    tile's k-depth. The one place slices are cut: the launch, the candidates and the cache check all use it."""
    depth = cfg.get("TK", 1)
    kc = -(-K // max(1, ksplit))
    kc = -(-kc // depth) * depth
    return -(-K // kc), kc


def run_length(cfg, K, ksplit):
    """The longest float32 running sum a product makes: a slice of K (slices), or, where gemm_block sums each KC-deep
    stage from zero and then adds the stages, the longer of a stage and the count of stages. Float32 error grows
    with it, so no tuning candidate may exceed the default's."""
    kc = slices(cfg, K, ksplit)[1]
    stage = cfg.get("KC", 0) if cfg["kernel"] == "gemm_block" else 0
    return max(min(stage, kc), -(-kc // stage)) if stage else kc


def gemm_default(dev, M, N, K, batch):
    cfg = gemm_config(dev, M, N, K, batch)
    return dict(cfg=cfg, ksplit=k_splits(dev, cfg, M, N, K, batch))


def gemm_candidates(dev, M, N, K, batch, kfast_a=False, kfast_b=False):
    """(cfg, ksplit, ta, tb) choices for the autotuner, the default first: every candidate tile with its default split,
    and that split doubled. No candidate's running sums are longer than the default's (run_length), so tuning can
    change speed but not make a result less accurate. Where an operand's k runs fastest in memory
    (kfast_a, kfast_b), GPUs also try transposing it first (ta, tb) for tiles where storing a k-fast slice is slow:
    32-deep ones (a slice touches many short rows) and single-buffered ones (the scattered stores into local memory
    wait between two barriers). The copy costs 1-2% at SGEMM 4096 on the H200; there A m-fast against k-fast ran
    41.3 against 39.4 TFLOP/s at 128x128x32 and 44.7 against 42.1 at 128x128x16 single-buffered, and made no
    difference double-buffered (h200-v9a)."""
    default = gemm_default(dev, M, N, K, batch)
    out = [default]
    longest = run_length(default["cfg"], K, default["ksplit"])  # no candidate sums longer runs than this
    transposes = [dict()]
    if dev.is_gpu:
        transposes += ([dict(ta=True)] if kfast_a else []) + ([dict(tb=True)] if kfast_b else []) + \
            ([dict(ta=True, tb=True)] if kfast_a and kfast_b else [])
    for cfg in GEMM_CANDIDATES[device_class(dev)]:
        if not fits(dev, cfg):
            continue
        base = k_splits(dev, cfg, M, N, K, batch)
        for ks in sorted({base, min(base * 2, max(1, K // 64))}):
            while run_length(cfg, K, ks) > longest and ks < K:
                ks += 1
            if run_length(cfg, K, ks) > longest:
                continue
            slow_store = cfg.get("TK", 0) >= 32 or cfg.get("LBUF") == 1
            for t in transposes if slow_store else transposes[:1]:
                choice = dict(cfg=cfg, ksplit=ks, **t)
                if choice not in out:
                    out.append(choice)
    return out


# Before timing a candidate the autotuner checks its output against the default's, as CLTune does: a candidate that a
# driver miscompiles (or that has a bug on some shape) must never become the choice. Two correct float32 results of
# sums of n terms differ by rounding, about sqrt(n) units of roundoff for data without a sign pattern (a plain running
# sum over 36,864 ReLU outputs erred 2.4e-6 normwise, against sqrt(n) u = 1.1e-5; tests/test_device.py); Winograd's
# transforms add up to 1.2e-5 per layer (tests/test_winograd.py). AGREEMENT_MARGIN times the first, and at least
# AGREEMENT_FLOOR, is what a candidate may differ by; its worst element 20 times that, of the largest output.
FLOAT32_ROUNDOFF = 2.0 ** -24
AGREEMENT_MARGIN = 16
AGREEMENT_FLOOR = 1e-4
AGREEMENT_UNKNOWN = 1e-3  # for a site whose key names no sum length


def sum_length(key):
    """How many terms each output of a tuning site sums, read from its key (gemm.gemm_key, conv._conv_key): a
    product's K; a convolution's window (forward), its window over the output channels (data gradient), or its images
    times output pixels (weight gradient). None for a key of another form."""
    try:
        kind, dims, *rest = key.split()
        if kind == "gemm":
            return int(dims.split("x")[2])
        n, c = (int(v) for v in dims.split("x")[:2])
        fields = {f[0]: f[1:] for f in rest if f[:1] in "okg" and not f.startswith("out")}
        out = next(f[3:] for f in rest if f.startswith("out"))
        window = int(fields["k"].split("x")[0]) * int(fields["k"].split("x")[1])
        groups, o = int(fields["g"]), int(fields["o"])
        if kind == "conv2d_fwd":
            return c // groups * window
        if kind == "conv2d_bwd_data":
            return o // groups * window
        if kind == "conv2d_bwd_weights":
            return n * int(out.split("x")[0]) * int(out.split("x")[1])
    except (ValueError, IndexError, KeyError, StopIteration):
        pass
    return None


def agreement_tolerance(key):
    """The normwise relative difference from the default's output that a candidate of this site may show (the float32
    rounding of its sum length, see AGREEMENT_MARGIN)."""
    n = sum_length(key)
    if n is None:
        return AGREEMENT_UNKNOWN
    return max(AGREEMENT_FLOOR, AGREEMENT_MARGIN * n ** 0.5 * FLOAT32_ROUNDOFF)


def _same(a, b):
    """Equality that tells 48 from 48.0 and 1 from True (Python's == does not): the JSON texts compared."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def valid_gemm(dev, choice, M, N, K, batch, b_split, kfast_a=True, kfast_b=True):
    """The autotuner's own candidate (gemm_candidates) that a cached GEMM choice names, else None: the file may be old
    or edited by hand, and only values this version offers for this device and shape (its tiles, its split-K
    factors, whose sums are no longer than the default's) reach a kernel's defines. kfast_a and kfast_b as for
    gemm_candidates; a site that does not pass them accepts the transposes offered to k-fast operands."""
    for candidate in gemm_candidates(dev, M, N, K, batch, kfast_a, kfast_b and not b_split):
        if _same(candidate, choice):
            return candidate
    return None


def describe(choice):
    """A short name for a choice, for bench reports: 'tiled 128x128x16/8x8 k4', 'block RM4', 'winograd'."""
    if isinstance(choice, str):
        return choice
    cfg, ks = choice["cfg"], choice["ksplit"]
    pre = "".join(f"{x}+" for x in ("ta", "tb") if choice.get(x))
    if cfg["kernel"] == "gemm_tiled":
        name = f"tiled {cfg['TM']}x{cfg['TN']}x{cfg['TK']}/{cfg['WM']}x{cfg['WN']}"
        name += " 1buf" if cfg.get("LBUF", 2) == 1 else ""
        name += " warp8x4" if cfg.get("WARP_8X4") else ""
    else:
        name = "block " + " ".join(f"{k}{cfg[k]}" for k in sorted(cfg) if k != "kernel")  # as the cache file orders
    return pre + name + (f" k{ks}" if ks > 1 else "")


# ---- the persistent cache ------------------------------------------------------------------------------------------

CACHE_VERSION = 2  # bumped whenever the candidates' rules change, so that older winners are not reused


def cache_path():
    """$CLNET_CACHE_DIR, else $XDG_CACHE_HOME/clnet, else ~/.cache/clnet; one JSON file for all devices."""
    root = os.environ.get("CLNET_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "clnet")
    return os.path.join(root, f"tuning-v{CACHE_VERSION}.json")


def device_key(dev):
    return f"{dev.platform_name} | {dev.name} | {dev.driver_version}"


# An entry is an algorithm's name or a dict of a few levels (a GEMM choice: cfg inside); the nesting is bounded so
# that no walk of the cache (json.dump's included) can run out of stack
ENTRY_DEPTH = 3


def _shallow(value, depth):
    if isinstance(value, dict):
        return depth > 0 and all(isinstance(k, str) and _shallow(v, depth - 1) for k, v in value.items())
    if isinstance(value, list):
        return depth > 0 and all(_shallow(v, depth - 1) for v in value)
    return value is None or isinstance(value, (str, int, float))


def _well_formed(cache):
    """Whether CACHE has the cache's shape: {device key: {site key: entry}}, each entry shallow."""
    return isinstance(cache, dict) and all(isinstance(v, dict) and _shallow(v, ENTRY_DEPTH + 1)
                                           for v in cache.values())


def _parse(f):
    """JSON from the file f; ValueError, in words for a warning, for text that is not JSON or nests past Python's
    recursion limit (the C decoder's own)."""
    try:
        return json.load(f)
    except RecursionError:
        raise ValueError("is nested too deeply") from None
    except ValueError as e:
        raise ValueError(f"is not valid JSON ({e})") from None


# ---- the table shipped in the package --------------------------------------------------------------------------------
# Devices already measured tune nothing on a first run: their winners ship with clnet, keyed by platform, device and
# driver family (the driver version's first number: NVIDIA's 580.159 -> 580), since a family's releases keep the same
# compiler, as CLBlast's shipped database assumes. bench/ship_tuning.py writes it from the caches of tuning runs; a
# user's own cache entry wins over the table's for the same key.
SHIPPED_TABLE = os.path.join(os.path.dirname(__file__), "tuning_table.json")


def family_key(device_key_text):
    platform, name, driver = device_key_text.split(" | ", 2)
    return f"{platform} | {name} | {driver.split('.')[0].strip()}"


_shipped = None


def shipped(dev):
    """The shipped table's entries for dev's family (empty for a device nobody measured, or for a table of another
    cache version: its choices may name kernels this version lacks)."""
    global _shipped
    if _shipped is None:
        _shipped = {}
        try:
            with open(SHIPPED_TABLE) as f:
                table = _parse(f)
            devices = table.get("devices", {}) if isinstance(table, dict) else None
            if not _well_formed(devices):
                raise ValueError("does not hold clnet's format")
            if table.get("cache_version") == CACHE_VERSION:
                _shipped = devices
        except FileNotFoundError:  # a build without a table: every device starts at the defaults
            pass
        except (OSError, ValueError) as e:
            why = f"cannot be read ({e.strerror})" if isinstance(e, OSError) else e
            warnings.warn(f"clnet: the shipped tuning table {SHIPPED_TABLE} cannot be used: it {why}; default kernel "
                          "choices apply (reinstall clnet to restore it)")
    return _shipped.get(family_key(device_key(dev)), {})


_cache = None


def _read(path):
    """The cache file's contents, from a folder no other user can change (files.open_folder: FileNotFoundError when
    it is absent, UnsafeFolder when another user could plant entries), never through a link. ValueError for a file
    that is not the cache's JSON."""
    folder, _ = open_folder(os.path.dirname(path))
    try:
        fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder)
    finally:
        os.close(folder)
    with os.fdopen(fd) as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("is not a regular file")
        cache = _parse(f)
    if not _well_formed(cache):
        raise ValueError("does not hold clnet's format")
    return cache


def _load():
    """The cache file's contents, read once per process (forget() rereads); lookups run per launch, so no path
    resolution happens after the first."""
    global _cache
    if _cache is None:
        path = cache_path()
        try:
            _cache = _read(path)
        except FileNotFoundError:
            _cache = {}
        except UnsafeFolder as e:
            warnings.warn(f"clnet: the tuning cache {path} is not read, default kernel choices apply: {e}")
            _cache = {}
        except OSError as e:
            warnings.warn(f"clnet: cannot read the tuning cache {path} ({e.strerror}); using default kernel "
                          "choices (set CLNET_CACHE_DIR to a readable folder)")
            _cache = {}
        except ValueError as e:
            _cache = _set_aside(path, str(e))
    return _cache


def _set_aside(path, why):
    """Renames a damaged cache file out of the way (kept for inspection) and starts an empty cache."""
    aside = f"{path}.damaged-{int(time.time())}"
    try:
        os.replace(path, aside)
        where = f"moved to {aside}"
    except OSError as e:
        where = f"could not be moved ({e.strerror})"
    warnings.warn(f"clnet: the tuning cache {path} {why}; it was {where}, and tuning starts afresh (default kernel "
                  "choices until `clnet tune` runs again)")
    return {}


@contextlib.contextmanager
def _locked(path):
    """An exclusive lock on PATH.lock while the cache is read, merged and replaced: processes tuning at once keep
    every entry (without it, two runs storing 300 keys each ended with 187 and 204 in the file). The folder is made
    and checked as every folder clnet writes in (files.open_folder); the lock file is opened through it, created if
    absent, never through a link (a link there makes open fail: nothing is created or opened at its target). Mode
    0600 less the umask: a user who could open the lock could hold it and stall every tuning run."""
    folder, _ = open_folder(os.path.dirname(path), create=True)
    try:
        lock = os.open(os.path.basename(path) + ".lock",
                       os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600, dir_fd=folder)
    finally:
        os.close(folder)
    try:
        if not stat.S_ISREG(os.fstat(lock).st_mode):
            raise OSError(errno.EINVAL, "the lock file is not a regular file", path + ".lock")
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)  # releases the lock


_device_entries = {}


def entries(dev):
    """This device's tuned entries (key -> choice): the user's cache over the shipped table's, merged once per process
    (store() adds to both this and the cache's own entries); empty for a device nobody tuned."""
    found = _device_entries.get(dev)
    if found is None:
        found = _device_entries[dev] = dict(shipped(dev))
        found.update(own_entries(dev))
    return found


def own_entries(dev):
    """The entries of dev in the user's cache file alone (tuned on this machine; the shipped table's excluded)."""
    return _load().setdefault(device_key(dev), {})


# A first run's tuning marks its model and shape as done (tune.tune_first) in the user's cache: never shipped
FIRST_RUN_MARK = "first-run budget spent: "


def store(dev, new_entries):
    """Adds entries for dev and writes the file atomically (a crash never leaves half a file), merged with what is on
    disk now, so that runs tuning other devices at the same time keep theirs."""
    entries(dev).update(new_entries)
    own_entries(dev).update(new_entries)
    _checked.clear()
    forget_choices()
    path = cache_path()
    try:
        with _locked(path):
            try:
                on_disk = _read(path)
            except FileNotFoundError:
                on_disk = {}
            except ValueError as e:  # kept aside for inspection rather than overwritten
                on_disk = _set_aside(path, str(e))
            on_disk.setdefault(device_key(dev), {}).update(new_entries)
            write_atomically(path, lambda f: json.dump(on_disk, f, indent=1, sort_keys=True), text=True)
    except UnsafeFolder as e:
        warnings.warn(f"clnet: the tuned choices last for this process only: {e}")
    except OSError as e:
        warnings.warn(f"clnet: cannot write the tuning cache {path} ({e.strerror}); the tuned choices last for this "
                      "process only (set CLNET_CACHE_DIR to a writable folder)")


def forget():
    """Drops the in-memory copy and the memoised defaults and choices, so the next lookup rereads the file (after
    CLNET_CACHE_DIR changes, or after a test replaces gemm_config or cpu_shaped)."""
    global _cache, _shipped
    _cache = _shipped = None
    _device_entries.clear()
    _checked.clear()
    _defaults.clear()
    forget_choices()


_choices = []  # the dictionaries made by choices()
CHOICES_KEPT = 4096  # entries a dictionary of choices() holds before it starts again (shapes that keep changing)


class Choices(dict):
    """A caller's memoised choices (an op's algorithm per device and shape): lookups that run at every launch keep
    what choose() returned. Emptied whenever the tuned entries change (store, forget)."""

    def keep(self, key, value):
        """self[key] = value, returned; at most CHOICES_KEPT entries (then the dictionary starts again)."""
        if len(self) >= CHOICES_KEPT:
            self.clear()
        self[key] = value
        return value


def choices():
    memo = Choices()
    _choices.append(memo)
    return memo


def forget_choices():
    for memo in _choices:
        memo.clear()


def recording():
    """Whether this thread's choices are watched (a tuner recording, a benchmark noting what ran): choose() must then
    run for each, so a memoised choice must not stand in for it."""
    return _mine(_RECORDER) is not None or _mine(_USED) is not None


# ---- choosing ------------------------------------------------------------------------------------------------------

class Recorder:
    """Collects, during one training iteration, every choice an op made: its key, its candidates, and a function that
    runs the op again with a given choice (the autotuner times those). The function returns the tensor it computed
    (or a tuple of them), which the autotuner compares with the default's before timing a candidate; one that returns
    None is timed unchecked."""

    def __init__(self):
        self.sites = {}

    def add(self, key, candidates, run):
        self.sites.setdefault(key, (candidates, run))


# Tuning changes speed, not accuracy: no candidate sums longer float32 runs than the default (run_length), and
# algorithms with a larger float32 error than the default's are tried only when this is True (set it before the first
# run, or pass --less-accurate to `clnet tune` / `clnet bench`). Today that is Winograd F(4x4,3x3): 4-5x F(2x2,3x3)'s
# error per layer (tests/test_winograd.py). On the H200 with it (bench/results/h200-v7), overfeat's iteration ran at
# 1.11x cuDNN's speed, but its gradients came out 5e-3 from float64 against PyTorch's 1-2e-3 (2.7e-3 with F(2x2,3x3)
# in v6): its larger error flipped a ReLU whose input was within rounding of zero (reproduced on PoCL by
# bench/relu_flips.py). cudnn.benchmark makes such trades without asking. F(2x2,5x5) errs as much per layer but is not
# gated: it is clnet's only fast algorithm for 5x5 layers, and the networks using it stayed within the bench's
# agreement rule (2x cuDNN's error against float64): alexnet 1.8e-3 against 9.5e-4, overfeat 3.3e-3 against 2.0e-3
# (H200, v8); overfeat at batch 128 on PoCL 2.3e-3 against 1.6e-3. AlexNet's margin is thin.
allow_less_accurate = False

# What this thread records, as grad mode and the capture state are its own (kernels.context): a benchmark or a tuner
# in one thread sees none of the choices another thread's ops make. `tuning.recorder` (a Recorder, set by the
# autotuner while it records) and `tuning.used` (set by the benchmark: {profiler tag: {key: description of the choice
# that ran}}) read and set them; None records nothing.
_RECORDER, _USED = "tuning_recorder", "tuning_used"


def _mine(name):
    return getattr(kernels.context, name, None)  # a thread that never set it records nothing


class _Module(types.ModuleType):
    recorder = property(lambda m: _mine(_RECORDER), lambda m, v: setattr(kernels.context, _RECORDER, v))
    used = property(lambda m: _mine(_USED), lambda m, v: setattr(kernels.context, _USED, v))


sys.modules[__name__].__class__ = _Module


# (device, key, allow_less_accurate) -> what valid() made of the cached entry (None: rejected); cleared when
# entries change
_checked = {}
_defaults = {}  # (device, key) -> default(), which depends only on the device and the shape the key names


def choose(dev, key, default, candidates=None, run=None, valid=None):
    """The tuned choice for key on dev, else default() (the device class's entry); a cached choice that valid()
    rejects (returns a false value for) is ignored with a warning, and one it accepts runs as valid returned it.
    While the autotuner records, the site is remembered with candidates() (the default first) and run."""
    recorder = _mine(_RECORDER)
    if recorder is not None and candidates is not None:
        options = candidates()
        if len(options) > 1:
            recorder.add(key, options, run)
    choice = entries(dev).get(key)
    if choice is not None and valid is not None:
        checked = (dev, key, allow_less_accurate)
        if checked not in _checked:
            ok = valid(choice)
            # valid returns the tuner's own equal candidate, which runs instead of the file's value; True keeps the
            # cached value (a plain algorithm name)
            _checked[checked] = choice if ok is True else ok or None
            if not ok:
                where = "the tuning cache's" if key in own_entries(dev) else "the shipped tuning table's"
                warnings.warn(f"clnet: ignoring {where} entry for '{key}' ({choice}): this version of clnet does not "
                              "offer it here, or it is less accurate than the default; `clnet tune --retune` replaces "
                              "it")
        choice = _checked[checked]
    if choice is None:  # the device class's entry, computed once per key (lookups run on every launch)
        choice = _defaults.get((dev, key))
        if choice is None:
            choice = _defaults[(dev, key)] = default()
    if _mine(_USED) is not None:  # (describe builds a string: not on every launch)
        note_used(key, describe(choice))
    return choice


def note_used(key, description):
    """What ran at a site, for the benchmark's kernel column (`used`), tuned or not."""
    used = _mine(_USED)
    if used is not None:
        used.setdefault(kernels.profiler.tag if kernels.profiler else None, {})[key] = description


def col_bytes(dev):
    return COL_BYTES[device_class(dev)]
