"""Average pooling over large windows (a global average pool: AdaptiveAvgPool2d(1), ONNX's GlobalAveragePool, a
kernel the size of the plane) is accurate to a few roundings of float32, not to one per element: each window row is
summed on its own, then the rows. One running sum over 112x112 positive values was up to 4e-6 off the float64 mean;
ONNX Runtime's and PyTorch's global pools are within 2e-7 on squeezenet's last map, where clnet's was at 5.8e-7."""
import numpy as np
import pytest
import torch

import clnet
import clnet.nn.functional as F
from clnet import nn


@pytest.mark.parametrize("hw", [(112, 112), (57, 83)])
def test_global_average_pool_is_accurate(dev, rng, hw):
    H, W = hw
    x = (rng.random((2, 24, H, W)) + 0.5).astype(np.float32)  # positive values: roundings do not cancel
    ref = x.astype(np.float64).mean(axis=(2, 3), keepdims=True)
    for name, y in (("AdaptiveAvgPool2d(1)", nn.AdaptiveAvgPool2d(1)(clnet.tensor(x, dev))),
                    ("avg_pool2d(kernel = plane)", F.avg_pool2d(clnet.tensor(x, dev), (H, W)))):
        err = np.abs(y.numpy() - ref).max() / np.abs(ref).max()
        # a running sum over all H*W terms lands at 2-4e-6 on the worst of these 48 planes; rows first, below 7e-7
        assert err < 1.5e-6, f"{name} over {H}x{W}: {err:.2e} off the float64 mean"
    # the backward is the mean's: dy / (H*W) everywhere, against PyTorch in float64
    t = clnet.tensor(x, dev, requires_grad=True)
    g = rng.standard_normal((2, 24, 1, 1)).astype(np.float32)
    nn.AdaptiveAvgPool2d(1)(t).backward(clnet.tensor(g, dev))
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.adaptive_avg_pool2d(xt, 1).backward(torch.tensor(g, dtype=torch.float64))
    np.testing.assert_allclose(t.grad.numpy(), xt.grad.numpy(), rtol=1e-6, atol=1e-12)
