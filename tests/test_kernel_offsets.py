"""Each kernel takes every __global pointer p with its byte offset (common.h's OFFSET_PARAM(p) after it) and moves p
there first thing (AT_OFFSET(T, p)): kernels.cl_arguments passes every tensor as the buffer that holds it and its
offset there, so a kernel missing either would read its operands' buffers from their starts."""
import os
import re

import numpy as np
import pytest

import clnet
from clnet import kernels, sources

RAW = {"probe.cl", "driver_cost.cl"}  # built as written by devices.py and bench/, their arguments set directly
KERNEL = re.compile(r"__kernel\b[^;{]*?\bvoid\s+(\w+)\s*\(")
AT_OFFSET = re.compile(r"\s*AT_OFFSET\(([^,]+),\s*(\w+)\)")


def _macro(name):
    """The body of gemm_common.h's #define name, on one line."""
    text = sources.source("gemm_common.h")
    body = re.search(rf"#define {name} \\\n((?:.*\\\n)*.*)", text).group(1)
    return " ".join(body.replace("\\\n", " ").split())


def _kernels(text):
    """(name, [parameters], the body's opening) of each kernel in text, comments aside."""
    text = re.sub(r"//[^\n]*", "", text)
    for m in KERNEL.finditer(text):
        depth, end = 0, m.end() - 1
        for end in range(m.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        params = [" ".join(p.split()) for p in text[m.end():end].replace("GEMM_ARGS", _macro("GEMM_ARGS")).split(",")]
        opening = text[text.index("{", end) + 1:].replace("GEMM_AT_OFFSETS", _macro("GEMM_AT_OFFSETS"))
        yield m.group(1), params, opening


def _offsets_missing(text):
    """What each kernel of text lacks: [(kernel, pointer, what)]."""
    missing = []
    for name, params, opening in _kernels(text):
        pointers = []
        for i, p in enumerate(params):
            if "__global" in p and "*" in p:
                pointer = re.search(r"(\w+)$", p).group(1)
                kind = " ".join(p[:p.rindex(pointer)].replace("restrict", " ").split()).replace(" *", "*")
                pointers.append((kind, pointer))
                if i + 1 == len(params) or params[i + 1] != f"OFFSET_PARAM({pointer})":
                    missing.append((name, pointer, "OFFSET_PARAM after it"))
        moved, at = [], 0
        while (m := AT_OFFSET.match(opening, at)) is not None:
            moved.append((" ".join(m.group(1).split()), m.group(2)))
            at = m.end() + (opening[m.end()] == ";")
        if moved != pointers:
            missing.append((name, pointers, f"AT_OFFSET for each first, found {moved}"))
    return missing


@pytest.mark.parametrize("filename", sorted(f for f in os.listdir(sources.kernel_dir())
                                            if f.endswith(".cl") and f not in RAW))
def test_every_kernel_takes_and_applies_its_pointers_offsets(filename):
    assert _offsets_missing(sources.source(filename)) == []


def test_the_check_finds_a_missing_offset():
    """The check above on kernels that lack one or the other, or move a pointer by the wrong type."""
    assert _offsets_missing("__kernel void f(__global float* x, OFFSET_PARAM(x), const int n) { x[0] = n; }")
    assert _offsets_missing("__kernel void f(__global float* x, const int n) {\n AT_OFFSET(__global float*, x) }")
    assert _offsets_missing("__kernel void f(__global const float* x, OFFSET_PARAM(x)) {\n"
                            "    AT_OFFSET(__global float*, x)\n}")
    assert not _offsets_missing("__kernel void f(__global float* restrict x, OFFSET_PARAM(x), __local float* s) {\n"
                                "    AT_OFFSET(__global float*, x)\n}")


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
