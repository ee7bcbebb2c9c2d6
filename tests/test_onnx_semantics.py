"""ONNX's semantics where clnet's importer once differed (clnet/onnx/): a Gemm or MatMul whose B is a computed
tensor (a graph input) multiplied as ONNX says, not as if transposed; training-mode BatchNormalization updating
running_var with the population variance, as ONNX specifies; asymmetric and auto_pad pooling pads; variadic Sum, Max,
Min and Mean; the file's initializers kept under their names, unchanged, unless fuse=True (which refuses training).
Each model is built with onnx.helper, compared with NumPy in float64 and with ONNX Runtime."""
import numpy as np
import pytest

import clnet

from conftest import assert_close, launched
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


@pytest.mark.parametrize("bias_first", [True, False])
def test_linear_over_more_dimensions_as_torch_exports_it(dev, rng, tmp_path, bias_first):
    """torch.onnx's Linear over (N, H, W, C): Transpose(W), MatMul, Add(b, product) runs as one Linear reading W as
    it is (load._linear_layers), with the same output, gradients of x, W and b, and state_dict (the file's layout);
    a second product whose transposed weight is also a graph output, and whose product another node reads, keeps its
    nodes. Against NumPy in float64 and ONNX Runtime."""
    h = onnx.helper
    w, b, w2 = f32(rng, 7, 5), f32(rng, 7), f32(rng, 3, 7)
    nodes = [h.make_node("Transpose", ["w"], ["wt"], perm=[1, 0], name="t"),
             h.make_node("MatMul", ["x", "wt"], ["xw"], name="mm"),
             h.make_node("Add", ["b", "xw"] if bias_first else ["xw", "b"], ["y"], name="add"),
             h.make_node("Transpose", ["w2"], ["w2t"], perm=[1, 0], name="t2"),
             h.make_node("MatMul", ["y", "w2t"], ["z"], name="mm2"),
             h.make_node("Mul", ["z", "z"], ["zz"], name="square")]
    path = build(tmp_path / "linear.onnx", nodes, [("x", (2, 3, 4, 5))],
                 [("zz", (2, 3, 4, 3)), ("z", (2, 3, 4, 3)), ("w2t", (7, 3))], dict(w=w, b=b, w2=w2))
    net = connx.load(path, device=dev)
    ops = [n.op for n in net._nodes]
    assert ops.count("Transpose") == 1 and ops.count("Add") == 0, f"the first Linear's nodes kept: {ops}"
    x = f32(rng, 2, 3, 4, 5)
    X, W, B, W2 = (a.astype(np.float64) for a in (x, w, b, w2))
    Y = X @ W.T + B
    Z = Y @ W2.T
    tx = clnet.tensor(x, dev, requires_grad=True)
    zz, z, w2t = net(tx)
    for got, want, ref, name in zip((zz, z, w2t), (Z * Z, Z, W2.T), runtime(path, x=x), ("z * z", "z", "w2^T")):
        assert_close(got.numpy(), want, f"Linear {name}", tol=1e-5)
        assert_close(got.numpy(), ref, f"Linear {name} against ONNX Runtime", tol=1e-5)
    zz.sum().backward()  # dL/dz = 2z
    dZ = 2.0 * Z
    dY = dZ @ W2
    params = dict(net.named_parameters())
    assert_close(tx.grad.numpy(), dY @ W, "dx", tol=1e-5)
    assert_close(params["w"].grad.numpy(), np.einsum("nhwo,nhwi->oi", dY, X), "dW", tol=1e-5)
    assert_close(params["b"].grad.numpy(), dY.sum(axis=(0, 1, 2)), "db", tol=1e-5)
    assert_close(params["w2"].grad.numpy(), np.einsum("nhwo,nhwi->oi", dZ, Y), "dW2", tol=1e-5)
    state = net.state_dict()
    np.testing.assert_array_equal(state["w"], w)
    np.testing.assert_array_equal(state["b"], b)


def _gelu64(x):
    from math import erf
    x = x.astype(np.float64)
    cdf = 0.5 * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / np.sqrt(2.0 * np.pi)
    return x * cdf, cdf + x * pdf  # GELU and its derivative


@pytest.mark.parametrize("spelling", ["torch", "clnet", "torch, 0.49", "clnet, erf read twice",
                                      "torch, constants of rank 3", "clnet, constants of rank 3"])
