"""What clnet's ONNX importer cannot run is refused by clnet.onnx.load, before any kernel runs, naming the node, the
operator, the opset and the reason (clnet/onnx/checks.py); external data is read only from inside the
model's folder; declared sizes are checked against the device before anything is read or allocated; an opset newer
than the importer knows warns. Also: the ONNX tests fail rather than skip where the onnx extra should be there."""
import os

import numpy as np
import pytest

import clnet

from conftest import assert_close, no_launch
import onnx_needed
from onnx_needed import require

onnx = require("onnx")
ort = require("onnxruntime")
import clnet.onnx as connx  # noqa: E402

from test_onnx_semantics import build, f32, runtime  # noqa: E402

h = onnx.helper
T4 = (2, 3, 4, 5)

# (case, nodes, graph inputs, initializers, words the message must hold)
CASES = [
    ("clip-vector-bound", [h.make_node("Clip", ["x", "lo"], ["y"], name="n")], [("x", T4), ("lo", (5,))], {},
     "bounds are scalars"),
    ("dropout-ratio-input", [h.make_node("Dropout", ["x", "r"], ["y"], name="n")], [("x", T4), ("r", ())], {},
     "'ratio'"),
    ("reduce-computed-axes", [h.make_node("ReduceSum", ["x", "a"], ["y"], name="n")], [("x", T4), ("a", (1,))], {},
     "'axes'"),
    ("pool-3d", [h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2, 2], name="n")], [("x", (1, 2, 4, 4, 4))],
     {}, "1-D and 2-D windows"),
    ("range-computed", [h.make_node("Range", ["x", "z", "d"], ["y"], name="n")], [("x", ()), ("z", ())],
     dict(d=np.array(1.0, np.float32)), "Range of a computed tensor"),
    ("maxpool-indices", [h.make_node("MaxPool", ["x"], ["p", "y"], kernel_shape=[2, 2], name="n")], [("x", T4)], {},
     "Indices output"),
    ("cast-double", [h.make_node("Cast", ["x"], ["y"], to=onnx.TensorProto.DOUBLE, name="n")], [("x", T4)], {},
     "ONNX type 11"),
    ("convtranspose-3d", [h.make_node("ConvTranspose", ["x", "w"], ["y"], name="n")], [("x", (1, 3, 4, 4, 4))],
     dict(w=np.ones((3, 2, 2, 2, 2), np.float32)), "3-D"),
    ("pad-wrap", [h.make_node("Pad", ["x", "p"], ["y"], mode="wrap", name="n")], [("x", T4)],
     dict(p=np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)), "mode 'wrap'"),
    ("slice-empty", [h.make_node("Slice", ["x", "s", "e"], ["y"], name="n")], [("x", T4)],
     dict(s=np.array([3], np.int64), e=np.array([1], np.int64)), "no empty tensors"),
    ("reshape-computed-shape", [h.make_node("Reshape", ["x", "s"], ["y"], name="n")], [("x", T4), ("s", (2,))], {},
     "'shape'"),
    ("expand-too-large", [h.make_node("Expand", ["c", "s"], ["y"], name="n")], [],
     dict(c=np.ones((1,), np.float32), s=np.array([1 << 13, 1 << 13, 2], np.int64)), "more than clnet folds"),
    ("constant-of-shape-too-large", [h.make_node("ConstantOfShape", ["s"], ["y"], name="n")], [],
     dict(s=np.array([1 << 20, 1 << 10], np.int64)), "more than clnet folds"),
    ("conv-3d-input", [h.make_node("Conv", ["x", "w"], ["y"], name="n")], [("x", (1, 3, 4))],
     dict(w=np.ones((2, 3, 3, 3), np.float32)), "4-D"),
]


@pytest.mark.parametrize("case, nodes, inputs, inits, words", CASES, ids=[c[0] for c in CASES])
def test_refused_at_load_with_node_op_opset_and_reason(tmp_path, case, nodes, inputs, inits, words):
    """Each of these once failed only when run (or ran wrong): now load refuses it, before any kernel, with the
    node, the operator, the opset and the reason, as clnet.onnx's error (a clnet.Error)."""
    path = str(tmp_path / f"{case}.onnx")
    ints = {("reshape-computed-shape", "s"), ("reduce-computed-axes", "a")}
    graph_inputs = [h.make_tensor_value_info(n, onnx.TensorProto.INT64 if (case, n) in ints else onnx.TensorProto.FLOAT,
                                             s) for n, s in inputs]
    out_type = {"cast-double": onnx.TensorProto.DOUBLE, "maxpool-indices": onnx.TensorProto.INT64}.get(
        case, onnx.TensorProto.FLOAT)
    graph = h.make_graph(nodes, "g", graph_inputs, [h.make_tensor_value_info("y", out_type, [None] * 4)],
                         [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    with no_launch(), pytest.raises(connx.OnnxImportError) as e:
        connx.load(path)
    message = str(e.value)
    assert isinstance(e.value, clnet.Error)
    assert f"ONNX node 'n' ({nodes[0].op_type}, opset 17)" in message and words in message, message
    assert "\n" not in message


def test_call_time_shape_errors_name_the_node_and_keep_the_cause(dev, rng, tmp_path):
    """Where load cannot see a shape (free dimensions), the call's shapes decide: an impossible broadcast then raises
    clnet.onnx's error naming the node, with the cause chained (not a plain ValueError from None)."""
    path = build(tmp_path / "free.onnx", [h.make_node("Add", ["a", "b"], ["y"], name="add")],
                 [("a", ("N", 3)), ("b", ("M", 3))], [("y", ("N", 3))])
    net = connx.load(path, device=dev)
    a, b = f32(rng, 2, 3), f32(rng, 2, 3)
    with clnet.no_grad():  # shapes that broadcast run
        assert_close(net(clnet.tensor(a, dev), clnet.tensor(b, dev)).numpy(), a.astype(np.float64) + b, "a + b")
        with pytest.raises(connx.OnnxImportError, match=r"ONNX node 'add' \(Add, opset 17\)") as e:
            net(clnet.tensor(a, dev), clnet.tensor(f32(rng, 3, 3), dev))
    assert isinstance(e.value.__cause__, ValueError)  # chained from its cause


def test_reshape_at_opset_1_takes_its_shape_attribute(dev, rng, tmp_path):
    """Reshape-1 carries the target shape as an attribute: it runs (a 0 copies the input's dimension)."""
    path = str(tmp_path / "reshape1.onnx")
    graph = h.make_graph([h.make_node("Reshape", ["x"], ["y"], shape=[0, -1], name="r")], "g",
                         [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, T4)],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (2, 60))])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 1)])
    model.ir_version = 3
    onnx.save(model, path)
    x = f32(rng, *T4)
    with clnet.no_grad():
        y = connx.load(path, device=dev)(clnet.tensor(x, dev)).numpy()
    assert np.array_equal(y, x.reshape(2, 60))


