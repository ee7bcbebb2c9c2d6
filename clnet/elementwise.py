"""Flat element-wise launches outside autograd's graph (cl_kernels/elementwise.cl): filling, adding and multiplying
whole tensors, an activation's gradient from its saved output, and `_map`, which runs a flat kernel in chunks past
kernels.INDEX_LIMIT. The op table (ops.py), autograd (a gradient's ones, sums over an output's uses) and the
convolutions (a ReLU fused into them) build on these; they record nothing for backward.
"""
from . import chain, kernels
from .chain import ACT_BWD, ACT_FWD, AXPBY, MUL, ChainStep
from .tensor import Numel, Tensor, chunks, empty

_context, _captures = kernels.context, kernels._captures  # one object each, made once (tensor.py reads them so)

VW = 4  # elements per work-item of act_fwd, act_bwd, axpby, fill, accumulate, sgd_step, adam_step (common.h)


def _map(dev, k, n, vw, *args, what="", step=None):
    """An element-wise kernel over n elements, vw per work-item. Past kernels.INDEX_LIMIT it runs in chunks: each
    tensor argument of n elements becomes the chunk's region (a window: `Tensor.region`), and the integer argument n
    the chunk's count (the flat kernels' other arguments are floats, Live values and one-element tensors). `step`:
    what one launch of it is as a chain step (chain.launch); a chunked one never fuses."""
    if n > kernels.INDEX_LIMIT:
        for start, count in chunks(what, (n,), n, [1], unit="element", multiple=VW):
            part = tuple(a.region(start, (count,)) if isinstance(a, Tensor) and a.size == n else
                         (count if type(a) in (int, Numel) and a == n else a) for a in args)
            kernels.launch(dev, k, (-(-count // vw),), kernels.ANY_GROUP, *part, what=what)
        return
    # chain.launch's eager case, one call less (every op's); the thread's capture looked up only while one exists
    c = _context
    if step is None or not _captures or c.capturing is None or c.paused:
        kernels.launch(dev, k, (-(-n // vw),), kernels.ANY_GROUP, *args, what=what)
        return
    chain.launch(dev, k, (-(-n // vw),), args, what, step, n)


def _elementwise(dev, name, defines=None):
    return kernels.kernel(dev, "elementwise.cl", name, defines)


def fill(t, value):
    n = t.size
    _map(t.device, _elementwise(t.device, "fill"), n, VW, t, float(value), n, what="fill")
    return t


def zeros(shape, dev):
    return fill(empty(shape, dev), 0.0)


def full(shape, dev, value):
    return fill(empty(shape, dev), value)


def full_like(t, value):
    return full(t.shape, t.device, value)


def add(a, b):
    """a + b of two tensors of one shape, outside the graph (gradients summed over an op's uses)."""
    out = empty(a.shape, a.device)
    _map(a.device, _elementwise(a.device, "axpby"), a.size, VW, a, b, out, 1.0, 1.0, a.size, what="add",
         step=axpby_step(1.0, 1.0))
    return out


def axpby_step(alpha, beta):
    """axpby's launch (a, b, out, alpha, beta, n) as a chain step."""
    return lambda: ChainStep(AXPBY, 0, 2, ((0, None), (1, None)), None, alpha, beta)


def mul(a, b):
    out = empty(a.shape, a.device)
    _map(a.device, _elementwise(a.device, "mul"), a.size, 1, a, b, out, a.size, what="mul",
         step=lambda: ChainStep(MUL, 0, 2, ((0, None), (1, None))))
    return out


ACTIVATIONS = {"relu": 1, "sigmoid": 2, "tanh": 3, "relu6": 4}  # act_fwd and act_bwd's ACT


def _activation_grad(kind, y, dy, what):
    """d loss / d x of y = f(x), from the saved output y: an Activation's backward, and a ReLU's fused into the Conv2d
    or Linear that made y (nn.Sequential's fusion)."""
    dx = empty(y.shape, y.device)
    number = ACTIVATIONS[kind]
    _map(y.device, _elementwise(y.device, "act_bwd", dict(ACT=number)), y.size, VW, y, dy, dx, y.size, what=what,
         step=lambda: ChainStep(ACT_BWD, number, 2, ((0, None), (1, None))))
    return dx


def activation(kind, x):
    """y = f(x) for an activation of ACTIVATIONS, outside autograd (ops.Activation records it)."""
    y = empty(x.shape, x.device)
    number = ACTIVATIONS[kind]
    _map(x.device, _elementwise(x.device, "act_fwd", dict(ACT=number)), x.size, VW, x, y, x.size, what=kind,
         step=lambda: ChainStep(ACT_FWD, number, 1, ((0, None),)))
    return y