def test_gelu_as_exporters_spell_it(dev, rng, tmp_path, spelling):
    """x * 0.5 * (1 + erf(x / sqrt 2)) in torch.onnx's nodes and in clnet's own export runs as one Gelu
    (load._gelus); near misses keep their nodes: 0.49 for the half, an Erf whose output another node reads, and
    one-element constants of rank 3, which raise the result's rank to 3. Values and the gradient against NumPy in
    float64 and ONNX Runtime."""
    h = onnx.helper
    consts = dict(sqrt2=np.float32(2 ** 0.5), rsqrt2=np.float32(0.5 ** 0.5), one=np.float32(1.0),
                  half=np.float32(0.49 if "0.49" in spelling else 0.5))
    rank3 = "rank 3" in spelling
    if rank3:
        consts = {k: np.reshape(v, (1, 1, 1)) for k, v in consts.items()}
    if spelling.startswith("torch"):
        nodes = [h.make_node("Div", ["x", "sqrt2"], ["d"]), h.make_node("Erf", ["d"], ["e"]),
                 h.make_node("Add", ["e", "one"], ["a"]), h.make_node("Mul", ["x", "a"], ["m"]),
                 h.make_node("Mul", ["m", "half"], ["y"])]
    else:
        nodes = [h.make_node("Mul", ["rsqrt2", "x"], ["d"]), h.make_node("Erf", ["d"], ["e"]),
                 h.make_node("Add", ["one", "e"], ["a"]), h.make_node("Mul", ["x", "half"], ["hx"]),
                 h.make_node("Mul", ["hx", "a"], ["y"])]
    outputs = [("y", (1, 3, 37) if rank3 else (3, 37))]
    if "twice" in spelling:
        nodes.append(h.make_node("Neg", ["e"], ["ne"]))
        outputs.append(("ne", (3, 37)))
    path = build(tmp_path / "gelu.onnx", [n for n in nodes], [("x", (3, 37))], outputs, consts)
    net = connx.load(path, device=dev)
    fused = spelling in ("torch", "clnet")
    assert [n.op for n in net._nodes].count("Gelu") == int(fused), [n.op for n in net._nodes]
    x = f32(rng, 3, 37) * 2
    value, slope = _gelu64(x)
    if not fused and "0.49" in spelling:
        value, slope = value * 0.98, slope * 0.98
    tx = clnet.tensor(x, dev, requires_grad=True)
    out = net(tx)
    y = out[0] if isinstance(out, tuple) else out
    assert y.shape == ((1, 3, 37) if rank3 else (3, 37)), f"GELU ({spelling}): shape {y.shape}"
    value = value.reshape(y.shape)
    assert_close(y.numpy(), value, f"GELU ({spelling})", tol=1e-5)
    assert_close(y.numpy(), runtime(path, x=x)[0], f"GELU ({spelling}) against ONNX Runtime", tol=1e-5)
    g = f32(rng, 3, 37)
    y.backward(clnet.tensor(g.reshape(y.shape), dev))
    assert_close(tx.grad.numpy(), g * slope, f"GELU's gradient ({spelling})", tol=1e-5)


@pytest.mark.parametrize("spelling", ["x * sigmoid(x)", "sigmoid(x) * x", "gate: y * sigmoid(x)",
                                      "sigmoid read twice"])
def test_silu_as_exporters_spell_it(dev, rng, tmp_path, spelling):
    """Mul(x, Sigmoid(x)) in either order runs as one SiLU (load._silus); a gate multiplying another tensor and a
    Sigmoid with a second reader keep their nodes. Values and both inputs' gradients against NumPy in float64 and
    ONNX Runtime."""
    h = onnx.helper
    mul_inputs = {"x * sigmoid(x)": ["x", "s"], "sigmoid(x) * x": ["s", "x"], "gate: y * sigmoid(x)": ["y", "s"],
                  "sigmoid read twice": ["x", "s"]}[spelling]
    nodes = [h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("Mul", mul_inputs, ["z"])]
    outputs = [("z", (4, 29))]
    if "twice" in spelling:
        nodes.append(h.make_node("Neg", ["s"], ["ns"]))
        outputs.append(("ns", (4, 29)))
    path = build(tmp_path / "silu.onnx", nodes, [("x", (4, 29)), ("y", (4, 29))], outputs)
    net = connx.load(path, device=dev)
    fused = spelling in ("x * sigmoid(x)", "sigmoid(x) * x")
    assert ("Sigmoid" in [n.op for n in net._nodes]) != fused, [n.op for n in net._nodes]
    x, y = f32(rng, 4, 29) * 3, f32(rng, 4, 29)
    X, Y = x.astype(np.float64), y.astype(np.float64)
    sig = 1.0 / (1.0 + np.exp(-X))
    other = Y if spelling.startswith("gate") else X
    tx, ty = clnet.tensor(x, dev, requires_grad=True), clnet.tensor(y, dev, requires_grad=True)
    out = net(tx, ty)
    z = out[0] if isinstance(out, tuple) else out
    assert_close(z.numpy(), other * sig, f"SiLU ({spelling})", tol=1e-5)
    assert_close(z.numpy(), runtime(path, x=x, y=y)[0], f"SiLU ({spelling}) against ONNX Runtime", tol=1e-5)
    g = f32(rng, 4, 29)
    z.backward(clnet.tensor(g, dev))
    dx = g * other * sig * (1 - sig) + (0 if spelling.startswith("gate") else g * sig)
    assert_close(tx.grad.numpy(), dx, f"SiLU's gradient ({spelling})", tol=1e-5)
    if spelling.startswith("gate"):
        assert_close(ty.grad.numpy(), g * sig, "the gate's gradient", tol=1e-5)