def test_newer_opset_warns_at_load(tmp_path):
    path = build(tmp_path / "new.onnx", [h.make_node("Relu", ["x"], ["y"], name="r")], [("x", (2, 3))],
                 [("y", (2, 3))], opset=connx.NEWEST_OPSET + 1)
    with pytest.warns(connx.OnnxOpsetWarning, match=f"opset {connx.NEWEST_OPSET + 1} is newer"):
        connx.load(path)


# ---- external data and declared sizes ------------------------------------------------------------------------------

def external_model(folder, location, w, dims=None):
    """A MatMul by an initializer whose data lives in `location` (relative to the model's folder, or absolute)."""
    t = onnx.numpy_helper.from_array(w, "w")
    t.ClearField("raw_data")
    if dims is not None:
        del t.dims[:]
        t.dims.extend(dims)
    t.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(w.nbytes if dims is None else
                                                                             int(np.prod(dims)) * 4))):
        e = t.external_data.add()
        e.key, e.value = k, v
    graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                         [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (2, w.shape[0]))],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (2, w.shape[1]))], [t])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def test_external_data_only_from_inside_the_models_folder(dev, rng, tmp_path):
    """External data inside the folder (a subfolder too) loads; an absolute path, a '..' path and a symbolic link
    leading out are refused at load, naming the tensor and the location, before anything is read."""
    w = f32(rng, 4, 3)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(w.tobytes())
    folder = tmp_path / "model"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "w.bin").write_bytes(w.tobytes())
    path = external_model(str(folder), "data/w.bin", w)
    x = f32(rng, 2, 4)
    with clnet.no_grad():
        y = connx.load(path, device=dev)(clnet.tensor(x, dev)).numpy()
    assert_close(y, x.astype(np.float64) @ w, "external data inside the folder", tol=1e-6)
    os.symlink(outside, folder / "link.bin")
    for location, words in ((str(outside), "absolute path"), ("../outside.bin", "'..'"),
                            ("data/../../outside.bin", "'..'"), ("link.bin", "symbolic link")):
        path = external_model(str(folder), location, w)
        with no_launch(), pytest.raises(connx.OnnxImportError, match=words) as e:
            connx.load(path)
        assert "tensor 'w'" in str(e.value) and location in str(e.value)


def test_declared_sizes_are_checked_before_reading(tmp_path):
    """A tensor whose declared dims need more bytes than its external file holds, or than the device has, is refused
    at load before its data is read or any buffer allocated; as is one whose in-file bytes do not match its dims."""
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "w.bin").write_bytes(np.zeros(12, np.float32).tobytes())
    w = np.zeros((4, 3), np.float32)
    path = external_model(str(folder), "w.bin", w, dims=(4, 3_000_000_000))
    with pytest.raises(connx.OnnxImportError, match="do not hold"):
        connx.load(path)

    class Tiny:  # a device of 1 KiB (its buffers at most 256 bytes): the 12-float weight fits one, not the other
        name = "tiny"

        class cl_device:
            global_mem_size, max_mem_alloc_size = 1024, 32
    path = external_model(str(folder), "w.bin", w)
    with no_launch(), pytest.raises(connx.OnnxImportError, match="more than the largest buffer device tiny"):
        connx.load(path, device=Tiny)
    Tiny.cl_device.global_mem_size = 40
    with no_launch(), pytest.raises(connx.OnnxImportError, match="more than device tiny"):
        connx.load(path, device=Tiny)

    damaged = onnx.numpy_helper.from_array(np.zeros((4, 3), np.float32), "w")
    damaged.raw_data = damaged.raw_data[:16]
    graph = h.make_graph([h.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                         [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, (2, 4))],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, (2, 3))], [damaged])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    bad = str(tmp_path / "short.onnx")
    with open(bad, "wb") as f:
        f.write(model.SerializeToString())
    with pytest.raises(connx.OnnxImportError, match="holds 16 bytes"):
        connx.load(bad)


# ---- the ONNX tests need the onnx extra where it is meant to be installed ------------------------------------------

def test_missing_onnx_fails_in_ci_and_skips_only_elsewhere(monkeypatch):
    monkeypatch.setattr(onnx_needed, "_installed", lambda dist: False)
    monkeypatch.delenv("CLNET_TEST_ONNX", raising=False)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(ImportError, match="must run here"):
        require("clnet_no_such_module")
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception):
        require("clnet_no_such_module")
    monkeypatch.setattr(onnx_needed, "_installed", lambda dist: True)  # installed, but the import fails
    with pytest.raises(ImportError, match="installed but does not import"):
        require("clnet_no_such_module")
