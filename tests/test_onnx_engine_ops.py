"""Imported graphs of the operators clnet.onnx maps onto the tensor engine train: their outputs match ONNX Runtime's
and the gradients of a loss with respect to the graph's input and its weights match PyTorch's gradients of the same
computation in float64 (attention built from MatMul, Einsum, Softmax, LayerNormalization and Gemm of computed
tensors; an image path through reflect Pad, linear Resize, ConvTranspose with asymmetric pads, Where,
InstanceNormalization, a negative-step Slice, ReduceL2 and Gather). Also: the unnamed weights of PyTorch's TorchScript
exporter ("onnx::Conv_17") take their module's names."""
import copy

import numpy as np
import pytest

import clnet

from conftest import HAVE_TORCH, assert_close, float32_error, float32_witnesses, needs_torch
from onnx_needed import require

onnx = require("onnx")
ort = require("onnxruntime")
import clnet.onnx as connx  # noqa: E402

# Float32's own error, the scale of a gradient's bound, is the largest of PyTorch's float32 run and JITTERED more
# witnesses of float32's rounding (one sample of it can be small by luck where a gradient largely cancels, as a bias
# before a normalization): float64 twins with every leaf module's output rounded (conftest.float32_witnesses), or
# where the reference is a function, float32 runs with inputs and weights perturbed by FLOAT32_JITTER.
FLOAT32_JITTER = 6e-8
JITTERED = 5

if HAVE_TORCH:
    import torch
    import torch.nn.functional as TF

h = onnx.helper


