"""ONNX import and export (clnet/onnx/): networks exported from PyTorch run in clnet as ONNX Runtime (CPU) runs
them, and train one step with every gradient PyTorch's (float64) within float32's error; clnet's zoo exported by
clnet.onnx.export passes onnx.checker and matches ONNX Runtime; unknown operators, damaged files and a missing onnx
package are refused with errors that name them.

Cost: each network is exported and run by ONNX Runtime once per session (module-scoped caches); the 224x224 zoo
networks and resnet50's training step run on one device only (PoCL where present), googlenet's training step on
another (Intel's runtime in CI); vgg-a and overfeat (130M+ weights) only with CLNET_TEST_BIG=1."""
import os
import sys
import warnings
import zlib

import numpy as np
import pytest

import clnet
from clnet import models, nn

from conftest import DEVICES, assert_close, needs_torch, no_launch

from onnx_needed import require  # noqa: E402

onnx = require("onnx")  # an error, not a skip, in CI or where the onnx extra is installed but broken
ort = require("onnxruntime")
import clnet.onnx as connx  # noqa: E402

# The 224x224 networks and resnet50's training step run on one device only (the suite's time budget): PoCL where it
# is present; googlenet's training step on another one where there is one (Intel's runtime in CI), to share the time.
BIG_DEVICE = next((d["index"] for d in DEVICES if "portable" in d["platform"].lower()),
                  DEVICES[0]["index"] if DEVICES else None)
TRAIN_DEVICE = next((d["index"] for d in DEVICES if d["index"] != BIG_DEVICE), BIG_DEVICE)


# VGG-A and OverFeat (133M and 145M weights: building, exporting and ONNX Runtime's load cost ~20-55 s each on a
# 2-core CPU) run when CLNET_TEST_BIG=1 (`CLNET_TEST_BIG=1 python3 -m pytest tests/test_onnx.py -k "vgg or overfeat"`).
BIG_OPT_IN = os.environ.get("CLNET_TEST_BIG", "") not in ("", "0")


def one_device_only(dev, name="", device=None):
    if name in ("vgg-a", "overfeat") and not BIG_OPT_IN:
        pytest.skip(f"{name}: 130M+ weights, run with CLNET_TEST_BIG=1 (the suite's time budget)")
    if dev.index != (BIG_DEVICE if device is None else device):
        pytest.skip("a 224x224 network or ResNet-50's training step: run on one device only (the suite's time "
                    "budget)")


# ---- networks written in PyTorch for the tests ---------------------------------------------------------------------

def mobilenet_like(torch):
    """MobileNetV2's shape: depthwise 3x3 convolutions, ReLU6, inverted residuals with linear bottlenecks."""
    tnn = torch.nn

    class InvertedResidual(tnn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            hidden, self.residual = cin * expand, stride == 1 and cin == cout
            layers = [tnn.Conv2d(cin, hidden, 1, bias=False), tnn.BatchNorm2d(hidden), tnn.ReLU6()] if expand > 1 \
                else []
            layers += [tnn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False), tnn.BatchNorm2d(hidden),
                       tnn.ReLU6(), tnn.Conv2d(hidden, cout, 1, bias=False), tnn.BatchNorm2d(cout)]
            self.conv = tnn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.residual else self.conv(x)

    return tnn.Sequential(tnn.Conv2d(3, 16, 3, 2, 1, bias=False), tnn.BatchNorm2d(16), tnn.ReLU6(),
                          InvertedResidual(16, 8, 1, 1), InvertedResidual(8, 12, 2, 6), InvertedResidual(12, 12, 1, 6),
                          InvertedResidual(12, 16, 2, 6), InvertedResidual(16, 16, 1, 6),
                          tnn.Conv2d(16, 64, 1, bias=False), tnn.BatchNorm2d(64), tnn.ReLU6(),
                          tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Dropout(0.2), tnn.Linear(64, 10))


def squeezenet_like(torch):
    """SqueezeNet's shape: Fire modules (1x1 squeeze, 1x1 and 3x3 expands joined), ceil-mode max pooling, dropout,
    a convolutional classifier and global average pooling."""
    tnn = torch.nn

    class Fire(tnn.Module):
        def __init__(self, cin, squeeze, e1, e3):
            super().__init__()
            self.squeeze, self.relu = tnn.Conv2d(cin, squeeze, 1), tnn.ReLU()
            self.expand1, self.expand3 = tnn.Conv2d(squeeze, e1, 1), tnn.Conv2d(squeeze, e3, 3, padding=1)

        def forward(self, x):
            x = self.relu(self.squeeze(x))
            return torch.cat([self.relu(self.expand1(x)), self.relu(self.expand3(x))], 1)

    return tnn.Sequential(tnn.Conv2d(3, 16, 3, 2), tnn.ReLU(), tnn.MaxPool2d(3, 2, ceil_mode=True),
                          Fire(16, 4, 8, 8), Fire(16, 4, 8, 8), tnn.MaxPool2d(3, 2, ceil_mode=True),
                          Fire(16, 8, 16, 16), tnn.Dropout(0.5), tnn.Conv2d(32, 10, 1), tnn.ReLU(),
                          tnn.AdaptiveAvgPool2d(1), tnn.Flatten())


