"""ONNX's semantics where clnet's importer once differed (clnet/onnx.py): a Gemm or MatMul whose B is a computed
tensor (a graph input) multiplied as ONNX says, not as if transposed; training-mode BatchNormalization updating
running_var with the population variance, as ONNX specifies; asymmetric and auto_pad pooling pads; variadic Sum, Max,
Min and Mean; the file's initializers kept under their names, unchanged, unless fuse=True (which refuses training).
Each model is built with onnx.helper, compared with NumPy in float64 and with ONNX Runtime."""
import numpy as np
import pytest

import clnet

from conftest import assert_close
from onnx_needed import require

onnx = require("onnx")
ort = require("onnxruntime")
import clnet.onnx as connx  # noqa: E402


def build(path, nodes, inputs, outputs, initializers=None, opset=17):
    """An ONNX file of float32 inputs and outputs ((name, shape) pairs) and NumPy initializers."""
    h = onnx.helper
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs],
                         [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in outputs],
                         [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def runtime(path, **feeds):
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    return sess.run(None, {k: np.asarray(v, np.float32) for k, v in feeds.items()})


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- Gemm and MatMul of computed tensors ---------------------------------------------------------------------------

@pytest.mark.parametrize("transA, transB, M, K, N", [(0, 0, 4, 4, 4), (0, 0, 2, 10, 3), (1, 0, 3, 5, 2),
                                                      (0, 1, 3, 5, 7), (1, 1, 1, 3, 5)])
def test_gemm_of_computed_b(dev, rng, tmp_path, transA, transB, M, K, N):
    """Gemm with A and B both graph inputs: op(A) op(B) * alpha + beta * C for each transA, transB (a square B once
    gave A B^T silently), and the gradients of A and B."""
    h = onnx.helper
    a_shape = (K, M) if transA else (M, K)
    b_shape = (N, K) if transB else (K, N)
    c = f32(rng, N)
    path = build(tmp_path / "gemm.onnx", [h.make_node("Gemm", ["a", "b", "c"], ["y"], transA=transA, transB=transB,
                                                        alpha=0.75, beta=-1.5, name="gemm")],
                 [("a", a_shape), ("b", b_shape)], [("y", (M, N))], dict(c=c))
    a, b = f32(rng, *a_shape), f32(rng, *b_shape)
    A64 = a.astype(np.float64).T if transA else a.astype(np.float64)
    B64 = b.astype(np.float64).T if transB else b.astype(np.float64)
    expected = 0.75 * A64 @ B64 - 1.5 * c
    net = connx.load(path, device=dev)
    ta, tb = clnet.tensor(a, dev, requires_grad=True), clnet.tensor(b, dev, requires_grad=True)
    y = net(ta, tb)
    assert_close(y.numpy(), expected, f"Gemm transA={transA} transB={transB}", tol=1e-5)
    assert_close(y.numpy(), runtime(path, a=a, b=b)[0], "Gemm against ONNX Runtime", tol=1e-5)
    (y * y).sum().backward()  # dL/dY = 2Y
    dY = 2.0 * expected
    dA, dB = 0.75 * dY @ B64.T, 0.75 * A64.T @ dY
    assert_close(ta.grad.numpy(), dA.T if transA else dA, "Gemm dA", tol=1e-5)
    assert_close(tb.grad.numpy(), dB.T if transB else dB, "Gemm dB", tol=1e-5)


def test_matmul_of_computed_tensors(dev, rng, tmp_path):
    """MatMul of a 3-D computed A by a computed B (a square one: transposing it gives no shape error), of a constant
    A by a computed B, and by a 1-D constant; against NumPy float64 and ONNX Runtime."""
    h = onnx.helper
    k = f32(rng, 2, 5)
    v = f32(rng, 5)
    nodes = [h.make_node("MatMul", ["a", "b"], ["ab"], name="mm_computed"),
             h.make_node("MatMul", ["k", "b"], ["kb"], name="mm_const_left"),
             h.make_node("MatMul", ["ab", "v"], ["abv"], name="mm_vector")]
    path = build(tmp_path / "mm.onnx", nodes, [("a", (3, 2, 5)), ("b", (5, 5))],
                 [("ab", (3, 2, 5)), ("kb", (2, 5)), ("abv", (3, 2))], dict(k=k, v=v))
    a, b = f32(rng, 3, 2, 5), f32(rng, 5, 5)
    A, B = a.astype(np.float64), b.astype(np.float64)
    net = connx.load(path, device=dev)
    with clnet.no_grad():
        ab, kb, abv = (t.numpy() for t in net(clnet.tensor(a, dev), clnet.tensor(b, dev)))
    for got, want, ref, name in zip((ab, kb, abv), (A @ B, k @ B, A @ B @ v), runtime(path, a=a, b=b),
                                    ("A B", "K B", "A B v")):
        assert_close(got, want, f"MatMul {name}", tol=1e-5)
        assert_close(got, ref, f"MatMul {name} against ONNX Runtime", tol=1e-5)
