"""Networks that are not chains: Inception and residual blocks against PyTorch in float64 (forward, every gradient,
batch norm's running statistics), the zoo's structure against its PyTorch twin, and what a branched training step
costs: exactly the batch and labels up and the loss down, and no memory growth over 50 steps."""
import functools
import gc

import numpy as np
import pytest

import clnet
from clnet import models, nn, optim
from clnet.tensor import pool

from conftest import Decisions, assert_close, float32_error, float32_witnesses, needs_torch


def torch_twin(model, build):
    """build(torch) with the clnet model's state loaded, in float64."""
    import torch
    twin = build(torch)
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    return twin.double()


def training_step_results(model, x, labels, input_grad, make_input):
    """The loss, input and parameter gradients, and running statistics after one training step, as float64 arrays
    (works for a clnet model and for a PyTorch twin)."""
    xt = make_input(x)
    if input_grad:
        xt.requires_grad_(True)
    logits = model(xt)
    if isinstance(logits, clnet.Tensor):
        loss = nn.CrossEntropyLoss()(logits, labels)
    else:
        import torch
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels.astype(np.int64)))
    loss.backward()

    def array(v):  # a clnet or PyTorch tensor, or a NumPy array from a clnet state dict
        if isinstance(v, clnet.Tensor):
            return v.numpy().astype(np.float64)
        return np.asarray(v.detach().double().numpy() if hasattr(v, "detach") else v, dtype=np.float64)
    results = {"loss": np.float64(loss.item())}
    if input_grad:
        results["grad input"] = array(xt.grad)
    results.update(("grad " + k, array(p.grad)) for k, p in model.named_parameters())
    results.update((k, array(v)) for k, v in model.state_dict().items() if "running" in k or "num_batches" in k)
    return results


def compare_with_torch(model, twin, x, labels, tol=1e-5, input_grad=True):
    """clnet against the float64 twin, each result within tol or within 4x float32's own error there: the largest of
    the same twin's in float32 and of float64 runs with float32-sized rounding (conftest.float32_witnesses). A
    deep net's batch-norm gradients at batch 2 can cancel to where float32 itself misses 1e-5, and one float32 run can
    be lucky: inception's 2-channel 1x1 bias gradient erred 4.5e-6 in PyTorch's float32 and 1.8e-5 in clnet's. The
    twins take clnet's max-pooling argmax (Decisions), checked to differ from float64's only at near-ties. Not its
    ReLU decisions: a hook would keep nn.Sequential from fusing each ReLU into its convolution, which this test
    checks. (The hooks on max poolings keep a ReLU or a small convolution before one from fusing into it: neither
    network given here has that pattern.)"""
    import torch

    def run(m):  # a twin's results, its input in its own precision
        return training_step_results(m, x, labels, input_grad,
                                     functools.partial(torch.tensor, dtype=next(m.parameters()).dtype))
    decisions = Decisions(model, kinds=("MaxPool2d",))
    witnesses = float32_witnesses(twin)
    ours = training_step_results(model, x, labels, input_grad, lambda a: clnet.tensor(a, model.device))
    decisions.impose(twin, check=True)
    for w in witnesses:
        decisions.impose(w, check=False)
    expected, witnessed = run(twin), [run(w) for w in witnesses]
    assert ours.keys() == expected.keys()
    for k, want in expected.items():
        assert_close(ours[k], want, k, tol=max(tol, 4 * float32_error(witnessed, want, k)))


def small_inception_net(lib):
    b = models.blocks(lib)
    nn_ = lib.nn
    return nn_.Sequential(nn_.Conv2d(3, 8, 3, padding=1), nn_.ReLU(), b["Inception"](8, 3, 4, 5, 2, 3, 3),
                          nn_.MaxPool2d(3, 2, 1), b["Inception"](14, 5, 3, 7, 3, 2, 1), nn_.AdaptiveAvgPool2d(1),
                          nn_.Flatten(), nn_.Linear(15, 7))


def small_residual_net(lib):
    b = models.blocks(lib)
    return b["ResNet"](b["Bottleneck"], (1, 2), widths=(4, 6), classes=5, in_channels=3, small=True)


@needs_torch
@pytest.mark.parametrize("build,shape,classes", [(small_inception_net, (3, 3, 11, 9), 7),
                                                 (small_residual_net, (2, 3, 9, 7), 5)],
                         ids=["inception", "residual"])
