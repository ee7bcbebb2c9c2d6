"""Launches that let clnet choose the work-group (kernels.ANY_GROUP): on PoCL, which builds a work-group function for
each local size it runs, they pad the global size to one of three local sizes, and the kernels' own bounds checks
keep the padded work-items from writing. Oclgrind pads every such launch (tests/test_oclgrind.py checks each family's
reads and writes there)."""
import numpy as np
import pytest

import clnet
from clnet import elementwise, kernels

SIZES = (1, 2, 5, 15, 16, 17, 63, 127, 255, 256, 1000, 1023, 1024, 1025, 4099, 16 * 1024 + 3, 100003)


def test_any_group_takes_few_work_group_sizes_and_covers_the_launch(dev):
    if dev.padded_group is None:
        pytest.skip(f"{dev.name}: its driver chooses the work-group")
    seen = set()
    shapes = [(n,) for n in SIZES] + [(a, b) for a in (1, 7, 33, 512, 1024, 3000) for b in (1, 3, 64)] + \
        [(a, b, c) for a in (2, 9, 700) for b in (1, 5) for c in (1, 11)]
    for shape in shapes:
        global_size, local = kernels.any_group(dev, shape)
        if len(shape) > 1 and not dev.is_simulator and global_size == shape and local == kernels.rows_group(shape):
            continue  # several dimensions with short rows: whole rows, nothing padded (test_rows_group)
        assert len(local) == len(shape) and all(l == 1 for l in local[1:]), (shape, local)
        assert all(g % l == 0 and shape[i] <= g < shape[i] + l for i, (g, l) in enumerate(zip(global_size, local)))
        seen.add(local[0])
    assert seen <= ({dev.padded_group} if dev.is_simulator else {1, 16, dev.padded_group}), seen


def test_rows_group_takes_whole_rows_and_depends_on_the_first_dimension():
    """PoCL's choice where the driver would pick, for launches of several dimensions with short rows: dimension 0
    whole, rows shorter than 16 grouped by a power of two dividing dimension 1, nothing padded; None elsewhere."""
    limit = kernels.ROWS_GROUP_LIMIT
    assert kernels.rows_group((37,)) is None and kernels.rows_group((limit, 3)) is None
    for shape in [(a, b) for a in (1, 3, 7, 15, 16, 45, limit - 1) for b in (1, 2, 3, 12, 48, 97)] + \
            [(a, b, c) for a in (5, 37) for b in (8, 9) for c in (1, 4)]:
        local = kernels.rows_group(shape)
        assert len(local) == len(shape) and local[0] == shape[0] and all(n == 1 for n in local[2:]), (shape, local)
        rows = local[1]
        assert shape[1] % rows == 0 and rows in (1, 2, 4, 8, 16), (shape, local)
        assert rows == 1 if shape[0] >= 16 else (shape[1] % (2 * rows) or rows == 16), (shape, local)
    # what PoCL builds depends on the first dimension alone where rows are long (its own choice took divisors of both)
    assert {kernels.rows_group((45, b)) for b in (7, 11, 64, 1000)} == {(45, 1)}


@pytest.mark.parametrize("n", SIZES)
def test_padded_work_items_write_nothing_past_the_tensor(dev, n):
    """fill over the first n elements of a larger tensor (a sub-buffer region): the elements after them keep their
    values, whatever the padded launch ran."""
    parent = clnet.full((n + 2048,), -7.0, device=dev)
    elementwise.fill(parent.region(0, (n,)), 3.5)
    got = parent.numpy()
    np.testing.assert_array_equal(got[:n], np.full(n, 3.5, np.float32))
    np.testing.assert_array_equal(got[n:], np.full(2048, -7.0, np.float32))
