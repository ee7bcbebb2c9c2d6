"""The command line's ONNX work: clnet run, input shapes, ONNX Runtime references, clnet bench's set-up."""

import os

import numpy as np

from .. import models
from ..autograd import no_grad
from ..devices import device as get_device
from ..tensor import tensor as _to_device
from .common import INSTALL_HINT, OnnxImportError, _onnx
from .load import load
from .reader import _read


# ---- the command line's work ---------------------------------------------------------------------------------------

def run_file(model_path, input_path, output_path, device="auto"):
    """`clnet run`: the network of an ONNX file on the arrays of an .npy (one input) or .npz (inputs by graph input
    name, or in order) file, in eval mode; writes .npy (one output) or .npz (outputs by name). Returns the output
    arrays."""
    dev = get_device(device)
    net = load(model_path, device=dev).eval()
    data = np.load(input_path)
    if isinstance(data, np.ndarray):
        arrays = [data]
    else:
        keys = list(data.keys())
        arrays = [data[k] for k in (net.input_names if set(net.input_names) <= set(keys) else keys)]
    if len(arrays) != len(net.input_names):
        raise ValueError(f"{input_path}: {len(arrays)} arrays for the {len(net.input_names)} graph inputs "
                         f"({', '.join(net.input_names)})")
    with no_grad():
        out = net(*[_to_device(np.asarray(a, np.float32), dev) for a in arrays])
    outs = [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
    if len(outs) == 1 and not str(output_path).endswith(".npz"):
        np.save(output_path, outs[0])
    else:
        np.savez(output_path, **dict(zip(net.output_names, outs)))
    return outs


def input_shape(path):
    """The shape of an ONNX file's first graph input, None for a free dimension."""
    onnx = _onnx()
    _, model = _read(onnx, path)
    init = {t.name for t in model.graph.initializer}
    first = next(i for i in model.graph.input if i.name not in init)
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in first.type.tensor_type.shape.dim)


def onnxruntime_outputs(path, *arrays):
    """ONNX Runtime's (CPU) outputs for host arrays: the reference `--compare` checks against."""
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError(f"comparing with ONNX Runtime needs the onnxruntime package: {INSTALL_HINT}") from e
    sess = onnxruntime.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.asarray(a, np.float32) for i, a in zip(sess.get_inputs(), arrays)}
    return sess.run(None, feeds)


def bench_setup(path, batch=None):
    """`clnet bench model.onnx`: (module, input shape, zoo model name or None). The batch is `batch`, else the file's
    (1 where it is free); the zoo name is that of the zoo model whose state_dict keys and shapes the file's
    initializers have (then PyTorch can rebuild the network, and `--compare` times it)."""
    net = load(path)
    shape = input_shape(path)
    if any(d is None for d in shape[1:]):
        raise OnnxImportError(f"{path}: the input's shape {shape} has free dimensions besides the batch; clnet "
                              "bench needs them fixed")
    in_shape = (batch or shape[0] or 1,) + tuple(shape[1:])
    ours = {k: tuple(v.shape) for k, v in net._state_items()}
    for k in net._transposed:
        ours[k] = ours[k][::-1]
    zoo = None
    for name in models.MODELS:
        theirs = {k: tuple(v.shape) for k, v in models.build(name)._state_items() if "num_batches" not in k}
        if theirs == ours:
            zoo = name
            break
    return net, in_shape, zoo


def onnxruntime_agreement(path, net, x):
    """The largest relative error of the module's output against ONNX Runtime's (CPU) on host input x, in the mode
    the file was exported in (batch statistics for a training-mode file, as ONNX Runtime computes it; the module's
    mode is restored)."""
    was = net.training
    net.train(net.exported_training)
    try:
        with no_grad():
            out = net(_to_device(np.asarray(x, np.float32), net.device))
    finally:
        net.train(was)
    ours = [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]
    worst = 0.0
    for a, b in zip(ours, onnxruntime_outputs(path, x)):
        worst = max(worst, float(np.abs(a.astype(np.float64) - b).max() / max(np.abs(b).max(), 1e-30)))
    return worst
