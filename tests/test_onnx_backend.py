"""ONNX's own backend node tests (onnx.backend.test.case.node: the cases every ONNX backend runs, generated here by
the onnx package with its expected outputs) through clnet's backend adapter (clnet.onnx.backend), on one device (PoCL
where present).

Every case whose operators are all in clnet's ONNX table, with outputs of types clnet holds (float32, bool, int32,
int64 held as int32) and float32 data among its inputs (other inputs -- indices, shapes, axes, and float32 ones only
host slots read, as Resize's scales -- are taken as constants), runs at ONNX's own tolerances (each case's rtol and
atol), except those EXCLUDED below, each with its reason; every excluded case is checked to be refused by
clnet.onnx.load (never a wrong value, never a refusal at run time), so the list shrinks as clnet grows. Random
outputs (RANDOM: training-mode Dropout, Bernoulli) are checked element by element. Cases outside the table or without
float32 data are counted, not run. With onnx 1.23.2: 664 cases pass, 32 are excluded, 6 are random.

Cost: the onnx package generates its ~1900 cases once (a few seconds), then the selected run in ~20 s on PoCL."""
import os
import warnings

import numpy as np
import pytest

import clnet

from conftest import DEVICES
from onnx_needed import require

onnx = require("onnx")
import clnet.onnx as connx  # noqa: E402
from clnet.onnx.backend import backend  # noqa: E402

# Case names (without "test_") by reason; every one must be refused at load.
EXCLUDED = {
    "empty tensors (a dimension of size 0), which clnet does not hold": """
        reduce_l1_empty_set reduce_l1_empty_set_expanded reduce_l2_empty_set reduce_log_sum_empty_set
        reduce_log_sum_empty_set_expanded reduce_log_sum_exp_empty_set reduce_max_empty_set reduce_min_empty_set
        reduce_prod_empty_set reduce_sum_empty_set reduce_sum_empty_set_non_reduced_axis_zero
        reduce_sum_square_empty_set reduce_sum_square_empty_set_expanded reshape_allowzero_reordered
        slice_start_out_of_bounds split_zero_size_splits_opset13 split_zero_size_splits_opset18""",
    "3-D and dilated pooling": """
        averagepool_2d_dilations averagepool_3d_default averagepool_3d_dilations_small
        averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False
        averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True
        averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False
        averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True maxpool_2d_dilations
        maxpool_3d_default maxpool_3d_dilations maxpool_3d_dilations_use_ref_impl
        maxpool_3d_dilations_use_ref_impl_large""",
    "3-D transposed convolution": "convtranspose_3d",
    "MaxPool's Indices output": "maxpool_with_argmax_2d_precomputed_pads maxpool_with_argmax_2d_precomputed_strides",
}
# Random outputs (ONNX's expected ones are one draw of NumPy's generator): training-mode Dropout's elements are checked
# to be 0 or x / (1 - ratio), Bernoulli's to be 0 or 1 (1 where p is 1, 0 where p is 0).
RANDOM = {"test_training_dropout", "test_training_dropout_default", "test_training_dropout_mask",
          "test_training_dropout_default_mask", "test_bernoulli_seed", "test_bernoulli_seed_expanded"}
REASONS = {"test_" + name: why for why, names in EXCLUDED.items() for name in names.split()}

# PoCL where present; CLNET_ONNX_BACKEND_DEVICE (a device index) picks another (a GPU's run of the suite)
DEVICE = next((d["index"] for d in DEVICES if "portable" in d["platform"].lower() and d.get("usable", True)),
              DEVICES[0]["index"] if DEVICES else None)
if os.environ.get("CLNET_ONNX_BACKEND_DEVICE"):
    DEVICE = int(os.environ["CLNET_ONNX_BACKEND_DEVICE"])


HELD = (onnx.TensorProto.FLOAT, onnx.TensorProto.BOOL, onnx.TensorProto.INT32, onnx.TensorProto.INT64)  # outputs