def test_imported_add_relu_exports_again(dev, rng, tmp_path):
    """An Add whose one reader is a Relu runs as one op once imported (ops.AddRelu, a residual block's end); exported
    again it is an Add and a Relu, and ONNX Runtime gives the import's output (a review found it had no translation)."""
    h = onnx.helper
    path = build(tmp_path / "add_relu.onnx", [h.make_node("Add", ["a", "b"], ["s"]), h.make_node("Relu", ["s"], ["y"])],
                 [("a", (2, 3, 5)), ("b", (2, 3, 5))], [("y", (2, 3, 5))])
    net = connx.load(path, device=dev)
    a, b = f32(rng, 2, 3, 5), f32(rng, 2, 3, 5)
    with clnet.no_grad():
        ours = net(clnet.tensor(a, dev), clnet.tensor(b, dev)).numpy()
    assert_close(ours, np.maximum(a.astype(np.float64) + b, 0), "the import", tol=1e-6)
    again = str(tmp_path / "again.onnx")
    connx.export(net, again, (clnet.tensor(a, dev), clnet.tensor(b, dev)))
    assert {n.op_type for n in onnx.load(again).graph.node} >= {"Add", "Relu"}
    sess = ort.InferenceSession(again, providers=["CPUExecutionProvider"])
    theirs = sess.run(None, {i.name: v for i, v in zip(sess.get_inputs(), (a, b))})[0]
    assert_close(theirs, ours, "the export again, in ONNX Runtime", tol=1e-6)


# ---- BatchNormalization in training mode ---------------------------------------------------------------------------

def numpy_batch_norm_training(x, scale, bias, mean, var, eps, momentum):
    """ONNX's BatchNormalization-15 with training_mode=1, in float64: the batch's statistics normalise; the running
    ones move towards the batch mean and the population (biased) variance."""
    x = x.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    m, v = x.mean(axis=axes), x.var(axis=axes)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - m.reshape(shape)) / np.sqrt(v.reshape(shape) + eps) * scale.reshape(shape) + bias.reshape(shape)
    return y, momentum * mean + (1 - momentum) * m, momentum * var + (1 - momentum) * v


@pytest.mark.parametrize("shape", [(3, 4, 5, 3), (5, 3, 7)])
def test_training_batch_norm_updates_running_var_with_the_population_variance(dev, rng, tmp_path, shape):
    """training_mode=1 (opset 15): the outputs running_mean and running_var, and the module's buffers that hold them
    (the file's initializers), are ONNX's (population variance), not PyTorch's n / (n - 1) one; a second call moves
    them again from there. 3-D inputs normalise per channel too."""
    h = onnx.helper
    C = shape[1]
    scale, bias = rng.uniform(0.5, 1.5, C).astype(np.float32), f32(rng, C)
    mean, var = f32(rng, C), rng.uniform(0.5, 2.0, C).astype(np.float32)
    eps, momentum = 1e-3, 0.8
    node = h.make_node("BatchNormalization", ["x", "scale", "bias", "mean", "var"], ["y", "rm", "rv"],
                       training_mode=1, epsilon=eps, momentum=momentum, name="bn")
    path = build(tmp_path / "bn.onnx", [node], [("x", shape)], [("y", shape), ("rm", (C,)), ("rv", (C,))],
                 dict(scale=scale, bias=bias, mean=mean, var=var), opset=15)
    net = connx.load(path, device=dev)
    assert net.training
    m64, v64 = mean.astype(np.float64), var.astype(np.float64)
    for step in range(2):
        x = f32(rng, *shape) * 2.0 + 0.5
        y_ref, m64, v64 = numpy_batch_norm_training(x, scale, bias, m64, v64, eps, momentum)
        with clnet.no_grad():
            y, rm, rv = (t.numpy() for t in net(clnet.tensor(x, dev)))
        assert_close(y, y_ref, f"step {step} y", tol=1e-5)
        assert_close(rm, m64, f"step {step} running_mean", tol=1e-6)
        assert_close(rv, v64, f"step {step} running_var", tol=1e-6)
        assert_close(net.state_dict()["var"], v64, f"step {step} the buffer var", tol=1e-6)


@pytest.mark.parametrize("op", ["BatchNormalization", "BatchNormalization+Clip", "Conv", "Conv+Clip", "Conv1d", "Add",
                                "Add broadcast"])
