"""ONNX's own backend node tests (onnx.backend.test.case.node: the cases every ONNX backend runs, generated here by
the onnx package with its expected outputs) through clnet's backend adapter (clnet.onnx.backend), on one device (PoCL
where present).

Every case whose operators are all in clnet's ONNX table, with float32 outputs and float32 data among its inputs (other
inputs, indices, shapes and axes, are taken as constants), runs at ONNX's own tolerances (each case's rtol and atol),
except those EXCLUDED below, each with its reason; every excluded case is checked to be refused by clnet.onnx.load
(never a wrong value, never a refusal at run time), so the list shrinks as clnet grows. Cases outside the table or
without float32 data are counted, not run. With onnx 1.23.2: 222 cases pass, 123 are excluded.

Cost: the onnx package generates its ~1900 cases once (a few seconds), then the selected run in ~20 s on PoCL."""
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
_ELEMENTWISE = "has no kernel for this op on computed tensors yet (the tensor ops' elementwise families)"
EXCLUDED = {
    "Sqrt " + _ELEMENTWISE + "; the _expanded cases are function bodies that use it": """
        sqrt sqrt_example group_normalization_epsilon_expanded group_normalization_example_expanded
        rms_normalization_2d_axis0_expanded rms_normalization_2d_axis1_expanded
        rms_normalization_2d_axis_negative_1_expanded rms_normalization_2d_axis_negative_2_expanded
        rms_normalization_3d_axis0_epsilon_expanded rms_normalization_3d_axis1_epsilon_expanded
        rms_normalization_3d_axis2_epsilon_expanded rms_normalization_3d_axis_negative_1_epsilon_expanded
        rms_normalization_3d_axis_negative_2_epsilon_expanded rms_normalization_3d_axis_negative_3_epsilon_expanded
        rms_normalization_4d_axis0_expanded rms_normalization_4d_axis1_expanded rms_normalization_4d_axis2_expanded
        rms_normalization_4d_axis3_expanded rms_normalization_4d_axis_negative_1_expanded
        rms_normalization_4d_axis_negative_2_expanded rms_normalization_4d_axis_negative_3_expanded
        rms_normalization_4d_axis_negative_4_expanded rms_normalization_default_axis_expanded""",
    "Pow " + _ELEMENTWISE: """
        pow pow_bcast_array pow_bcast_scalar pow_example pow_types_float32_int32 pow_types_float32_int64
        pow_types_float32_uint32 pow_types_float32_uint64 mvn_expanded mvn_expanded_ver18""",
    "Ceil and Floor " + _ELEMENTWISE: "ceil ceil_example floor floor_example",
    "Less and Where " + _ELEMENTWISE + " (Clip's function body)": """
        clip_default_max_expanded clip_default_min_expanded clip_example_expanded clip_expanded
        clip_inbounds_expanded clip_min_greater_than_max_expanded clip_outbounds_expanded clip_splitbounds_expanded
        where_example""",
    "division by a computed tensor (no elementwise division kernel yet)": "div div_bcast div_example",
    "Slice of computed tensors (the tensor ops' views)": """
        slice slice_default_axes slice_default_steps slice_end_out_of_bounds slice_neg slice_neg_steps
        slice_negative_axes slice_start_out_of_bounds causal_conv_with_state_decode_step_expanded
        causal_conv_with_state_with_bias_and_past_state_expanded causal_conv_with_state_with_past_state_expanded""",
    "Expand, Gather and Range of computed tensors (the tensor ops' views and indexing)": """
        expand_dim_changed expand_dim_unchanged gather_0 gather_1 gather_2d_indices gather_negative_indices
        range_float_type_positive_delta flexattention_diff_head_sizes_expanded_ver26 flexattention_expanded_ver26
        flexattention_gqa_expanded_ver26 flexattention_prob_mod_expanded_ver26
        flexattention_relative_positional_expanded_ver26 flexattention_scaled_expanded_ver26
        flexattention_score_mod_expanded_ver26 flexattention_soft_cap_expanded_ver26""",
    "batched MatMul of computed tensors (the tensor ops' matmul)": "matmul_1d_3d matmul_3d matmul_4d matmul_bcast",
    "ReduceProd of a computed tensor (no product reduction)": """
        reduce_prod_default_axes_keepdims_example reduce_prod_default_axes_keepdims_random
        reduce_prod_do_not_keepdims_example reduce_prod_do_not_keepdims_random reduce_prod_keepdims_example
        reduce_prod_keepdims_random reduce_prod_negative_axes_keepdims_example
        reduce_prod_negative_axes_keepdims_random""",
    "empty tensors (a dimension of size 0), which clnet does not hold": """
        reduce_l1_empty_set_expanded reduce_max_empty_set reduce_min_empty_set reduce_prod_empty_set
        reduce_sum_empty_set reduce_sum_empty_set_non_reduced_axis_zero reduce_sum_square_empty_set_expanded
        reshape_allowzero_reordered""",
    "3-D and dilated pooling": """
        averagepool_2d_dilations averagepool_3d_default averagepool_3d_dilations_small
        averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False
        averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True
        averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False
        averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True maxpool_2d_dilations
        maxpool_3d_default maxpool_3d_dilations maxpool_3d_dilations_use_ref_impl
        maxpool_3d_dilations_use_ref_impl_large""",
    "Dropout whose ratio or training_mode is a graph input (random masks in training are not comparable either)":
        "dropout_default_ratio training_dropout training_dropout_default training_dropout_zero_ratio",
    "inputs of types NumPy does not hold (bfloat16, float8, int4, int2, ...) or casts between them": """
        castlike_BFLOAT16_to_FLOAT_expanded castlike_DOUBLE_to_FLOAT_expanded castlike_FLOAT16_to_FLOAT_expanded
        castlike_FLOAT4E2M1_to_FLOAT_expanded castlike_FLOAT8E4M3FNUZ_to_FLOAT_expanded
        castlike_FLOAT8E4M3FN_to_FLOAT_expanded castlike_FLOAT8E5M2FNUZ_to_FLOAT_expanded
        castlike_FLOAT8E5M2_to_FLOAT_expanded castlike_INT2_to_FLOAT_expanded castlike_INT4_to_FLOAT_expanded
        castlike_UINT2_to_FLOAT_expanded castlike_UINT4_to_FLOAT_expanded""",
}
REASONS = {"test_" + name: why for why, names in EXCLUDED.items() for name in names.split()}

DEVICE = next((d["index"] for d in DEVICES if "portable" in d["platform"].lower() and d.get("usable", True)),
              DEVICES[0]["index"] if DEVICES else None)


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
        floats = tensors and all(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for v in graph.output) and \
            any(v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT for v in graph.input)
        if floats and {n.op_type for n in graph.node} <= table:
            selected.append(c)
        else:
            outside += 1
    return selected, outside


SELECTED, OUTSIDE = _collect()


RUN = [c for c in SELECTED if c.name not in REASONS]
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
            np.testing.assert_allclose(g, want, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name} output {i}")


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
    assert not set(REASONS) - names, sorted(set(REASONS) - names)
