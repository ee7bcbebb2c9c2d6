"""Independent float64 NumPy references for every clnet op, forward and backward, written from the definitions."""
import numpy as np


def conv_out(size, k, s, pad_total, d):
    return (size + pad_total - d * (k - 1) - 1) // s + 1


def im2col(x, kh, kw, s, pad_begin, pad_total, d, oh, ow):
    """x (N, C, H, W) -> (N, C, kh, kw, oh, ow) windows, padding read as zero."""
    N, C, H, W = x.shape
    xp = np.zeros((N, C, H + pad_total[0] + s[0] * kh * d[0], W + pad_total[1] + s[1] * kw * d[1]))
    xp[:, :, pad_begin[0]:pad_begin[0] + H, pad_begin[1]:pad_begin[1] + W] = x
    cols = np.empty((N, C, kh, kw, oh, ow))
    for i in range(kh):
        for j in range(kw):
            y0, x0 = i * d[0], j * d[1]
            cols[:, :, i, j] = xp[:, :, y0:y0 + s[0] * oh:s[0], x0:x0 + s[1] * ow:s[1]]
    return cols


def col2im(cols, x_shape, s, pad_begin, pad_total, d):
    N, C, H, W = x_shape
    _, _, kh, kw, oh, ow = cols.shape
    xp = np.zeros((N, C, H + pad_total[0] + s[0] * kh * d[0], W + pad_total[1] + s[1] * kw * d[1]))
    for i in range(kh):
        for j in range(kw):
            y0, x0 = i * d[0], j * d[1]
            xp[:, :, y0:y0 + s[0] * oh:s[0], x0:x0 + s[1] * ow:s[1]] += cols[:, :, i, j]
    return xp[:, :, pad_begin[0]:pad_begin[0] + H, pad_begin[1]:pad_begin[1] + W]


def conv2d(x, w, b, stride, pad_begin, pad_total, dilation, groups, dy=None):
    """Forward output; with dy also (dx, dw, db)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    N, C, H, W = x.shape
    O, Cg, kh, kw = w.shape
    G = groups
    Og = O // G
    oh = conv_out(H, kh, stride[0], pad_total[0], dilation[0])
    ow = conv_out(W, kw, stride[1], pad_total[1], dilation[1])
    cols = im2col(x, kh, kw, stride, pad_begin, pad_total, dilation, oh, ow)
    cols_g = cols.reshape(N, G, Cg, kh, kw, oh, ow)
    w_g = w.reshape(G, Og, Cg, kh, kw)
    y = np.einsum("ngckluv,gockl->ngouv", cols_g, w_g)
    y = y.reshape(N, O, oh, ow)
    if b is not None:
        y = y + b.astype(np.float64)[None, :, None, None]
    if dy is None:
        return y
    dy_g = dy.astype(np.float64).reshape(N, G, Og, oh, ow)
    dw = np.einsum("ngouv,ngckluv->gockl", dy_g, cols_g).reshape(w.shape)
    dcols = np.einsum("ngouv,gockl->ngckluv", dy_g, w_g).reshape(N, C, kh, kw, oh, ow)
    dx = col2im(dcols, x.shape, stride, pad_begin, pad_total, dilation)
    db = dy.astype(np.float64).sum(axis=(0, 2, 3)) if b is not None else None
    return y, dx, dw, db


def pool_out(size, k, s, p, ceil_mode):
    span = size + 2 * p - k
    o = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (o - 1) * s >= size + p:
        o -= 1
    return o


def maxpool2d(x, k, s, p, ceil_mode, dy=None):
    x = x.astype(np.float64)
    N, C, H, W = x.shape
    oh, ow = pool_out(H, k[0], s[0], p[0], ceil_mode), pool_out(W, k[1], s[1], p[1], ceil_mode)
    y = np.empty((N, C, oh, ow))
    dx = np.zeros_like(x)
    for i in range(oh):
        for j in range(ow):
            y0, x0 = i * s[0] - p[0], j * s[1] - p[1]
            ys, xs = slice(max(y0, 0), min(y0 + k[0], H)), slice(max(x0, 0), min(x0 + k[1], W))
            win = x[:, :, ys, xs].reshape(N, C, -1)
            y[:, :, i, j] = win.max(axis=2)
            if dy is not None:
                arg = win.argmax(axis=2)  # first maximum, as PyTorch
                wh = xs.stop - xs.start
                for n in range(N):
                    for c in range(C):
                        a = arg[n, c]
                        dx[n, c, ys.start + a // wh, xs.start + a % wh] += dy[n, c, i, j]
    return y if dy is None else (y, dx)


def avgpool2d(x, k, s, p, ceil_mode, count_include_pad, dy=None):
    x = x.astype(np.float64)
    N, C, H, W = x.shape
    oh, ow = pool_out(H, k[0], s[0], p[0], ceil_mode), pool_out(W, k[1], s[1], p[1], ceil_mode)
    y = np.empty((N, C, oh, ow))
    dx = np.zeros_like(x)
    for i in range(oh):
        for j in range(ow):
            y0, x0 = i * s[0] - p[0], j * s[1] - p[1]
            y1, x1 = min(y0 + k[0], H + p[0]), min(x0 + k[1], W + p[1])
            full = (y1 - y0) * (x1 - x0)
            ys, xs = slice(max(y0, 0), min(y1, H)), slice(max(x0, 0), min(x1, W))
            count = full if count_include_pad else (ys.stop - ys.start) * (xs.stop - xs.start)
            y[:, :, i, j] = x[:, :, ys, xs].sum(axis=(2, 3)) / count
            if dy is not None:
                dx[:, :, ys, xs] += dy[:, :, i, j][:, :, None, None] / count
    return y if dy is None else (y, dx)


def linear(x, w, b, dy=None):
    x, w = x.astype(np.float64), w.astype(np.float64)
    y = x @ w.T + (b.astype(np.float64) if b is not None else 0.0)
    if dy is None:
        return y
    dy = dy.astype(np.float64)
    return y, dy @ w, dy.T @ x, (dy.sum(axis=0) if b is not None else None)


def activation(kind, x, dy=None):
    x = x.astype(np.float64)
    if kind == "relu":
        y = np.maximum(x, 0)
        d = (x > 0).astype(np.float64)
    elif kind == "sigmoid":
        y = 1 / (1 + np.exp(-x))
        d = y * (1 - y)
    else:
        y = np.tanh(x)
        d = 1 - y * y
    return y if dy is None else (y, dy * d)


def softmax(x, dim, log, dy=None):
    x = x.astype(np.float64)
    z = x - x.max(axis=dim, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=dim, keepdims=True))
    y = z - lse if log else np.exp(z - lse)
    if dy is None:
        return y
    dy = dy.astype(np.float64)
    if log:
        dx = dy - np.exp(y) * dy.sum(axis=dim, keepdims=True)
    else:
        dx = y * (dy - (dy * y).sum(axis=dim, keepdims=True))
    return y, dx


def cross_entropy(logits, labels):
    """(mean loss, d loss / d logits)."""
    z = logits.astype(np.float64)
    N = z.shape[0]
    logp = softmax(z, 1, True)
    loss = -logp[np.arange(N), labels].mean()
    grad = np.exp(logp)
    grad[np.arange(N), labels] -= 1
    return loss, grad / N


def sgd(p, g, buf, lr, momentum, weight_decay, nesterov):
    """One step; returns (p, buf). buf None means the first step."""
    d = g + weight_decay * p
    if momentum:
        buf = d.copy() if buf is None else momentum * buf + d
        d = d + momentum * buf if nesterov else buf
    return p - lr * d, buf