@pytest.mark.parametrize("case", ["fused", "y also an output", "y read twice"])
def test_the_relu_after_a_batch_norm_or_a_convolution_runs_in_it(dev, rng, tmp_path, monkeypatch, op, case):
    """A BatchNormalization or Conv whose output only a Relu reads applies the ReLU itself (a batch norm also a Clip
    to [0, 6], ReLU6): the batch norm in its passes and its backward's (no act_fwd or act_bwd launch), the
    convolution in its epilogue and, having a bias, its ReLU's gradient in its bias gradient's pass (no act_fwd or
    act_bwd launch; a Clip after it stays a node). Outputs, running statistics and
    gradients are bit for bit those of the nodes run apart, in training and in eval. Not where the output is a graph
    output or has another reader."""
    clip, broadcast = op.endswith("+Clip"), op.endswith(" broadcast")
    op = op.replace("+Clip", "").replace(" broadcast", "")
    act = ("relu6" if op == "BatchNormalization" else None) if clip else "relu"
    h = onnx.helper
    shape, C = ((4, 3, 11) if op == "Conv1d" else (4, 3, 5, 6)), 3
    if op == "Add":  # a residual block's end (broadcast: the add runs apart, then the ReLU, as the nodes would)
        first = h.make_node("Add", ["x", "z"], ["y"], name="add")
        init = dict(z=f32(rng, *((1, C, 1, 1) if broadcast else shape)))
    elif op == "Conv1d":
        first = h.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1], name="conv1d")
        init = dict(w=f32(rng, C, C, 3) * 0.3, b=f32(rng, C))
    elif op == "BatchNormalization":
        first = h.make_node(op, ["x", "scale", "bias", "mean", "var"], ["y", "rm", "rv"], training_mode=1, name="bn")
        init = dict(scale=rng.uniform(0.5, 1.5, C).astype(np.float32), bias=f32(rng, C), mean=f32(rng, C),
                    var=rng.uniform(0.5, 2.0, C).astype(np.float32))
    else:
        first = h.make_node(op, ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], name="conv")
        init = dict(w=f32(rng, C, C, 3, 3) * 0.3, b=f32(rng, C))
    nodes = [first, h.make_node("Clip", ["y", "lo", "hi"], ["r"], name="relu6") if clip else
             h.make_node("Relu", ["y"], ["r"], name="relu")]
    if clip:
        init.update(lo=np.array(0.0, np.float32), hi=np.array(6.0, np.float32))
        if op == "BatchNormalization":
            init["scale"] = init["scale"] * 8  # outputs past 6 too
    outputs = [("r", shape)]
    if case == "y also an output":
        outputs.append(("y", shape))
    if case == "y read twice":
        nodes.append(h.make_node("Add", ["r", "y"], ["s"], name="add"))
        outputs = [("s", shape)]
    path = build(tmp_path / "relu_after.onnx", nodes, [("x", shape)], outputs, init, opset=15)
    x0, dy = f32(rng, *shape), f32(rng, *shape)
    results, launches = {}, {}
    for fuse in (True, False):
        if not fuse:
            monkeypatch.setattr(connx.module, "_fuse_relus", lambda nodes, outputs, constants: None)
        net = connx.load(path, device=dev)
        assert net._nodes[0].act == (act if fuse and case == "fused" else None)
        x = clnet.tensor(x0, dev, requires_grad=True)
        with launched() as names:
            out = net(x)
            out = out[0] if isinstance(out, tuple) else out
            (out * clnet.tensor(dy, dev)).sum().backward()
        state = net.state_dict()
        net.eval()
        with clnet.no_grad():
            evaluated = net(clnet.tensor(x0, dev))
        evaluated = evaluated[0] if isinstance(evaluated, tuple) else evaluated
        results[fuse] = [out.numpy(), x.grad.numpy(), evaluated.numpy()] + [state[k] for k in sorted(state)] + [
            p.grad.numpy() for p in net.parameters()]
        launches[fuse] = names
    fused = case == "fused" and act is not None and not broadcast
    # the Add keeps act_bwd; the convolutions here have a bias, whose pass takes their ReLU's gradient (bias_grad)
    saved = ("act_fwd",) if op == "Add" else ("act_fwd", "act_bwd")
    if not clip:  # (a Clip runs pointwise.cl's kernels, not act_fwd)
        for name in saved:
            assert (name in launches[True]) == (not fused)
    assert len(launches[True]) == len(launches[False]) - len(saved) * fused
    for a, b in zip(results[True], results[False]):
        assert np.array_equal(a, b)


def test_a_relu_after_an_add_of_host_values_still_applies(dev, tmp_path):
    """Shape arithmetic runs on the host: an Add of host values followed by a Relu keeps the ReLU (the Relu passes
    on only what the add's device path has already taken through it)."""
    h = onnx.helper
    nodes = [h.make_node("Shape", ["x"], ["s"], name="shape"), h.make_node("Add", ["s", "c"], ["t"], name="add"),
             h.make_node("Relu", ["t"], ["u"], name="relu")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (4, 3, 5, 6))],
                         [h.make_tensor_value_info("u", onnx.TensorProto.INT64, (4,))],
                         [onnx.numpy_helper.from_array(np.array([-5, 0, -9, 1], np.int64), "c")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "shape.onnx"))
    net = connx.load(str(tmp_path / "shape.onnx"), device=dev)
    assert net._nodes[1].act == "relu"
    assert net(clnet.tensor(np.zeros((4, 3, 5, 6), np.float32), dev)).numpy().tolist() == [0, 3, 0, 7]


