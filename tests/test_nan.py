"""NaN propagates through every op as in PyTorch: the positions that come out NaN (forward, and the input gradient)
are PyTorch's, for an input holding a NaN and an infinity at random places. A NaN that an op silently drops would
let a diverging run look healthy."""
import numpy as np
import pytest

import clnet
import clnet.nn.functional as F
from clnet import nn

from conftest import needs_torch


def poisoned(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, 2, replace=False)
    flat[picks[0]], flat[picks[1]] = np.nan, np.inf
    return x


CASES = {
    "max_pool2d": ((2, 3, 7, 7), lambda F_, x: F_.max_pool2d(x, 3, 2)),
    "max_pool2d pad": ((2, 3, 6, 6), lambda F_, x: F_.max_pool2d(x, 3, 1, 1)),
    "avg_pool2d": ((2, 3, 6, 6), lambda F_, x: F_.avg_pool2d(x, 2, 2)),  # every input in a window
    "softmax": ((3, 11), lambda F_, x: F_.softmax(x, dim=1)),
    "log_softmax": ((3, 11), lambda F_, x: F_.log_softmax(x, dim=1)),
    "relu": ((4, 9), lambda F_, x: F_.relu(x)),
    "sigmoid": ((4, 9), lambda F_, x: F_.sigmoid(x) if hasattr(F_, "sigmoid") else x.sigmoid()),
    "tanh": ((4, 9), lambda F_, x: F_.tanh(x) if hasattr(F_, "tanh") else x.tanh()),
}


@needs_torch
@pytest.mark.parametrize("case", list(CASES))
def test_nan_positions_match_torch(dev, rng, case):
    import torch
    shape, fn = CASES[case]
    x = poisoned(rng, shape)
    dy = rng.standard_normal(fn(torch.nn.functional, torch.from_numpy(x)).shape).astype(np.float32)
    tx = torch.from_numpy(x).requires_grad_(True)
    ty = fn(torch.nn.functional, tx)
    ty.backward(torch.from_numpy(dy))
    cx = clnet.tensor(x, dev, requires_grad=True)
    cy = fn(F, cx)
    cy.backward(clnet.tensor(dy, dev))
    np.testing.assert_array_equal(np.isnan(cy.numpy()), np.isnan(ty.detach().numpy()), err_msg=f"{case} forward")
    np.testing.assert_array_equal(np.isnan(cx.grad.numpy()), np.isnan(tx.grad.numpy()),
                                  err_msg=f"{case} input gradient")
    assert np.isnan(cy.numpy()).any(), f"{case}: the NaN vanished"


@needs_torch
@pytest.mark.parametrize("layer", ["conv", "linear", "batch_norm", "cross_entropy"])
def test_nan_through_layers_matches_torch(dev, rng, layer):
    import torch
    clnet.manual_seed(int(rng.integers(1 << 30)))
    if layer == "conv":
        m, shape = nn.Conv2d(3, 4, 3, padding=1), (2, 3, 6, 6)
        tm = torch.nn.Conv2d(3, 4, 3, padding=1)
    elif layer == "linear":
        m, shape = nn.Linear(7, 5), (3, 7)
        tm = torch.nn.Linear(7, 5)
    elif layer == "batch_norm":
        m, shape = nn.BatchNorm2d(3), (2, 3, 4, 4)
        tm = torch.nn.BatchNorm2d(3)
    else:
        m, shape, tm = None, (4, 6), None
    x = poisoned(rng, shape)
    if m is not None:
        tm.load_state_dict({k: torch.from_numpy(np.asarray(v)) if np.asarray(v).dtype != np.int32
                            else torch.tensor(int(v)) for k, v in m.state_dict().items()})
        m.to(dev)
        ty = tm(torch.from_numpy(x))
        cy = m(clnet.tensor(x, dev))
    else:
        labels = rng.integers(0, 6, 4)
        ty = torch.nn.functional.cross_entropy(torch.from_numpy(x), torch.from_numpy(labels))
        cy = F.cross_entropy(clnet.tensor(x, dev), clnet.tensor(labels.astype(np.int32), dev))
    np.testing.assert_array_equal(np.isnan(np.asarray(cy.numpy())), np.isnan(ty.detach().numpy()),
                                  err_msg=f"{layer} forward")
    assert np.isnan(np.asarray(cy.numpy())).any()