def test_branched_blocks_match_torch(dev, rng, build, shape, classes):
    clnet.manual_seed(int(rng.integers(1 << 30)))
    model = build(clnet).to(dev)
    for m in model.modules():  # non-trivial batch-norm affine parameters
        if isinstance(m, nn.BatchNorm2d):
            m.load_state_dict(dict(weight=rng.uniform(0.5, 1.5, m.num_features),
                                   bias=rng.standard_normal(m.num_features), running_mean=np.zeros(m.num_features),
                                   running_var=np.ones(m.num_features), num_batches_tracked=np.array(0)))
    twin = torch_twin(model, build)
    x = rng.standard_normal(shape).astype(np.float32)
    labels = rng.integers(0, classes, shape[0])
    compare_with_torch(model, twin, x, labels)


@needs_torch
def test_resnet_in_eval_uses_running_statistics(dev, rng):
    model = small_residual_net(clnet).to(dev)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    for _ in range(2):  # move the running statistics away from their start
        model(clnet.tensor(rng.standard_normal((4, 3, 8, 8)), dev))
    twin = torch_twin(model, small_residual_net)
    model.eval()
    twin.eval()
    compare_with_torch(model, twin, x, rng.integers(0, 5, 2))


def test_zoo_state_dicts_are_torchvision_shaped():
    """Keys and shapes of every zoo model equal its PyTorch twin's (built from the same definition), and ResNet's
    keys are torchvision's."""
    torch = pytest.importorskip("torch")
    for name in models.MODELS:
        ours = {k: tuple(v.shape) for k, v in models.build(name).state_dict().items()}
        theirs = {k: tuple(v.shape) for k, v in models.build(name, lib=torch).state_dict().items()}
        assert list(ours) == list(theirs) and ours == theirs, name
    keys = set(models.build("resnet18").state_dict())
    for k in ("conv1.weight", "bn1.running_var", "layer1.0.conv1.weight", "layer2.0.downsample.0.weight",
              "layer2.0.downsample.1.num_batches_tracked", "layer4.1.bn2.bias", "fc.weight"):
        assert k in keys
    assert len(models.build("resnet50").state_dict()) == 320  # as torchvision's resnet50
    assert sum(int(np.prod(p.shape)) for p in models.build("googlenet").parameters()) == 6998552


def googlenet_like():
    b = models.blocks(clnet)
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                         b["Inception"](8, 4, 4, 6, 2, 3, 3), b["Inception"](16, 4, 4, 4, 2, 2, 2), nn.AvgPool2d(4),
                         nn.Flatten(), nn.Linear(12, 10))


@pytest.mark.parametrize("build,shape", [(googlenet_like, (2, 3, 16, 16)), (lambda: models.build("resnet8"), (2, 1, 28, 28))],
                         ids=["googlenet-like", "resnet8"])
def test_branched_step_transfers_and_memory(dev, rng, build, shape):
    """A training step copies the batch and labels up and the loss down, nothing else; over 50 steps the device
    memory stays flat (each step's graph and saved tensors are released), and every launch finds its kernel with its
    arguments already set (the pool hands each tensor the same buffer every step): no argument set is made."""
    from clnet import kernels
    model = build().to(dev)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x_host = rng.standard_normal(shape).astype(np.float32)
    y_host = rng.integers(0, 10, 2)

    def step():
        x, y = clnet.tensor(x_host, dev), clnet.tensor(y_host, dev)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return float(loss)

    gc.collect()  # earlier tests' garbage, freed mid-loop, would hand this step other buffers from the pool
    for _ in range(4):  # the first steps allocate (gradients, flat optimizer buffers) and settle the pool
        step()
    dev.synchronize()
    clnet.reset_transfer_stats()
    first = step()
    stats = clnet.transfer_stats()
    assert stats == dict(host_to_device_bytes=x_host.nbytes + 2 * 4, host_to_device_count=2, device_to_host_bytes=4,
                         device_to_host_count=1)
    allocated = pool(dev).allocated_bytes
    argument_sets = sum(len(k.clones) for k in kernels._kernels.values())
    for _ in range(50):
        last = step()
    dev.synchronize()
    assert pool(dev).allocated_bytes == allocated
    assert sum(len(k.clones) for k in kernels._kernels.values()) == argument_sets
    assert np.isfinite(last) and last < first