def test_a_join_that_begins_with_an_earlier_one_joins_its_output(dev, rng, tmp_path, monkeypatch):
    """densenet's pattern: each Concat joins every map before it. One that begins with all of an earlier Concat's
    inputs joins that one's output and the rest (module._chain_concats): the forward bit for bit the same, two copies
    a join instead of one an input, the gradients those of PyTorch in float64 (and of the joins run as written)."""
    torch = pytest.importorskip("torch")
    h = onnx.helper
    shape = (2, 2, 3, 3)
    w1, w2 = f32(rng, 2, 4, 1, 1), f32(rng, 2, 6, 1, 1)
    nodes = [h.make_node("Sigmoid", ["x"], ["a"], name="a"),
             h.make_node("Concat", ["x", "a"], ["c1"], axis=1, name="c1"),
             h.make_node("Conv", ["c1", "w1"], ["b"], name="b"),
             h.make_node("Concat", ["x", "a", "b"], ["c2"], axis=1, name="c2"),
             h.make_node("Conv", ["c2", "w2"], ["d"], name="d"),
             h.make_node("Concat", ["x", "a", "b", "d"], ["c3"], axis=1, name="c3")]
    path = build(tmp_path / "dense.onnx", nodes, [("x", shape)], [("c3", (2, 8, 3, 3))], dict(w1=w1, w2=w2))
    x0, dy = f32(rng, *shape), f32(rng, 2, 8, 3, 3)
    runs = {}
    for chained in (True, False):
        if not chained:
            monkeypatch.setattr(connx.module, "_chain_concats", lambda nodes: None)
        net = connx.load(path, device=dev)
        joins = [n.inputs for n in net._nodes if n.op == "Concat"]
        assert joins == ([["x", "a"], ["c1", "b"], ["c2", "d"]] if chained else
                         [["x", "a"], ["x", "a", "b"], ["x", "a", "b", "d"]])
        x = clnet.tensor(x0, dev, requires_grad=True)
        y = net(x)
        (y * clnet.tensor(dy, dev)).sum().backward()
        runs[chained] = [y.numpy(), x.grad.numpy()] + [p.grad.numpy() for _, p in sorted(net.named_parameters())]
    assert np.array_equal(runs[True][0], runs[False][0])
    tx = torch.tensor(x0.astype(np.float64), requires_grad=True)
    tw1, tw2 = (torch.tensor(w.astype(np.float64), requires_grad=True) for w in (w1, w2))
    ta = torch.sigmoid(tx)
    tb = torch.nn.functional.conv2d(torch.cat([tx, ta], 1), tw1)
    td = torch.nn.functional.conv2d(torch.cat([tx, ta, tb], 1), tw2)
    ty = torch.cat([tx, ta, tb, td], 1)
    (ty * torch.tensor(dy.astype(np.float64))).sum().backward()
    for got, want, name in zip(runs[True][1:], (tx.grad, tw1.grad, tw2.grad), ("d x", "d w1", "d w2")):
        assert_close(got, want.numpy(), name, tol=1e-6)
    for got, written in zip(runs[True][1:], runs[False][1:]):
        assert_close(got, written, "against the joins as written", tol=1e-6)


def test_training_batch_norm_leaves_graph_inputs_unchanged(dev, rng, tmp_path):
    """Running statistics given as graph inputs (as ONNX's node tests give them) come back updated as new outputs;
    the caller's tensors keep their values."""
    h = onnx.helper
    shape, C = (2, 3, 4, 5), 3
    node = h.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1, name="bn")
    path = build(tmp_path / "bn_inputs.onnx", [node], [("x", shape), ("s", (C,)), ("b", (C,)), ("m", (C,)),
                                                         ("v", (C,))],
                 [("y", shape), ("rm", (C,)), ("rv", (C,))], opset=15)
    x, s, b, m = f32(rng, *shape), f32(rng, C), f32(rng, C), f32(rng, C)
    v = rng.uniform(0.5, 2.0, C).astype(np.float32)
    net = connx.load(path, device=dev)
    args = [clnet.tensor(a, dev) for a in (x, s, b, m, v)]
    with clnet.no_grad():
        y, rm, rv = (t.numpy() for t in net(*args))
    y_ref, m_ref, v_ref = numpy_batch_norm_training(x, s, b, m.astype(np.float64), v.astype(np.float64), 1e-5, 0.9)
    assert_close(y, y_ref, "y", tol=1e-5)
    assert_close(rm, m_ref, "running_mean", tol=1e-6)
    assert_close(rv, v_ref, "running_var", tol=1e-6)
    for got, ref, name in zip((y, rm, rv), runtime(path, x=x, s=s, b=b, m=m, v=v), ("y", "rm", "rv")):
        assert_close(got, ref, f"{name} against ONNX Runtime", tol=1e-5)
    assert np.array_equal(args[3].numpy(), m) and np.array_equal(args[4].numpy(), v)


# ---- pooling pads and variadic operators ---------------------------------------------------------------------------

def numpy_pool(x, kind, k, s, pads, out_hw, count_include_pad=0):
    """Max or average pooling in float64 with pads (top, left, bottom, right) and the output's size given; windows
    clipped to the padded input, the average over the input elements (count_include_pad=0) or the padded ones."""
    N, C, H, W = x.shape
    t, l, b, r = pads
    y = np.zeros((N, C) + tuple(out_hw))
    for i in range(out_hw[0]):
        for j in range(out_hw[1]):
            y0, x0 = i * s[0] - t, j * s[1] - l
            ys, xs = slice(max(y0, 0), min(y0 + k[0], H)), slice(max(x0, 0), min(x0 + k[1], W))
            win = x[:, :, ys, xs].astype(np.float64)
            if kind == "max":
                y[:, :, i, j] = win.max(axis=(2, 3))
            else:
                padded = (min(y0 + k[0], H + b) - y0) * (min(x0 + k[1], W + r) - x0)
                y[:, :, i, j] = win.sum(axis=(2, 3)) / (padded if count_include_pad else win[0, 0].size)
    return y