def operators_net(torch):
    """The rest of the operator table: dilated grouped convolution, LeakyRelu, HardSwish, HardSigmoid, Sigmoid,
    Tanh, per-channel Mul and Add of parameters, scalar Mul/Div/Sub, a channel shuffle (Reshape, Transpose), average
    pooling without the padding counted, Clip, ReduceMean, a Shape-driven Reshape, Softmax and LogSoftmax, and two
    graph outputs."""
    tnn, F = torch.nn, torch.nn.functional

    class Operators(tnn.Module):
        def __init__(self):
            super().__init__()
            self.conv = tnn.Conv2d(3, 8, 3, padding=1)
            self.dilated = tnn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=2)
            self.scale = tnn.Parameter(torch.rand(1, 8, 1, 1) + 0.5)
            self.shift = tnn.Parameter(torch.randn(8, 1, 1))
            self.pool = tnn.AvgPool2d(3, 2, 1, count_include_pad=False)
            self.fc = tnn.Linear(8 * 4 * 4, 6)
            self.fc_mean = tnn.Linear(8, 6)

        def forward(self, x):
            x = F.leaky_relu(self.conv(x), 0.1)
            x = F.hardswish(self.dilated(x)) * self.scale + self.shift
            n, c, h, w = x.shape
            x = x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
            x = torch.sigmoid(x) * 2 - torch.tanh(x) / 3 + F.hardsigmoid(x)
            x = torch.clamp(self.pool(x), -0.5, 1.5)
            y = self.fc(x.view(x.size(0), -1)) + self.fc_mean(x.mean((2, 3)))
            return torch.log_softmax(y, 1), torch.softmax(y, 1)

    return Operators()


NETS = {  # name: (builder, input shape, classes)
    "lenet": (lambda torch: models.build("lenet", lib=torch), (2, 1, 28, 28), 10),
    "alexnet": (lambda torch: models.build("alexnet", lib=torch), (1, 3, 224, 224), 1000),
    "vgg-a": (lambda torch: models.build("vgg-a", lib=torch), (1, 3, 224, 224), 1000),
    "googlenet": (lambda torch: models.build("googlenet", lib=torch), (1, 3, 224, 224), 1000),
    "resnet18": (lambda torch: models.build("resnet18", lib=torch), (2, 3, 64, 64), 1000),
    "resnet50": (lambda torch: models.build("resnet50", lib=torch), (2, 3, 96, 96), 1000),
    "mobilenet-like": (mobilenet_like, (2, 3, 32, 32), 10),
    "squeezenet-like": (squeezenet_like, (2, 3, 33, 33), 10),
    "operators": (operators_net, (2, 3, 8, 8), 6),
}
BIG = {"alexnet", "vgg-a"}


class Exports:
    """Each (network, mode, exporter) exported once per session, with its torch model and input."""

    def __init__(self, folder):
        self.folder, self.cache = folder, {}

    def get(self, name, training=False, dynamo=False, opset=17, folding=True):
        key = (name, training, dynamo) + ((opset, folding) if (opset, folding) != (17, True) else ())
        if key not in self.cache:
            import torch
            build, shape, classes = NETS[name]
            seed = zlib.crc32(repr(key).encode())  # the same weights and input every session
            torch.manual_seed(seed)
            model = build(torch)
            for m in model.modules():  # batch norm with statistics and affine parameters away from their start
                if isinstance(m, torch.nn.BatchNorm2d):
                    with torch.no_grad():
                        m.running_mean.uniform_(-0.5, 0.5)
                        m.running_var.uniform_(0.5, 2.0)
                        m.weight.uniform_(0.5, 1.5)
                        m.bias.uniform_(-0.5, 0.5)
            model.train(training)
            x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
            path = os.path.join(self.folder, f"{name}-{'train' if training else 'eval'}-"
                                             f"{'dynamo' if dynamo else 'ts'}-{opset}-{int(folding)}.onnx")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if dynamo:
                    torch.onnx.export(model, (torch.from_numpy(x),), path, dynamo=True, verbose=False)
                else:
                    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
                    torch.onnx.export(model, (torch.from_numpy(x),), path, dynamo=False, training=mode,
                                      do_constant_folding=folding and not training, opset_version=opset)
            self.cache[key] = dict(path=path, model=model, x=x, classes=classes, reference=None)
        return self.cache[key]

    def reference(self, entry):
        if entry["reference"] is None:
            entry["reference"] = connx.onnxruntime_outputs(entry["path"], entry["x"])
        return entry["reference"]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    pytest.importorskip("torch")
    return Exports(str(tmp_path_factory.mktemp("onnx")))


