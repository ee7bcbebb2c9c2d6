"""The layers since 2016 (clnet/nn/modern.py), the new losses and functional ops against their PyTorch namesakes in
float64: each module's state_dict loaded into the PyTorch twin, the forward and every gradient compared."""
import numpy as np
import pytest

import clnet
from clnet import nn
import clnet.nn.functional as F
from conftest import assert_close

torch = pytest.importorskip("torch")
TF = torch.nn.functional


def _twin(ours, theirs):
    """Copy ours's state into theirs (float64), so the two compute the same function."""
    state = {k: torch.tensor(v, dtype=torch.float64 if v.dtype.kind == "f" else None)
             for k, v in ours.state_dict().items()}
    theirs.load_state_dict(state)
    return theirs.double()


def _compare(dev, rng, ours, theirs, inputs, name, tol=2e-5, grad_inputs=True):
    """ours(*inputs) against theirs(*inputs) (float64): output, input gradients and parameter gradients for a random
    upstream gradient; `inputs` are NumPy arrays (float ones get gradients)."""
    xs = [clnet.tensor(a, dev, requires_grad=grad_inputs and a.dtype.kind == "f") for a in inputs]
    txs = [torch.tensor(a, dtype=torch.float64 if a.dtype.kind == "f" else None,
                        requires_grad=grad_inputs and a.dtype.kind == "f") for a in inputs]
    y, ty = ours(*xs), theirs(*txs)
    if isinstance(ty, tuple):
        y, ty = y[0], ty[0]
    assert y.shape == tuple(ty.shape), f"{name}: shape {y.shape}, expected {tuple(ty.shape)}"
    assert_close(y.numpy(), ty.detach().numpy(), name, tol)
    g = rng.standard_normal(y.shape).astype(np.float32)
    y.backward(clnet.tensor(g, dev))
    ty.backward(torch.tensor(g, dtype=torch.float64))
    for i, (x, tx) in enumerate(zip(xs, txs)):
        if tx.requires_grad:
            assert_close(x.grad.numpy(), tx.grad.numpy(), f"{name}: input {i}'s gradient", tol)
    if isinstance(ours, nn.Module):
        theirs_params = dict(theirs.named_parameters())
        for k, p in ours.named_parameters():
            assert_close(p.grad.numpy(), theirs_params[k].grad.numpy(), f"{name}: {k}'s gradient", tol)


def _move(m, dev):
    m.to(dev)
    return m


ACTIVATIONS = {
    "GELU": lambda m: m.GELU(), "GELU tanh": lambda m: m.GELU("tanh"), "SiLU": lambda m: m.SiLU(),
    "Mish": lambda m: m.Mish(), "Hardswish": lambda m: m.Hardswish(), "Hardsigmoid": lambda m: m.Hardsigmoid(),
    "LeakyReLU": lambda m: m.LeakyReLU(0.2), "ELU": lambda m: m.ELU(0.5), "CELU": lambda m: m.CELU(1.5), "SELU": lambda m: m.SELU(),
    "Softplus": lambda m: m.Softplus(2.0, 5.0), "Hardtanh": lambda m: m.Hardtanh(-0.5, 0.5)}


@pytest.mark.parametrize("name", list(ACTIVATIONS))
def test_activation_modules(dev, rng, name):
    x = (rng.uniform(0.2, 4.0, (3, 33)) * rng.choice([-1, 1], (3, 33))).astype(np.float32)
    _compare(dev, rng, ACTIVATIONS[name](nn), ACTIVATIONS[name](torch.nn), [x], name)


def test_normalisation_layers(dev, rng):
    x = rng.standard_normal((3, 6, 5, 7)).astype(np.float32)
    for ours, theirs in [(nn.LayerNorm(7), torch.nn.LayerNorm(7)), (nn.LayerNorm((5, 7)), torch.nn.LayerNorm((5, 7))),
                         (nn.GroupNorm(3, 6), torch.nn.GroupNorm(3, 6)),
                         (nn.InstanceNorm2d(6, affine=True), torch.nn.InstanceNorm2d(6, affine=True))]:
        for p in ours.parameters():  # not the default ones and zeros: the affine part is checked too
            with clnet.no_grad():
                p.write(rng.standard_normal(p.shape).astype(np.float32))
        _compare(dev, rng, _move(ours, dev), _twin(ours, theirs), [x], repr(ours), tol=1e-5)
    for shape in [(5, 4), (5, 4, 3)]:
        ours, theirs = nn.BatchNorm1d(4), torch.nn.BatchNorm1d(4)
        _compare(dev, rng, _move(ours, dev), _twin(ours, theirs), [rng.standard_normal(shape).astype(np.float32)],
                 f"BatchNorm1d on {shape}", tol=1e-5)
        assert_close(ours.running_var.numpy(), theirs.running_var.numpy(), "BatchNorm1d running_var", 1e-5)


