"""The layers of the networks since 2016, with PyTorch's names, arguments, defaults and state_dict keys:
activations (GELU, SiLU, Mish, ...), normalisation over other dimensions (LayerNorm, GroupNorm, BatchNorm1d,
InstanceNorm2d), Embedding, resizing and padding, adaptive max pooling, channel shuffle, and attention
(MultiheadAttention, TransformerEncoderLayer). Each forward is plain code over the general tensor ops."""
import math

import numpy as np

from .. import pointwise, rng, views
from ..shapes import pair
from ..tensor import Parameter
from . import functional as F
from .layers import BatchNorm2d, Dropout, Linear
from .module import Module


def _uniform(shape, bound):
    return rng.generator().uniform(-bound, bound, size=shape).astype(np.float32)


# ---- activations ---------------------------------------------------------------------------------------------------

class _Elementwise(Module):
    """An activation: fn applied to the input with the module's `args` attributes after it. inplace is accepted, as
    PyTorch's modules take it, and changes nothing: each result is a new tensor."""
    keeps_shape = True
    fn = None
    args = ()

    def __init__(self, inplace=False):
        super().__init__()

    def forward(self, x):
        return type(self).fn(x, *(getattr(self, a) for a in self.args))

    def extra_repr(self):
        return ", ".join(f"{a}={getattr(self, a)}" for a in self.args)


class GELU(_Elementwise):
    fn, args = F.gelu, ("approximate",)

    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate


class SiLU(_Elementwise):
    fn = F.silu


class Mish(_Elementwise):
    fn = F.mish


class Hardswish(_Elementwise):
    fn = F.hardswish


class Hardsigmoid(_Elementwise):
    fn = F.hardsigmoid


class SELU(_Elementwise):
    fn = F.selu


class LeakyReLU(_Elementwise):
    fn, args = F.leaky_relu, ("negative_slope",)

    def __init__(self, negative_slope=0.01, inplace=False):
        super().__init__()
        self.negative_slope = float(negative_slope)


class _Alpha(_Elementwise):
    args = ("alpha",)

    def __init__(self, alpha=1.0, inplace=False):
        super().__init__()
        self.alpha = float(alpha)


class ELU(_Alpha):
    fn = F.elu


class CELU(_Alpha):
    fn = F.celu


class Softplus(_Elementwise):
    fn, args = F.softplus, ("beta", "threshold")

    def __init__(self, beta=1.0, threshold=20.0):
        super().__init__()
        self.beta, self.threshold = float(beta), float(threshold)


class Hardtanh(_Elementwise):
    fn, args = F.hardtanh, ("min_val", "max_val")

    def __init__(self, min_val=-1.0, max_val=1.0, inplace=False):
        super().__init__()
        self.min_val, self.max_val = float(min_val), float(max_val)


class PReLU(Module):
    keeps_shape = True

    def __init__(self, num_parameters=1, init=0.25):
        super().__init__()
        self.num_parameters = int(num_parameters)
        self.weight = Parameter(np.full(self.num_parameters, init, np.float32))

    def forward(self, x):
        return F.prelu(x, self.weight)