def outputs(y):
    return [t.numpy() for t in (y if isinstance(y, tuple) else (y,))]


# ---- import: forward against ONNX Runtime --------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("name", list(NETS))
def test_import_matches_onnxruntime(dev, exports, name):
    """PyTorch's TorchScript exporter in eval mode (batch norm folded into the convolutions by the exporter, or, in
    the nets where it is not, run as the file has it) against ONNX Runtime, float32 both."""
    if name in BIG:
        one_device_only(dev, name)
    e = exports.get(name)
    net = connx.load(e["path"], device=dev)
    assert not net.training
    assert_runs_as_onnxruntime(dev, exports, e, net, name)


def assert_runs_as_onnxruntime(dev, exports, e, net, label):
    """Every output of net on the export's input against ONNX Runtime's, float32 both."""
    with clnet.no_grad():
        ours = outputs(net(clnet.tensor(e["x"], dev)))
    theirs = exports.reference(e)
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert_close(a, b, f"{label} output {i}", tol=1e-5)


@needs_torch
@pytest.mark.parametrize("opset", [13, 20])
def test_operators_at_other_opsets(dev, exports, opset):
    """The operator network exported at opsets 13 and 20 (axes as inputs, Clip's bounds as inputs, Softmax over the
    last axis) as ONNX Runtime runs it."""
    e = exports.get("operators", opset=opset)
    net = connx.load(e["path"], device=dev)
    assert net.opset == opset
    assert_runs_as_onnxruntime(dev, exports, e, net, f"opset {opset}")


@needs_torch
@pytest.mark.parametrize("name", ["mobilenet-like", "operators"])
def test_dynamo_export_imports(dev, exports, name):
    """PyTorch's dynamo exporter (opset 20 here: ReduceMean with axes as an input, Reshape from constants, batch norm
    folded by the exporter) runs as ONNX Runtime runs it (every output)."""
    pytest.importorskip("onnxscript", reason="PyTorch's dynamo exporter needs onnxscript")
    e = exports.get(name, dynamo=True)
    assert_runs_as_onnxruntime(dev, exports, e, connx.load(e["path"], device=dev), f"{name} (dynamo exporter)")


@needs_torch
def test_batch_norm_fused_at_load_or_kept(dev, exports):
    """An inference-mode BatchNormalization after a Conv folds into it at load (fuse=True), or stays (fuse=False):
    both give ONNX Runtime's output; the unfused module keeps every initializer."""
    e = exports.get("mobilenet-like", folding=False)  # PyTorch's exporter then keeps the BatchNormalization nodes
    graph = onnx.load(e["path"]).graph
    assert sum(n.op_type == "BatchNormalization" for n in graph.node) == 16
    x = clnet.tensor(e["x"], dev)
    reference = exports.reference(e)[0]
    weights = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT and np.prod(t.dims) > 1}
    for fuse in (True, False):
        net = connx.load(e["path"], device=dev, fuse=fuse)
        with clnet.no_grad():
            assert_close(net(x).numpy(), reference, f"fuse={fuse}", tol=1e-5)
        batch_norms = [k for k in net.state_dict() if "running_mean" in k]
        if fuse:
            assert not batch_norms and len(net.state_dict()) == 2 * 16 + 2  # a weight and a bias per convolution
        else:
            assert weights <= set(net.state_dict()) and len(batch_norms) == 16


# ---- import: a training step against PyTorch -----------------------------------------------------------------------

def torch_grads(model, x, labels, dtype):
    """PyTorch's forward, cross-entropy and backward from the model's weights, in dtype: (copy, loss)."""
    import copy
    import torch
    twin = copy.deepcopy(model).to(dtype)  # each module's mode kept
    loss = torch.nn.functional.cross_entropy(twin(torch.from_numpy(x).to(dtype)),
                                             torch.from_numpy(labels.astype(np.int64)))
    loss.backward()
    return twin, loss.item()


def has_batch_norm(model):
    import torch
    return any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())


