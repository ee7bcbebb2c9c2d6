"""Products of computed tensors: torch.matmul's semantics (1-D to N-D, batch dimensions broadcast), bmm, baddbmm.

Every product is one batched GEMM launch (gemm.py, tuned as every other product): a B whose batch dimensions all
broadcast folds A's batch into A's rows (one product, as torch.matmul runs it), an A whose batch dimensions all
broadcast is read with batch stride 0; an operand that broadcasts along only some of them is materialised at the
batch shape first (a strided copy). Transposes cost nothing: backward's A^T and B^T are layouts (gemm.Mat), not copies.
"""
import math

from . import layout, ops, pointwise, reduce, views
from .autograd import Function
from .gemm import Mat, gemm
from .tensor import Tensor, empty


def _float(what, t):
    if not isinstance(t, Tensor):
        raise TypeError(f"{what}: expected a clnet tensor, got {type(t).__name__}")
    if t.dtype.kind != "f":
        raise TypeError(f"{what}: expected float32 tensors, got {t.dtype}; cast with .float()")
    return t


class BatchedMatMul(Function):
    """C[i] = alpha * A[i or 0] @ B[i or 0] (+ beta * D) for A (Ba, M, K), B (Bb, K, N), Ba and Bb each the batch
    or 1."""
    __slots__ = ("alpha",)

    def forward(self, a, b, batch, alpha=1.0):
        self.alpha = alpha
        Ba, M, K = a.shape
        Bb, _, N = b.shape
        out = empty((batch, M, N), a.device)
        _product(M, N, K, a, Mat(bs=M * K if Ba > 1 else 0, rs=K, cs=1), b, Mat(bs=K * N if Bb > 1 else 0, rs=N, cs=1),
                 out, Mat(bs=M * N, rs=N, cs=1), alpha, batch, "matmul")
        self.save(a, b)
        return out

    def backward(self, dc):
        a, b = self.saved
        Ba, M, K = a.shape
        Bb, _, N = b.shape
        batch = dc.shape[0]
        da = db = None
        if self.needs[0]:  # dA = dC @ B^T, summed over the batch where A was broadcast (zeros over a batch of none)
            da = empty((batch, M, K), dc.device)
            _product(M, K, N, dc, Mat(bs=M * N, rs=N, cs=1), b, Mat(bs=K * N if Bb > 1 else 0, rs=1, cs=N), da,
                     Mat(bs=M * K, rs=K, cs=1), self.alpha, batch, "matmul backward (first operand)")
            if Ba == 1:
                da = reduce.sum_to(da, (1, M, K))
        if self.needs[1]:  # dB = A^T @ dC
            db = empty((batch, K, N), dc.device)
            _product(K, N, M, a, Mat(bs=M * K if Ba > 1 else 0, rs=1, cs=K), dc, Mat(bs=M * N, rs=N, cs=1), db,
                     Mat(bs=K * N, rs=N, cs=1), self.alpha, batch, "matmul backward (second operand)")
            if Bb == 1:
                db = reduce.sum_to(db, (1, K, N))
        return da, db


def _product(M, N, K, A, a, B, b, C, c, alpha, batch, what):
    """C = alpha * A @ B for `batch` products laid out as a, b, c (gemm); a sum of no terms (K = 0) is zeros."""
    if K == 0:
        ops.fill(C, 0.0)
        return
    gemm(M, N, K, A, a, B, b, C, c, alpha=alpha, batch=batch, what=what)


def _batched(a, b, what, alpha=1.0):
    """matmul of operands of rank >= 2 (their last two dims the matrices)."""
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"{what}: shapes {a.shape} and {b.shape} cannot be multiplied ({a.shape[-1]} columns "
                         f"against {b.shape[-2]} rows)")
    if a.device is not b.device:
        raise ValueError(f"{what}: the tensors are on different devices ({a.device.name}, {b.device.name})")
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    batch_shape = layout.broadcast_shapes(what + " (batch dimensions)", a.shape[:-2], b.shape[:-2])
    nb = math.prod(batch_shape)
    if nb > 1 and math.prod(b.shape[:-2]) == 1:
        # B the same for every batch (a weight applied over (N, H, W, C)): the batch folds into A's rows, as
        # torch.matmul folds it. One product of nb * M rows; its backward's dB sums over the batch inside one
        # product, where nb products would each write a dB for a reduction to sum (ONNX's convnext_tiny, before
        # onnx/load took its MLPs as Linears: 3584 products of 56 rows a layer at batch 64)
        out = BatchedMatMul.apply(a.reshape(1, nb * M, K), b.reshape(1, K, N), batch=1, alpha=alpha)
        return out.reshape(batch_shape + (M, N))

    def flat(x, rows, cols):
        own = x.shape[:-2]
        if math.prod(own) == 1:
            return x.reshape(1, rows, cols)
        if tuple(own) != batch_shape:
            x = views.expand(x, batch_shape + (rows, cols))
        return x.reshape(nb, rows, cols)
    out = BatchedMatMul.apply(flat(a, M, K), flat(b, K, N), batch=max(nb, 1) if nb else 0, alpha=alpha)
    return out.reshape(batch_shape + (M, N))


def matmul(input, other):
    """torch.matmul: 1-D operands become a row (first) or a column (second) and that dimension is dropped again; a
    2-D product is mm; higher ranks broadcast their batch dimensions."""
    what = "matmul"
    a, b = _float(what, input), _float(what, other)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"{what}: both operands need at least one dimension, got shapes {a.shape} and {b.shape}; "
                         "use * for a scalar product")
    squeeze_rows, squeeze_cols = a.ndim == 1, b.ndim == 1
    if squeeze_rows:
        a = a.reshape(1, a.shape[0])
    if squeeze_cols:
        b = b.reshape(b.shape[0], 1)
    out = _batched(a, b, what)
    if squeeze_rows:
        out = out.reshape(out.shape[:-2] + out.shape[-1:])
    if squeeze_cols:
        out = out.reshape(out.shape[:-1])
    return out


def mm(input, mat2):
    if input.ndim != 2 or mat2.ndim != 2:
        raise ValueError(f"mm: expected two 2-D tensors, got shapes {input.shape} and {mat2.shape}")
    return matmul(input, mat2)


def bmm(input, mat2):
    if input.ndim != 3 or mat2.ndim != 3 or input.shape[0] != mat2.shape[0]:
        raise ValueError(f"bmm: expected 3-D tensors with one batch size, got shapes {input.shape} and {mat2.shape}")
    return matmul(input, mat2)


def baddbmm(input, batch1, batch2, beta=1.0, alpha=1.0):
    """beta * input + alpha * (batch1 @ batch2), input broadcast to the product's shape, as torch.baddbmm."""
    if batch1.ndim != 3 or batch2.ndim != 3:
        raise ValueError(f"baddbmm: expected 3-D batches, got shapes {batch1.shape} and {batch2.shape}")
    product = _batched(_float("baddbmm", batch1), _float("baddbmm", batch2), "baddbmm", alpha=float(alpha))
    if beta == 0:
        return product
    return pointwise.add(product, pointwise.mul(input, float(beta)) if beta != 1 else input)


TENSOR_METHODS = {"matmul": matmul, "mm": mm, "bmm": bmm}
