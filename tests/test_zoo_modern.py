"""The zoo's networks since 2016 (mobilenet_v2, efficientnet_b0, shufflenet_v2_x1_0, convnext_tiny, vit_b_16)
against PyTorch twins written here, independently of clnet/models.py, from the papers and torchvision's module
layout: the twin loads the clnet model's state_dict unchanged (so the keys and shapes are torchvision's), and the
forward output, the loss, the input's and every parameter's gradient and batch norm's running statistics agree in
float64, in training (batch statistics; dropout and drop path at 0) and in eval (running statistics; dropout and
drop path on, which eval must ignore). The twins take clnet's ReLU and max-pooling decisions, each checked to differ
from float64's only within rounding of the kink (conftest.Decisions), so an input at the edge cannot move every
gradient below it. CI runs width- and depth-reduced configurations of the same classes, and shufflenet_v2_x1_0 at
full width on a small image; the full-size models are built on the host only, to check their state_dict layout and
parameter counts against torchvision's published ones."""
import copy
import math
from collections import OrderedDict

import numpy as np
import pytest

import clnet
from clnet import models, nn

from conftest import Decisions, assert_close, float32_error, float32_witnesses, needs_torch

torch = pytest.importorskip("torch")
tnn = torch.nn


# ---- the PyTorch twins ---------------------------------------------------------------------------------------------