@needs_torch
@pytest.mark.parametrize("name", ["lenet", "googlenet", "resnet18", "resnet50", "mobilenet-like", "squeezenet-like"])
def test_training_step_from_imported_file(dev, exports, name, monkeypatch):
    """Exported in training mode where the network has batch norm (batch statistics, as the torch model trains):
    one step of clnet on the imported module gives PyTorch's float64 loss, every parameter gradient (by the
    initializer's name, which is the state_dict key) and batch norm's updated running statistics (ONNX's: the
    population variance), each within 1e-5 (googlenet and ResNet-50 2e-2) or ten times PyTorch's own float32 error
    on it, whichever is larger (a first layer's weight gradient sums thousands of terms that largely cancel: PyTorch's
    float32 misses googlenet's by 1.3e-2); and, for the zoo's networks, the zoo's own clnet model from the same
    weights within 1e-6."""
    import torch
    if name in ("googlenet", "resnet50"):
        one_device_only(dev, name, TRAIN_DEVICE if name == "googlenet" else BIG_DEVICE)
    e = exports.get(name)
    if has_batch_norm(e["model"]):
        e = exports.get(name, training=True)
    net = connx.load(e["path"], device=dev)
    assert net.training == has_batch_norm(e["model"])
    net.train()
    model = e["model"].train()
    for m in model.modules():  # dropout's draws differ between the engines: both leave it out
        if isinstance(m, torch.nn.Dropout):
            m.eval()
    monkeypatch.setattr(connx.F, "dropout", lambda x, p, training: x)
    labels = np.arange(e["x"].shape[0]) % e["classes"]
    twin, tloss = torch_grads(model, e["x"], labels, torch.float64)
    single, sloss = torch_grads(model, e["x"], labels, torch.float32)
    loss = nn.CrossEntropyLoss()(net(clnet.tensor(e["x"], dev)), labels)
    loss.backward()
    within_float32(loss.item(), torch.tensor(tloss), torch.tensor(sloss), f"{name} loss")
    theirs, floats = dict(twin.named_parameters()), dict(single.named_parameters())
    ours = dict(net.named_parameters())
    assert set(ours) == set(theirs), f"parameter names: {sorted(set(ours) ^ set(theirs))[:6]}"
    if name in models.MODELS:  # the zoo's own clnet model from the same weights: the same kernels, the same numbers
        zoo = models.build(name).to(dev)
        zoo.load_state_dict(model.state_dict())
        nn.CrossEntropyLoss()(zoo(clnet.tensor(e["x"], dev)), labels).backward()
        for k, p in zoo.named_parameters():
            assert_close(ours[k].grad.numpy(), p.grad.numpy(), f"{name} grad {k} against the zoo's", tol=1e-6)
    # ResNet-50 at 96x96 normalises layer4 over 2 x 3 x 3 values a channel: there clnet's batch-norm gradients err
    # 5-10x PyTorch's float32 (1e-2 of the norm against 1.6e-3 on one draw); the zoo check above shows the import
    # adds nothing to it
    # googlenet 2e-2 as ResNet-50: its inception branches' first weights get gradients of norm ~2e-5 that cancel
    # through several batch norms, and PyTorch's own float32 error, the other bound, is 10x smaller on an AMD Zen 5
    # than on the CPU this was set on (there the parent commit, 1d29a6f, misses the old 1e-4 by 3%, on both devices)
    floor = {"resnet50": 2e-2, "googlenet": 2e-2}.get(name, 1e-5)
    for k, p in ours.items():
        within_float32(p.grad.numpy(), theirs[k].grad, floats[k].grad, f"{name} grad {k}", floor)
    state = net.state_dict()
    twin_state, single_state = (onnx_running_stats(model, e["x"], t.state_dict()) for t in (twin, single))
    for k, v in twin_state.items():
        if "running" in k:
            within_float32(state[k], v, single_state[k], f"{name} {k}", floor)