def test_embedding_and_padding_idx(dev, rng):
    ours = _move(nn.Embedding(11, 5, padding_idx=2), dev)
    theirs = _twin(ours, torch.nn.Embedding(11, 5, padding_idx=2))
    idx = rng.integers(0, 11, (4, 6)).astype(np.int64)
    idx[0, :3] = 2
    idx[1, :] = 7  # a repeated index sums its rows' gradients
    _compare(dev, rng, ours, theirs, [idx], "Embedding")


@pytest.mark.parametrize("kwargs", [dict(scale_factor=2, mode="nearest"), dict(size=(7, 5), mode="nearest"),
                                    dict(size=(9, 4), mode="bilinear", align_corners=False),
                                    dict(scale_factor=1.5, mode="bilinear", align_corners=True)],
                         ids=lambda k: str(k))
def test_interpolate(dev, rng, kwargs):
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    _compare(dev, rng, lambda t: F.interpolate(t, **kwargs), lambda t: TF.interpolate(t, **kwargs), [x],
             f"interpolate {kwargs}")


def test_adaptive_pooling_of_any_size(dev, rng):
    x = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    for size in [(3, 4), 2, (5, 9), (1, 1)]:
        _compare(dev, rng, nn.AdaptiveAvgPool2d(size), torch.nn.AdaptiveAvgPool2d(size), [x], f"avg {size}")
        _compare(dev, rng, nn.AdaptiveMaxPool2d(size), torch.nn.AdaptiveMaxPool2d(size), [x], f"max {size}")


def test_pads_shuffle_unflatten(dev, rng):
    x = rng.standard_normal((2, 6, 4, 5)).astype(np.float32)
    for ours, theirs in [(nn.ZeroPad2d((1, 2, 0, 3)), torch.nn.ZeroPad2d((1, 2, 0, 3))),
                         (nn.ReflectionPad2d(2), torch.nn.ReflectionPad2d(2)),
                         (nn.ReplicationPad2d((0, 1, 2, 1)), torch.nn.ReplicationPad2d((0, 1, 2, 1))),
                         (nn.ChannelShuffle(3), torch.nn.ChannelShuffle(3)),
                         (nn.Unflatten(1, (2, 3)), torch.nn.Unflatten(1, (2, 3)))]:
        _compare(dev, rng, ours, theirs, [x], repr(ours))


def test_regression_losses(dev, rng):
    a, b = rng.standard_normal((4, 7)).astype(np.float32), rng.standard_normal((4, 7)).astype(np.float32)
    p = rng.uniform(0.05, 0.95, (4, 7)).astype(np.float32)
    y = (rng.random((4, 7)) > 0.5).astype(np.float32)
    w = rng.uniform(0.5, 2.0, (7,)).astype(np.float32)
    for reduction in ("mean", "sum", "none"):
        for ours, theirs, inputs in [
                (nn.MSELoss(reduction=reduction), torch.nn.MSELoss(reduction=reduction), [a, b]),
                (nn.L1Loss(reduction=reduction), torch.nn.L1Loss(reduction=reduction), [a, b]),
                (nn.SmoothL1Loss(reduction, beta=0.5), torch.nn.SmoothL1Loss(reduction=reduction, beta=0.5), [a, b]),
                (nn.BCELoss(reduction=reduction), torch.nn.BCELoss(reduction=reduction), [p, y]),
                (nn.BCEWithLogitsLoss(reduction=reduction, pos_weight=clnet.tensor(w, dev)),
                 torch.nn.BCEWithLogitsLoss(reduction=reduction, pos_weight=torch.tensor(w, dtype=torch.float64)),
                 [a, y])]:
            _compare(dev, rng, ours, theirs, inputs, f"{ours!r} {reduction}")
    loss = nn.MSELoss()(clnet.tensor(a, dev), b.tolist())  # a list target, as PyTorch's losses accept tensors
    assert_close(loss.numpy(), np.mean((a - b) ** 2), "MSELoss of a list target")


@pytest.mark.parametrize("case", ["plain", "weight", "ignore", "ignore -100", "smoothing", "probabilities", "spatial",
                                  "sum", "none"])