def _model(path, nodes, inputs, output, rank, initializers, opset=17):
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs],
                         [h.make_tensor_value_info(output, onnx.TensorProto.FLOAT, [None] * rank)],
                         [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return str(path)


def _check(dev, path, x, weights, torch_fn, rng, tol):
    """Forward against ONNX Runtime, then the gradients of sum(y * g) for the input and every weight against
    PyTorch's of torch_fn in float64."""
    net = connx.load(path, device=dev)
    net.train()
    tx = clnet.tensor(x, dev, requires_grad=True)
    y = net(tx)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert_close(y.numpy(), want, "forward against ONNX Runtime", tol=tol)
    g = rng.standard_normal(y.shape).astype(np.float32)
    (y * clnet.tensor(g, dev)).sum().backward()
    def torch_grads(dtype, jitter=0.0):
        def leaf(v):
            return torch.tensor(v * (1 + jitter * rng.standard_normal(v.shape)), dtype=dtype, requires_grad=True)
        tw = {k: leaf(v) for k, v in weights.items()}
        xt = leaf(x)
        yt = torch_fn(xt, tw)
        (yt * torch.tensor(g, dtype=dtype)).sum().backward()
        return yt.detach().numpy(), dict({k: t.grad.numpy() for k, t in tw.items()}, x=xt.grad.numpy())
    yt, ref = torch_grads(torch.float64)
    refs32 = [torch_grads(torch.float32)[1]] + [torch_grads(torch.float32, FLOAT32_JITTER)[1] for _ in range(JITTERED)]
    assert_close(y.numpy(), yt, "forward against PyTorch", tol=tol)

    def bound(k):
        err32 = max(np.linalg.norm(r[k] - ref[k]) for r in refs32) / max(np.linalg.norm(ref[k]), 1e-30)
        return max(tol, 10 * err32)
    assert_close(tx.grad.numpy(), ref["x"], "input gradient", tol=bound("x"))
    params = dict(net.named_parameters())
    for k in weights:
        grad = params[k].grad.numpy()
        if k in net._transposed:  # a MatMul's 2-D weight, held as (out, in) for the dense kernels
            grad = grad.T
        assert_close(grad, ref[k], f"gradient of {k}", tol=bound(k))


@needs_torch
def test_attention_graph_trains(dev, rng, tmp_path):
    B, T, D = 2, 5, 8
    w = {"wq": rng.standard_normal((D, D)) / 3, "wk": rng.standard_normal((D, D)) / 3,
         "wv": rng.standard_normal((D, D)) / 3, "ln_s": rng.uniform(0.5, 1.5, D), "ln_b": rng.standard_normal(D),
         "c": rng.standard_normal((1, D))}
    w = {k: np.asarray(v, np.float32) for k, v in w.items()}
    nodes = [
        h.make_node("MatMul", ["x", "wq"], ["q"]), h.make_node("MatMul", ["x", "wk"], ["k"]),
        h.make_node("MatMul", ["x", "wv"], ["v"]),
        h.make_node("Einsum", ["q", "k"], ["s"], equation="bqd,bkd->bqk"),
        h.make_node("Mul", ["s", "scale"], ["s2"]), h.make_node("Softmax", ["s2"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "v"], ["o"]),
        h.make_node("LayerNormalization", ["o", "ln_s", "ln_b"], ["n"], axis=-1, epsilon=1e-5),
        h.make_node("Reshape", ["n", "flat"], ["n2"]),
        # Gemm of two computed tensors, B not transposed: n2^T (D, B T) times n2 (B T, D), plus beta C
        h.make_node("Gemm", ["n2", "n2", "c"], ["y"], transA=1, alpha=0.5, beta=2.0),
    ]
    inits = dict(w, scale=np.array(D ** -0.5, np.float32), flat=np.array([B * T, D], np.int64))
    path = _model(tmp_path / "attention.onnx", nodes, [("x", (B, T, D))], "y", 2, inits)

    def reference(x, t):
        q, k, v = x @ t["wq"], x @ t["wk"], x @ t["wv"]
        p = torch.softmax(torch.einsum("bqd,bkd->bqk", q, k) * D ** -0.5, dim=-1)
        n = TF.layer_norm(p @ v, (D,), t["ln_s"], t["ln_b"], eps=1e-5).reshape(B * T, D)
        return 0.5 * n.T @ n + 2.0 * t["c"]
    _check(dev, path, rng.standard_normal((B, T, D)).astype(np.float32), w, reference, rng, tol=2e-5)


@needs_torch
def test_image_graph_trains(dev, rng, tmp_path):
    N, C, H, W, O = 2, 3, 6, 7, 4
    w = {"wt": rng.standard_normal((C, O, 3, 3)) / 3, "bt": rng.standard_normal(O),
         "in_s": rng.uniform(0.5, 1.5, O), "in_b": rng.standard_normal(O)}
    w = {k: np.asarray(v, np.float32) for k, v in w.items()}
    nodes = [
        h.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),  # H: 1 before, 2 after; W: 2 before, 1 after
        h.make_node("Resize", ["p", "", "scales"], ["r"], mode="linear"),  # half_pixel, (9, 10) -> (13, 20)
        h.make_node("ConvTranspose", ["r", "wt", "bt"], ["t"], strides=[2, 2], pads=[1, 0, 0, 1]),
        h.make_node("Greater", ["t", "zero"], ["pos"]), h.make_node("Mul", ["t", "slope"], ["neg"]),
        h.make_node("Where", ["pos", "t", "neg"], ["i"]),
        h.make_node("InstanceNormalization", ["i", "in_s", "in_b"], ["l"], epsilon=1e-5),
        h.make_node("Slice", ["l", "starts", "ends", "axes", "steps"], ["s"]),  # every other column, backwards
        h.make_node("ReduceL2", ["s", "l2axes"], ["n"], keepdims=0),
        h.make_node("Gather", ["n", "index"], ["y"], axis=1),
    ]
    inits = dict(w, pads=np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64),
                 scales=np.array([1, 1, 1.5, 2], np.float32), zero=np.array(0, np.float32),
                 slope=np.array(0.1, np.float32), starts=np.array([-1], np.int64),
                 ends=np.array([-(2 ** 63)], np.int64), axes=np.array([3], np.int64), steps=np.array([-2], np.int64),
                 l2axes=np.array([2], np.int64), index=np.array([2, 0, 3], np.int64))
    path = _model(tmp_path / "image.onnx", nodes, [("x", (N, C, H, W))], "y", 3, inits, opset=18)

    def reference(x, t):
        p = TF.pad(x, (2, 1, 1, 2), mode="reflect")
        r = TF.interpolate(p, scale_factor=(1.5, 2.0), mode="bilinear", align_corners=False)
        y = TF.conv_transpose2d(r, t["wt"], t["bt"], stride=2)[:, :, 1:, :-1]
        i = torch.where(y > 0, y, y * 0.1)
        lr = TF.instance_norm(i, weight=t["in_s"], bias=t["in_b"], eps=1e-5)
        s = lr[..., torch.arange(lr.shape[3] - 1, -1, -2)]
        n = torch.sqrt((s * s).sum(2))
        return n[:, [2, 0, 3]]
    _check(dev, path, rng.standard_normal((N, C, H, W)).astype(np.float32), w, reference, rng, tol=2e-5)