def onnx_running_stats(model, x, stepped):
    """The state_dict `stepped` (PyTorch's after one training step from `model`'s) with ONNX's running variances:
    ONNX's BatchNormalization moves running_var towards the population variance, PyTorch's towards the unbiased one
    (times n / (n - 1), n values a channel). With r0 the value before and r PyTorch's, ONNX's is
    ((n - 1) r + (1 - momentum) r0) / n; n from each batch norm's input shape (hooks on a copy in eval mode)."""
    import copy
    import torch
    probe, counts = copy.deepcopy(model).eval(), {}
    for name, m in probe.named_modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.register_forward_pre_hook(lambda mod, args, name=name: counts.__setitem__(
                name, args[0].numel() // args[0].shape[1]))
    with torch.no_grad():
        probe(torch.from_numpy(x))
    out = dict(stepped)
    modules = dict(model.named_modules())
    for name, n in counts.items():
        key, m = f"{name}.running_var", modules[name]
        before = m.running_var.to(stepped[key].dtype)
        out[key] = ((n - 1) * stepped[key] + (1 - m.momentum) * before) / n
    return out


def within_float32(ours, reference, single, name, floor=1e-5):
    """ours against PyTorch's float64 reference: normwise and worst-element errors within `floor` of the
    reference's size or ten times PyTorch's own float32 error (`single`), whichever is larger (two float32 engines
    summing in different orders differ by several times on an ill-conditioned gradient). The second bound
    holds where the reference all but cancels (a bias whose gradient a following batch norm removes is ~1e-17)."""
    ref = reference.detach().double().numpy()
    ours, single = np.asarray(ours, np.float64), single.detach().double().numpy()
    assert ours.shape == ref.shape and np.all(np.isfinite(ours)), f"{name}: shape {ours.shape} or non-finite values"
    err, err32 = np.linalg.norm(ours - ref), np.linalg.norm(single - ref)
    worst, worst32 = np.abs(ours - ref).max(initial=0), np.abs(single - ref).max(initial=0)
    allowed = max(floor * np.linalg.norm(ref), 10 * err32)
    allowed_worst = max(20 * floor * np.abs(ref).max(initial=0), 10 * worst32)
    assert err <= allowed and worst <= allowed_worst, \
        f"{name}: error {err:.2e} (worst element {worst:.2e}), allowed {allowed:.2e} ({allowed_worst:.2e}); " \
        f"PyTorch float32: {err32:.2e} ({worst32:.2e}), reference norm {np.linalg.norm(ref):.2e}"


@needs_torch
def test_state_dict_round_trip(exports):
    """The imported module's state_dict has PyTorch's keys (no num_batches_tracked, which ONNX does not carry) and
    values; load_state_dict takes a PyTorch state_dict, the model's own included (its num_batches_tracked passed
    over; an unknown key is still refused)."""
    e = exports.get("resnet18", training=True)
    net = connx.load(e["path"])
    torch_state = {k: v for k, v in e["model"].state_dict().items() if "num_batches" not in k}
    state = net.state_dict()
    assert set(state) == set(torch_state)
    for k, v in torch_state.items():
        np.testing.assert_array_equal(state[k], v.numpy(), err_msg=k)
    changed = {k: v + 1.0 for k, v in torch_state.items()}
    net.load_state_dict(changed)
    assert np.array_equal(net.state_dict()["fc.weight"], changed["fc.weight"].numpy())
    net.load_state_dict(e["model"].state_dict())
    assert np.array_equal(net.state_dict()["fc.weight"], torch_state["fc.weight"].numpy())
    with pytest.raises(KeyError, match=r"unexpected keys \['fc.num_batches_tracked'\]"):
        net.load_state_dict(dict(torch_state, **{"fc.num_batches_tracked": np.zeros((), np.int64)}))


@needs_torch
def test_imported_training_step_costs_what_the_zoos_does(dev, exports, rng):
    """After the first steps (which upload the graph's constants once), a training step of an imported network
    copies the batch and labels up and the loss down, nothing else, and device memory stays flat: the operator
    network's host-side Shape subgraph, per-channel constants and channel-shuffle weights cost no copies per step."""
    from clnet import optim
    from clnet.tensor import pool
    e = exports.get("operators")
    net = connx.load(e["path"], device=dev).train()
    opt = optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x_host, y_host = e["x"], rng.integers(0, 6, e["x"].shape[0])

    def step():
        x, y = clnet.tensor(x_host, dev), clnet.tensor(y_host, dev)
        opt.zero_grad()
        log_probs, probs = net(x)
        # both outputs reach the loss: an op that saves its own output (softmax) and never runs its backward is a
        # reference cycle, freed only when Python's collector runs, which moves the pool's high-water mark
        loss = nn.CrossEntropyLoss()(log_probs, y) + probs.mean()
        loss.backward()
        opt.step()
        return float(loss)

    for _ in range(4):
        step()
    dev.synchronize()
    clnet.reset_transfer_stats()
    step()
    assert clnet.transfer_stats() == dict(host_to_device_bytes=x_host.nbytes + y_host.size * 4, host_to_device_count=2,
                                          device_to_host_bytes=4, device_to_host_count=1)
    allocated = pool(dev).allocated_bytes
    for _ in range(10):
        step()
    dev.synchronize()
    assert pool(dev).allocated_bytes == allocated


# ---- operators built with onnx.helper ------------------------------------------------------------------------------

def helper_model(path, nodes, inputs, outputs, initializers, opset=17):
    h = onnx.helper
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in inputs],
                         [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, s) for n, s in outputs],
                         [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_helper_built_operators(dev, rng, tmp_path):
    """Conv with auto_pad SAME_UPPER and stride 2, LRN, MatMul and Gemm(transB=0, alpha, beta) with (in, out)
    weights, Gemm with a (1, out) bias, Unsqueeze/Squeeze, Softmax over the last axis: as ONNX Runtime runs them;
    MatMul's weight trains in clnet's (out, in) layout and state_dict gives it back as the file has it."""
    h = onnx.helper
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3
    mm = rng.standard_normal((4 * 3 * 4, 5)).astype(np.float32) * 0.2
    gemm = rng.standard_normal((5, 7)).astype(np.float32) * 0.3
    bias = rng.standard_normal((1, 7)).astype(np.float32)
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER", strides=[2, 2], name="conv"),
             h.make_node("LRN", ["c"], ["l"], size=3, alpha=1e-2, beta=0.75, bias=2.0, name="lrn"),
             h.make_node("Flatten", ["l"], ["f"], axis=1, name="flat"),
             h.make_node("MatMul", ["f", "mm"], ["m"], name="matmul"),
             h.make_node("Gemm", ["m", "gemm", "bias"], ["g"], transB=0, alpha=0.5, beta=2.0, name="gemm"),
             h.make_node("Unsqueeze", ["g", "axes"], ["u"], name="unsq"),
             h.make_node("Squeeze", ["u", "axes"], ["s"], name="sq"),
             h.make_node("Softmax", ["s"], ["y"], axis=-1, name="softmax")]
    path = helper_model(str(tmp_path / "ops.onnx"), nodes, [("x", (2, 3, 5, 7))], [("y", (2, 7))],
                        dict(w=w, mm=mm, gemm=gemm, bias=bias, axes=np.array([1], np.int64)))
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    net = connx.load(path, device=dev)
    y = net(clnet.tensor(x, dev, requires_grad=True))
    assert_close(y.numpy(), connx.onnxruntime_outputs(path, x)[0], "helper-built graph", tol=1e-5)
    assert net.state_dict()["mm"].shape == (48, 5) and np.array_equal(net.state_dict()["mm"], mm)
    (y * y).sum().backward()
    assert net._parameters["mm"].grad.shape == (5, 48)