def test_cross_entropy_options(dev, rng, case):
    N, C = 6, 5
    logits = rng.standard_normal((N, C, 3) if case == "spatial" else (N, C)).astype(np.float32)
    labels = rng.integers(0, C, (N, 3) if case == "spatial" else (N,)).astype(np.int64)
    kwargs = dict(weight=dict(weight=rng.uniform(0.5, 2, C).astype(np.float32)), ignore=dict(ignore_index=1),
                  smoothing=dict(label_smoothing=0.2), sum=dict(reduction="sum"), none=dict(reduction="none")
                  ).get(case, {})
    if case == "ignore":  # two labels ignored, one kept (all six ignored, the mean is 0/0: seed 3308298759)
        labels[:2], labels[2] = 1, 0
    if case == "ignore -100":  # PyTorch's default ignore_index
        labels[:2] = -100
    target = labels
    if case == "probabilities":
        target = rng.dirichlet(np.ones(C), N).astype(np.float32)
    ours_kw = {k: (clnet.tensor(v, dev) if isinstance(v, np.ndarray) else v) for k, v in kwargs.items()}
    theirs_kw = {k: (torch.tensor(v, dtype=torch.float64) if isinstance(v, np.ndarray) else v)
                 for k, v in kwargs.items()}
    if case == "probabilities":
        _compare(dev, rng, nn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss(), [logits, target], case)
        return
    x, tx = clnet.tensor(logits, dev, requires_grad=True), torch.tensor(logits, dtype=torch.float64,
                                                                        requires_grad=True)
    # host labels, device labels made from host data (their range known), and computed ones (a slice: range unknown)
    for t in (target, clnet.tensor(target, dev), clnet.tensor(np.concatenate([target, target[:1]]), dev)[:N]):
        x.grad = None
        y, ty = nn.CrossEntropyLoss(**ours_kw)(x, t), torch.nn.CrossEntropyLoss(**theirs_kw)(tx, torch.tensor(target))
        assert_close(y.numpy(), ty.detach().numpy(), case)
        g = rng.standard_normal(y.shape).astype(np.float32)
        y.backward(clnet.tensor(g, dev))
        tx.grad = None
        ty.backward(torch.tensor(g, dtype=torch.float64))
        assert_close(x.grad.numpy(), tx.grad.numpy(), f"{case}: the logits' gradient")


def test_labels_changed_in_place_forget_their_range(dev, rng):
    """Labels made from host data remember their range (the fused cross-entropy checks it without a read-back); an
    in-place change forgets it, so the loss is PyTorch's: labels shifted into range (refused before, by the old
    range) and a label set to ignore_index (NaN before: the fused kernel has no ignore_index)."""
    logits = rng.standard_normal((4, 4)).astype(np.float32)
    tl = torch.tensor(logits, dtype=torch.float64)
    y = clnet.tensor(np.array([1, 2, 3, 4]), dev)
    y -= 1
    assert_close(F.cross_entropy(clnet.tensor(logits, dev), y).numpy(),
                 TF.cross_entropy(tl, torch.tensor([0, 1, 2, 3])).item(), "labels shifted in place")
    y = clnet.tensor(np.array([0, 1, 2, 3]), dev)
    y[3] = -100
    assert_close(nn.CrossEntropyLoss()(clnet.tensor(logits, dev), y).numpy(),
                 TF.cross_entropy(tl, torch.tensor([0, 1, 2, -100])).item(), "a label set to ignore_index")


def test_class_weights_from_the_host(dev, rng):
    """A loss's per-class weight as a list, a NumPy array or a torch tensor, as PyTorch users write it (a list raised
    AttributeError, a NumPy array blamed index_select), and a weight of the wrong length refused naming the loss."""
    logits, labels = rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 4, 6)
    w = rng.uniform(0.5, 2.0, 4)
    want = torch.nn.CrossEntropyLoss(weight=torch.tensor(w))(torch.tensor(logits, dtype=torch.float64),
                                                              torch.tensor(labels)).item()
    for given in (w.tolist(), w, torch.tensor(w)):
        for loss in (nn.CrossEntropyLoss(weight=given), lambda x, t: F.nll_loss(F.log_softmax(x, 1), t, given)):
            assert_close(loss(clnet.tensor(logits, dev), labels).numpy(), want, f"weight as {type(given).__name__}")
    with pytest.raises(ValueError, match=r"cross_entropy: weight has shape \(3,\), expected \(4,\)"):
        nn.CrossEntropyLoss(weight=[1.0, 2.0, 3.0])(clnet.tensor(logits, dev), labels)


