"""The model zoo: each network a few lines of layers, with the input shape it expects."""
from . import nn

MODELS = {}


def register(name, input_shape, default_batch):
    def wrap(fn):
        MODELS[name] = dict(build=fn, input_shape=input_shape, batch=default_batch, doc=fn.__doc__)
        return fn
    return wrap


@register("lenet", (1, 28, 28), 64)
def lenet():
    """LeNet as in Caffe's MNIST example: conv 5x5x20, pool, conv 5x5x50, pool, dense 500 + ReLU, dense 10."""
    return nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))


@register("lenet-wide", (1, 28, 28), 64)
def lenet_wide():
    """The network of the performance report that started clnet: three 120-channel convolutions, two 2048 dense."""
    return nn.Sequential(nn.Conv2d(1, 120, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(120, 120, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(120, 120, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(120, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))


@register("alexnet", (3, 224, 224), 128)
def alexnet():
    """AlexNet, the one-weird-trick variant of convnet-benchmarks (64-192-384-256-256 channels)."""
    return nn.Sequential(nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
                         nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
                         nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2), nn.Flatten(),
                         nn.Linear(256 * 6 * 6, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, 1000))


@register("overfeat", (3, 231, 231), 128)
def overfeat():
    """OverFeat, fast model, as in convnet-benchmarks."""
    return nn.Sequential(nn.Conv2d(3, 96, 11, stride=4), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Conv2d(96, 256, 5), nn.ReLU(), nn.MaxPool2d(2, 2),
                         nn.Conv2d(256, 512, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(512, 1024, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(1024, 1024, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Flatten(),
                         nn.Linear(1024 * 6 * 6, 3072), nn.ReLU(), nn.Linear(3072, 4096), nn.ReLU(),
                         nn.Linear(4096, 1000))


@register("vgg-a", (3, 224, 224), 64)
def vgg_a():
    """VGG-A (VGG-11), as in convnet-benchmarks."""
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


def build(name):
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODELS)}")
    return MODELS[name]["build"]()