def test_transpose_and_clip_forms(dev, rng, tmp_path):
    """Transpose of a channel shuffle and of axes of size 1, Clip with only a minimum or only a maximum, and the
    Shape -> Gather -> Concat -> Reshape subgraph evaluated from each call's shape (a second batch size)."""
    h = onnx.helper
    nodes = [h.make_node("Reshape", ["x", "s5"], ["r"]), h.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
             h.make_node("Reshape", ["t", "s4"], ["u"]),
             h.make_node("Clip", ["u", "lo"], ["c1"]), h.make_node("Clip", ["c1", "", "hi"], ["c2"]),
             h.make_node("Shape", ["c2"], ["shape"]), h.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             h.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
             h.make_node("Concat", ["n1", "minus"], ["target"], axis=0),
             h.make_node("Reshape", ["c2", "target"], ["flat"]),
             h.make_node("Unsqueeze", ["flat", "two"], ["flat3"]),
             h.make_node("Transpose", ["flat3"], ["y"], perm=[0, 2, 1])]
    path = helper_model(str(tmp_path / "t.onnx"), nodes, [("x", ("N", 6, 2, 3))], [("y", ("N", 1, 36))],
                        dict(s5=np.array([0, 2, 3, 2, 3], np.int64), s4=np.array([0, 6, 2, 3], np.int64),
                             lo=np.array(-0.3, np.float32), hi=np.array(0.8, np.float32),
                             zero=np.array(0, np.int64), axes0=np.array([0], np.int64), minus=np.array([-1], np.int64),
                             two=np.array([2], np.int64)))
    net = connx.load(path, device=dev)
    for batch in (2, 3):
        x = rng.standard_normal((batch, 6, 2, 3)).astype(np.float32)
        with clnet.no_grad():
            y = net(clnet.tensor(x, dev)).numpy()
        assert y.shape == (batch, 1, 36)
        assert_close(y, connx.onnxruntime_outputs(path, x)[0], f"batch {batch}", tol=1e-6)


def test_inputs_and_outputs_in_the_files_order(dev, rng, tmp_path):
    """A graph of two inputs and two outputs takes and returns them in the file's order."""
    h = onnx.helper
    nodes = [h.make_node("Sub", ["b", "a"], ["d"]), h.make_node("Concat", ["a", "d"], ["c"], axis=1),
             h.make_node("Relu", ["d"], ["r"])]
    path = helper_model(str(tmp_path / "two.onnx"), nodes, [("a", (2, 3)), ("b", (2, 3))],
                        [("r", (2, 3)), ("c", (2, 6))], {})
    net = connx.load(path, device=dev)
    a, b = rng.standard_normal((2, 2, 3)).astype(np.float32)
    r, c = net(clnet.tensor(a, dev), clnet.tensor(b, dev))
    np.testing.assert_allclose(r.numpy(), np.maximum(b - a, 0), atol=1e-6)
    np.testing.assert_allclose(c.numpy(), np.concatenate([a, b - a], 1), atol=1e-6)
    with pytest.raises(TypeError, match="takes 2 inputs"):
        net(clnet.tensor(a, dev))


# ---- export --------------------------------------------------------------------------------------------------------

