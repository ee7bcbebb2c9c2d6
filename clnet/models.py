"""The model zoo: each network written once, against a PyTorch-shaped library (clnet, or torch itself for the
benchmark's and the tests' PyTorch twins), so the twin has the same structure and state_dict keys by construction.

`build(name)` makes a clnet model; `build(name, lib=torch)` its PyTorch twin.
"""
import math
import sys
from collections import OrderedDict

import numpy as np

from . import rng

MODELS = {}


def register(name, input_shape, default_batch, classes=1000):
    def wrap(fn):
        MODELS[name] = dict(build=fn, input_shape=input_shape, batch=default_batch, classes=classes, doc=fn.__doc__)
        return fn
    return wrap


@register("lenet", (1, 28, 28), 64, classes=10)
def lenet(lib):
    """LeNet as in Caffe's MNIST example: conv 5x5x20, pool, conv 5x5x50, pool, dense 500 + ReLU, dense 10."""
    nn = lib.nn
    return nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))


@register("lenet-wide", (1, 28, 28), 64, classes=10)
def lenet_wide(lib):
    """The network of the performance report that started clnet: three 120-channel convolutions, two 2048 dense."""
    nn = lib.nn
    return nn.Sequential(nn.Conv2d(1, 120, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(120, 120, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(120, 120, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(120, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))


@register("alexnet", (3, 224, 224), 128)
def alexnet(lib):
    """AlexNet, the one-weird-trick variant of convnet-benchmarks (64-192-384-256-256 channels)."""
    nn = lib.nn
    return nn.Sequential(nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
                         nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
                         nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2), nn.Flatten(),
                         nn.Linear(256 * 6 * 6, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, 1000))


@register("overfeat", (3, 231, 231), 128)
def overfeat(lib):
    """OverFeat, fast model, as in convnet-benchmarks."""
    nn = lib.nn
    return nn.Sequential(nn.Conv2d(3, 96, 11, stride=4), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Conv2d(96, 256, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Conv2d(256, 512, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(512, 1024, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(1024, 1024, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                         nn.Linear(1024 * 6 * 6, 3072), nn.ReLU(), nn.Linear(3072, 4096), nn.ReLU(),
                         nn.Linear(4096, 1000))


@register("vgg-a", (3, 224, 224), 64)
def vgg_a(lib):
    """VGG-A (VGG-11), as in convnet-benchmarks."""
    nn = lib.nn
    layers = []
    c = 3
    for v in (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"):
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU()]
            c = v
    layers += [nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
               nn.Linear(4096, 1000)]
    return nn.Sequential(*layers)


# ---- networks with branches ----------------------------------------------------------------------------------------

_blocks = {}


def blocks(lib):
    """The building blocks of the branched networks, defined once per library (clnet or torch)."""
    if lib.__name__ in _blocks:
        return _blocks[lib.__name__]
    nn = lib.nn

    def conv_relu(cin, cout, k, stride=1, padding=0):
        return nn.Sequential(nn.Conv2d(cin, cout, k, stride=stride, padding=padding), nn.ReLU())

    class Inception(nn.Module):
        """GoogLeNet v1's module: 1x1; 1x1 -> 3x3; 1x1 -> 5x5; 3x3 stride-1 max pool -> 1x1; joined by channel."""

        def __init__(self, cin, c1, c3r, c3, c5r, c5, cp):
            super().__init__()
            self.b1 = conv_relu(cin, c1, 1)
            self.b2 = nn.Sequential(conv_relu(cin, c3r, 1), conv_relu(c3r, c3, 3, padding=1))
            self.b3 = nn.Sequential(conv_relu(cin, c5r, 1), conv_relu(c5r, c5, 5, padding=2))
            self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1), conv_relu(cin, cp, 1))

        def forward(self, x):
            return lib.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)

    class BasicBlock(nn.Module):
        """ResNet's two 3x3 convolutions with batch norm and the identity (or a 1x1 projection) added."""
        expansion = 1

        def __init__(self, cin, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU()
            self.downsample = downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(out + identity)

    class Bottleneck(nn.Module):
        """ResNet-50's 1x1 -> 3x3 (the stride, as torchvision's v1.5) -> 1x1 (4x the planes), plus the shortcut."""
        expansion = 4

        def __init__(self, cin, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU()
            self.downsample = downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(out + identity)

    class ResNet(nn.Module):
        """torchvision's ResNet layout and state_dict keys (conv1, bn1, layer1.0.conv1, layer2.0.downsample.0, fc).
        `small` makes the stem fit 28x28 grey images (3x3 conv, no max pool)."""

        def __init__(self, block, layers, widths=(64, 128, 256, 512), classes=1000, in_channels=3, small=False):
            super().__init__()
            self.inplanes = widths[0]
            if small:
                self.conv1 = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
                self.maxpool = nn.Identity()
            else:
                self.conv1 = nn.Conv2d(in_channels, widths[0], 7, stride=2, padding=3, bias=False)
                self.maxpool = nn.MaxPool2d(3, 2, 1)
            self.bn1 = nn.BatchNorm2d(widths[0])
            self.relu = nn.ReLU()
            for i, (planes, n) in enumerate(zip(widths, layers)):
                setattr(self, f"layer{i + 1}", self._layer(block, planes, n, 1 if i == 0 else 2))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(widths[len(layers) - 1] * block.expansion, classes)

        def _layer(self, block, planes, n, stride):
            downsample = None
            if stride != 1 or self.inplanes != planes * block.expansion:
                downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride=stride,
                                                     bias=False), nn.BatchNorm2d(planes * block.expansion))
            layers = [block(self.inplanes, planes, stride, downsample)]
            self.inplanes = planes * block.expansion
            layers += [block(self.inplanes, planes) for _ in range(1, n)]
            return nn.Sequential(*layers)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            i = 1
            while hasattr(self, f"layer{i}"):
                x = getattr(self, f"layer{i}")(x)
                i += 1
            return self.fc(self.avgpool(x).flatten(1))

    class GoogLeNet(nn.Module):
        """GoogLeNet v1 as convnet-benchmarks' torch7 imagenet_winners/googlenet.lua defines it (no auxiliary heads,
        no local response normalisation, no dropout)."""

        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(conv_relu(3, 64, 7, 2, 3), nn.MaxPool2d(3, 2, 1), conv_relu(64, 64, 1),
                                      conv_relu(64, 192, 3, padding=1), nn.MaxPool2d(3, 2, 1))
            self.inception3a = Inception(192, 64, 96, 128, 16, 32, 32)
            self.inception3b = Inception(256, 128, 128, 192, 32, 96, 64)
            self.pool3 = nn.MaxPool2d(3, 2, 1)
            self.inception4a = Inception(480, 192, 96, 208, 16, 48, 64)
            self.inception4b = Inception(512, 160, 112, 224, 24, 64, 64)
            self.inception4c = Inception(512, 128, 128, 256, 24, 64, 64)
            self.inception4d = Inception(512, 112, 144, 288, 32, 64, 64)
            self.inception4e = Inception(528, 256, 160, 320, 32, 128, 128)
            self.pool4 = nn.MaxPool2d(3, 2, 1)
            self.inception5a = Inception(832, 256, 160, 320, 32, 128, 128)
            self.inception5b = Inception(832, 384, 192, 384, 48, 128, 128)
            self.avgpool = nn.AvgPool2d(7, 1)
            self.fc = nn.Linear(1024, 1000)

        def forward(self, x):
            x = self.stem(x)
            x = self.pool3(self.inception3b(self.inception3a(x)))
            for name in ("4a", "4b", "4c", "4d", "4e"):
                x = getattr(self, "inception" + name)(x)
            x = self.inception5b(self.inception5a(self.pool4(x)))
            return self.fc(self.avgpool(x).flatten(1))

    _blocks[lib.__name__] = found = dict(Inception=Inception, BasicBlock=BasicBlock, Bottleneck=Bottleneck,
                                         ResNet=ResNet, GoogLeNet=GoogLeNet)
    return found


@register("googlenet", (3, 224, 224), 128)
def googlenet(lib):
    """GoogLeNet v1 (Inception), as in convnet-benchmarks: nine inception modules, 3x3 stride-1 pooling branches."""
    return blocks(lib)["GoogLeNet"]()


@register("resnet18", (3, 224, 224), 128)
def resnet18(lib):
    """ResNet-18 with torchvision's architecture and state_dict keys."""
    b = blocks(lib)
    return b["ResNet"](b["BasicBlock"], (2, 2, 2, 2))


@register("resnet50", (3, 224, 224), 64)
def resnet50(lib):
    """ResNet-50 (v1.5, stride in the 3x3) with torchvision's architecture and state_dict keys."""
    b = blocks(lib)
    return b["ResNet"](b["Bottleneck"], (3, 4, 6, 3))


@register("resnet8", (1, 28, 28), 64, classes=10)
def resnet8(lib):
    """A small residual network for 28x28 grey images: a 3x3 stem and three stages of one basic block each
    (16-32-64 channels, batch norm), global average pooling, dense 10."""
    b = blocks(lib)
    return b["ResNet"](b["BasicBlock"], (1, 1, 1), widths=(16, 32, 64), classes=10, in_channels=1, small=True)


# ---- the networks since 2016: torchvision's mobilenet_v2, efficientnet_b0, shufflenet_v2_x1_0, convnext_tiny, vit_b_16

def make_divisible(v, divisor=8, min_value=None):
    """v rounded to the nearest multiple of divisor, never below min_value (divisor by default) nor more than 10%
    below v: the channel rule of MobileNet, EfficientNet and their torchvision builds."""
    min_value = divisor if min_value is None else min_value
    rounded = max(min_value, int(v + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * v else rounded


def _parameter(lib, array):
    """A parameter holding a host array, for either library (torch wants a torch tensor, clnet takes the array)."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    return lib.nn.Parameter(lib.from_numpy(array) if hasattr(lib, "from_numpy") else array)


_modern = {}


def modern_blocks(lib):
    """The building blocks of the networks since 2016, defined once per library (clnet or torch), with torchvision's
    module names, so that the state_dict keys are torchvision's."""
    if lib.__name__ in _modern:
        return _modern[lib.__name__]
    nn = lib.nn

    def conv_norm_act(cin, cout, k=3, stride=1, groups=1, act=None, padding=None, norm=None, bias=None):
        """torchvision's Conv2dNormActivation: convolution (no bias before a norm), a norm, an activation; keys 0, 1,
        2 of one Sequential."""
        norm = nn.BatchNorm2d if norm is None else norm
        layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2 if padding is None else padding, groups=groups,
                            bias=(norm is False) if bias is None else bias)]
        if norm is not False:
            layers.append(norm(cout))
        if act is not None:
            layers.append(act())
        return nn.Sequential(*layers)

    class StochasticDepth(nn.Module):
        """Drop path ("row" mode): in training each sample's residual branch is zeroed with probability p and the
        survivors scaled by 1 / (1 - p); identity in eval (torchvision.ops.StochasticDepth)."""
        keeps_shape = True

        def __init__(self, p, mode="row"):
            super().__init__()
            if not 0.0 <= p <= 1.0 or mode != "row":
                raise ValueError(f"StochasticDepth(p={p}, mode={mode!r}): p must be in [0, 1] and mode 'row'")
            self.p, self.mode = float(p), mode

        def extra_repr(self):
            return f"p={self.p}, mode={self.mode}"

        def forward(self, x):
            if not self.training or self.p == 0.0:
                return x
            survival = 1.0 - self.p
            if survival == 0.0:
                return x * 0.0
            # floor(u + s) is 1 with probability s for u uniform in [0, 1): a per-sample Bernoulli draw
            keep = (lib.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype, device=x.device) + survival).floor()
            return x * (keep * (1.0 / survival))

    class Permute(nn.Module):
        keeps_shape = False

        def __init__(self, dims):
            super().__init__()
            self.dims = tuple(dims)

        def output_shape(self, input_shape):
            return tuple(input_shape[d] for d in self.dims)

        def forward(self, x):
            return x.permute(*self.dims)

    class LayerNorm2d(nn.LayerNorm):
        """LayerNorm over the channels of (N, C, H, W), as torchvision's (through channels-last and back)."""

        def output_shape(self, input_shape):
            return tuple(input_shape)

        def forward(self, x):
            return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    # -- MobileNetV2 (Sandler et al. 2018) --
    class InvertedResidual(nn.Module):
        """1x1 expansion (unless t is 1), 3x3 depthwise, linear 1x1 projection; the input added where shapes
        allow. Keys conv.0.0 ... as torchvision's."""

        def __init__(self, cin, cout, stride, expand_ratio):
            super().__init__()
            hidden = int(round(cin * expand_ratio))
            self.use_res_connect = stride == 1 and cin == cout
            layers = [] if expand_ratio == 1 else [conv_norm_act(cin, hidden, 1, act=nn.ReLU6)]
            layers += [conv_norm_act(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
                       nn.Conv2d(hidden, cout, 1, 1, 0, bias=False), nn.BatchNorm2d(cout)]
            self.conv = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    class MobileNetV2(nn.Module):
        """torchvision's MobileNetV2 (its arguments: width_mult, the (t, c, n, s) setting, dropout)."""

        def __init__(self, num_classes=1000, width_mult=1.0, inverted_residual_setting=None, round_nearest=8,
                     dropout=0.2):
            super().__init__()
            setting = inverted_residual_setting or [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2],
                                                    [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]
            if any(len(row) != 4 for row in setting):
                raise ValueError(f"MobileNetV2: inverted_residual_setting rows are (t, c, n, s), got {setting}")
            cin = make_divisible(32 * width_mult, round_nearest)
            self.last_channel = make_divisible(1280 * max(1.0, width_mult), round_nearest)
            features = [conv_norm_act(3, cin, 3, 2, act=nn.ReLU6)]
            for t, c, n, s in setting:
                cout = make_divisible(c * width_mult, round_nearest)
                for i in range(n):
                    features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                    cin = cout
            features.append(conv_norm_act(cin, self.last_channel, 1, act=nn.ReLU6))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(self.last_channel, num_classes))

        def forward(self, x):
            x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
            return self.classifier(x.flatten(1))

    # -- EfficientNet (Tan and Le 2019) --
    class SqueezeExcitation(nn.Module):
        """Channels rescaled by a gate computed from their spatial mean: avgpool, fc1, activation, fc2, sigmoid."""

        def __init__(self, cin, squeeze, activation=None):
            super().__init__()
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc1 = nn.Conv2d(cin, squeeze, 1)
            self.fc2 = nn.Conv2d(squeeze, cin, 1)
            self.activation = (activation or nn.ReLU)()
            self.scale_activation = nn.Sigmoid()

        def forward(self, x):
            scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
            return scale * x

    class MBConv(nn.Module):
        """EfficientNet's block: 1x1 expansion (unless the ratio keeps the width), kxk depthwise, squeeze and
        excitation, linear 1x1 projection, all with SiLU; drop path on the residual branch. Keys block.0.0 ..."""

        def __init__(self, expand_ratio, kernel, stride, cin, cout, stochastic_depth_prob):
            super().__init__()
            if stride not in (1, 2):
                raise ValueError(f"MBConv: stride must be 1 or 2, got {stride}")
            self.use_res_connect = stride == 1 and cin == cout
            hidden = make_divisible(cin * expand_ratio, 8)
            layers = [] if hidden == cin else [conv_norm_act(cin, hidden, 1, act=nn.SiLU)]
            layers += [conv_norm_act(hidden, hidden, kernel, stride, groups=hidden, act=nn.SiLU),
                       SqueezeExcitation(hidden, max(1, cin // 4), nn.SiLU),
                       conv_norm_act(hidden, cout, 1)]
            self.block = nn.Sequential(*layers)
            self.stochastic_depth = StochasticDepth(stochastic_depth_prob)

        def forward(self, x):
            out = self.block(x)
            return self.stochastic_depth(out) + x if self.use_res_connect else out

    class EfficientNet(nn.Module):
        """torchvision's EfficientNet (v1): setting rows (expand_ratio, kernel, stride, input_channels, out_channels,
        num_layers), already scaled by the width and depth multipliers (efficientnet_setting)."""

        def __init__(self, inverted_residual_setting, dropout=0.2, stochastic_depth_prob=0.2, num_classes=1000,
                     last_channel=None):
            super().__init__()
            setting = [tuple(row) for row in inverted_residual_setting]
            if not setting or any(len(row) != 6 for row in setting):
                raise ValueError("EfficientNet: inverted_residual_setting rows are (expand_ratio, kernel, stride, "
                                 f"input_channels, out_channels, num_layers), got {inverted_residual_setting}")
            layers = [conv_norm_act(3, setting[0][3], 3, 2, act=nn.SiLU)]
            total = sum(row[5] for row in setting)
            block_id = 0
            for expand_ratio, kernel, stride, cin, cout, n in setting:
                stage = []
                for i in range(n):
                    stage.append(MBConv(expand_ratio, kernel, stride if i == 0 else 1, cin if i == 0 else cout, cout,
                                        stochastic_depth_prob * block_id / total))
                    block_id += 1
                layers.append(nn.Sequential(*stage))
            last_in = setting[-1][4]
            last = 4 * last_in if last_channel is None else last_channel
            layers.append(conv_norm_act(last_in, last, 1, act=nn.SiLU))
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes))

        def forward(self, x):
            return self.classifier(self.avgpool(self.features(x)).flatten(1))

    # -- ShuffleNetV2 (Ma et al. 2018) --
    class ShuffleUnit(nn.Module):
        """ShuffleNetV2's unit: stride 1 splits the channels in half and transforms one half; stride 2 transforms
        two copies (branch1 and branch2); the halves are joined and their channels shuffled."""

        def __init__(self, cin, cout, stride):
            super().__init__()
            if stride not in (1, 2) or (stride == 1 and cin != cout) or cout % 2:
                raise ValueError(f"ShuffleNetV2 unit ({cin}, {cout}, stride {stride}): stride 1 needs equal even "
                                 "widths, stride 2 an even output width")
            self.stride = stride
            half = cout // 2
            if stride > 1:
                self.branch1 = nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False),
                                             nn.BatchNorm2d(cin), nn.Conv2d(cin, half, 1, bias=False),
                                             nn.BatchNorm2d(half), nn.ReLU())
            else:
                self.branch1 = nn.Sequential()
            self.branch2 = nn.Sequential(nn.Conv2d(cin if stride > 1 else half, half, 1, bias=False),
                                         nn.BatchNorm2d(half), nn.ReLU(),
                                         nn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False),
                                         nn.BatchNorm2d(half), nn.Conv2d(half, half, 1, bias=False),
                                         nn.BatchNorm2d(half), nn.ReLU())

        def forward(self, x):
            if self.stride == 1:
                x1, x2 = x.chunk(2, dim=1)
                out = lib.cat([x1, self.branch2(x2)], dim=1)
            else:
                out = lib.cat([self.branch1(x), self.branch2(x)], dim=1)
            N, C, H, W = out.shape
            return out.reshape(N, 2, C // 2, H, W).transpose(1, 2).reshape(N, C, H, W)

    class ShuffleNetV2(nn.Module):
        """torchvision's ShuffleNetV2: stages_repeats (3 stages), stages_out_channels (5 widths)."""

        def __init__(self, stages_repeats, stages_out_channels, num_classes=1000):
            super().__init__()
            if len(stages_repeats) != 3 or len(stages_out_channels) != 5:
                raise ValueError(f"ShuffleNetV2: expected 3 stages_repeats and 5 stages_out_channels, got "
                                 f"{stages_repeats} and {stages_out_channels}")
            c = stages_out_channels[0]
            self.conv1 = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            for i, (n, cout) in enumerate(zip(stages_repeats, stages_out_channels[1:4])):
                units = [ShuffleUnit(c, cout, 2)] + [ShuffleUnit(cout, cout, 1) for _ in range(n - 1)]
                setattr(self, f"stage{i + 2}", nn.Sequential(*units))
                c = cout
            last = stages_out_channels[-1]
            self.conv5 = nn.Sequential(nn.Conv2d(c, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU())
            self.fc = nn.Linear(last, num_classes)

        def forward(self, x):
            x = self.stage4(self.stage3(self.stage2(self.maxpool(self.conv1(x)))))
            return self.fc(self.conv5(x).mean((2, 3)))

    # -- ConvNeXt (Liu et al. 2022) --
    class CNBlock(nn.Module):
        """7x7 depthwise, LayerNorm over channels, 4x inverted bottleneck of Linear layers with GELU, per-channel
        layer scale, drop path, residual."""

        def __init__(self, dim, layer_scale, stochastic_depth_prob):
            super().__init__()
            self.block = nn.Sequential(nn.Conv2d(dim, dim, 7, padding=3, groups=dim), Permute((0, 2, 3, 1)),
                                       nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, 4 * dim), nn.GELU(),
                                       nn.Linear(4 * dim, dim), Permute((0, 3, 1, 2)))
            self.layer_scale = _parameter(lib, np.full((dim, 1, 1), layer_scale))
            self.stochastic_depth = StochasticDepth(stochastic_depth_prob)

        def forward(self, x):
            return self.stochastic_depth(self.layer_scale * self.block(x)) + x

    class ConvNeXt(nn.Module):
        """torchvision's ConvNeXt: block_setting rows (input_channels, out_channels or None for the last stage,
        num_layers); a 4x4 stride-4 stem, stages joined by LayerNorm and a 2x2 stride-2 convolution."""

        def __init__(self, block_setting, stochastic_depth_prob=0.0, layer_scale=1e-6, num_classes=1000):
            super().__init__()
            setting = [tuple(row) for row in block_setting]
            total = sum(row[2] for row in setting)
            if not setting or any(len(row) != 3 for row in setting) or total < 2:
                raise ValueError("ConvNeXt: block_setting rows are (input_channels, out_channels or None, "
                                 f"num_layers), with 2 blocks or more in all; got {block_setting}")
            norm = lambda c: LayerNorm2d(c, eps=1e-6)  # noqa: E731
            layers = [conv_norm_act(3, setting[0][0], 4, 4, padding=0, norm=norm, bias=True)]
            block_id = 0
            for cin, cout, n in setting:
                stage = []
                for _ in range(n):
                    stage.append(CNBlock(cin, layer_scale, stochastic_depth_prob * block_id / (total - 1.0)))
                    block_id += 1
                layers.append(nn.Sequential(*stage))
                if cout is not None:
                    layers.append(nn.Sequential(norm(cin), nn.Conv2d(cin, cout, 2, 2)))
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            last = setting[-1][1] if setting[-1][1] is not None else setting[-1][0]
            self.classifier = nn.Sequential(norm(last), nn.Flatten(1), nn.Linear(last, num_classes))

        def forward(self, x):
            return self.classifier(self.avgpool(self.features(x)))

    # -- Vision Transformer (Dosovitskiy et al. 2021) --
    class EncoderBlock(nn.Module):
        """Pre-norm transformer block: x + attention(ln_1(x)), then + mlp(ln_2(x)) (Linear, GELU, Linear)."""

        def __init__(self, num_heads, hidden_dim, mlp_dim, dropout, attention_dropout):
            super().__init__()
            self.ln_1 = nn.LayerNorm(hidden_dim, eps=1e-6)
            self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads, dropout=attention_dropout,
                                                        batch_first=True)
            self.dropout = nn.Dropout(dropout)
            self.ln_2 = nn.LayerNorm(hidden_dim, eps=1e-6)
            self.mlp = nn.Sequential(nn.Linear(hidden_dim, mlp_dim), nn.GELU(), nn.Dropout(dropout),
                                     nn.Linear(mlp_dim, hidden_dim), nn.Dropout(dropout))

        def forward(self, x):
            y = self.ln_1(x)
            x = x + self.dropout(self.self_attention(y, y, y, need_weights=False)[0])
            return x + self.mlp(self.ln_2(x))

    class Encoder(nn.Module):
        def __init__(self, seq_length, num_layers, num_heads, hidden_dim, mlp_dim, dropout, attention_dropout):
            super().__init__()
            self.pos_embedding = _parameter(lib, rng.generator().normal(0.0, 0.02, (1, seq_length, hidden_dim)))
            self.dropout = nn.Dropout(dropout)
            self.layers = nn.Sequential(OrderedDict(
                (f"encoder_layer_{i}", EncoderBlock(num_heads, hidden_dim, mlp_dim, dropout, attention_dropout))
                for i in range(num_layers)))
            self.ln = nn.LayerNorm(hidden_dim, eps=1e-6)

        def forward(self, x):
            return self.ln(self.layers(self.dropout(x + self.pos_embedding)))

    class VisionTransformer(nn.Module):
        """torchvision's VisionTransformer: patches embedded by a stride-patch convolution, a class token, learnt
        position embeddings, pre-norm encoder blocks, the class token's final state classified by heads.head."""

        def __init__(self, image_size, patch_size, num_layers, num_heads, hidden_dim, mlp_dim, dropout=0.0,
                     attention_dropout=0.0, num_classes=1000):
            super().__init__()
            if image_size % patch_size:
                raise ValueError(f"VisionTransformer: patch_size {patch_size} must divide image_size {image_size}")
            self.image_size, self.patch_size, self.hidden_dim = image_size, patch_size, hidden_dim
            self.conv_proj = nn.Conv2d(3, hidden_dim, patch_size, patch_size)
            self.class_token = _parameter(lib, np.zeros((1, 1, hidden_dim)))
            self.encoder = Encoder((image_size // patch_size) ** 2 + 1, num_layers, num_heads, hidden_dim, mlp_dim,
                                   dropout, attention_dropout)
            self.heads = nn.Sequential(OrderedDict(head=nn.Linear(hidden_dim, num_classes)))

        def forward(self, x):
            if tuple(x.shape[1:]) != (3, self.image_size, self.image_size):
                raise ValueError(f"VisionTransformer: expected input (N, 3, {self.image_size}, {self.image_size}), "
                                 f"got shape {tuple(x.shape)}")
            n = x.shape[0]
            x = self.conv_proj(x).reshape(n, self.hidden_dim, -1).permute(0, 2, 1)  # (N, patches, hidden)
            x = lib.cat([self.class_token.expand(n, -1, -1), x], dim=1)
            return self.heads(self.encoder(x)[:, 0])

    _modern[lib.__name__] = found = dict(
        StochasticDepth=StochasticDepth, Permute=Permute, LayerNorm2d=LayerNorm2d, InvertedResidual=InvertedResidual,
        MobileNetV2=MobileNetV2, SqueezeExcitation=SqueezeExcitation, MBConv=MBConv, EfficientNet=EfficientNet,
        ShuffleUnit=ShuffleUnit, ShuffleNetV2=ShuffleNetV2, CNBlock=CNBlock, ConvNeXt=ConvNeXt,
        EncoderBlock=EncoderBlock, Encoder=Encoder, VisionTransformer=VisionTransformer)
    return found


def efficientnet_setting(width_mult=1.0, depth_mult=1.0):
    """EfficientNet-B0's stages (Table 1 of the paper) scaled: widths by make_divisible(c * width_mult, 8), depths
    by ceil(n * depth_mult), as torchvision's B0-B7."""
    rows = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
            (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
    return [(t, k, s, make_divisible(cin * width_mult), make_divisible(cout * width_mult),
             int(math.ceil(n * depth_mult))) for t, k, s, cin, cout, n in rows]


@register("mobilenet_v2", (3, 224, 224), 128)
def mobilenet_v2(lib):
    """MobileNetV2 with torchvision's architecture and state_dict keys (inverted residuals, ReLU6, dropout 0.2)."""
    return modern_blocks(lib)["MobileNetV2"]()


@register("efficientnet_b0", (3, 224, 224), 64)
def efficientnet_b0(lib):
    """EfficientNet-B0 with torchvision's architecture and state_dict keys (MBConv with squeeze-and-excitation and
    SiLU, stochastic depth 0.2, dropout 0.2)."""
    return modern_blocks(lib)["EfficientNet"](efficientnet_setting(1.0, 1.0), dropout=0.2, stochastic_depth_prob=0.2)


@register("shufflenet_v2_x1_0", (3, 224, 224), 128)
def shufflenet_v2_x1_0(lib):
    """ShuffleNetV2 1.0x with torchvision's architecture and state_dict keys (channel split and shuffle)."""
    return modern_blocks(lib)["ShuffleNetV2"]((4, 8, 4), (24, 116, 232, 464, 1024))


@register("convnext_tiny", (3, 224, 224), 64)
def convnext_tiny(lib):
    """ConvNeXt-T with torchvision's architecture and state_dict keys (7x7 depthwise, LayerNorm, GELU, layer scale,
    stochastic depth 0.1)."""
    return modern_blocks(lib)["ConvNeXt"]([(96, 192, 3), (192, 384, 3), (384, 768, 9), (768, None, 3)],
                                          stochastic_depth_prob=0.1)


@register("vit_b_16", (3, 224, 224), 64)
def vit_b_16(lib):
    """ViT-B/16 with torchvision's architecture and state_dict keys (12 pre-norm blocks of 12 heads, hidden 768,
    MLP 3072, no dropout)."""
    return modern_blocks(lib)["VisionTransformer"](224, 16, 12, 12, 768, 3072)


def build(name, lib=None):
    """A zoo model: clnet's (lib None) or the same definition built with another PyTorch-shaped library (torch)."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return MODELS[name]["build"](lib if lib is not None else sys.modules[__package__])