class ConvTranspose2d(Module):
    """torch.nn.ConvTranspose2d: weight (in_channels, out_channels/groups, kH, kW), PyTorch's initialisation."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1):
        super().__init__()
        name = f"ConvTranspose2d({in_channels}, {out_channels}, {kernel_size})"
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), int(groups)
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(f"{name}: in_channels and out_channels must both be divisible by groups={groups}")
        self.kernel_size = pair(kernel_size, "kernel_size", name)
        self.stride, self.padding = pair(stride, "stride", name), pair(padding, "padding", name)
        self.output_padding, self.dilation = pair(output_padding, "output_padding", name), pair(dilation, "dilation",
                                                                                                  name)
        kh, kw = self.kernel_size
        bound = 1.0 / math.sqrt(self.out_channels // self.groups * kh * kw)  # PyTorch's fan-in of this weight
        self.weight = Parameter(_uniform((self.in_channels, self.out_channels // self.groups, kh, kw), bound))
        self.bias = Parameter(_uniform((self.out_channels,), bound)) if bias else None

    def extra_repr(self):
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}")

    def forward(self, x, output_size=None):
        op = self.output_padding
        if output_size is not None:  # the output_padding that gives this size, as PyTorch's forward(x, output_size)
            size = tuple(output_size)[-2:]
            op = tuple(o - ((n - 1) * s - 2 * p + d * (k - 1) + 1) for o, n, s, p, d, k in
                       zip(size, x.shape[2:], self.stride, self.padding, self.dilation, self.kernel_size))
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, op, self.groups,
                                  self.dilation)


# ---- normalisation -------------------------------------------------------------------------------------------------

class LayerNorm(Module):
    keeps_shape = True

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps, self.elementwise_affine = shape, float(eps), bool(elementwise_affine)
        self.weight = Parameter(np.ones(shape, np.float32)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(shape, np.float32)) if elementwise_affine and bias else None

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class GroupNorm(Module):
    keeps_shape = True

    def __init__(self, num_groups, num_channels, eps=1e-5, affine=True):
        super().__init__()
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm({num_groups}, {num_channels}): num_groups must divide num_channels")
        self.num_groups, self.num_channels, self.eps, self.affine = int(num_groups), int(num_channels), float(eps), \
            bool(affine)
        self.weight = Parameter(np.ones(num_channels, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(num_channels, np.float32)) if affine else None

    def extra_repr(self):
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"

    def forward(self, x):
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"{self!r}: expected input with {self.num_channels} channels, got shape {x.shape}")
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)


class InstanceNorm2d(Module):
    """Each channel of each sample normalised over its positions (PyTorch's defaults: no affine parameters, no
    running statistics)."""
    keeps_shape = True

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=False, track_running_stats=False):
        super().__init__()
        if track_running_stats:
            raise ValueError("InstanceNorm2d: clnet normalises with each instance's statistics "
                             "(track_running_stats=False, PyTorch's default)")
        self.num_features, self.eps, self.affine = int(num_features), float(eps), bool(affine)
        self.weight = Parameter(np.ones(num_features, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(num_features, np.float32)) if affine else None

    def forward(self, x):
        if x.ndim != 4 or x.shape[1] != self.num_features:
            raise ValueError(f"InstanceNorm2d({self.num_features}): expected input (N, {self.num_features}, H, W), "
                             f"got shape {x.shape}")
        return F.group_norm(x, self.num_features, self.weight, self.bias, self.eps)


class BatchNorm1d(BatchNorm2d):
    """Batch normalisation of (N, C) or (N, C, L) per channel, as torch.nn.BatchNorm1d (BatchNorm2d's kernels)."""

    def output_shape(self, input_shape):
        if len(input_shape) not in (2, 3) or input_shape[1] != self.num_features:
            raise ValueError(f"BatchNorm1d({self.num_features}): expected input (N, {self.num_features}) or "
                             f"(N, {self.num_features}, L), got shape {tuple(input_shape)}")
        return tuple(input_shape)

    def forward(self, x):
        self.output_shape(x.shape)
        return self._normalize(x.reshape(x.shape + (1,) * (4 - x.ndim)) if x.ndim == 3 else x).reshape(x.shape)


# ---- indexing, resizing, padding, shuffling ------------------------------------------------------------------------

class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, _weight=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.padding_idx = int(num_embeddings), int(embedding_dim), \
            padding_idx
        w = rng.generator().standard_normal((num_embeddings, embedding_dim)).astype(np.float32)
        if padding_idx is not None:
            w[padding_idx] = 0
        self.weight = Parameter(w if _weight is None else _weight)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"

    def forward(self, input):
        return F.embedding(input, self.weight, self.padding_idx)


class Upsample(Module):
    def __init__(self, size=None, scale_factor=None, mode="nearest", align_corners=None):
        super().__init__()
        self.size, self.scale_factor, self.mode, self.align_corners = size, scale_factor, mode, align_corners

    def extra_repr(self):
        return f"size={self.size}, scale_factor={self.scale_factor}, mode={self.mode!r}"

    def forward(self, x):
        return F.interpolate(x, self.size, self.scale_factor, self.mode, self.align_corners)


class ZeroPad2d(Module):
    def __init__(self, padding):
        super().__init__()
        self.padding = (padding,) * 4 if isinstance(padding, int) else tuple(padding)

    def forward(self, x):
        return F.pad(x, self.padding)


class ConstantPad2d(ZeroPad2d):
    def __init__(self, padding, value):
        super().__init__(padding)
        self.value = float(value)

    def forward(self, x):
        return F.pad(x, self.padding, value=self.value)


class ReflectionPad2d(ZeroPad2d):
    def forward(self, x):
        return F.pad(x, self.padding, mode="reflect")


class ReplicationPad2d(ZeroPad2d):
    def forward(self, x):
        return F.pad(x, self.padding, mode="replicate")


class Unflatten(Module):
    def __init__(self, dim, unflattened_size):
        super().__init__()
        self.dim, self.unflattened_size = dim, tuple(unflattened_size)

    def forward(self, x):
        return views.unflatten(x, self.dim, self.unflattened_size)


class ChannelShuffle(Module):
    """(N, g * c, ...) -> channels reordered as (c, g), ShuffleNet's mixing: one launch."""
    keeps_shape = True

    def __init__(self, groups):
        super().__init__()
        self.groups = int(groups)

    def forward(self, x):
        N, C = x.shape[:2]
        if C % self.groups:
            raise ValueError(f"ChannelShuffle({self.groups}): the groups must divide the {C} channels of {x.shape}")
        rest = x.shape[2:]
        return views.transpose(x.reshape((N, self.groups, C // self.groups) + rest), 1, 2).reshape(x.shape)


class AdaptiveMaxPool2d(Module):
    def __init__(self, output_size, return_indices=False):
        super().__init__()
        self.output_size, self.return_indices = output_size, return_indices

    def forward(self, x):
        return F.adaptive_max_pool2d(x, self.output_size, self.return_indices)


# ---- attention -----------------------------------------------------------------------------------------------------

class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention's parameters (in_proj_weight and in_proj_bias packing q, k, v; out_proj) and
    forward: (attn_output, head-averaged attention weights or None)."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, batch_first=False):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention({embed_dim}, {num_heads}): num_heads must divide embed_dim")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = int(embed_dim), int(num_heads), \
            float(dropout), bool(batch_first)
        self.head_dim = embed_dim // num_heads
        bound = math.sqrt(6.0 / (embed_dim + 3 * embed_dim))  # xavier_uniform over the packed (3E, E) weight
        self.in_proj_weight = Parameter(_uniform((3 * embed_dim, embed_dim), bound))
        self.in_proj_bias = Parameter(np.zeros(3 * embed_dim, np.float32)) if bias else None
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
        if bias:
            self.out_proj.bias = Parameter(np.zeros(embed_dim, np.float32))

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if getattr(query, "ndim", 0) == 2:  # unbatched, as PyTorch takes it: (L, E) and (S, E), a padding mask (S,)
            at = 0 if self.batch_first else 1
            out, weights = self.forward(
                *(views.unsqueeze(t, at) if getattr(t, "ndim", 0) == 2 else t for t in (query, key, value)),
                None if key_padding_mask is None else views.unsqueeze(key_padding_mask, 0), need_weights, attn_mask,
                average_attn_weights, is_causal)
            return views.squeeze(out, at), (None if weights is None else views.squeeze(weights, 0))
        for name, t in (("query", query), ("key", key), ("value", value)):
            if getattr(t, "ndim", 0) != 3:
                raise ValueError(f"{self._name()}: the {name} has shape {getattr(t, 'shape', type(t).__name__)}; "
                                 f"expected {'(N, L, E)' if self.batch_first else '(L, N, E)'} (or an unbatched "
                                 "(L, E) query)")
        if key.shape != value.shape:
            raise ValueError(f"{self._name()}: the key has shape {key.shape} and the value {value.shape}; they must "
                             "match (one value per key)")
        if not self.batch_first:  # (L, N, E) -> (N, L, E)
            query, key, value = (views.transpose(t, 0, 1) for t in (query, key, value))
        N, L, E = query.shape
        S = key.shape[1]
        if E != self.embed_dim or key.shape[2] != self.embed_dim:
            raise ValueError(f"{self._name()}: the query's and the key's last dimensions are {E} and {key.shape[2]}, "
                             f"expected {self.embed_dim}")
        if key.shape[0] != N:
            raise ValueError(f"{self._name()}: the query holds a batch of {N}, the key and value {key.shape[0]}")
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (N, S):
            raise ValueError(f"{self._name()}: key_padding_mask has shape {tuple(key_padding_mask.shape)}, expected "
                             f"(N, S) = {(N, S)}: a batch of {N}, {S} keys")
        if attn_mask is not None and tuple(attn_mask.shape) not in ((L, S), (N * self.num_heads, L, S)):
            raise ValueError(f"{self._name()}: attn_mask has shape {tuple(attn_mask.shape)}, expected (L, S) = "
                             f"{(L, S)} or (N * num_heads, L, S) = {(N * self.num_heads, L, S)}")
        h, d = self.num_heads, self.head_dim
        w, b = self.in_proj_weight, self.in_proj_bias
        ws = views.chunk(w, 3, 0)
        bs = views.chunk(b, 3, 0) if b is not None else (None,) * 3
        q, k, v = (F.linear(t, wi, bi) for t, wi, bi in zip((query, key, value), ws, bs))
        q, k, v = (views.permute(t.reshape(N, -1, h, d), 0, 2, 1, 3) for t in (q, k, v))  # (N, h, len, d)
        mask = None
        if attn_mask is not None:
            mask = attn_mask if attn_mask.dtype != np.bool_ else pointwise.logical_not(attn_mask)  # True: keep
            if attn_mask.ndim == 3:  # (N * h, L, S)
                mask = mask.reshape(N, h, L, S)
        elif is_causal:
            mask = F._constant_matrix(query.device, ("causal", L, S), lambda: np.tril(np.ones((L, S)))) > 0.5
        if key_padding_mask is not None:  # (N, S), True where a key is padding
            keep = pointwise.logical_not(key_padding_mask).reshape(N, 1, 1, S) \
                if key_padding_mask.dtype == np.bool_ else key_padding_mask.reshape(N, 1, 1, S)
            if mask is None:
                mask = keep
            elif mask.dtype == np.bool_ and keep.dtype == np.bool_:
                mask = mask & keep
            else:
                mask = pointwise.where(keep, mask, -np.inf) if keep.dtype == np.bool_ else mask + keep
        scores = (q @ views.transpose(k, -2, -1)) * (1.0 / math.sqrt(d))
        if mask is not None:
            scores = pointwise.where(mask, scores, -np.inf) if mask.dtype == np.bool_ else scores + mask
        weights = scores.softmax(-1)
        if self.dropout > 0 and self.training:
            weights = F.dropout(weights, self.dropout, True)
        out = views.permute(weights @ v, 0, 2, 1, 3).reshape(N, L, E)
        out = self.out_proj(out.reshape(N * L, E)).reshape(N, L, E)
        if not self.batch_first:
            out = views.transpose(out, 0, 1)
        if not need_weights:
            return out, None
        return out, (weights.mean(1) if average_attn_weights else weights)


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention then a feed-forward block, each with dropout, a residual
    and LayerNorm (after each, or before with norm_first)."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu", layer_norm_eps=1e-5,
                 batch_first=False, norm_first=False, bias=True):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1, self.dropout2 = Dropout(dropout), Dropout(dropout)
        if activation not in ("relu", "gelu") and not callable(activation):
            raise ValueError(f"TransformerEncoderLayer: activation must be 'relu', 'gelu' or a callable, not "
                             f"{activation!r}")
        self.activation = activation

    def _act(self, x):
        if self.activation == "relu":
            return pointwise.unary("relu", x)
        if self.activation == "gelu":
            return F.gelu(x)
        return self.activation(x)

    def _sa(self, x, mask, padding, is_causal):
        return self.dropout1(self.self_attn(x, x, x, key_padding_mask=padding, attn_mask=mask, need_weights=False,
                                            is_causal=is_causal)[0])

    def _ff(self, x):
        return self.dropout2(self.linear2(self.dropout(self._act(self.linear1(x)))))

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff(x))


__all__ = ["AdaptiveMaxPool2d", "BatchNorm1d", "CELU", "ChannelShuffle", "ConstantPad2d", "ConvTranspose2d", "ELU", "Embedding", "GELU",
           "GroupNorm", "Hardsigmoid", "Hardswish", "Hardtanh", "InstanceNorm2d", "LayerNorm", "LeakyReLU", "Mish",
           "MultiheadAttention", "PReLU", "ReflectionPad2d", "ReplicationPad2d", "SELU", "SiLU", "Softplus",
           "TransformerEncoderLayer", "Unflatten", "Upsample", "ZeroPad2d"]