EXPORT_INPUTS = {"lenet": (2, 1, 28, 28), "lenet-wide": (2, 1, 28, 28), "resnet8": (2, 1, 28, 28),
                 "resnet18": (2, 3, 32, 32), "resnet50": (1, 3, 32, 32), "googlenet": (1, 3, 224, 224),
                 "alexnet": (1, 3, 224, 224), "overfeat": (1, 3, 231, 231), "vgg-a": (1, 3, 224, 224),
                 "mobilenet_v2": (1, 3, 32, 32), "efficientnet_b0": (2, 3, 32, 32),
                 "shufflenet_v2_x1_0": (2, 3, 32, 32), "convnext_tiny": (2, 3, 32, 32), "vit_b_16": (2, 3, 32, 32)}
# vit_b_16's own code (patches, class token, attention, GELU MLP) in a configuration small enough for CI: 32x32
# images of 16x16 patches, 2 layers of 4 heads, hidden 64, MLP 128
SMALL = {"vit_b_16": lambda: models.modern_blocks(clnet)["VisionTransformer"](32, 16, 2, 4, 64, 128)}

# Zoo models whose ops clnet.onnx.export does not translate yet (none now).
NOT_EXPORTED_YET = set()


def test_every_zoo_model_is_exported_or_listed():
    """A zoo model is either exported below or named in NOT_EXPORTED_YET: none escapes the export test unlisted."""
    assert set(models.MODELS) == set(EXPORT_INPUTS) | NOT_EXPORTED_YET, \
        sorted(set(models.MODELS) ^ (set(EXPORT_INPUTS) | NOT_EXPORTED_YET))