def _collect():
    from onnx.backend.test.case import node
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    table = set(connx.DEVICE_OPS) | set(connx.HOST_OPS)
    selected, outside = [], 0
    for c in cases:
        graph = c.model.graph
        tensors = all(v.type.HasField("tensor_type") for v in list(graph.input) + list(graph.output))
        floats = tensors and all(v.type.tensor_type.elem_type in HELD for v in graph.output) and \
            any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for v in graph.input)
        if floats and {n.op_type for n in graph.node} <= table:
            selected.append(c)
        else:
            outside += 1
    return selected, outside


SELECTED, OUTSIDE = _collect()


RUN = [c for c in SELECTED if c.name not in REASONS and c.name not in RANDOM]
REFUSED = [c for c in SELECTED if c.name in REASONS]


@pytest.fixture(scope="module")
def device():
    if DEVICE is None:
        pytest.skip("no OpenCL device")
    return clnet.device(DEVICE)


@pytest.mark.filterwarnings("ignore::clnet.onnx.OnnxOpsetWarning")
@pytest.mark.parametrize("case", RUN, ids=[c.name for c in RUN])
def test_node(device, case):
    rep = backend().prepare(case.model, device)
    for inputs, outputs in case.data_sets:
        got = rep.run(inputs)
        assert len(got) == len(outputs)
        for i, (g, want) in enumerate(zip(got, outputs)):
            want = onnx.numpy_helper.to_array(want) if isinstance(want, onnx.TensorProto) else want
            np.testing.assert_allclose(g, want, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name} output {i}")


@pytest.mark.filterwarnings("ignore::clnet.onnx.OnnxOpsetWarning")
@pytest.mark.parametrize("case", [c for c in SELECTED if c.name in RANDOM],
                         ids=[c.name for c in SELECTED if c.name in RANDOM])
def test_random_case_draws_what_it_should(device, case):
    """Dropout with training_mode true: every element is dropped (0) or kept and scaled by 1 / (1 - ratio), and
    both happen. Bernoulli: every element is 0 or 1, 1 where its probability is 1 and 0 where it is 0."""
    rep = backend().prepare(case.model, device)
    inputs, _ = case.data_sets[0]
    y = rep.run(inputs)[0]
    x = np.asarray(inputs[0], np.float64)
    if "bernoulli" in case.name:
        assert set(np.unique(y)) <= {0.0, 1.0}, case.name
        assert np.all(y[x == 1.0] == 1.0) and np.all(y[x == 0.0] == 0.0), case.name
        return
    ratio = float(np.asarray(inputs[1]))
    kept = np.isclose(y, x / (1 - ratio), rtol=1e-6, atol=0)
    assert np.all(kept | (y == 0)), case.name
    assert kept.any() and (y == 0).any(), case.name
    if "mask" in case.name:  # the mask says which were kept
        outputs = rep.run(inputs)
        y, mask = outputs[0], outputs[1]
        assert mask.dtype == np.bool_, mask.dtype
        np.testing.assert_allclose(y, np.where(mask, x / (1 - ratio), 0.0), rtol=1e-6, err_msg=case.name)
        assert mask.any() and not mask.all(), case.name


@pytest.mark.filterwarnings("ignore::clnet.onnx.OnnxOpsetWarning")
@pytest.mark.parametrize("case", REFUSED, ids=[c.name for c in REFUSED])
def test_excluded_case_is_refused_at_load(device, case):
    """An excluded case is refused by load (the backend loads at prepare, or at the first run where it takes integer
    inputs as constants), with clnet.onnx's error; one that starts to load must leave EXCLUDED."""
    with pytest.raises(connx.OnnxImportError):
        backend().prepare(case.model, device).run(case.data_sets[0][0])


def test_the_selection_is_the_suite():
    """The onnx package generated its cases, clnet's table selects a substantial part of them, and every exclusion
    names a case of this onnx version (a stale name would hide nothing, but says the list is out of date)."""
    assert len(SELECTED) + OUTSIDE > 1000 and len(RUN) >= 200, (len(SELECTED), OUTSIDE, len(RUN))
    names = {c.name for c in SELECTED}
    assert not (set(REASONS) | RANDOM) - names, sorted((set(REASONS) | RANDOM) - names)