def _divisible(v, d=8):
    r = max(d, int(v + d / 2) // d * d)
    return r + d if r < 0.9 * v else r


def cna(cin, cout, k, stride=1, groups=1, act=None, norm=True, padding=None, bias=False):
    """Conv2dNormActivation's layout: '0' convolution, '1' norm, '2' activation."""
    parts = OrderedDict()
    parts["0"] = tnn.Conv2d(cin, cout, k, stride, k // 2 if padding is None else padding, groups=groups, bias=bias)
    if norm is True:
        parts["1"] = tnn.BatchNorm2d(cout)
    elif norm:
        parts["1"] = norm(cout)
    if act:
        parts[str(len(parts))] = act()
    return tnn.Sequential(parts)


def drop_path(x, p, training):
    if not training or p == 0:
        return x
    keep = torch.empty((x.shape[0],) + (1,) * (x.dim() - 1), dtype=x.dtype).bernoulli_(1 - p)
    return x * keep / (1 - p)


class TwinMobileBlock(tnn.Module):
    def __init__(self, cin, cout, stride, t):
        super().__init__()
        mid = int(round(cin * t))
        seq = [] if t == 1 else [cna(cin, mid, 1, act=tnn.ReLU6)]
        seq += [cna(mid, mid, 3, stride, mid, act=tnn.ReLU6), tnn.Conv2d(mid, cout, 1, bias=False),
                tnn.BatchNorm2d(cout)]
        self.conv = tnn.Sequential(*seq)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.conv(x)
        return x + y if self.residual else y


class TwinMobileNetV2(tnn.Module):
    def __init__(self, classes=1000, width=1.0, rows=None, dropout=0.2):
        super().__init__()
        rows = rows or [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1], [6, 160, 3, 2],
                        [6, 320, 1, 1]]
        c = _divisible(32 * width)
        last = _divisible(1280 * max(1.0, width))
        feats = [cna(3, c, 3, 2, act=tnn.ReLU6)]
        for t, ch, n, s in rows:
            for i in range(n):
                feats.append(TwinMobileBlock(c, _divisible(ch * width), s if i == 0 else 1, t))
                c = _divisible(ch * width)
        feats.append(cna(c, last, 1, act=tnn.ReLU6))
        self.features = tnn.Sequential(*feats)
        self.classifier = tnn.Sequential(tnn.Dropout(dropout), tnn.Linear(last, classes))

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


class TwinSE(tnn.Module):
    def __init__(self, c, s):
        super().__init__()
        self.fc1, self.fc2 = tnn.Conv2d(c, s, 1), tnn.Conv2d(s, c, 1)

    def forward(self, x):
        g = x.mean((2, 3), keepdim=True)
        return x * torch.sigmoid(self.fc2(torch.nn.functional.silu(self.fc1(g))))


class TwinMBConv(tnn.Module):
    def __init__(self, t, k, stride, cin, cout, p):
        super().__init__()
        mid = _divisible(cin * t)
        seq = [] if mid == cin else [cna(cin, mid, 1, act=tnn.SiLU)]
        seq += [cna(mid, mid, k, stride, mid, act=tnn.SiLU), TwinSE(mid, max(1, cin // 4)), cna(mid, cout, 1)]
        self.block = tnn.Sequential(*seq)
        self.p, self.residual = p, stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return drop_path(y, self.p, self.training) + x if self.residual else y


class TwinEfficientNet(tnn.Module):
    def __init__(self, rows, dropout, sd, classes=1000, last=None):
        super().__init__()
        feats = [cna(3, rows[0][3], 3, 2, act=tnn.SiLU)]
        n_blocks, i = sum(r[5] for r in rows), 0
        for t, k, s, cin, cout, n in rows:
            stage = []
            for j in range(n):
                stage.append(TwinMBConv(t, k, s if j == 0 else 1, cin if j == 0 else cout, cout, sd * i / n_blocks))
                i += 1
            feats.append(tnn.Sequential(*stage))
        last = last or 4 * rows[-1][4]
        feats.append(cna(rows[-1][4], last, 1, act=tnn.SiLU))
        self.features = tnn.Sequential(*feats)
        self.classifier = tnn.Sequential(tnn.Dropout(dropout), tnn.Linear(last, classes))

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3)))


def b0_rows(width=1.0, depth=1.0):
    table = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
             (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
    return [(t, k, s, _divisible(a * width), _divisible(b * width), math.ceil(n * depth)) for t, k, s, a, b, n in table]


class TwinShuffleUnit(tnn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        h = cout // 2
        self.stride = stride
        if stride == 2:
            self.branch1 = tnn.Sequential(tnn.Conv2d(cin, cin, 3, 2, 1, groups=cin, bias=False), tnn.BatchNorm2d(cin),
                                          tnn.Conv2d(cin, h, 1, bias=False), tnn.BatchNorm2d(h), tnn.ReLU())
        self.branch2 = tnn.Sequential(tnn.Conv2d(cin if stride == 2 else h, h, 1, bias=False), tnn.BatchNorm2d(h),
                                      tnn.ReLU(), tnn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False),
                                      tnn.BatchNorm2d(h), tnn.Conv2d(h, h, 1, bias=False), tnn.BatchNorm2d(h),
                                      tnn.ReLU())

    def forward(self, x):
        if self.stride == 1:
            c = x.shape[1] // 2
            y = torch.cat([x[:, :c], self.branch2(x[:, c:])], 1)
        else:
            y = torch.cat([self.branch1(x), self.branch2(x)], 1)
        return torch.nn.functional.channel_shuffle(y, 2)


class TwinShuffleNetV2(tnn.Module):
    def __init__(self, repeats, widths, classes=1000):
        super().__init__()
        self.conv1 = tnn.Sequential(tnn.Conv2d(3, widths[0], 3, 2, 1, bias=False), tnn.BatchNorm2d(widths[0]),
                                    tnn.ReLU())
        self.maxpool = tnn.MaxPool2d(3, 2, 1)
        c = widths[0]
        for name, n, w in zip(("stage2", "stage3", "stage4"), repeats, widths[1:4]):
            setattr(self, name, tnn.Sequential(TwinShuffleUnit(c, w, 2), *[TwinShuffleUnit(w, w, 1)
                                                                         for _ in range(n - 1)]))
            c = w
        self.conv5 = tnn.Sequential(tnn.Conv2d(c, widths[4], 1, bias=False), tnn.BatchNorm2d(widths[4]), tnn.ReLU())
        self.fc = tnn.Linear(widths[4], classes)

    def forward(self, x):
        x = self.stage4(self.stage3(self.stage2(self.maxpool(self.conv1(x)))))
        return self.fc(self.conv5(x).mean((2, 3)))


class ChannelsLayerNorm(tnn.LayerNorm):
    """LayerNorm over dim 1 of (N, C, H, W), computed directly over the channel dimension (not via permutes)."""

    def forward(self, x):
        mu = x.mean(1, keepdim=True)
        var = ((x - mu) ** 2).mean(1, keepdim=True)
        return (x - mu) / torch.sqrt(var + self.eps) * self.weight[:, None, None] + self.bias[:, None, None]


class Channels(tnn.Module):
    def __init__(self, last):
        super().__init__()
        self.last = last

    def forward(self, x):
        return x.permute(0, 2, 3, 1) if self.last else x.permute(0, 3, 1, 2)


class TwinCNBlock(tnn.Module):
    def __init__(self, dim, scale, p):
        super().__init__()
        self.block = tnn.Sequential(tnn.Conv2d(dim, dim, 7, 1, 3, groups=dim), Channels(True),
                                    tnn.LayerNorm(dim, eps=1e-6), tnn.Linear(dim, 4 * dim), tnn.GELU(),
                                    tnn.Linear(4 * dim, dim), Channels(False))
        self.layer_scale = tnn.Parameter(torch.full((dim, 1, 1), scale))
        self.p = p

    def forward(self, x):
        return x + drop_path(self.layer_scale * self.block(x), self.p, self.training)


class TwinConvNeXt(tnn.Module):
    def __init__(self, stages, sd=0.0, scale=1e-6, classes=1000):
        super().__init__()
        ln = lambda c: ChannelsLayerNorm(c, eps=1e-6)  # noqa: E731
        feats = [cna(3, stages[0][0], 4, 4, norm=ln, padding=0, bias=True)]
        n_blocks, i = sum(s[2] for s in stages), 0
        for cin, cout, n in stages:
            blocks = []
            for _ in range(n):
                blocks.append(TwinCNBlock(cin, scale, sd * i / (n_blocks - 1)))
                i += 1
            feats.append(tnn.Sequential(*blocks))
            if cout:
                feats.append(tnn.Sequential(ln(cin), tnn.Conv2d(cin, cout, 2, 2)))
        self.features = tnn.Sequential(*feats)
        last = stages[-1][1] or stages[-1][0]
        self.classifier = tnn.Sequential(ln(last), tnn.Flatten(1), tnn.Linear(last, classes))

    def forward(self, x):
        return self.classifier(self.features(x).mean((2, 3), keepdim=True))


class TwinViTBlock(tnn.Module):
    def __init__(self, heads, dim, mlp, dropout, attn_dropout):
        super().__init__()
        self.ln_1 = tnn.LayerNorm(dim, eps=1e-6)
        self.self_attention = tnn.MultiheadAttention(dim, heads, dropout=attn_dropout, batch_first=True)
        self.dropout = tnn.Dropout(dropout)
        self.ln_2 = tnn.LayerNorm(dim, eps=1e-6)
        self.mlp = tnn.Sequential(tnn.Linear(dim, mlp), tnn.GELU(), tnn.Dropout(dropout), tnn.Linear(mlp, dim),
                                  tnn.Dropout(dropout))

    def forward(self, x):
        h = self.ln_1(x)
        x = x + self.dropout(self.self_attention(h, h, h, need_weights=False)[0])
        return x + self.mlp(self.ln_2(x))


class TwinViTEncoder(tnn.Module):
    def __init__(self, seq, layers, heads, dim, mlp, dropout, attn_dropout):
        super().__init__()
        self.pos_embedding = tnn.Parameter(torch.zeros(1, seq, dim))
        self.dropout = tnn.Dropout(dropout)
        self.layers = tnn.Sequential(OrderedDict((f"encoder_layer_{i}", TwinViTBlock(heads, dim, mlp, dropout,
                                                                                     attn_dropout))
                                                 for i in range(layers)))
        self.ln = tnn.LayerNorm(dim, eps=1e-6)

    def forward(self, x):
        return self.ln(self.layers(self.dropout(x + self.pos_embedding)))


class TwinViT(tnn.Module):
    def __init__(self, image, patch, layers, heads, dim, mlp, dropout=0.0, attn_dropout=0.0, classes=1000):
        super().__init__()
        self.patch = patch
        self.conv_proj = tnn.Conv2d(3, dim, patch, patch)
        self.class_token = tnn.Parameter(torch.zeros(1, 1, dim))
        self.encoder = TwinViTEncoder((image // patch) ** 2 + 1, layers, heads, dim, mlp, dropout, attn_dropout)
        self.heads = tnn.Sequential(OrderedDict(head=tnn.Linear(dim, classes)))

    def forward(self, x):
        tokens = self.conv_proj(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.class_token.expand(x.shape[0], 1, -1), tokens], 1)
        return self.heads(self.encoder(tokens)[:, 0])


# ---- the configurations --------------------------------------------------------------------------------------------

def _zoo(lib, name):
    return models.modern_blocks(lib)[name]


# name: (clnet model from (dropout, drop path), twin from the same, input shape, classes); small enough for CI
SMALL = {
    "mobilenet_v2": (
        lambda d, sd: _zoo(clnet, "MobileNetV2")(5, 0.25, [[1, 8, 1, 1], [6, 12, 2, 2], [6, 16, 1, 2]], dropout=d),
        lambda d, sd: TwinMobileNetV2(5, 0.25, [[1, 8, 1, 1], [6, 12, 2, 2], [6, 16, 1, 2]], dropout=d),
        (2, 3, 23, 19), 5),
    "efficientnet_b0": (
        lambda d, sd: _zoo(clnet, "EfficientNet")([(1, 3, 1, 8, 8, 1), (6, 5, 2, 8, 16, 2)], d, sd, 5, 24),
        lambda d, sd: TwinEfficientNet([(1, 3, 1, 8, 8, 1), (6, 5, 2, 8, 16, 2)], d, sd, 5, 24),
        (2, 3, 17, 21), 5),
    "shufflenet_v2_x1_0": (
        lambda d, sd: _zoo(clnet, "ShuffleNetV2")((1, 2, 1), (8, 16, 24, 32, 40), 5),
        lambda d, sd: TwinShuffleNetV2((1, 2, 1), (8, 16, 24, 32, 40), 5),
        (2, 3, 37, 41), 5),
    "convnext_tiny": (
        lambda d, sd: _zoo(clnet, "ConvNeXt")([(8, 16, 1), (16, None, 2)], sd, 1e-6, 5),
        lambda d, sd: TwinConvNeXt([(8, 16, 1), (16, None, 2)], sd, 1e-6, 5),
        (2, 3, 35, 29), 5),
    "vit_b_16": (
        lambda d, sd: _zoo(clnet, "VisionTransformer")(20, 4, 2, 2, 12, 20, d, d, 5),
        lambda d, sd: TwinViT(20, 4, 2, 2, 12, 20, d, d, 5),
        (2, 3, 20, 20), 5),
}

# the full-size twins and torchvision's published parameter counts (num_params of each model's weights)
FULL = {
    "mobilenet_v2": (lambda: TwinMobileNetV2(), 3504872),
    "efficientnet_b0": (lambda: TwinEfficientNet(b0_rows(), 0.2, 0.2), 5288548),
    "shufflenet_v2_x1_0": (lambda: TwinShuffleNetV2((4, 8, 4), (24, 116, 232, 464, 1024)), 2278604),
    "convnext_tiny": (lambda: TwinConvNeXt([(96, 192, 3), (192, 384, 3), (384, 768, 9), (768, None, 3)], 0.1),
                      28589128),
    "vit_b_16": (lambda: TwinViT(224, 16, 12, 12, 768, 3072), 86567656),
}


# ---- helpers -------------------------------------------------------------------------------------------------------

def randomise_constants(model, rng):
    """Replaces every parameter and buffer that holds one value throughout (norm weights and biases, layer scale,
    class token, running statistics) by random values, so that none of them can hide a wrong wiring."""
    state = {}
    for k, v in model.state_dict().items():
        if v.dtype.kind != "f" or np.ptp(v) != 0:
            continue
        if k.endswith("running_var") or (v.flat[0] != 0 and not k.endswith("running_mean")):
            state[k] = rng.uniform(0.5, 1.5, v.shape).astype(np.float32)
        else:
            state[k] = (0.3 * rng.standard_normal(v.shape)).astype(np.float32)
    model.load_state_dict(state, strict=False)


def results(model, x, labels, torch_side, decisions=None, check=False):
    """Output, loss, input gradient, every parameter's gradient, and the buffers after one forward and backward,
    in float64 (for a clnet model or a PyTorch one; a PyTorch one following clnet's recorded decisions, if given)."""
    if torch_side:
        if decisions is not None:
            decisions.impose(model, check)
        xt = torch.tensor(x, dtype=next(model.parameters()).dtype, requires_grad=True)
        out = model(xt)
        loss = torch.nn.functional.cross_entropy(out, torch.from_numpy(labels.astype(np.int64)))
        loss.backward()
        got = {"output": out, "loss": loss, "grad input": xt.grad}
        got.update(("grad " + k, p.grad) for k, p in model.named_parameters())
        got.update(model.state_dict())
        return {k: v.detach().double().numpy() for k, v in got.items()}
    xt = clnet.tensor(x, model.device).requires_grad_(True)
    out = model(xt)
    loss = nn.CrossEntropyLoss()(out, labels)
    loss.backward()
    got = {"output": out, "loss": loss, "grad input": xt.grad}
    got.update(("grad " + k, p.grad) for k, p in model.named_parameters())
    got = {k: v.numpy() for k, v in got.items()}
    got.update(model.state_dict())
    return {k: np.asarray(v, np.float64) for k, v in got.items()}


def compare(model, twin, x, labels, tol=2e-5, follow=True):
    """clnet against the float64 twin: each quantity within tol, or within 4x float32's own error there, the larger
    of the same twin's in float32 and of float64 runs with float32-sized rounding (conftest.float32_witnesses). A
    gradient that cancels at batch 2 can be beyond float32 itself at 1e-5, and PyTorch's one float32 run can be
    lucky: through a batch norm channel of 8 values with a variance 340x below its layer's median (full widths at
    2x2 planes), PyTorch's error was 5e-6, the perturbed runs' 3e-6 to 2.2e-5, clnet's 3.3e-5. follow: the twins take
    clnet's ReLU and max-pooling decisions (Decisions), each checked to differ from float64's only at a kink."""
    decisions = Decisions(model) if follow else None
    ours = results(model, x, labels, False)
    twin = twin.double()
    witnesses = [results(w, x, labels, True, decisions) for w in float32_witnesses(twin)]  # before twin's hooks
    want = results(twin, x, labels, True, decisions, check=True)
    assert sorted(ours) == sorted(want)
    # A gradient a million times below the network's largest is zero but for rounding (a bias just before a batch
    # norm): there every engine's value is its own rounding noise, and clnet's landed at 6x the largest witness's
    # (efficientnet_b0 on PoCL, 5e8 of itself): such a quantity gets 16x the witnesses' error, the others 4x.
    largest = max(np.linalg.norm(w) for k, w in want.items() if k.startswith("grad "))
    for k, w in want.items():
        if k.endswith("num_batches_tracked"):
            assert ours[k] == w, k
            continue
        noise = k.startswith("grad ") and np.linalg.norm(w) < 1e-6 * largest
        assert_close(ours[k], w, k, tol=max(tol, (16 if noise else 4) * float32_error(witnesses, w, k)))


def make_pair(name, dev, rng, dropout, drop_path_p):
    build, build_twin, shape, classes = SMALL[name]
    clnet.manual_seed(int(rng.integers(1 << 30)))
    model = build(dropout, drop_path_p)
    randomise_constants(model, rng)
    model.to(dev)
    twin = build_twin(dropout, drop_path_p)
    # the state_dict goes over unchanged: strict, every key and shape as the twin's (torchvision's) layout
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    x = rng.standard_normal(shape).astype(np.float32)
    return model, twin, x, rng.integers(0, classes, shape[0])


# ---- tests ---------------------------------------------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("name", list(SMALL))
def test_training_step_matches_twin(dev, rng, name):
    """Training mode (batch norm on the batch's statistics, running statistics updated), dropout and drop path at
    0: the output, loss, every gradient and buffer as PyTorch's float64."""
    model, twin, x, labels = make_pair(name, dev, rng, 0.0, 0.0)
    compare(model, twin, x, labels)


@needs_torch
@pytest.mark.parametrize("name", list(SMALL))
def test_eval_matches_twin(dev, rng, name):
    """Eval mode with dropout 0.4 and drop path 0.5 configured: both are identities, batch norm uses the (random)
    running statistics."""
    model, twin, x, labels = make_pair(name, dev, rng, 0.4, 0.5)
    model.eval()
    twin.eval()
    compare(model, twin, x, labels)


@needs_torch
@pytest.mark.parametrize("name", list(FULL))
def test_full_size_layout_is_torchvisions(name):
    """The registered full-size model's state_dict keys (in order) and shapes are the independent twin's, and its
    parameter count is torchvision's published one. Nothing runs."""
    make_twin, count = FULL[name]
    ours = models.build(name)
    theirs = make_twin()
    assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in theirs.state_dict().items()]
    assert sum(int(np.prod(p.shape)) for p in ours.parameters()) == count
    assert models.MODELS[name]["input_shape"] == (3, 224, 224)


@needs_torch
def test_full_width_shufflenet_matches_twin(dev, rng):
    """shufflenet_v2_x1_0's full widths (116, 232 and 464 channels through the depthwise layers, the split, the
    concatenation and the shuffle; 1024 at conv5), one or two units a stage, on an odd-sized image (stride 2 on odd
    planes): one training step as the float64 twin, ReLU and max-pooling decisions followed (compare). Within 4e-5:
    stage 4's batch norms see 2 images of 3x3 planes, 18 values a channel, and stage4.0.branch2.1.weight's gradient
    erred 2.0e-5 (seed 1632702387, PoCL and Intel's runtime) where PyTorch's float32 runs erred under 5e-6."""
    widths, repeats, shape = (24, 116, 232, 464, 1024), (1, 2, 1), (2, 3, 45, 45)
    clnet.manual_seed(int(rng.integers(1 << 30)))
    model = _zoo(clnet, "ShuffleNetV2")(repeats, widths, 10)
    randomise_constants(model, rng)
    model.to(dev)
    twin = TwinShuffleNetV2(repeats, widths, 10)
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    compare(model, twin, rng.standard_normal(shape).astype(np.float32), rng.integers(0, 10, shape[0]), tol=4e-5)


@needs_torch
@pytest.mark.parametrize("kind", ("ReLU", "ReLU6"))
def test_twins_follow_decisions_only_at_kinks(dev, rng, kind):
    """compare's Decisions: where clnet's decision differs from float64's at a kink, the twin follows clnet's (the
    unit's gradient goes with it); where it differs at an input clearly away from a kink, the comparison fails."""
    kink = 6.0 if kind == "ReLU6" else 0.0
    model = nn.Sequential(nn.Linear(4, 5), getattr(nn, kind)(), nn.Linear(5, 3))
    w = rng.standard_normal((5, 4)).astype(np.float32)
    b = rng.uniform(0.5, 1.5, 5).astype(np.float32)
    w[2], b[2] = 0.0, kink  # unit 2's input is the kink itself, in float32 and float64 alike: off (ReLU6: at 6)
    w[0], b[0] = 0.0, 1.0  # unit 0's is 1, on
    model.load_state_dict({"0.weight": w, "0.bias": b}, strict=False)
    model.to(dev)
    twin = tnn.Sequential(tnn.Linear(4, 5), getattr(tnn, kind)(), tnn.Linear(5, 3)).double()
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    x = rng.standard_normal((3, 4)).astype(np.float32)
    labels = rng.integers(0, 3, 3)

    def twin_grads(edit):
        decisions = Decisions(model)
        results(model, x, labels, False)
        edit(decisions.seen["1"][0])
        return results(copy.deepcopy(twin), x, labels, True, decisions, check=True)

    assert twin_grads(lambda seen: None)["grad 0.bias"][2] == 0.0
    # clnet's input there a rounding step inside the linear part: the twin passes unit 2's gradient through
    assert twin_grads(lambda seen: seen[:, 2].fill(kink + (1e-7 if kink == 0 else -1e-6)))["grad 0.bias"][2] != 0.0
    # a decision switched at an input 1 from the kink is no rounding: named, and failed
    with pytest.raises(AssertionError, match=r"1 \(" + kind + r"\): 1 on/off decisions differ"):
        twin_grads(lambda seen: seen.__setitem__((1, 0), -1.0 if kink == 0 else 12.0))


@needs_torch
def test_twins_follow_pooling_argmax_only_at_near_ties(dev, rng):
    """compare's Decisions at a max pooling: where clnet's argmax differs from float64's within rounding, the twin's
    gradient goes to clnet's; where clnet took an input clearly below the window's maximum, the comparison fails."""
    model = nn.Sequential(nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4, 3)).to(dev)
    twin = tnn.Sequential(tnn.MaxPool2d(2), tnn.Flatten(), tnn.Linear(4, 3)).double()
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    x = rng.standard_normal((2, 1, 4, 4)).astype(np.float32)
    x[0, 0, 0, :2] = 10.0  # the first window's two largest inputs tie, in float32 and float64 alike: the first wins
    labels = rng.integers(0, 3, 2)

    def twin_grads(edit):
        decisions = Decisions(model)
        results(model, x, labels, False)
        edit(decisions.seen["0"][0])
        return results(copy.deepcopy(twin), x, labels, True, decisions, check=True)["grad input"][0, 0, 0, :2]

    first, second = twin_grads(lambda seen: None)
    assert first != 0.0 and second == 0.0
    # clnet's second input a rounding step above the first: the twin's gradient goes to the second
    first, second = twin_grads(lambda seen: seen.__setitem__((0, 0, 0, 1), np.nextafter(np.float32(10), np.inf)))
    assert first == 0.0 and second != 0.0
    # an argmax moved to an input about 10 below the window's maximum is no rounding: named, and failed
    with pytest.raises(AssertionError, match=r"0 \(MaxPool2d\): 1 argmax decisions differ"):
        twin_grads(lambda seen: seen.__setitem__((0, 0, 1, 1), 20.0))


def test_stochastic_depth(dev, rng):
    """Drop path in training: each sample of the residual branch is all zero or scaled by 1 / (1 - p), about p of
    them dropped, and the gradient follows the same mask; identity in eval and at p = 0."""
    sd = models.modern_blocks(clnet)["StochasticDepth"](0.3)
    x = clnet.tensor(rng.uniform(0.5, 1.5, (400, 3, 2, 2)).astype(np.float32), dev).requires_grad_(True)
    y = sd(x)
    g = rng.standard_normal(x.shape).astype(np.float32)
    y.backward(clnet.tensor(g, dev))
    xs, ys, grad = x.numpy(), y.numpy(), x.grad.numpy()
    kept = ys.reshape(400, -1).max(1) > 0
    np.testing.assert_allclose(ys[kept], xs[kept] / 0.7, rtol=1e-6)
    assert np.all(ys[~kept] == 0)
    np.testing.assert_allclose(grad[kept], g[kept] / 0.7, rtol=1e-6)
    assert np.all(grad[~kept] == 0)
    assert 75 <= (~kept).sum() <= 165  # binomial(400, 0.3): mean 120, standard deviation 9.2
    sd.eval()
    assert sd(x) is x
    assert models.modern_blocks(clnet)["StochasticDepth"](0.0)(x) is x
    with pytest.raises(ValueError, match="StochasticDepth"):
        models.modern_blocks(clnet)["StochasticDepth"](1.5)


def test_bad_configurations_are_named():
    b = models.modern_blocks(clnet)
    with pytest.raises(ValueError, match=r"VisionTransformer: expected input \(N, 3, 20, 20\), got shape "
                                         r"\(1, 3, 16, 16\)"):
        b["VisionTransformer"](20, 4, 1, 2, 4, 8)(clnet.tensor(np.zeros((1, 3, 16, 16), np.float32)))
    with pytest.raises(ValueError, match="patch_size 6 must divide image_size 20"):
        b["VisionTransformer"](20, 6, 1, 2, 4, 8)
    with pytest.raises(ValueError, match="ShuffleNetV2: expected 3 stages_repeats"):
        b["ShuffleNetV2"]((1, 1), (8, 16, 24, 32, 40))
    with pytest.raises(ValueError, match="MobileNetV2: inverted_residual_setting rows are"):
        b["MobileNetV2"](inverted_residual_setting=[[1, 16, 1]])
    with pytest.raises(ValueError, match="ConvNeXt: block_setting rows are"):
        b["ConvNeXt"]([(8, None, 1)])
