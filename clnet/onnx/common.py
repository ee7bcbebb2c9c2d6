"""What every part of clnet.onnx shares: its error and warning, the optional onnx package, node attributes
and host values."""

import numpy as np

from ..errors import Error


INSTALL_HINT = "pip install 'clnet[onnx]'"
EXPORT_OPSET = 17
NEWEST_OPSET = 21  # the newest default-domain opset whose operator changes the importer was checked against


class OnnxImportError(Error, ValueError):
    """An ONNX file clnet cannot read or run: names the file, and the node, operator type and opset where one is at
    fault."""


class OnnxOpsetWarning(UserWarning):
    """A file of an opset newer than the importer was checked against (NEWEST_OPSET)."""


def _onnx():
    try:
        import onnx
        import onnx.numpy_helper  # noqa: F401
    except ImportError as e:
        raise ImportError(f"clnet.onnx needs the onnx package, which is not installed: {INSTALL_HINT}") from e
    return onnx


# ---- attributes and host values ------------------------------------------------------------------------------------

def _attributes(onnx, node):
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif a.type == onnx.AttributeProto.TENSOR:
            v = onnx.numpy_helper.to_array(v)
        elif isinstance(v, list):
            v = [x.decode() if isinstance(x, bytes) else x for x in v]
        out[a.name] = v
    return out


def _host_int_list(v):
    return [int(i) for i in np.asarray(v).reshape(-1)]


def _is_host(v):
    return isinstance(v, np.ndarray)