@pytest.mark.parametrize("name", list(EXPORT_INPUTS))
def test_zoo_export_matches_onnxruntime(dev, rng, tmp_path, name):
    """Every zoo model written by clnet.onnx.export passes onnx.checker and ONNX Runtime gives clnet's output
    (batch norm in eval mode with moved running statistics); the file declares a free batch dimension."""
    shape = EXPORT_INPUTS[name]
    if shape[-1] >= 224:
        one_device_only(dev, name)
    clnet.manual_seed(int(rng.integers(1 << 30)))
    model = SMALL.get(name, lambda: models.build(name))().to(dev)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            C = m.num_features
            m.load_state_dict(dict(weight=rng.uniform(0.5, 1.5, C), bias=rng.uniform(-0.5, 0.5, C),
                                   running_mean=rng.uniform(-0.5, 0.5, C), running_var=rng.uniform(0.5, 2, C),
                                   num_batches_tracked=np.array(3)))
    x = rng.standard_normal(shape).astype(np.float32)
    path = str(tmp_path / f"{name}.onnx")
    connx.export(model, path, clnet.tensor(x, dev))  # runs onnx.checker on the file it wrote
    if shape[-1] < 224:
        onnx.checker.check_model(path, full_check=True)  # with shape inference
    assert model.training  # the mode is restored
    model.eval()
    with clnet.no_grad():
        ours = model(clnet.tensor(x, dev)).numpy()
    assert_close(connx.onnxruntime_outputs(path, x)[0], ours, f"{name} exported", tol=1e-5)
    dims = onnx.load(path, load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "N"
    if shape[-1] < 224:  # and ONNX Runtime runs it at another batch size
        x3 = rng.standard_normal((3,) + shape[1:]).astype(np.float32)
        with clnet.no_grad():
            ours = model(clnet.tensor(x3, dev)).numpy()
        assert_close(connx.onnxruntime_outputs(path, x3)[0], ours, f"{name} exported, batch 3", tol=1e-5)
    os.remove(path)


def test_export_round_trip(dev, rng, tmp_path):
    """A branched network with batch norm, a residual add, concatenation, scalar arithmetic, average pooling and
    softmax: exported and imported back it has the same state_dict keys and values and gives the same output, at
    another batch size too."""
    b = models.blocks(clnet)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU6())
            self.block = b["BasicBlock"](8, 8)
            self.inception = b["Inception"](8, 2, 2, 3, 2, 2, 1)
            self.pool = nn.AvgPool2d(3, 2, 1, count_include_pad=False)
            self.fc = nn.Linear(8 * 4 * 4, 5)
            self.norm = nn.LocalResponseNorm(3)

        def forward(self, x):
            x = self.block(self.stem(x))
            x = self.norm(self.inception(x)) * 0.5 - 1.0
            x = nn.functional.sigmoid(self.pool(x)) + nn.functional.tanh(self.pool(x))
            return nn.functional.log_softmax(self.fc(x.flatten(1)), dim=1)

    model = Net().to(dev)
    path = str(tmp_path / "net.onnx")
    connx.export(model, path, rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    back = connx.load(path, device=dev, fuse=False)
    assert not back.training
    model.eval()
    expected = {k: v for k, v in model.state_dict().items() if "num_batches" not in k}
    state = back.state_dict()
    assert set(state) == set(expected)
    for k, v in expected.items():
        np.testing.assert_array_equal(state[k], v, err_msg=k)
    for batch in (2, 3):
        x = clnet.tensor(rng.standard_normal((batch, 3, 8, 8)), dev)
        with clnet.no_grad():
            assert_close(back(x).numpy(), model(x).numpy(), f"round trip, batch {batch}", tol=1e-6)


# ---- refusals ------------------------------------------------------------------------------------------------------

def test_unknown_operator_is_refused_at_load(tmp_path):
    h = onnx.helper
    nodes = [h.make_node("Relu", ["x"], ["r"], name="first"), h.make_node("Det", ["r"], ["y"], name="odd_one")]
    path = helper_model(str(tmp_path / "det.onnx"), nodes, [("x", (3, 3))], [("y", ())], {}, opset=15)
    with no_launch(), pytest.raises(connx.OnnxImportError) as e:
        connx.load(path)
    message = str(e.value)
    assert "Det" in message and "'odd_one'" in message and "opset 15" in message and "det.onnx" in message


def test_unsupported_attributes_are_refused_at_load(tmp_path):
    h = onnx.helper
    cases = [("LRN", dict(size=4), "even size"),
             ("AveragePool", dict(kernel_shape=[2, 2], pads=[0, 0, 1, 1], count_include_pad=1), "count_include_pad"),
             ("Conv", dict(kernel_shape=[3, 3, 3]), "1-D and 2-D convolutions")]
    for op, attrs, words in cases:
        inputs = ["x", "w"] if op == "Conv" else ["x"]
        inits = dict(w=np.ones((1, 1, 3, 3, 3), np.float32)) if op == "Conv" else {}
        path = helper_model(str(tmp_path / f"{op}.onnx"), [h.make_node(op, inputs, ["y"], name="n", **attrs)],
                            [("x", (1, 1, 4, 4) if op != "Conv" else (1, 1, 4, 4, 4))], [("y", (1, 1, 4, 4))], inits)
        with no_launch(), pytest.raises(connx.OnnxImportError, match=words) as e:
            connx.load(path)
        assert f"({op}, opset 17)" in str(e.value)


def test_damaged_and_truncated_files_name_the_file(tmp_path):
    h = onnx.helper
    w = np.ones((4, 3, 3, 3), np.float32)
    good = helper_model(str(tmp_path / "good.onnx"), [h.make_node("Conv", ["x", "w"], ["y"])], [("x", (1, 3, 5, 5))],
                        [("y", (1, 4, 3, 3))], dict(w=w))
    data = open(good, "rb").read()
    for name, content in (("truncated.onnx", data[:len(data) * 2 // 3]), ("garbage.onnx", b"\x07not an onnx file")):
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(connx.OnnxImportError, match="truncated or damaged") as e:
            connx.load(path)
        assert str(path) in str(e.value)
    with pytest.raises(FileNotFoundError, match="missing.onnx"):
        connx.load(tmp_path / "missing.onnx")


def test_missing_onnx_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)  # import onnx now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'clnet\[onnx\]'"):
        connx.load(tmp_path / "any.onnx")
    with pytest.raises(ImportError, match=r"pip install 'clnet\[onnx\]'"):
        connx.export(nn.Linear(2, 2), tmp_path / "any.onnx", np.zeros((1, 2), np.float32))


def test_run_file(dev, tmp_path, rng):
    """`clnet run`'s work: an .npy in, the network's output .npy out."""
    model = models.build("lenet").to(dev)
    x = rng.standard_normal((3, 1, 28, 28)).astype(np.float32)
    connx.export(model, tmp_path / "lenet.onnx", x[:1])
    np.save(tmp_path / "x.npy", x)
    connx.run_file(tmp_path / "lenet.onnx", tmp_path / "x.npy", tmp_path / "y.npy", device=dev.index)
    with clnet.no_grad():
        expected = model.eval()(clnet.tensor(x, dev)).numpy()
    assert_close(np.load(tmp_path / "y.npy"), expected, "clnet run", tol=1e-6)
    assert connx.input_shape(tmp_path / "lenet.onnx") == (None, 1, 28, 28)


def test_export_writes_through_the_one_file_helper(dev, tmp_path):
    """clnet.onnx.export writes as checkpoints do (files.write_atomically): a folder its group can write is refused
    with nothing written, and a file already there keeps its mode when it is replaced."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).to(dev)
    x = np.random.default_rng(3).standard_normal((2, 3, 2, 2)).astype(np.float32)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o775)
    with pytest.raises(clnet.files.UnsafeFolder, match="can be written by its group"):
        connx.export(model, str(shared / "net.onnx"), x)
    assert not os.listdir(shared)
    path = tmp_path / "net.onnx"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    connx.export(model, str(path), x)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert onnx.load(str(path)).graph.node
