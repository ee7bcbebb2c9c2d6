"""A torchvision network's ONNX graph without its weights, and the weights filled in again: for profiling clnet's
host time on a machine where torchvision is missing (bench/host_profile.py --stub), from a file small enough to
carry. Only the graph's structure and shapes matter there, so the weights come back as random values.

    python bench/onnx_strip.py export densenet121 densenet121-b1.onnx   # where torchvision is (training mode, b1)
    python bench/onnx_strip.py fill densenet121-b1.onnx densenet121-full.onnx   # anywhere
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper


def export(name, path, batch=1):
    import shutil
    import tempfile
    from depthwise import export as export_training  # torchvision's model in training mode
    shutil.move(export_training(name, (batch, 3, 224, 224), tempfile.mkdtemp())[1], path)
    model = onnx.load(path)
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and np.prod(init.dims) > 16:
            init.ClearField("raw_data")
            init.ClearField("float_data")
            init.doc_string = "stripped"
    onnx.save(model, path)


def fill(src, dst, seed=0):
    model = onnx.load(src)
    rng = np.random.default_rng(seed)
    for init in model.graph.initializer:
        if init.doc_string == "stripped":
            fan_in = int(np.prod(init.dims[1:])) if len(init.dims) > 1 else 1
            values = (rng.standard_normal(tuple(init.dims)) / np.sqrt(fan_in)).astype(np.float32)
            if len(init.dims) == 1:  # batch norm's scale and variance must stay positive
                values = np.abs(values) + 0.5
            init.CopyFrom(numpy_helper.from_array(values, init.name))
    onnx.save(model, dst)


if __name__ == "__main__":
    {"export": export, "fill": fill}[sys.argv[1]](*sys.argv[2:])