@pytest.mark.parametrize("op, attrs, pads", [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]), (0, 0, 1, 1)),  # Caffe's ceil rounding
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1]), (1, 0, 0, 1)),
    ("MaxPool", dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_UPPER"), None),
    ("AveragePool", dict(kernel_shape=[3, 2], strides=[2, 1], auto_pad="SAME_LOWER"), None),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 1, 0], ceil_mode=1), (0, 1, 1, 0)),
])
def test_asymmetric_pooling_pads(dev, rng, tmp_path, op, attrs, pads):
    """Pads that differ at the two ends, given (Caffe-era files' [0, 0, 1, 1]) or from auto_pad SAME on an odd
    size, with and without ceil_mode: ONNX Runtime's output shape and values, NumPy float64's values."""
    h = onnx.helper
    x = f32(rng, 2, 3, 7, 9)
    path = build(tmp_path / "pool.onnx", [h.make_node(op, ["x"], ["y"], name="pool", **attrs)], [("x", x.shape)],
                 [("y", [None] * 4)])
    expected = runtime(path, x=x)[0]
    if pads is None:  # SAME: the total padding that keeps ceil(size / stride), the odd one at the end (UPPER)
        pads = [0, 0, 0, 0]
        for i, (size, k, s) in enumerate(zip(x.shape[2:], attrs["kernel_shape"], attrs["strides"])):
            total = max((-(-size // s) - 1) * s + k - size, 0)
            first = total // 2 if attrs["auto_pad"] == "SAME_UPPER" else total - total // 2
            pads[i], pads[i + 2] = first, total - first
    kind = "max" if op == "MaxPool" else "avg"
    reference = numpy_pool(x, kind, attrs["kernel_shape"], attrs["strides"], pads, expected.shape[2:])
    net = connx.load(path, device=dev)
    with clnet.no_grad():
        y = net(clnet.tensor(x, dev)).numpy()
    assert y.shape == expected.shape
    assert_close(y, reference, f"{op} {attrs} against NumPy", tol=1e-6)
    assert_close(y, expected, f"{op} {attrs} against ONNX Runtime", tol=1e-6)


def test_variadic_sum_max_min_mean(dev, rng, tmp_path):
    """Sum of three tensors and of one, Max and Mean of three, Min of two (a constant among them): ONNX Runtime's
    values, NumPy's, and Max's gradient to the input that holds each maximum."""
    h = onnx.helper
    shape = (2, 3, 5)
    k = f32(rng, *shape)
    nodes = [h.make_node("Sum", ["a", "b", "c"], ["s"], name="sum3"), h.make_node("Sum", ["a"], ["s1"], name="sum1"),
             h.make_node("Max", ["a", "b", "c"], ["mx"], name="max3"), h.make_node("Min", ["b", "k"], ["mn"],
                                                                                    name="min2"),
             h.make_node("Mean", ["a", "b", "c"], ["me"], name="mean3")]
    outs = [(o, shape) for o in ("s", "s1", "mx", "mn", "me")]
    path = build(tmp_path / "variadic.onnx", nodes, [(n, shape) for n in "abc"], outs, dict(k=k))
    a, b, c = (f32(rng, *shape) for _ in range(3))
    A, B, C = (v.astype(np.float64) for v in (a, b, c))
    expected = [A + B + C, A, np.maximum(np.maximum(A, B), C), np.minimum(B, k), (A + B + C) / 3]
    net = connx.load(path, device=dev)
    ta, tb, tc = (clnet.tensor(v, dev, requires_grad=True) for v in (a, b, c))
    got = net(ta, tb, tc)
    for g, want, ref, (name, _) in zip(got, expected, runtime(path, a=a, b=b, c=c), outs):
        assert_close(g.numpy(), want, f"{name}", tol=1e-6)
        assert_close(g.numpy(), ref, f"{name} against ONNX Runtime", tol=1e-6)
    got[2].sum().backward()  # d max / d input: 1 where that input is the largest
    winner = np.argmax(np.stack([A, B, C]), axis=0)
    for i, t in enumerate((ta, tb, tc)):
        assert np.array_equal(t.grad.numpy(), (winner == i).astype(np.float32)), f"Max's gradient to input {i}"


# ---- the file's network, unchanged, unless fuse=True ---------------------------------------------------------------

def conv_bn_file(path, rng, training_mode=0):
    h = onnx.helper
    inits = {"conv1.weight": f32(rng, 4, 3, 3, 3) * 0.3, "conv1.bias": f32(rng, 4),
             "bn1.weight": rng.uniform(0.5, 1.5, 4).astype(np.float32), "bn1.bias": f32(rng, 4),
             "bn1.running_mean": f32(rng, 4) * 0.1, "bn1.running_var": rng.uniform(0.5, 2, 4).astype(np.float32)}
    outs = ["y", "rm", "rv"] if training_mode else ["y"]
    nodes = [h.make_node("Conv", ["x", "conv1.weight", "conv1.bias"], ["c"], pads=[1, 1, 1, 1], name="conv1"),
             h.make_node("BatchNormalization", ["c", "bn1.weight", "bn1.bias", "bn1.running_mean",
                                                "bn1.running_var"], outs, training_mode=training_mode, name="bn1")]
    return build(path, nodes, [("x", (2, 3, 5, 6))], [("y", (2, 4, 5, 6))], inits, opset=15), inits


def test_eval_file_keeps_its_initializers_unless_fused(dev, rng, tmp_path):
    """An eval-mode Conv -> BatchNormalization: by default the state_dict holds the file's initializers under their
    names, bit for bit, and the module trains (batch statistics in train()); fuse=True folds the batch norm for
    inference (the same output) and refuses train(); a training-mode file with fuse=True is refused at load."""
    path, inits = conv_bn_file(tmp_path / "convbn.onnx", rng)
    x = f32(rng, 2, 3, 5, 6)
    expected = runtime(path, x=x)[0]
    net = connx.load(path, device=dev)
    state = net.state_dict()
    assert set(state) == set(inits)
    for k, v in inits.items():
        assert np.array_equal(state[k], v), k
    with clnet.no_grad():
        assert_close(net(clnet.tensor(x, dev)).numpy(), expected, "unfused", tol=1e-5)
    net.train()
    y = net(clnet.tensor(x, dev, requires_grad=True))
    y.sum().backward()  # batch statistics: the sum of a batch-normalised channel's outputs is its bias times N*H*W
    assert_close(net._parameters["bn1.bias"].grad.numpy(), np.full(4, 2 * 5 * 6.0), "bn1.bias grad", tol=1e-6)
    fused = connx.load(path, device=dev, fuse=True)
    assert not fused.training and "bn1.running_var" not in fused.state_dict()
    with clnet.no_grad():
        assert_close(fused(clnet.tensor(x, dev)).numpy(), expected, "fused", tol=1e-5)
    with pytest.raises(connx.OnnxImportError, match="fuse=False to train"):
        fused.train()
    training_path, _ = conv_bn_file(tmp_path / "convbn_training.onnx", rng, training_mode=1)
    with pytest.raises(connx.OnnxImportError, match="exported in training mode"):
        connx.load(training_path, fuse=True)


# ---- broadcasting, Clip with computed bounds, Neg, Abs, 1-D convolution and pooling --------------------------------

def test_broadcasts_and_computed_clip_bounds(dev, rng, tmp_path):
    """Add/Sub/Mul/Div with a constant of any broadcastable shape, computed tensors repeated along leading axes (and
    a computed scalar), Gemm with a computed scalar bias, Clip with computed bounds, Neg and Abs: NumPy float64's and
    ONNX Runtime's values, and the gradient of a repeated computed operand (the sum over its repeats)."""
    h = onnx.helper
    k1, k2 = f32(rng, 4, 1), f32(rng, 3, 1, 5)
    nodes = [h.make_node("Add", ["x", "v"], ["a"], name="add_suffix"),     # (3, 4, 5) + computed (5,)
             h.make_node("Mul", ["x", "k1"], ["b"], name="mul_const"),      # * constant (4, 1)
             h.make_node("Div", ["x", "k2"], ["c"], name="div_const"),      # / constant (3, 1, 5)
             h.make_node("Sub", ["s", "x"], ["d"], name="sub_scalar"),      # computed scalar - x
             h.make_node("Clip", ["x", "lo", "hi"], ["e"], name="clip"),
             h.make_node("Neg", ["x"], ["f"], name="neg"), h.make_node("Abs", ["x"], ["g"], name="abs"),
             h.make_node("Gemm", ["m", "w", "s"], ["gm"], name="gemm_scalar_bias")]
    shape = (3, 4, 5)
    outs = [(o, shape) for o in "abcdefg"] + [("gm", (2, 3))]
    path = build(tmp_path / "bcast.onnx", nodes, [("x", shape), ("v", (5,)), ("s", ()), ("lo", ()), ("hi", ()),
                                                   ("m", (2, 4)), ("w", (4, 3))], outs, dict(k1=k1, k2=k2))
    x, v, m, w = f32(rng, *shape), f32(rng, 5), f32(rng, 2, 4), f32(rng, 4, 3)
    s, lo, hi = (np.array(val, np.float32) for val in (0.7, -0.4, 0.5))
    X = x.astype(np.float64)
    expected = [X + v, X * k1, X / k2.astype(np.float64), 0.7 - X, np.clip(X, -0.4, 0.5), -X, np.abs(X),
                m.astype(np.float64) @ w + s]
    net = connx.load(path, device=dev)
    tv = clnet.tensor(v, dev, requires_grad=True)
    got = net(clnet.tensor(x, dev), tv, *(clnet.tensor(t, dev) for t in (s, lo, hi, m, w)))
    feeds = dict(x=x, v=v, s=s, lo=lo, hi=hi, m=m, w=w)
    for g, want, ref, (name, _) in zip(got, expected, runtime(path, **feeds), outs):
        assert_close(g.numpy(), want, name, tol=1e-6)
        assert_close(g.numpy(), ref, f"{name} against ONNX Runtime", tol=1e-6)
    got[0].sum().backward()
    assert_close(tv.grad.numpy(), np.full(5, 12.0), "the repeated operand's gradient", tol=1e-6)


def test_one_dimensional_convolution_and_pooling(dev, rng, tmp_path):
    """Conv, MaxPool and AveragePool over (N, C, L) run as their 2-D forms of height 1 (pads, strides, dilation)."""
    h = onnx.helper
    w, b = f32(rng, 4, 3, 3) * 0.3, f32(rng, 4)
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], pads=[2, 1], strides=[2], dilations=[2], name="conv1d"),
             h.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2], pads=[0, 1], name="max1d"),
             h.make_node("AveragePool", ["x"], ["q"], kernel_shape=[3], strides=[2], pads=[1, 1], name="avg1d")]
    path = build(tmp_path / "conv1d.onnx", nodes, [("x", (2, 3, 11))], [("p", [None] * 3), ("q", [None] * 3)],
                 dict(w=w, b=b))
    x = f32(rng, 2, 3, 11)
    with clnet.no_grad():
        p, q = (t.numpy() for t in connx.load(path, device=dev)(clnet.tensor(x, dev)))
    rp, rq = runtime(path, x=x)
    assert p.shape == rp.shape and q.shape == rq.shape
    assert_close(p, rp, "Conv 1-D then MaxPool 1-D against ONNX Runtime", tol=1e-5)
    assert_close(q, rq, "AveragePool 1-D against ONNX Runtime", tol=1e-6)


