"""Bad input gets a clear Python exception before any kernel runs."""
import numpy as np
import pytest

import clnet
from clnet import models, nn

from conftest import no_launch


def test_wrong_channels(dev):
    layer = nn.Conv2d(3, 64, 11).to(dev)
    x = clnet.tensor(np.zeros((8, 1, 224, 224), np.float32), dev)
    with no_launch(), pytest.raises(ValueError, match=r"expected input with 3 channels, got shape \(8, 1, 224, 224\)"):
        layer(x)


def test_wrong_rank(dev):
    x = clnet.tensor(np.zeros((8, 28, 28), np.float32), dev)
    pool = nn.MaxPool2d(2).to(dev)
    with no_launch(), pytest.raises(ValueError, match=r"expected input of shape \(N, C, H, W\), got shape \(8, 28, 28\)"):
        pool(x)


def test_kernel_larger_than_padded_input(dev):
    x = clnet.tensor(np.zeros((1, 1, 3, 3), np.float32), dev)
    conv, pool = nn.Conv2d(1, 2, 5, padding=0).to(dev), nn.MaxPool2d(4).to(dev)
    with no_launch(), pytest.raises(ValueError, match="larger than the padded input"):
        conv(x)
    with no_launch(), pytest.raises(ValueError, match="larger than the padded input"):
        pool(x)


def test_model_error_names_the_layer(dev):
    x = clnet.tensor(np.zeros((2, 1, 32, 32), np.float32), dev)
    model = models.build("lenet").to(dev)
    with no_launch(), pytest.raises(ValueError, match=r"layer 5: Linear\(in_features=800.*got shape \(2, 1250\)"):
        model(x)


def test_labels_out_of_range(dev):
    logits = clnet.tensor(np.zeros((4, 10), np.float32), dev)
    with no_launch(), pytest.raises(ValueError, match=r"labels must lie in \[0, 9\].*\[0, 10\]"):
        nn.CrossEntropyLoss()(logits, np.array([0, 1, 2, 10]))


def test_labels_tensor_out_of_range(dev):
    logits = clnet.tensor(np.zeros((3, 10), np.float32), dev)
    labels = clnet.tensor(np.array([1, -1, 3]), dev)
    with pytest.raises(ValueError, match="labels must lie"):
        nn.CrossEntropyLoss()(logits, labels)


def test_labels_shape(dev):
    logits = clnet.tensor(np.zeros((3, 10), np.float32), dev)
    with pytest.raises(ValueError, match=r"expected \(3,\)"):
        nn.CrossEntropyLoss()(logits, np.array([1, 2]))


def test_state_dict_errors(dev):
    model = models.build("lenet")
    sd = model.state_dict()
    bad = dict(sd)
    del bad["2.bias"]
    with pytest.raises(KeyError, match=r"missing keys \['2.bias'\]"):
        model.load_state_dict(bad)
    bad = dict(sd, extra=np.zeros(3))
    with pytest.raises(KeyError, match=r"unexpected keys \['extra'\]"):
        model.load_state_dict(bad)
    bad = dict(sd)
    bad["5.weight"] = np.zeros((500, 801), np.float32)
    with pytest.raises(ValueError, match=r"'5.weight' has shape \(500, 801\), the model expects \(500, 800\)"):
        model.load_state_dict(bad)
    np.testing.assert_array_equal(model.state_dict()["5.weight"], sd["5.weight"])  # nothing changed


def test_bad_configuration():
    with pytest.raises(ValueError, match="divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="'same' needs stride 1"):
        nn.Conv2d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="at most half the kernel"):
        nn.MaxPool2d(2, padding=2)