@needs_torch
def test_torchscript_unnamed_weights_take_module_names(dev, rng, tmp_path):
    """PyTorch's TorchScript exporter folds an eval-mode batch norm into the convolution and names the result
    "onnx::Conv_<n>"; load names it after the convolution's module (its node's scope, /layer1/layer1.0/conv1/Conv),
    keeps the values the file holds, and says which file name each came from."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(self.bn1(self.conv1(x)))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer1 = torch.nn.Sequential(Block())
            self.fc = torch.nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(self.layer1(x).mean((2, 3)))

    torch.manual_seed(int(rng.integers(1 << 30)))
    model = Net().eval()
    with torch.no_grad():
        model.layer1[0].bn1.running_mean.uniform_(-0.5, 0.5)
        model.layer1[0].bn1.running_var.uniform_(0.5, 2.0)
    path = str(tmp_path / "ts.onnx")
    x = torch.randn(2, 3, 8, 8)
    torch.onnx.export(model, x, path, dynamo=False)
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}
    net = connx.load(path, device=dev)
    state = net.state_dict()
    assert set(state) == {"layer1.0.conv1.weight", "layer1.0.conv1.bias", "fc.weight", "fc.bias"}, sorted(state)
    assert set(net.file_names) == {"layer1.0.conv1.weight", "layer1.0.conv1.bias"}
    for k, v in state.items():
        np.testing.assert_array_equal(v, stored[net.file_names.get(k, k)], err_msg=k)
    with clnet.no_grad():
        got = net(clnet.tensor(x.numpy(), dev)).numpy()
    assert_close(got, model(x).detach().numpy(), "TorchScript export", tol=1e-5)


@needs_torch
@pytest.mark.parametrize("dynamo, training", [(False, False), (False, True), (True, False)],
                         ids=["torchscript-eval", "torchscript-training", "dynamo-eval"])
def test_pytorch_exports_of_modern_blocks_train(dev, rng, tmp_path, dynamo, training):
    """A PyTorch network of the blocks newer classifiers use (hardswish, LayerNorm over channels-last, squeeze and
    excitation, a pre-norm TransformerEncoderLayer, bilinear upsampling, ConvTranspose2d, GroupNorm, GELU, reflect
    padding, a global max), exported by the TorchScript exporter in eval and training modes and by the dynamo
    exporter in eval mode: clnet's import agrees with ONNX Runtime and PyTorch, and in training mode every weight's
    gradient is PyTorch's."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 16, 3, 2, 1)
            self.dw = torch.nn.Conv2d(16, 16, 3, 1, 1, groups=16)
            self.ln = torch.nn.LayerNorm(16)
            self.se1, self.se2 = torch.nn.Conv2d(16, 4, 1), torch.nn.Conv2d(4, 16, 1)
            self.enc = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
            self.up = torch.nn.ConvTranspose2d(16, 8, 2, 2)
            self.gn = torch.nn.GroupNorm(2, 8)
            self.fc = torch.nn.Linear(8, 5)

        def forward(self, x):
            x = self.dw(TF.hardswish(self.stem(x)))
            x = self.ln(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            x = x * torch.sigmoid(self.se2(torch.relu(self.se1(x.mean((2, 3), keepdim=True)))))
            B, C, H, W = x.shape
            x = self.enc(x.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(B, C, H, W)
            x = TF.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
            x = TF.pad(TF.gelu(self.gn(self.up(x))), (1, 1, 1, 1), mode="reflect")
            return torch.log_softmax(self.fc(x.amax((2, 3))), dim=1)

    torch.manual_seed(int(rng.integers(1 << 30)))
    model = Net().train(training)
    x = torch.randn(2, 3, 16, 16)
    path = str(tmp_path / "modern.onnx")
    if dynamo:
        pytest.importorskip("onnxscript")  # the dynamo exporter's dependency
        torch.onnx.export(model, (x,), dynamo=True, verbose=False).save(path)
    else:
        mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
        torch.onnx.export(model, x, path, dynamo=False, training=mode, do_constant_folding=not training,
                          input_names=["input"], dynamic_axes={"input": {0: "N"}})
    net = connx.load(path, device=dev)
    assert net.training == training
    y = net(clnet.tensor(x.numpy(), dev))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    want = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    assert_close(y.numpy(), want, "against ONNX Runtime", tol=1e-5)
    assert_close(y.numpy(), model(x).detach().numpy(), "against PyTorch", tol=1e-5)
    if not training:
        return
    g = rng.standard_normal(y.shape).astype(np.float32)
    (y * clnet.tensor(g, dev)).sum().backward()
    ours, theirs = dict(net.named_parameters()), dict(model.named_parameters())
    assert set(ours) <= set(theirs) and len(ours) == len(theirs), sorted(set(theirs) ^ set(ours))
    # the reference: the same step in float64; each gradient within 2e-5 of it, or within 10x PyTorch float32's own
    # distance from it where float32 itself lands farther (se1's weight and bias: sums over few active ReLUs that
    # largely cancel; se1.bias erred 4.0e-5 on seed 1289027431, 4.2x PyTorch's), float32's distance the largest of
    # PyTorch's float32 run's and JITTERED perturbed float64 twins
    model64 = copy.deepcopy(model).double()
    (model64(x.double()) * torch.tensor(g, dtype=torch.float64)).sum().backward()
    exact = {k: p.grad.numpy() for k, p in model64.named_parameters()}

    def grads(twin):  # the same step's gradients, in the twin's precision
        twin.zero_grad()
        dtype = next(twin.parameters()).dtype
        (twin(x.to(dtype)) * torch.tensor(g, dtype=dtype)).sum().backward()
        return {k: p.grad.numpy() for k, p in twin.named_parameters()}
    witnessed = [grads(w) for w in float32_witnesses(model64, runs=JITTERED, seed=int(rng.integers(1 << 30)))]
    for k, p in ours.items():
        grad = p.grad.numpy().T if k in net._transposed else p.grad.numpy()
        assert_close(grad, exact[k], f"gradient of {k}", tol=max(2e-5, 10 * float32_error(witnessed, exact[k], k)))


def test_index_and_shape_ops_of_computed_tensors(dev, rng, tmp_path):
    """ArgMax, Trilu, Tile, Expand, Split, Cast to int64 and back, GatherElements, Equal, Not and Where, Range and
    ConstantOfShape from a call's shapes, Flatten of axis 0, Transpose moving the batch axis: every output is ONNX
    Runtime's, at two batch sizes."""
    T = onnx.TensorProto
    nodes = [
        h.make_node("ArgMax", ["x"], ["am"], axis=2, keepdims=0),
        h.make_node("Cast", ["am"], ["amf"], to=T.FLOAT),
        h.make_node("Trilu", ["x", "k"], ["tri"], upper=1),
        h.make_node("Tile", ["x", "reps"], ["tile"]),
        h.make_node("ReduceSum", ["x", "axis2"], ["col"], keepdims=1),
        h.make_node("Expand", ["col", "wide"], ["exp"]),
        h.make_node("Split", ["x", "parts"], ["s0", "s1"], axis=2),
        h.make_node("Cast", ["s1"], ["s1i"], to=T.INT64), h.make_node("Cast", ["s1i"], ["trunc"], to=T.FLOAT),
        h.make_node("GatherElements", ["x", "idx"], ["ge"], axis=2),
        h.make_node("Equal", ["trunc", "zero"], ["eq"]), h.make_node("Not", ["eq"], ["ne"]),
        h.make_node("Where", ["ne", "s1", "trunc"], ["wh"]),
        h.make_node("Shape", ["x"], ["shape"]), h.make_node("Gather", ["shape", "last"], ["n"]),
        h.make_node("Range", ["zero_i", "n", "one_i"], ["r"]), h.make_node("Cast", ["r"], ["rf"], to=T.FLOAT),
        h.make_node("ConstantOfShape", ["shape"], ["c"], value=onnx.numpy_helper.from_array(np.array([0.5],
                                                                                                   np.float32))),
        h.make_node("Add", ["x", "c"], ["xc"]), h.make_node("Mul", ["xc", "rf"], ["xr"]),
        h.make_node("Flatten", ["xr"], ["flat"], axis=0),
        h.make_node("Transpose", ["x"], ["tr"], perm=[2, 0, 1]),
    ]
    outs = ["amf", "tri", "tile", "exp", "wh", "ge", "flat", "tr"]
    inits = dict(k=np.array(1, np.int64), reps=np.array([1, 2, 1], np.int64), axis2=np.array([2], np.int64),
                 wide=np.array([1, 3, 5], np.int64), parts=np.array([2, 3], np.int64), zero=np.array(0, np.float32),
                 idx=rng.integers(-5, 5, (1, 3, 4)).astype(np.int64), last=np.array(2, np.int64),
                 zero_i=np.array(0, np.int64), one_i=np.array(1, np.int64))
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, ["N", 3, 5])],
                         [h.make_tensor_value_info(o, T.FLOAT, [None] * (2 if o in ("amf", "flat") else 3))
                          for o in outs],
                         [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    path = str(tmp_path / "index.onnx")
    onnx.save(model, path)
    net = connx.load(path, device=dev)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (2, 3):
        x = (rng.standard_normal((batch, 3, 5)) * 3).astype(np.float32)
        with clnet.no_grad():
            got = net(clnet.tensor(x, dev))
        for name, g, want in zip(outs, got, sess.run(None, {"x": x})):
            assert_close(g.numpy(), want, name, tol=1e-6)


def test_random_draws_of_training_exports(dev, rng, tmp_path):
    """RandomUniformLike (training-mode stochastic depth in PyTorch's exports), RandomNormalLike and Bernoulli draw
    from clnet's generator: of the input's shape, inside [low, high), with the mean and spread they should have."""
    T = onnx.TensorProto
    nodes = [h.make_node("RandomUniformLike", ["x"], ["u"], low=-1.0, high=3.0),
             h.make_node("RandomNormalLike", ["x"], ["z"], mean=2.0, scale=0.5),
             h.make_node("Bernoulli", ["p"], ["b"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [64, 64])],
                         [h.make_tensor_value_info(o, T.FLOAT, [64, 64]) for o in ("u", "z", "b")],
                         [onnx.numpy_helper.from_array(np.full((64, 64), 0.25, np.float32), "p")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    path = str(tmp_path / "random.onnx")
    onnx.save(model, path)
    u, z, b = (t.numpy().astype(np.float64) for t in connx.load(path, device=dev)(clnet.tensor(np.zeros((64, 64)),
                                                                                               dev)))
    n = u.size
    assert u.min() >= -1.0 and u.max() < 3.0 and abs(u.mean() - 1.0) < 5 * (4 / 12 ** 0.5) / n ** 0.5
    assert abs(z.mean() - 2.0) < 5 * 0.5 / n ** 0.5 and abs(z.std() - 0.5) < 0.05
    assert set(np.unique(b)) <= {0.0, 1.0} and abs(b.mean() - 0.25) < 5 * (0.25 * 0.75 / n) ** 0.5


@needs_torch
def test_imported_transformer_exports_again(dev, rng, tmp_path):
    """A ViT (the zoo's code built in PyTorch, small) exported by PyTorch's TorchScript exporter, imported and
    exported again by clnet: the second file holds what the import ran (the class token's Gather as index_select) and
    ONNX Runtime runs it with the import's output."""
    from clnet import models
    torch.manual_seed(int(rng.integers(1 << 30)))
    model = models.modern_blocks(torch)["VisionTransformer"](32, 16, 2, 4, 64, 128).eval()
    with torch.no_grad():
        model.heads.head.weight.normal_(0.0, 0.1)  # (zero-initialised: every logit would be its bias)
    first, second = str(tmp_path / "vit.onnx"), str(tmp_path / "vit-again.onnx")
    torch.onnx.export(model, torch.randn(2, 3, 32, 32), first, dynamo=False, input_names=["input"],
                      dynamic_axes={"input": {0: "N"}})
    net = connx.load(first, device=dev)
    x = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    connx.export(net, second, clnet.tensor(x, dev))
    written = onnx.load(second).graph
    assert "Gather" in {n.op_type for n in written.node}
    # PyTorch's attention moves the batch to dimension 1, where export does not follow it: the file is for batch 2
    assert written.input[0].type.tensor_type.shape.dim[0].dim_value == 2
    sess = ort.InferenceSession(second, providers=["CPUExecutionProvider"])
    for batch in (2,):
        xb = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)
        with clnet.no_grad():
            ours = net(clnet.tensor(xb, dev)).numpy()
        assert_close(sess.run(None, {sess.get_inputs()[0].name: xb})[0], ours, f"batch {batch}", tol=1e-5)
        assert_close(ours, model(torch.tensor(xb)).detach().numpy(), f"batch {batch} against PyTorch", tol=1e-5)


def test_unary_parameters_travel_as_the_tables_onnx_attributes(dev, rng, tmp_path):
    """LeakyReLU, ELU and CELU with other than default parameters, exported (pointwise.UNARY's onnx_attrs name the
    attributes), run by ONNX Runtime and loaded again: the same output all three ways, against NumPy float64."""
    from clnet import nn
    m = nn.Sequential(nn.Linear(4, 6), nn.LeakyReLU(0.2), nn.Linear(6, 6), nn.ELU(0.7), nn.CELU(1.3)).to(dev)
    x = rng.standard_normal((5, 4)).astype(np.float32) * 3
    ours = m(clnet.tensor(x, dev)).numpy()
    s = {k: v.astype(np.float64) for k, v in m.state_dict().items()}
    h = x @ s["0.weight"].T + s["0.bias"]
    h = np.where(h > 0, h, 0.2 * h) @ s["2.weight"].T + s["2.bias"]
    h = np.where(h > 0, h, 0.7 * np.expm1(h))
    expected = np.maximum(h, 0) + np.minimum(0, 1.3 * np.expm1(h / 1.3))
    assert_close(ours, expected, "clnet")
    path = str(tmp_path / "unary.onnx")
    connx.export(m, path, clnet.tensor(x, dev))
    attrs = {n.op_type: {a.name: a.f for a in n.attribute} for n in onnx.load(path).graph.node}
    assert attrs["LeakyRelu"] == {"alpha": pytest.approx(0.2)} and attrs["Elu"] == {"alpha": pytest.approx(0.7)} \
        and attrs["Celu"] == {"alpha": pytest.approx(1.3)}
    session = ort.InferenceSession(path)
    assert_close(session.run(None, {session.get_inputs()[0].name: x})[0], expected, "ONNX Runtime")
    assert_close(connx.load(path, device=dev)(clnet.tensor(x, dev)).numpy(), expected, "clnet from the file")


@pytest.mark.parametrize("given", ["tensor", "numpy"])
def test_export_takes_an_integer_input(dev, rng, tmp_path, given):
    """A network whose input is integer (an Embedding's indices) exports with an int32 input, from a clnet tensor or
    NumPy integers (refused before: an int32 tensor cannot require a gradient, and NumPy's were cast to float), and
    runs other indices in ONNX Runtime and in clnet as clnet does (the embedding's reshape of its indices was traced
    as a constant: the file ignored its input)."""
    class Tokens(clnet.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.head = clnet.nn.Embedding(11, 4), clnet.nn.Linear(4, 3)

        def forward(self, i):
            return self.head(self.embed(i))
    model = Tokens().to(dev)
    idx = rng.integers(0, 11, (2, 5))
    expected = model(clnet.tensor(idx, dev)).numpy()
    path = tmp_path / "tokens.onnx"
    connx.export(model, path, clnet.tensor(idx, dev) if given == "tensor" else idx)
    session = ort.InferenceSession(str(path))
    assert session.get_inputs()[0].type == "tensor(int32)"
    other = rng.integers(0, 11, (2, 5))  # the input read, not the example's indices kept (they were, as a constant)
    expected = model(clnet.tensor(other, dev)).numpy()
    got = session.run(None, {session.get_inputs()[0].name: other.astype(np.int32)})[0]
    assert_close(got, expected, "ONNX Runtime on the exported tokens network", tol=1e-6)
    assert_close(connx.load(path, device=dev)(clnet.tensor(other, dev)).numpy(), expected, "clnet on it", tol=1e-6)