@pytest.mark.parametrize("perm", [[1, 0, 2], [2, 1, 0], [1, 2, 0], [0, 2, 1]])
def test_transposes_of_small_tensors(dev, rng, tmp_path, perm):
    """Transposes that move the batch axis, of a tensor of known, small size: NumPy's values and the gradient (the
    inverse permutation of the output's)."""
    h = onnx.helper
    x = f32(rng, 2, 3, 4)
    out_shape = tuple(x.shape[p] for p in perm)
    path = build(tmp_path / "t.onnx", [h.make_node("Transpose", ["x"], ["y"], perm=perm, name="t")],
                 [("x", x.shape)], [("y", out_shape)])
    tx = clnet.tensor(x, dev, requires_grad=True)
    y = connx.load(path, device=dev)(tx)
    assert np.array_equal(y.numpy(), np.transpose(x, perm))
    g = f32(rng, *out_shape)
    (y * clnet.tensor(g, dev)).sum().backward()
    assert np.array_equal(tx.grad.numpy(), np.transpose(g, np.argsort(perm)))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
def test_reductions_over_any_axes(dev, rng, tmp_path, op):
    """Reductions over a middle axis, over axes that are not adjacent, over the trailing ones and over all (axes as
    an input, opset 18), with and without keepdims: NumPy float64's and ONNX Runtime's values, and the gradient of the
    middle-axis one (ones for a sum, 1/K for a mean, the first extreme's position for max and min)."""
    h = onnx.helper
    shape = (3, 4, 5, 2)
    cases = [([1], 1), ([0, 2], 0), ([2, 3], 1), ([], 0)]
    nodes, outs, inits = [], [], {}
    fn = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max, "ReduceMin": np.min}[op]
    x = f32(rng, *shape)
    expected = []
    for i, (axes, keep) in enumerate(cases):
        inits[f"axes{i}"] = np.array(axes, np.int64)
        nodes.append(h.make_node(op, ["x", f"axes{i}"] if axes else ["x"], [f"y{i}"], keepdims=keep, name=f"r{i}"))
        want = fn(x.astype(np.float64), axis=tuple(axes) if axes else None, keepdims=bool(keep))
        outs.append((f"y{i}", np.shape(want)))
        expected.append(want)
    path = build(tmp_path / "reduce.onnx", nodes, [("x", shape)], outs, inits, opset=18)
    net = connx.load(path, device=dev)
    tx = clnet.tensor(x, dev, requires_grad=True)
    got = net(tx)
    for (axes, _), g, want, ref, (name, _) in zip(cases, got, expected, runtime(path, x=x), outs):
        # a sum's float32 error grows with sum |x| / |sum x| (its cancellation): the bound is 1e-6 of sum |x|
        absolute = fn(np.abs(x.astype(np.float64)), axis=tuple(axes) if axes else None)
        tol = 1e-6 * max(1.0, float(np.max(absolute) / np.max(np.abs(want)))) if op in ("ReduceSum", "ReduceMean") \
            else 1e-6
        assert_close(g.numpy(), want, f"{op} {name}", tol=tol)
        assert_close(g.numpy(), ref, f"{op} {name} against ONNX Runtime", tol=tol)
    got[0].sum().backward()
    if op in ("ReduceSum", "ReduceMean"):
        grad = np.full(shape, 1.0 if op == "ReduceSum" else 0.25)
    else:
        pick = (np.argmax if op == "ReduceMax" else np.argmin)(x, axis=1)
        grad = (np.arange(4).reshape(1, 4, 1, 1) == pick[:, None]).astype(np.float64)
    assert_close(tx.grad.numpy(), grad, f"{op} gradient", tol=1e-6)


def test_host_values_from_shapes_follow_each_call(dev, rng, tmp_path):
    """A value computed on the host from a call's shapes (here the vector [N, 2] from Shape) multiplies as that
    call's value, not as the first call's."""
    h = onnx.helper
    nodes = [h.make_node("Shape", ["x"], ["s"], name="shape"),
             h.make_node("Cast", ["s"], ["f"], to=onnx.TensorProto.FLOAT, name="cast"),
             h.make_node("Mul", ["x", "f"], ["y"], name="mul")]
    path = build(tmp_path / "shapes.onnx", nodes, [("x", ("N", 2))], [("y", ("N", 2))])
    net = connx.load(path, device=dev)
    for batch in (2, 3, 2):
        x = f32(rng, batch, 2)
        with clnet.no_grad():
            y = net(clnet.tensor(x, dev)).numpy()
        assert_close(y, x * np.array([batch, 2.0]), f"batch {batch}", tol=1e-7)
