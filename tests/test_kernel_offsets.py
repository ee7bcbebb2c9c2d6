"""The build's rewrite of each kernel's pointer parameters into (pointer, byte offset) pairs (sources.with_offsets):
kernels.cl_arguments passes every tensor as the buffer that holds it and its offset there."""
import os

import numpy as np
import pytest

import clnet
from clnet import kernels, sources


def sample(name):
    """tests/kernels/name: OpenCL text the rewrite is tested on."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", name)) as f:
        return f.read()


def test_each_global_pointer_gets_its_offset_and_the_body_applies_it():
    text = sources.with_offsets(sample("offsets_sample.cl"))
    assert ("void f(__global const float* restrict x, OFFSET_PARAM(x), const int n, __global float* out, "
            "OFFSET_PARAM(out), __local float* scratch, const float alpha) {") in " ".join(text.split())
    assert "AT_OFFSET(__global const float*, x)" in text
    assert "AT_OFFSET(__global float*, out)" in text
    assert "in_a_comment(__global float* p) {" in text  # a comment is left as it is
    assert "OFFSET_PARAM(scratch)" not in text and "scratch)" not in text  # local memory takes no offset


def test_a_parameter_macro_defined_two_ways_is_refused():
    with pytest.raises(sources.KernelError, match="P is defined 2 ways"):
        sources.with_offsets(sample("offsets_two_ways.cl"))


def test_launch_arguments_carry_each_tensors_offset(dev, rng):
    """cl_arguments: a tensor is its buffer and byte offset, None and a bare buffer are 0 offsets, a Live argument's
    index among the kernel's arguments is kept; and a kernel reads an operand at its offset (a region)."""
    data = rng.standard_normal(4096).astype(np.float32)
    t = clnet.tensor(data, dev)
    from clnet.tensor import region_alignment
    align = region_alignment(dev) // 4
    part = t.region(2 * align, (100,))
    values, at = kernels.cl_arguments((part, 3, None, 1.5))
    assert at == [0, 2, 3, 5] and values[0] is part.storage.buffer
    assert int(values[1]) == part.storage.at and int(values[4]) == 0 and values[3] is None
    np.testing.assert_array_equal((part * 2.0).numpy(), 2 * data[2 * align:2 * align + 100])
