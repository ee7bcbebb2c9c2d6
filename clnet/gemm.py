"""The matrix product every heavy op lowers to: operand layouts (Mat), the tuned choice of kernel and tile, and the
launch (cl_kernels/gemm.cl for GPUs, gemm_cpu.cl for CPUs)."""
from typing import NamedTuple

from . import kernels, tuning
from .tensor import empty

NO_SPLIT = 1 << 30  # a column divisor no index reaches


class Mat(NamedTuple):
    """How a matrix operand sits in its buffer: element (r, c) of batch b is at
    off + b*bs + r*rs + (c % cdiv)*cs + (c // cdiv)*cso; with split_rows (B only, on GPUs: k over (image, pixel), as
    x^T in a 1x1 convolution's weight gradient), the split cuts the rows instead:
    off + b*bs + (r % cdiv)*rs + (r // cdiv)*cso + c*cs. (A tuple: made, hashed and compared as one in every product's
    memoised look-ups.)"""
    off: int = 0
    bs: int = 0
    rs: int = 1
    cs: int = 1
    cdiv: int = NO_SPLIT
    cso: int = 0
    split_rows: bool = False

    @property
    def split(self):
        """Whether the columns are split (a row split is split_rows)."""
        return self.cdiv != NO_SPLIT and not self.split_rows

    def args(self):
        return self[:6]


def takes_split_rows(dev):
    """Whether dev's products take a B whose rows are split (Mat.split_rows): gemm_tiled does, so GPUs whose
    work-groups hold its small tile (a GPU that cannot runs gemm_block, whose build refuses B_KSPLIT)."""
    return tuning.device_class(dev) == "gpu" and tuning.fits(dev, tuning.GEMM_TILED_SMALL)


def skinny(dev, M, K, batch, a, b, c):
    """Whether a product runs as a dense layer's batch-1 product (one row, or a depth of one): one launch of gemv.cl
    on a GPU; on a CPU gemv_cpu.cl's row-streaming kernels, where A's k, C's n and B's k or n strides are 1 (a dense
    layer's own layouts: other layouts keep gemm_block)."""
    if batch != 1 or not (M == 1 or K == 1) or a.split or b.split or b.split_rows or c.split:
        return False
    if not tuning.cpu_shaped(dev):
        return True
    if K == 1:
        return b.cs == 1 and c.cs == 1
    return a.cs == 1 and c.cs == 1 and (b.rs == 1 or b.cs == 1)


def gemm(M, N, K, A, a, B, b, C, c, alpha=1.0, beta=0.0, batch=1, bias=None, bias_mode=0, bias_bs=0, relu=False,
         what="matrix product", rowsum=None, rowsum_beta=1.0, a_mask=None):
    """C = act(alpha * A @ B + beta * C + bias) for `batch` products laid out as the Mats a, b, c describe; with
    rowsum (a vector of M), also rowsum = alpha * A's row sums (+ rowsum unless rowsum_beta is 0), only for a rank-1
    product that skinny() runs (a dense layer's bias gradient at batch 1, in its weight gradient's launch); with
    a_mask, A taken as zero where a_mask <= 0 (a fused ReLU's gradient: a_mask holds one value per element of A's one
    row or column), only where skinny() runs the product.

    The kernel, tile shape and split-K factor come from tuning.choose, keyed by the sizes and the operands' layouts."""
    dev = C.device
    alpha, beta = float(alpha), float(beta)  # float parameters: an int would be set as int32 bits
    thin = skinny(dev, M, K, batch, a, b, c)
    if rowsum is not None and not (K == 1 and thin):
        raise ValueError("internal: gemm's rowsum is only for a rank-1 product that skinny() runs")
    if a_mask is not None and not thin:
        raise ValueError("internal: gemm's a_mask is only for a product that skinny() runs")
    if thin:
        _skinny(dev, M, N, K, A, a, B, b, C, c, alpha, beta, bias, bias_mode, relu, what, rowsum, rowsum_beta,
                a_mask)
        return
    memo_key = (dev, M, N, K, batch, a, b, c)
    choice = _choices.get(memo_key)
    if choice is not None and not tuning.recording():
        _gemm_choice(dev, choice, M, N, K, A, a, B, b, C, c, alpha, beta, batch, bias, bias_mode, bias_bs, relu, what)
        return
    key = gemm_key(M, N, K, batch, a, b, c)

    def run(choice):  # returns what it computed, for the autotuner to check each candidate against the default
        _gemm_choice(dev, choice, M, N, K, A, a, B, b, C, c, alpha, beta, batch, bias, bias_mode, bias_bs, relu,
                     what)
        return C

    b_split = b.split or b.split_rows  # a split B is never copied transposed (tb)
    choice = tuning.choose(dev, key, lambda: tuning.gemm_default(dev, M, N, K, batch),
                           lambda: tuning.gemm_candidates(dev, M, N, K, batch, _kfast_a(a),
                                                          _kfast_b(b) and not b_split), run,
                           lambda cached: tuning.valid_gemm(dev, cached, M, N, K, batch, b_split))
    run(_choices.keep(memo_key, choice))


