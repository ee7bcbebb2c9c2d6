"""The model zoo: each network written once, against a PyTorch-shaped library (clnet, or torch itself for the
benchmark's and the tests' PyTorch twins), so the twin has the same structure and state_dict keys by construction.

`build(name)` makes a clnet model; `build(name, lib=torch)` its PyTorch twin.
"""
import sys

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


def build(name, lib=None):
    """A zoo model: clnet's (lib None) or the same definition built with another PyTorch-shaped library (torch)."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return MODELS[name]["build"](lib if lib is not None else sys.modules[__package__])
