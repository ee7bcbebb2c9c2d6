"""What a launch is as a step of a fused chain (`ChainStep`), the launch that tells a graph being captured so, and the
one cl_kernels/chain.cl launch that runs a chain (clnet/graph.py decides what fuses, at the end of a capture).

The pointwise family (pointwise.py: unary, binary, comparison, where, cast, unary backward) and the flat
element-wise kernels (elementwise.py: axpby, affine, mul, an activation and its gradient from the saved output)
describe their launches; chain.cl computes each step through the same formula text as the launch it replaces
(pointwise_formulas.h, pointwise_binary.h, elementwise_formulas.h), so a fused replay writes what the unfused one
wrote, bit for bit.
"""
from typing import NamedTuple

import numpy as np

from . import kernels
from .tensor import Tensor

CHAIN_STEPS, CHAIN_BUFFERS, STEP_WORDS = 16, 12, 16  # chain.cl's MAX_STEPS, its buffer arguments, STEP_WORDS
_TAG = {np.dtype(np.float32): 0, np.dtype(np.int32): 1, np.dtype(np.bool_): 2}  # chain.cl's element types
# chain.cl's step kinds: pointwise.cl's launches, then elementwise.cl's
UNARY_FWD, UNARY_BWD, BINARY_FWD, WHERE_FWD, CAST = 1, 2, 3, 4, 5
AXPBY, AFFINE, MUL, ACT_FWD, ACT_BWD = 6, 7, 8, 9, 10


def read_layout(sizes, strides):
    """A ChainStep operand's layout: None where it is read at the flat index i (its strides the row-major ones of
    sizes), else (sizes, strides)."""
    step = 1
    for size, stride in zip(reversed(sizes), reversed(strides)):
        if stride != step:
            return tuple(sizes), tuple(strides)
        step *= size
    return None


class ChainStep(NamedTuple):
    """A launch as one step of a fused chain: its kind (UNARY_FWD ...), op number and parameters, the index among the
    launch's arguments of its output (written at the flat index i) and of each operand with its layout (None: read at
    i; else the coalesced (sizes, strides) strided.h would read it through), and the working type of a binary op.
    Graph reads `out` and `reads` to decide what may fuse and calls `chain_launch` for each chain."""
    kind: int
    op: int
    out: int
    reads: tuple
    work: object = None
    p0: float = 0.0
    p1: float = 0.0
    most_steps = CHAIN_STEPS  # what one chain.cl launch holds, which Graph's fusion keeps to
    most_buffers = CHAIN_BUFFERS

    @staticmethod
    def chain_launch(dev, buffers, steps, n):
        """(kernel, arguments, code tensor) of one chain.cl launch over n elements: `buffers` the (cl buffer, byte
        offset) pairs of its slots (at most CHAIN_BUFFERS), `steps` (ChainStep, {argument index: dtype}, output
        slot, [source per operand: a slot, or -(j+1) for the value step j computed]) in order (at most CHAIN_STEPS).
        The code tensor is the graph's to keep alive."""
        if len(steps) > CHAIN_STEPS or len(buffers) > CHAIN_BUFFERS:
            raise ValueError("internal: a chain longer than chain.cl holds")
        code, layouts = [len(steps)], []
        base = 1 + STEP_WORDS * len(steps)
        for step, dtypes, out_slot, sources in steps:
            bits = np.array([step.p0, step.p1], np.float32).view(np.int32)
            words = [step.kind, step.op, _TAG[dtypes[step.out]], out_slot,
                     _TAG[step.work] if step.work is not None else 0, int(bits[0]), int(bits[1])]
            for (index, lay), source in zip(step.reads, sources):
                at = 0
                if lay is not None:
                    at = base + len(layouts)
                    layouts += [len(lay[0]), *lay[0], *lay[1]]
                words += [source, _TAG[dtypes[index]], at]
            code += words + [0] * (STEP_WORDS - len(words))
        values = np.array(code + layouts, np.int32)
        with kernels.set_up():
            program = Tensor(values.shape, np.dtype(np.int32), dev).write(values)
        k = kernels.kernel(dev, "chain.cl", "pointwise_chain", None)
        slots = list(buffers) + [buffers[0]] * (CHAIN_BUFFERS - len(buffers))
        return k, tuple(slots) + (program, n), program


def launch(dev, k, global_size, args, what, step, n):
    """kernels.launch of k over global_size (any work-group: the kernel checks its bounds), which covers n elements.
    `step` makes what the launch is as a chain step (a function returning a ChainStep, called only while a graph
    records, so eager launches pay nothing for it): that graph is told, with the launch's arguments, and decides at
    the end of the capture what fuses."""
    c = kernels.context  # kernels.recording(), inline: this runs at every element-wise launch
    graph = c.capturing if step is not None and not c.paused else None
    if graph is None:
        kernels.launch(dev, k, global_size, kernels.ANY_GROUP, *args, what=what)
        return
    graph.offer(k, args, step(), n)
    try:
        kernels.launch(dev, k, global_size, kernels.ANY_GROUP, *args, what=what)
    finally:
        graph.offer(None, None, None, None)  # recorded or not, it describes this launch only
