"""The geometry of a convolution, in pure Python: what every convolution algorithm and the layers agree on."""
from typing import NamedTuple

import numpy as np

from . import tuning


class ConvShape(NamedTuple):
    """A layer's sizes (input N, C, H, W; O filters of KH x KW; strides, top/left paddings, dilations, groups; the
    output plane): a tuple, as it keys the memoised choices of every convolution (hashed at each launch)."""
    N: int
    C: int
    H: int
    W: int
    O: int
    KH: int
    KW: int
    SH: int
    SW: int
    PH: int  # top padding (bottom padding only changes OH)
    PW: int  # left padding
    DH: int
    DW: int
    G: int
    OH: int
    OW: int

    @property
    def pointwise(self):
        """1x1, stride 1, no padding: the input already is the lowered matrix."""
        return (self.KH == 1 and self.KW == 1 and self.SH == 1 and self.SW == 1 and self.PH == 0 and self.PW == 0
                and self.OH == self.H and self.OW == self.W)

    @property
    def flops(self):
        """The forward's multiply-adds x 2 (each gradient pass has as many)."""
        return 2 * self.N * self.O * self.OH * self.OW * (self.C // self.G) * self.KH * self.KW

    def geometry(self, nimg):
        return (self.C, self.H, self.W, self.KH, self.KW, self.SH, self.SW, self.PH, self.PW, self.DH, self.DW,
                self.OH, self.OW, nimg)

    def chunk(self, dev):
        """Images per im2col chunk, so that the column buffer stays within the device's budget."""
        per_image = self.C * self.KH * self.KW * self.OH * self.OW * 4
        return max(1, min(self.N, tuning.col_bytes(dev) // max(per_image, 1)))


def pair(v, name, what):
    """An int or a pair of ints as a pair; else a ValueError naming `what`."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2 or not all(isinstance(i, (int, np.integer)) for i in v):
            raise ValueError(f"{what}: {name} must be an int or a pair of ints, got {v!r}")
        return int(v[0]), int(v[1])
    if not isinstance(v, (int, np.integer)):
        raise ValueError(f"{what}: {name} must be an int or a pair of ints, got {v!r}")
    return int(v), int(v)


def check_image(what, shape, channels=None):
    if len(shape) != 4:
        raise ValueError(f"{what}: expected input of shape (N, C, H, W), got shape {tuple(shape)}")
    if channels is not None and shape[1] != channels:
        raise ValueError(f"{what}: expected input with {channels} channels, got shape {tuple(shape)}")


def conv_padding(padding, kernel_size, stride, dilation, what):
    """(begin, total) padding per axis for an int, a pair, 'same' or 'valid'. PyTorch puts the odd pixel of 'same'
    padding at the bottom/right."""
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"{what}: padding must be 'same', 'valid', an int or a pair, got {padding!r}")
        if padding == "same" and stride != (1, 1):
            raise ValueError(f"{what}: padding='same' needs stride 1 (as in PyTorch); give explicit padding")
        total = tuple(d * (k - 1) if padding == "same" else 0 for d, k in zip(dilation, kernel_size))
        return (total[0] // 2, total[1] // 2), total
    p = pair(padding, "padding", what)
    if min(p) < 0:
        raise ValueError(f"{what}: padding must be non-negative")
    return p, (2 * p[0], 2 * p[1])


def conv_shape(what, input_shape, weight_shape, stride, pad_begin, pad_total, dilation, groups):
    """The ConvShape of x (N, C, H, W) convolved with w (O, C/groups, KH, KW); a ValueError naming `what` and the
    fix when they do not fit."""
    O, Cg, KH, KW = weight_shape
    check_image(what, input_shape, Cg * groups)
    N, C, H, W = input_shape
    (sh, sw), (dh, dw) = stride, dilation
    span_h, span_w = dh * (KH - 1) + 1, dw * (KW - 1) + 1
    if span_h > H + pad_total[0] or span_w > W + pad_total[1]:
        raise ValueError(f"{what}: the kernel ({span_h}x{span_w} with dilation) is larger than the padded input "
                         f"({H + pad_total[0]}x{W + pad_total[1]}) for input shape {tuple(input_shape)}; use a "
                         "larger input, more padding or a smaller kernel")
    oh = (H + pad_total[0] - span_h) // sh + 1
    ow = (W + pad_total[1] - span_w) // sw + 1
    return ConvShape(N, C, H, W, O, KH, KW, sh, sw, pad_begin[0], pad_begin[1], dh, dw, groups, oh, ow)


def pool_geometry(kernel_size, stride, padding, what):
    """(kernel, stride, padding) pairs of a pooling window, checked as PyTorch checks them."""
    k = pair(kernel_size, "kernel_size", what)
    s = pair(stride if stride is not None and stride != [] else kernel_size, "stride", what)
    p = pair(padding, "padding", what)
    if min(k + s) < 1 or min(p) < 0:
        raise ValueError(f"{what}: kernel_size and stride must be positive, padding non-negative")
    if any(2 * pi > ki for pi, ki in zip(p, k)):
        raise ValueError(f"{what}: padding {p} must be at most half the kernel size (as in PyTorch)")
    return k, s, p


def pool_output(what, input_shape, k, s, p, ceil_mode):
    """(N, C, OH, OW) of a pooling window over input_shape."""
    check_image(what, input_shape)
    N, C, H, W = input_shape
    out = []
    for size, ki, si, pi in zip((H, W), k, s, p):
        if size + 2 * pi < ki:
            raise ValueError(f"{what}: the window ({ki}) is larger than the padded input ({size + 2 * pi}) for "
                             f"input shape {tuple(input_shape)}; use a smaller window or more padding")
        span = size + 2 * pi - ki
        o = (-(-span // si) if ceil_mode else span // si) + 1
        if ceil_mode and (o - 1) * si >= size + pi:  # the last window must start inside the input
            o -= 1
        out.append(o)
    return (N, C, out[0], out[1])