def test_backward_through_a_released_graph(dev):
    """Each forward's graph serves one backward (its saved tensors are released after it): a second backward is
    refused, before any kernel runs, with what to do; retain_graph=True keeps it for one more."""
    layer = nn.Linear(4, 2).to(dev)
    x = clnet.tensor(np.ones((3, 4), np.float32), dev)
    y = layer(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    with no_launch(), pytest.raises(RuntimeError, match="already released.*run the forward again"):
        y.backward()


def test_backward_of_a_tensor_that_needs_no_gradient(dev):
    y = (clnet.tensor(np.ones(3, np.float32), dev) * 2.0).sum()
    with no_launch(), pytest.raises(RuntimeError, match="does not require a gradient.*requires_grad=True"):
        y.backward()
    y = nn.ReLU()(clnet.tensor(np.ones(3, np.float32), dev, requires_grad=True))
    with no_launch(), pytest.raises(RuntimeError, match=r"shape \(3,\) needs its gradient.*y.sum\(\)"):
        y.backward()


def test_gradient_shape_checked(dev):
    layer = nn.Linear(4, 2).to(dev)
    y = layer(clnet.tensor(np.zeros((3, 4), np.float32), dev))
    with no_launch(), pytest.raises(ValueError, match=r"gradient has shape \(3, 3\).*\(3, 2\)"):
        y.backward(clnet.tensor(np.zeros((3, 3), np.float32), dev))
    with no_launch(), pytest.raises(TypeError, match="must be a clnet tensor"):
        y.backward(np.zeros((3, 2), np.float32))


def test_numpy_input_is_refused_with_a_hint(dev):
    with pytest.raises(TypeError, match="clnet.tensor"):
        nn.ReLU().to(dev)(np.zeros(3))


# Exceptions that never reach a user: each is caught inside clnet where it is raised.
INTERNAL = {"clnet.kernels.NeedsStaging": "a window past the index limit, caught by kernels.launch, which stages it"}


def test_every_error_class_derives_from_clnet_error():
    """A user catches all of clnet's errors with `except clnet.Error`: every exception class in every clnet module
    (those needing an optional package included where it is installed) derives from it, but INTERNAL's."""
    import importlib
    import inspect
    import pkgutil
    seen, unloaded = [], []
    for info in pkgutil.walk_packages(clnet.__path__, "clnet."):
        try:
            module = importlib.import_module(info.name)
        except ImportError as e:  # an optional extra missing here (mpi4py, onnx, matplotlib)
            unloaded.append(f"{info.name}: {e}")
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseException) and not issubclass(cls, Warning) and cls.__module__ == info.name:
                seen.append(cls)
    assert len(seen) >= 12, seen  # the issue counted twelve classes
    outside = [f"{c.__module__}.{c.__qualname__}" for c in seen
               if not issubclass(c, clnet.Error) and f"{c.__module__}.{c.__qualname__}" not in INTERNAL]
    assert not outside, f"not clnet.Error subclasses: {outside} (modules not imported: {unloaded})"


@pytest.mark.parametrize("dtype", [np.int32, bool])
def test_layers_refuse_inputs_that_are_not_float32(dev, dtype):
    """An int32 or bool input to a layer whose kernels read floats is refused, as PyTorch refuses it (its bits were
    read as floats: 1e-45 for 1)."""
    from clnet.nn import functional as F
    image, flat = np.ones((1, 2, 4, 4), dtype), np.ones((2, 3), dtype)
    for what, run in [("Conv2d", lambda: nn.Conv2d(2, 1, 1).to(dev)(clnet.tensor(image, dev))),
                      ("Linear", lambda: nn.Linear(3, 2).to(dev)(clnet.tensor(flat, dev))),
                      ("max pooling", lambda: nn.MaxPool2d(2).to(dev)(clnet.tensor(image, dev))),
                      ("average pooling", lambda: nn.AvgPool2d(2).to(dev)(clnet.tensor(image, dev))),
                      ("conv2d", lambda: F.conv2d(clnet.tensor(np.ones((1, 2, 4, 4), np.float32), dev),
                                                  clnet.tensor(np.ones((1, 2, 1, 1), dtype), dev)))]:
        words = rf"{what}.*: expected a? ?float32 tensors?, got (one of dtype )?{np.dtype(dtype)}.*convert it with "
        with no_launch(), pytest.raises(TypeError, match=words + r"\.float\(\)"):
            run()


def test_layers_refuse_tensors_on_two_devices():
    """A layer's weights on another device than its input: a clear error before any launch (PoCL's driver crashed
    the process on a buffer of Intel's context, and Intel's reported INVALID_MEM_OBJECT)."""
    from conftest import DEVICES
    from clnet.nn import functional as F
    if len(DEVICES) < 2:
        pytest.skip("one OpenCL device")
    a, b = clnet.device(DEVICES[0]["index"]), clnet.device(DEVICES[1]["index"])
    for x_dev, w_dev in ((a, b), (b, a)):
        def t(*shape, dev):
            return clnet.tensor(np.ones(shape, np.float32), dev)
        for what, run in [("linear", lambda: F.linear(t(2, 3, dev=x_dev), t(4, 3, dev=w_dev))),
                          ("conv2d", lambda: F.conv2d(t(1, 1, 3, 3, dev=x_dev), t(1, 1, 1, 1, dev=w_dev))),
                          ("conv_transpose2d", lambda: F.conv_transpose2d(t(1, 1, 3, 3, dev=x_dev),
                                                                          t(1, 1, 1, 1, dev=w_dev))),
                          ("batch norm", lambda: F.batch_norm(t(2, 3, dev=x_dev), t(3, dev=w_dev), t(3, dev=w_dev))),
                          ("batch norm", lambda: F.batch_norm(t(2, 3, dev=x_dev), t(3, dev=w_dev), t(3, dev=w_dev),
                                                              training=True))]:
            with pytest.raises(ValueError, match=rf"{what}: a tensor of shape .* is on .*, another on .*; move "
                                                 "them to one device"):
                run()
