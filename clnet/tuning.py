"""Per-device kernel parameters: a default entry per device class, chosen by the device's type and properties.

One entry drives both a kernel's defines and its launch geometry, so the two cannot drift apart.
"""

# GPU-shaped matrix product: tiles staged in local memory. Large tiles only pay when they fill the device.
GEMM_TILED_SMALL = dict(kernel="gemm_tiled", TM=64, TN=64, TK=16, WM=4, WN=4)
GEMM_TILED_LARGE = dict(kernel="gemm_tiled", TM=128, TN=128, TK=16, WM=8, WN=8)
# CPU-shaped: register blocks, wide vector loads, no local memory (about 20x the tiled kernel on PoCL).
GEMM_BLOCK = dict(kernel="gemm_block", RM=4)

# Largest im2col buffer per convolution chunk; the batch is split into chunks that fit.
COL_BYTES = dict(gpu=512 << 20, cpu=64 << 20)


def gemm_config(dev, M, N, K, batch=1):
    """Kernel choice and tile shape for an M x N x K product (times batch) on dev."""
    if not dev.is_gpu:
        return GEMM_BLOCK
    large = GEMM_TILED_LARGE
    tiles = -(-M // large["TM"]) * -(-N // large["TN"]) * batch
    fits_local = dev.local_mem_size >= 2 * large["TK"] * (large["TM"] + large["TN"] + 2) * 4
    if tiles >= 2 * dev.compute_units and fits_local and dev.max_work_group_size >= 256:
        return large
    return GEMM_TILED_SMALL


# Split-K: slices of at least this depth, and enough work-groups to fill the device this many times over.
SPLIT_K_MIN_DEPTH = 256
SPLIT_K_WAVES = 4


def k_splits(dev, cfg, M, N, K, batch=1):
    """How many slices to cut K into: products with few output tiles and a deep K (weight gradients) get more.

    Besides filling the device, slicing shortens each float32 running sum, so long reductions stay accurate.
    """
    if cfg["kernel"] == "gemm_tiled":
        tiles = -(-M // cfg["TM"]) * -(-N // cfg["TN"]) * batch
    else:
        tiles = -(-M // cfg["RM"]) * -(-N // 16) * batch
    want = SPLIT_K_WAVES * dev.compute_units * (1 if dev.is_gpu else 16)
    if tiles >= want or K < 2 * SPLIT_K_MIN_DEPTH:
        return 1
    return max(1, min(-(-want // tiles), K // SPLIT_K_MIN_DEPTH))


def col_bytes(dev):
    return COL_BYTES["gpu" if dev.is_gpu else "cpu"]