_choices = tuning.choices()  # (device, sizes, the operands' layouts) -> gemm's tuned or default choice
_built = tuning.choices()  # (device, id of a choice's cfg, layouts, epilogue) -> (cfg, _gemm_kernel's answer)


def _gemm_kernel(dev, cfg, a, b, c, epilogue):
    """(kernel, work-group, (columns of C, work-items) and (rows, work-items) of each block of the grid along N and
    M) of a product with choice cfg on operands laid out as a, b, c."""
    name = cfg["kernel"]
    defines = {k: v for k, v in cfg.items() if k != "kernel"}
    defines.update(A_SPLIT=a.split, B_SPLIT=b.split, B_KSPLIT=b.split_rows, C_SPLIT=c.split,
                   **_built_epilogue(dev, epilogue))
    if name == "gemm_tiled":
        # float4 fetches where the operand's layout allows and each slice splits into float4s over the work-group
        float4s_per_round = 4 * (cfg["TM"] // cfg["WM"]) * (cfg["TN"] // cfg["WN"])
        c_vec = _vec_c(c)
        # without float4 stores, C goes out through local memory where a strip of it fits beside the slices
        c_stage = not c_vec and (cfg["TM"] // cfg["WM"]) % cfg["WN"] == 0 and \
            tuning.local_bytes(cfg) + tuning.stage_bytes(cfg) <= dev.local_mem_size
        defines.update(A_KFAST=_kfast_a(a), B_KFAST=_kfast_b(b),
                       A_VEC=_vec_a(a) and cfg["TM"] * cfg["TK"] % float4s_per_round == 0,
                       B_VEC=_vec_b(b) and cfg["TN"] * cfg["TK"] % float4s_per_round == 0, C_VEC=c_vec,
                       C_STAGE=c_stage)
        local = (cfg["TN"] // cfg["WN"], cfg["TM"] // cfg["WM"], 1)
        grid = (cfg["TN"], local[0]), (cfg["TM"], local[1])
    else:
        defines.update(B_CONTIG=(b.cs == 1 and not b.split))
        local, grid = ((cfg["WG"], 1, 1) if cfg.get("WG") else None), ((16, 1), (cfg["RM"], 1))
    return (kernels.kernel(dev, GEMM_FILES[name], name, defines), local) + grid


def _skinny(dev, M, N, K, A, a, B, b, C, c, alpha, beta, bias, bias_mode, relu, what, rowsum=None, rowsum_beta=1.0,
            a_mask=None):
    """One row of C (M == 1) or a depth of one (K == 1): a dense layer's products at batch 1, with no tile or split-K
    to choose. GPUs: one gemv.cl launch each (its sums in 64-term stages). CPUs: gemv_cpu.cl, which streams B's rows
    (lenet-wide's 2048 x 2048 layer on PoCL, weights from memory: forward, input and weight gradients 2.09, 3.22 and
    1.82 ms through gemm_block, 1.54, 1.21 and 1.24 ms; bench/gemv_cpu_ab.py)."""
    epilogue = (bias_mode if bias is not None else 0, int(relu))  # kernel arguments after bias (gemv_common.h)
    flags = dict(A_MASK=1) if a_mask is not None else {}
    mask = (a_mask,)  # amask: every gemv kernel takes it (NULL unless A_MASK)
    if tuning.used is not None:
        tuning.note_used(f"gemv {M}x{N}x{K}", "rank-1" if K == 1 else "gemv")
    extra = (rowsum, int(rowsum_beta != 0.0))  # D, d_add: every rank-1 kernel takes them (NULL, 0: none)
    if tuning.cpu_shaped(dev):
        _skinny_cpu(dev, M, N, K, A, a, B, b, C, c, alpha, beta, bias, epilogue, flags, mask, extra, what)
        return
    flags.update(_built_epilogue(dev, epilogue))
    if K == 1:
        k = kernels.kernel(dev, "gemv.cl", "gemm_rank1", dict(flags, ROWSUM=1) if rowsum is not None else flags)
        kernels.launch(dev, k, (N, M), kernels.ANY_GROUP, M, N, alpha, beta, A, a.off, a.rs, B, b.off, b.cs, C, c.off,
                       c.rs, c.cs, bias, *epilogue, *extra, *mask, what=what)
        return
    LN, LK, KS = tuning.gemv_shape(dev, k_fast=b.rs == 1, n_fast=b.cs == 1)
    k = kernels.kernel(dev, "gemv.cl", "gemv", dict(LN=LN, LK=LK, KS=KS, **flags))
    kernels.launch(dev, k, (-(-N // LN) * LN, LK), (LN, LK), N, K, alpha, beta, A, a.off, a.cs, B, b.off, b.rs, b.cs,
                   C, c.off, c.cs, bias, *epilogue, *mask, what=what)


def dense_backward_one_row(dev, O, I, dy, w, x, dx, dw, dw_beta, db=None, db_beta=1.0, a_mask=None,
                           what="Linear backward"):
    """A dense layer's backward at batch 1 on a GPU in one gemv.cl launch (gemv_rank1): dx = dy w (w: O x I, rows
    contiguous) and, as each work-item reads w(o, i), dw(o, i) = dy(o) x(i) + dw_beta dw(o, i); with db, also
    db = dy + db_beta db. The same arithmetic, in the same order, as _skinny's gemv and rank-1 launches, one launch
    fewer. a_mask: dy read through a fused ReLU's gradient, as _skinny's."""
    flags = dict(A_MASK=1) if a_mask is not None else {}
    if db is not None:
        flags["ROWSUM"] = 1
    LN, LK, KS = tuning.gemv_shape(dev, k_fast=False, n_fast=True)
    if tuning.used is not None:
        tuning.note_used(f"gemv 1x{I}x{O}", "gemv + rank-1")
    k = kernels.kernel(dev, "gemv.cl", "gemv_rank1", dict(LN=LN, LK=LK, KS=KS, **flags,
                                                           **_built_epilogue(dev, (0, 0))))
    extra = (db, int(db_beta != 0.0))
    mask = (a_mask,)
    kernels.launch(dev, k, (-(-I // LN) * LN, LK), (LN, LK), I, O, dy, 0, 1, w, 0, I, 1, dx, 0, 1, x, 0, 1, dw, 0,
                   float(dw_beta), *extra, *mask, what=what)


GEMV_CPU_ROWS = 16  # gemv_dot's outputs per work-item (a multiple of 4)


def _skinny_cpu(dev, M, N, K, A, a, B, b, C, c, alpha, beta, bias, epilogue, flags, mask, extra, what):
    """gemv_cpu.cl: the rank-1 product a row of C per work-item; one row of C from B's k-contiguous rows as dot
    products (one launch), or from its n-contiguous rows as P partial rows, each a slice of k, then their ordered sum
    (two launches; P about four per core, each slice at least 128 rows)."""
    flags = dict(flags, ROWS=GEMV_CPU_ROWS)  # every kernel of the file with the same defines: one program
    if K == 1:
        k = kernels.kernel(dev, "gemv_cpu.cl", "rank1_rows", dict(flags, ROWSUM=1) if extra[0] is not None else flags)
        kernels.launch(dev, k, (M,), (1,), M, N, alpha, beta, A, a.off, a.rs, B, b.off, C, c.off, c.rs, bias,
                       *epilogue, *extra, *mask, what=what)
    elif b.rs == 1:
        k = kernels.kernel(dev, "gemv_cpu.cl", "gemv_dot", flags)
        kernels.launch(dev, k, (-(-N // GEMV_CPU_ROWS),), (1,), N, K, alpha, beta, A, a.off, B, b.off, b.cs, C, c.off,
                       bias, *epilogue, *mask, what=what)
    else:
        parts = max(1, min(4 * dev.compute_units, K // 128))
        kc = -(-K // parts)
        parts = -(-K // kc)
        part = empty((parts * N,), dev)
        k = kernels.kernel(dev, "gemv_cpu.cl", "gemv_axpy", flags)
        kernels.launch(dev, k, (parts,), (1,), N, K, kc, A, a.off, B, b.off, b.rs, part, *mask, what=what)
        k = kernels.kernel(dev, "gemv_cpu.cl", "gemv_sum", flags)
        kernels.launch(dev, k, (N,), kernels.ANY_GROUP, N, parts, alpha, beta, part, C, c.off, bias, *epilogue,
                       what=what)


def gemm_key(M, N, K, batch, a, b, c):
    """The tuning key of a product: its sizes and the operands' layout classes (which way k runs, splits)."""
    return (f"gemm {M}x{N}x{K}x{batch} A{'k' if _kfast_a(a) else 'm'}{'s' if a.split else ''} "
            f"B{'k' if _kfast_b(b) else 'n'}{'s' if b.split else 'r' if b.split_rows else ''} "
            f"C{'s' if c.split else ''}")


def _kfast_a(a):
    # k contiguous (within each image's segment when split, as dy in a weight gradient): load along k to coalesce
    return a.cs == 1 and a.rs != 1


def _kfast_b(b):
    return b.rs == 1 and b.cs != 1


def _quads(*values):
    return all(v % 4 == 0 for v in values)


def _vec_along_rows(x):
    """Whether float4s of 4 consecutive columns of x (the layout `x` describes) are each contiguous and 16-byte
    aligned: columns contiguous, every other step a multiple of 4 elements, and with a column split, no float4
    crossing a segment."""
    return x.cs == 1 and _quads(x.off, x.bs, x.rs, x.cso) and (not x.split or _quads(x.cdiv))


def _vec_along_columns(x):
    """The same for float4s of 4 consecutive rows."""
    return x.rs == 1 and _quads(x.off, x.bs, x.cs, x.cso) and (not x.split_rows or _quads(x.cdiv))


def _vec_a(a):
    """Whether gemm_tiled may fetch A (m, k) as float4s along the axis its loads run: k when k-fast, else m."""
    return _vec_along_rows(a) if _kfast_a(a) else _vec_along_columns(a)


def _vec_b(b):
    """The same for B (k, n): along k when k-fast, else along n."""
    return _vec_along_columns(b) if _kfast_b(b) else _vec_along_rows(b)


def _vec_c(c):
    """Whether gemm_tiled may store C (m, n) as float4s along n."""
    return _vec_along_rows(c)


def _transposed(dev, X, x, R, CC, batch):
    """The operand X (laid out as x; R rows, CC columns, batch of them) copied to a dense (CC, R) buffer per batch."""
    tile = next(t for t in (32, 16, 8, 4, 2, 1) if t * t <= dev.max_work_group_size)
    T = empty((batch * R * CC,), dev)
    k = kernels.kernel(dev, "transpose.cl", "transpose", dict(TT=tile, SPLIT=x.split))
    kernels.launch(dev, k, (CC, R, batch), (tile, tile, 1), X, *x.args(), R, CC, T, what="operand transpose")
    return T


def _gemm_choice(dev, choice, M, N, K, A, a, B, b, C, c, alpha, beta, batch, bias, bias_mode, bias_bs, relu, what):
    cfg, ksplit = choice["cfg"], choice["ksplit"]
    if choice.get("ta"):  # A(m, k) -> A^T stored (K, M): loads along m
        A, a = _transposed(dev, A, a, M, K, batch), Mat(bs=K * M, rs=1, cs=M)
    if choice.get("tb"):  # B(k, n), k fastest, seen as (N, K) -> stored (K, N): loads along n
        assert not (b.split or b.split_rows), \
            "a transposed B copy needs an unsplit B (gemm_candidates never offers it otherwise)"
        B, b = _transposed(dev, B, Mat(off=b.off, bs=b.bs, rs=b.cs, cs=b.rs), N, K, batch), Mat(bs=K * N, rs=N, cs=1)
    # the epilogue's (bias mode, ReLU): kernel arguments, so the plain product, a split-K slice and a layer's fused
    # forward share one program (gemm_common.h)
    epilogue = (bias_mode if bias is not None else 0, int(relu))
    ksplit, kc = tuning.slices(cfg, K, ksplit)
    if ksplit > 1:
        partial = empty((batch * ksplit * M * N,), dev)
        _gemm(dev, cfg, M, N, K, A, a, B, b, partial, Mat(bs=M * N, rs=N, cs=1), 1.0, 0.0, batch * ksplit,
              None, 0, (0, 0), ksplit, kc, what)
        k = kernels.kernel(dev, "gemm.cl", "gemm_reduce", dict(C_SPLIT=c.split, **_built_epilogue(dev, epilogue)))
        kernels.launch(dev, k, (N, M, batch), kernels.ANY_GROUP, M, N, ksplit, alpha, beta, partial, C, *c.args(), bias,
                       bias_bs, *epilogue, what=what + " (split-K sum)")
        return
    _gemm(dev, cfg, M, N, K, A, a, B, b, C, c, alpha, beta, batch, bias, bias_bs, epilogue, 1, K, what)


GEMM_FILES = dict(gemm_tiled="gemm.cl", gemm_block="gemm_cpu.cl")


def _built_epilogue(dev, epilogue):
    """The epilogue (bias mode, ReLU) as defines where the device fixes it at build time (tuning.EPILOGUE_AT_BUILD:
    GPUs), else none: the kernels then read their arguments, and one program serves every epilogue."""
    return dict(EPILOGUE_BIAS=epilogue[0], EPILOGUE_RELU=epilogue[1]) if tuning.epilogue_at_build(dev) else {}


def _gemm(dev, cfg, M, N, K, A, a, B, b, C, c, alpha, beta, zsize, bias, bias_bs, epilogue, ksplit, kc, what):
    memo_key = (dev, id(cfg), a, b, c, epilogue)
    found = _built.get(memo_key)
    if found is None or found[0] is not cfg:  # (an id names one cfg while it lives: the entry keeps it alive)
        found = _built.keep(memo_key, (cfg,) + _gemm_kernel(dev, cfg, a, b, c, epilogue))
    _, k, local, (tn, wn), (tm, wm) = found
    global_size = (-(-N // tn) * wn, -(-M // tm) * wm, zsize)
    kernels.launch(dev, k, global_size, local, M, N, K, alpha, beta, A, *a.args(), B, *b.args(), C, *c.args(),
                   bias, bias_bs, *epilogue, ksplit, kc, what=what)