def test_nll_loss_refuses_labels_out_of_range(dev):
    x = clnet.tensor(np.zeros((2, 3), np.float32), dev)
    with pytest.raises(ValueError, match=r"nll_loss: targets must lie in \[0, 2\]"):
        F.nll_loss(x, [0, 3])


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "float"])
def test_scaled_dot_product_attention(dev, rng, mask):
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 7)))
    m = rng.random((5, 6)) > 0.3
    m[:, 0] = True  # no row without a key
    extra = dict(none={}, causal=dict(is_causal=True), bool=dict(attn_mask=m),
                 float=dict(attn_mask=rng.standard_normal((5, 6)).astype(np.float32)))[mask]
    if mask == "causal":
        k, v = k[:, :, :5], v[:, :, :5]
    ours_kw = {a: (clnet.tensor(b, dev) if isinstance(b, np.ndarray) else b) for a, b in extra.items()}
    theirs_kw = {a: (torch.tensor(b, dtype=torch.float64 if b.dtype.kind == "f" else None)
                     if isinstance(b, np.ndarray) else b) for a, b in extra.items()}
    _compare(dev, rng, lambda *t: F.scaled_dot_product_attention(*t, **ours_kw),
             lambda *t: TF.scaled_dot_product_attention(*t, **theirs_kw), [q, k, v], f"attention ({mask})")


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention(dev, rng, batch_first):
    E, h = 8, 2
    ours = _move(nn.MultiheadAttention(E, h, batch_first=batch_first), dev)
    theirs = _twin(ours, torch.nn.MultiheadAttention(E, h, batch_first=batch_first))
    shape = (3, 5, E) if batch_first else (5, 3, E)
    x = rng.standard_normal(shape).astype(np.float32)
    _compare(dev, rng, lambda t: ours(t, t, t)[0], lambda t: theirs(t, t, t)[0], [x], "self-attention")
    for p in ours.parameters():
        p.grad = None
    pad = np.zeros((3, 5), bool)
    pad[0, 3:] = True
    out, w = ours(*(clnet.tensor(x, dev),) * 3, key_padding_mask=clnet.tensor(pad, dev))
    tx = torch.tensor(x, dtype=torch.float64)
    tout, tw = theirs(tx, tx, tx, key_padding_mask=torch.tensor(pad))
    assert_close(out.numpy(), tout.detach().numpy(), "attention with key padding")
    assert_close(w.numpy(), tw.detach().numpy(), "head-averaged weights")
    # unbatched, as PyTorch takes it: a query (L, E), keys and values (S, E), a padding mask (S,); forward and backward
    q, kv = x[:, 0] if not batch_first else x[0], rng.standard_normal((4, E)).astype(np.float32)
    pad1 = np.array([False, False, True, False])
    _compare(dev, rng, lambda a, b: ours(a, b, b, key_padding_mask=clnet.tensor(pad1, dev))[0],
             lambda a, b: theirs(a, b, b, key_padding_mask=torch.tensor(pad1))[0], [q, kv], "unbatched attention")
    t = clnet.tensor(x, dev)
    for bad, words in [(dict(key_padding_mask=clnet.tensor(pad[:, :4], dev)), r"key_padding_mask has shape \(3, 4\), "
                                                                               r"expected \(N, S\) = \(3, 5\)"),
                       (dict(attn_mask=clnet.tensor(np.zeros((4, 5), bool), dev)), r"attn_mask has shape \(4, 5\)"),
                       (dict(value=clnet.tensor(x[:2] if batch_first else x[:, :2], dev)),
                        r"the key has shape .* and the value .*; they must match")]:
        args = dict(query=t, key=t, value=t)
        args.update({k: v for k, v in bad.items() if k == "value"})
        with pytest.raises(ValueError, match=r"MultiheadAttention\(embed_dim=8, num_heads=2.*\): " + words):
            ours(**args, **{k: v for k, v in bad.items() if k != "value"})


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer(dev, rng, norm_first):
    ours = _move(nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True,
                                            norm_first=norm_first), dev)
    theirs = _twin(ours, torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu",
                                                          batch_first=True, norm_first=norm_first))
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    _compare(dev, rng, ours, theirs, [x], f"TransformerEncoderLayer(norm_first={norm_first})", tol=1e-5)


@pytest.mark.parametrize("args", [dict(stride=1, padding=0), dict(stride=2, padding=1, output_padding=1),
                                  dict(stride=2, padding=0, groups=2), dict(stride=3, padding=2, dilation=2)],
                         ids=lambda a: str(a))
def test_conv_transpose2d(dev, rng, args):
    ours = _move(nn.ConvTranspose2d(4, 6, 3, **args), dev)
    theirs = _twin(ours, torch.nn.ConvTranspose2d(4, 6, 3, **args))
    x = rng.standard_normal((2, 4, 5, 7)).astype(np.float32)
    _compare(dev, rng, ours, theirs, [x], f"ConvTranspose2d {args}", tol=1e-5)
