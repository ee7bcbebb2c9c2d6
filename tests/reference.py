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
    elif kind == "relu6":
        y = np.clip(x, 0, 6)
        d = ((x > 0) & (x < 6)).astype(np.float64)
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


def binary(op, a, b, dy=None):
    """a + b, a - b or a * b of two arrays of one shape; with dy also (da, db)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    y = {"+": a + b, "-": a - b, "*": a * b}[op]
    if dy is None:
        return y
    dy = dy.astype(np.float64)
    grads = {"+": (dy, dy), "-": (dy, -dy), "*": (dy * b, dy * a)}[op]
    return (y,) + grads


def cat(xs, dim, dy=None):
    """np.concatenate along dim; with dy also the slice of dy that belongs to each input."""
    y = np.concatenate([x.astype(np.float64) for x in xs], axis=dim)
    if dy is None:
        return y
    bounds = np.cumsum([x.shape[dim] for x in xs])[:-1]
    return (y,) + tuple(np.split(dy.astype(np.float64), bounds, axis=dim))


def adaptive_avg_pool2d(x, out, dy=None):
    """Average pooling to out = (OH, OW) where each divides the input's size: the mean of each block."""
    x = x.astype(np.float64)
    N, C, H, W = x.shape
    oh, ow = out
    kh, kw = H // oh, W // ow
    y = x.reshape(N, C, oh, kh, ow, kw).mean(axis=(3, 5))
    if dy is None:
        return y
    dx = np.repeat(np.repeat(dy.astype(np.float64), kh, axis=2), kw, axis=3) / (kh * kw)
    return y, dx


def _per_channel(v, ndim):
    """A (C,) vector shaped to broadcast over (N, C, ...)."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


def batch_norm_train(x, weight, bias, eps, dy=None):
    """Batch normalisation with the batch's statistics over every axis but the channel (1); weight, bias None mean
    1 and 0. Returns (y, batch mean, unbiased batch variance) and, with dy, also (dx, dweight, dbias), dweight and
    dbias None where weight and bias are. The running statistics follow from the mean and unbiased variance
    (running_update)."""
    x = x.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    n = x.size // x.shape[1]
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    invstd = 1.0 / np.sqrt(var + eps)
    xhat = (x - _per_channel(mean, x.ndim)) * _per_channel(invstd, x.ndim)
    w = np.ones(x.shape[1]) if weight is None else weight.astype(np.float64)
    y = xhat * _per_channel(w, x.ndim)
    if bias is not None:
        y = y + _per_channel(bias.astype(np.float64), x.ndim)
    out = (y, mean, var * n / (n - 1))
    if dy is None:
        return out
    dy = dy.astype(np.float64)
    sum_dy, sum_dy_xhat = dy.sum(axis=axes), (dy * xhat).sum(axis=axes)
    # d/dx of w * (x - mean) * invstd, with mean and invstd functions of the whole batch
    dx = _per_channel(w * invstd / n, x.ndim) * (n * dy - _per_channel(sum_dy, x.ndim)
                                                 - xhat * _per_channel(sum_dy_xhat, x.ndim))
    return out + (dx, None if weight is None else sum_dy_xhat, None if bias is None else sum_dy)


def batch_norm_eval(x, running_mean, running_var, weight, bias, eps, dy=None):
    """Batch normalisation with fixed statistics; with dy also (dx, dweight, dbias) as batch_norm_train's."""
    x = x.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    invstd = 1.0 / np.sqrt(running_var.astype(np.float64) + eps)
    xhat = (x - _per_channel(running_mean.astype(np.float64), x.ndim)) * _per_channel(invstd, x.ndim)
    w = np.ones(x.shape[1]) if weight is None else weight.astype(np.float64)
    y = xhat * _per_channel(w, x.ndim)
    if bias is not None:
        y = y + _per_channel(bias.astype(np.float64), x.ndim)
    if dy is None:
        return y
    dy = dy.astype(np.float64)
    dx = dy * _per_channel(w * invstd, x.ndim)
    return (y, dx, None if weight is None else (dy * xhat).sum(axis=axes),
            None if bias is None else dy.sum(axis=axes))


def running_update(running, batch_value, momentum):
    """PyTorch's running statistic after one training batch: (1 - momentum) * running + momentum * batch value."""
    return (1.0 - momentum) * running + momentum * batch_value


def local_response_norm(x, size, alpha, beta, k, dy=None):
    """y[c] = x[c] / (k + alpha / size * sum of x[j]^2 over j in [c - size//2, c + (size-1)//2]) ** beta, across the
    channel axis (1), zero outside the channels; with dy also dx."""
    x = x.astype(np.float64)
    C = x.shape[1]
    window = [range(max(0, c - size // 2), min(C, c + (size - 1) // 2 + 1)) for c in range(C)]
    s = np.stack([k + alpha / size * (x[:, list(w)] ** 2).sum(axis=1) for w in window], axis=1)
    y = x * s ** -beta
    if dy is None:
        return y
    dy = dy.astype(np.float64)
    # y[c] depends on x[i] through its own x (c == i) and through s[c] for every window c that holds i
    t = dy * x * s ** (-beta - 1)
    dx = dy * s ** -beta
    for i in range(C):
        holders = [c for c in range(C) if i in window[c]]
        dx[:, i] -= 2 * alpha * beta / size * x[:, i] * t[:, holders].sum(axis=1)
    return y, dx
