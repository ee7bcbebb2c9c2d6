"""Device choice, discovery of unregistered vendor libraries, tensors and transfer counting."""
import os

import numpy as np
import pytest

import clnet
from clnet import devices as device_mod
from clnet import conv, gemm, ops
from clnet.gemm import Mat

from conftest import assert_close, assert_close_to_terms, launched, skip_other_class_unless_first


def test_devices_listed():
    rows = clnet.list_devices()
    assert rows, "no OpenCL device: PoCL should always be present"
    for r in rows:
        assert {"index", "platform", "name", "type", "compute_units", "global_mem", "local_mem", "version"} <= set(r)


def test_device_choice():
    auto = clnet.device("auto")
    assert clnet.device("auto") is auto
    assert clnet.device(auto.index) is auto
    part = auto.name[:5].lower()  # a name substring picks the first device whose name holds it
    first = next(d["index"] for d in clnet.list_devices() if part in d["name"].lower())
    assert clnet.device(auto.name[:5]) is clnet.device(first)
    assert clnet.device(auto.name[:5].upper()) is clnet.device(first)
    assert clnet.device(str(auto.index)) is auto


def test_unknown_device_lists_devices():
    with pytest.raises(clnet.DeviceNotFound, match="devices present: 0: "):
        clnet.device("no-such-device-xyz")
    with pytest.raises(clnet.DeviceNotFound, match="no OpenCL device with index 99"):
        clnet.device(99)


def test_gpu_request_without_gpu():
    if any("GPU" in r["type"] and not r["simulator"] for r in clnet.list_devices()):  # Oclgrind says GPU too
        pytest.skip("a GPU is present")
    with pytest.raises(clnet.DeviceNotFound, match="no OpenCL GPU found"):
        clnet.device("gpu")


def test_unregistered_vendor_library_is_found(tmp_path, monkeypatch):
    """A vendor library with no ICD file is found; libraries already named by an ICD file are left alone."""
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    (vendors / "pocl.icd").write_text("libpocl.so.2\n")
    libdir = tmp_path / "lib"
    libdir.mkdir()
    (libdir / "libnvidia-opencl.so.1").write_text("")
    (libdir / "libpocl.so.2").write_text("")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(vendors))
    monkeypatch.setattr(device_mod, "LIBRARY_DIRS", (str(libdir),))
    monkeypatch.setattr(device_mod, "_ldconfig_paths", lambda: {})
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    monkeypatch.setattr(device_mod, "registered_libraries", [])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the registration goes there (tests/test_icd.py)
    new_dir = device_mod.register_vendor_libraries()
    assert os.environ["OCL_ICD_VENDORS"] == new_dir != str(vendors)
    contents = sorted(open(os.path.join(new_dir, f)).read().strip() for f in os.listdir(new_dir))
    assert contents == sorted(["libpocl.so.2", str(libdir / "libnvidia-opencl.so.1")])
    assert device_mod.registered_libraries == [str(libdir / "libnvidia-opencl.so.1")]


def test_tensor_round_trip_and_counts(dev, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    clnet.reset_transfer_stats()
    t = clnet.tensor(a, dev)
    assert t.shape == (3, 5) and t.dtype == np.float32 and t.device is dev
    np.testing.assert_array_equal(t.numpy(), a)
    labels = clnet.tensor(np.array([1, 2, 3], np.int64), dev)
    assert labels.dtype == np.int32
    np.testing.assert_array_equal(labels.numpy(), [1, 2, 3])
    assert clnet.transfer_stats() == dict(host_to_device_bytes=a.nbytes + 12, host_to_device_count=2,
                                          device_to_host_bytes=a.nbytes + 12, device_to_host_count=2)


def test_pool_reuses_buffers(dev):
    from clnet.tensor import pool
    t = clnet.tensor(np.ones(1000, np.float32), dev)
    buf = t.buffer
    del t
    before = pool(dev).allocated_bytes
    t2 = clnet.tensor(np.ones(999, np.float32), dev)
    assert t2.buffer is buf or t2.buffer.int_ptr == buf.int_ptr
    assert pool(dev).allocated_bytes == before


# No size here is a multiple of 4 along any stride, so every gemm_tiled program of this test fetches and stores
# scalars (one program per tile shape and layout, which the split-K slices of the last case share since the epilogue
# became kernel arguments); test_gemm_float4_fetches runs every tile shape and layout with float4 fetches and stores.
# The float4 switches of A, B and C are separate code (each operand's fetch, the store), so covering each of them on
# and off with every tile and layout covers what their mixes would: a mix here built 24 more programs per device.
GEMM_CASES = [(1, 1, 1), (3, 31, 33), (65, 17, 129), (130, 129, 31), (33, 201, 65), (3, 17, 2049)]  # last: split-K


@pytest.fixture(params=["device-default", "tiled-small", "tiled-large", "tiled-shallow", "tiled-deep", "tiled-wide",
                        "tiled-thin", "tiled-warp", "block"])
def gemm_variant(request, monkeypatch, dev):
    """Every GEMM kernel shape is checked on every device of its class and on the first of the other class, not only
    the one its tuning would pick."""
    from clnet import tuning
    forced = {"tiled-small": tuning.GEMM_TILED_SMALL, "tiled-large": tuning.GEMM_TILED_LARGE,
              # an 8-deep slice over 128 work-items: another split of the fetches
              "tiled-shallow": dict(kernel="gemm_tiled", TM=32, TN=64, TK=8, WM=4, WN=4),
              "tiled-deep": dict(tuning.GEMM_TILED_SMALL, TK=32, LBUF=1),
              # 8x16 outputs per work-item, 256 columns per tile: no tuning candidate now, but the kernel takes any
              # WM, WN multiples of 4, and this keeps that checked
              "tiled-wide": dict(kernel="gemm_tiled", TM=128, TN=256, TK=8, WM=8, WN=16),
              # 16 rows, 128 work-items: A fetched as scalars even where its layout allows float4s
              "tiled-thin": tuning.GEMM_TILED_THIN,
              # warps of 8 x 4 work-items (WARP_8X4): no tuning candidate, measured by bench/sgemm_variants.py
              "tiled-warp": dict(tuning.GEMM_TILED_LARGE, WARP_8X4=1),
              "block": tuning.GEMM_BLOCK}.get(request.param)
    if forced:
        if (forced["kernel"] == "gemm_tiled") != dev.is_gpu:
            skip_other_class_unless_first(dev, request.param)
        monkeypatch.setattr(tuning, "gemm_config", lambda *args, **kwargs: forced)
    tuning.forget()  # defaults are memoised per shape
    yield request.param
    tuning.forget()


@pytest.mark.parametrize("M,N,K", GEMM_CASES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_layouts(dev, rng, gemm_variant, M, N, K, trans_a, trans_b):
    A = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    B = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    C0 = rng.standard_normal((M, N)).astype(np.float32)
    bias = rng.standard_normal(N).astype(np.float32)
    a = Mat(rs=1, cs=M) if trans_a else Mat(rs=K, cs=1)
    b = Mat(rs=1, cs=K) if trans_b else Mat(rs=N, cs=1)
    C = clnet.tensor(C0, dev)
    gemm.gemm(M, N, K, clnet.tensor(A, dev), a, clnet.tensor(B, dev), b, C, Mat(rs=N, cs=1), alpha=0.5, beta=2.0,
              bias=clnet.tensor(bias, dev), bias_mode=2, relu=True)
    A64 = (A.T if trans_a else A).astype(np.float64)
    B64 = (B.T if trans_b else B).astype(np.float64)
    expected = np.maximum(0.5 * A64 @ B64 + 2.0 * C0 + bias, 0)
    if expected.size >= 16:
        assert_close(C.numpy(), expected, "C", tol=1e-5)
    else:
        # a few outputs can each be a sum whose terms cancel to far below their size (about one full run in five
        # failed a result-relative check): check each against the size of its terms instead
        terms = 0.5 * np.abs(A64) @ np.abs(B64) + 2.0 * np.abs(C0) + np.abs(bias)
        assert_close_to_terms(C.numpy(), expected, terms, "C", tol=1e-6)


# N % 4 = 3 and 1: float4s cross C's and B's last column; the last case runs split-K, its N a multiple of 4 so that the
# slices' dense partial products are stored as float4s too and the slices share the other cases' program
@pytest.mark.parametrize("M,N,K", [(37, 71, 45), (130, 129, 67), (5, 8, 4099)])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("bias_mode", [1, 2])
def test_gemm_float4_fetches(dev, rng, gemm_variant, M, N, K, trans_a, trans_b, bias_mode):
    """Operands whose rows start 16-byte aligned (leading dimensions padded to a multiple of 4, 4 elements of offset)
    are fetched, and C stored, as float4s; the odd sizes leave float4s crossing every edge. NaN padding shows a read
    past K (the result turns NaN) and a write past any edge (the padding does not stay NaN); a read past M or N only
    feeds outputs that are never stored, and is not seen here."""
    def stored(rows, cols, transposed=False):
        """A rows x cols matrix inside a NaN-padded buffer, stored with its columns contiguous or, transposed, its
        rows: (values in float64, buffer, Mat)."""
        r, c = (cols, rows) if transposed else (rows, cols)
        ld = -(-c // 4) * 4 + 4
        buf = np.full(4 + r * ld + 4, np.nan, np.float32)
        x = rng.standard_normal((r, c)).astype(np.float32)
        buf[4:4 + r * ld].reshape(r, ld)[:, :c] = x
        x = x.T if transposed else x
        return x.astype(np.float64), clnet.tensor(buf, dev), Mat(off=4, rs=1, cs=ld) if transposed else \
            Mat(off=4, rs=ld, cs=1)

    A64, A, a = stored(M, K, trans_a)
    B64, B, b = stored(K, N, trans_b)
    C0, C, c = stored(M, N)
    bias = rng.standard_normal(M if bias_mode == 1 else N).astype(np.float32)
    assert gemm._vec_a(a) and gemm._vec_b(b) and gemm._vec_c(c)
    gemm.gemm(M, N, K, A, a, B, b, C, c, alpha=0.5, beta=2.0, bias=clnet.tensor(bias, dev), bias_mode=bias_mode,
              relu=True)
    expected = np.maximum(0.5 * A64 @ B64 + 2.0 * C0 + (bias[:, None] if bias_mode == 1 else bias), 0)
    out = C.numpy()[4:4 + M * c.rs].reshape(M, c.rs)
    assert_close(out[:, :N], expected, "C", tol=1e-5)
    assert np.isnan(out[:, N:]).all() and np.isnan(C.numpy()[:4]).all() and np.isnan(C.numpy()[4 + M * c.rs:]).all()


@pytest.mark.parametrize("field,value", [("off", 2), ("bs", 6), ("rs", 6), ("cs", 6), ("cdiv", 6), ("cso", 6)])
def test_float4_needs_every_step_aligned(field, value):
    """Each layout that takes float4s stops taking them when any one of its steps is not a multiple of 4 elements
    (a wrong 'yes' is a misaligned or non-contiguous float4: PoCL crashes on one)."""
    aligned = {  # (rule, layout): k-fast and m-fast A, k-fast and n-fast B, C; all with a column split, and B
        # k-fast with a row split
        "A k-fast": (gemm._vec_a, Mat(off=4, bs=64, rs=8, cs=1, cdiv=8, cso=16)),
        "A m-fast": (gemm._vec_a, Mat(off=4, bs=64, rs=1, cs=8, cdiv=3, cso=16)),
        "B k-fast": (gemm._vec_b, Mat(off=4, bs=64, rs=1, cs=8, cdiv=3, cso=16)),
        "B k-fast, rows split": (gemm._vec_b, Mat(off=4, bs=64, rs=1, cs=8, cdiv=8, cso=16, split_rows=True)),
        "B n-fast": (gemm._vec_b, Mat(off=4, bs=64, rs=8, cs=1, cdiv=8, cso=16)),
        "C": (gemm._vec_c, Mat(off=4, bs=64, rs=8, cs=1, cdiv=8, cso=16)),
    }
    for name, (rule, mat) in aligned.items():
        assert rule(mat), name
        changed = mat._replace(**{field: value})
        contiguous_step = "cs" if mat.cs == 1 else "rs"
        # the contiguous axis's step stays 1 (a 6 there makes the layout another class); cdiv only counts where the
        # split cuts that axis
        if field == contiguous_step or (field == "cdiv" and (mat.cs == 1) == mat.split_rows):
            continue
        assert not rule(changed), (name, field, value)


def test_gemm_batched_with_split_columns(dev, rng, gemm_variant):
    """C's columns run over (image, pixel) of an NCHW tensor, batched over groups: the convolution layout."""
    G, Mg, K, imgs, P = 2, 3, 5, 3, 7
    A = rng.standard_normal((G, Mg, K)).astype(np.float32)
    B = rng.standard_normal((G, K, imgs * P)).astype(np.float32)
    C = clnet.tensor(np.full((imgs, G * Mg, P), np.nan, np.float32), dev)
    gemm.gemm(Mg, imgs * P, K, clnet.tensor(A, dev), Mat(bs=Mg * K, rs=K, cs=1), clnet.tensor(B, dev),
              Mat(bs=K * imgs * P, rs=imgs * P, cs=1), C, Mat(bs=Mg * P, rs=P, cs=1, cdiv=P, cso=G * Mg * P),
              batch=G)
    prod = np.einsum("gmk,gkn->gmn", A.astype(np.float64), B.astype(np.float64)).reshape(G, Mg, imgs, P)
    expected = prod.transpose(2, 0, 1, 3).reshape(imgs, G * Mg, P)
    assert_close(C.numpy(), expected, "C", tol=1e-5)


def _scatter(x, mat, pad):
    """A (batch, rows, cols) float32 array placed in a NaN-filled buffer (pad more floats after its last element)
    where `mat` says its elements lie: (the buffer, every element's index)."""
    batch, rows, cols = x.shape
    b, r, c = np.meshgrid(np.arange(batch), np.arange(rows), np.arange(cols), indexing="ij")
    if mat.split_rows:
        idx = mat.off + b * mat.bs + (r % mat.cdiv) * mat.rs + (r // mat.cdiv) * mat.cso + c * mat.cs
    else:
        idx = mat.off + b * mat.bs + r * mat.rs + (c % mat.cdiv) * mat.cs + (c // mat.cdiv) * mat.cso
    buf = np.full(idx.max() + 1 + pad, np.nan, np.float32)
    assert len(np.unique(idx)) == idx.size
    buf[idx] = x
    return buf, idx


@pytest.mark.parametrize("P", [3, 13, 20])
@pytest.mark.parametrize("ksplit", [None, 3])
@pytest.mark.parametrize("b_split", ["columns", "rows"])
def test_gemm_split_operands(dev, rng, gemm_variant, P, ksplit, b_split):
    """Every operand split at once, as a convolution's products have them: A's k over (image, pixel) (dy in a weight
    gradient), C's n over (image, pixel) of an NCHW tensor, and B's n likewise, or B's k (rows: x^T in a 1x1 layer's
    weight gradient, gemm_tiled's alone); batched. Planes of 3 pixels wrap several times within one slice of k, 13
    leaves float4s off, 20 takes them (where the tile's split allows); K spans many slices, cut also into 3 split-K
    slices. Checked against float64, and NaN padding around every operand stays."""
    from clnet import tuning
    if b_split == "rows" and gemm_variant in ("block", "device-default" if not gemm.takes_split_rows(dev) else ""):
        pytest.skip("a row split of B is gemm_tiled's alone (gemm_block runs this product)")
    batch, M, imgs_k, imgs_n = 2, 37, 23, 5
    K, N = imgs_k * P, imgs_n * P
    a = Mat(off=4, bs=M * K, rs=P, cs=1, cdiv=P, cso=M * P)  # (imgs_k, M, P) per batch
    if b_split == "rows":
        b = Mat(off=4, bs=K * N, rs=1, cs=P, cdiv=P, cso=N * P, split_rows=True)  # (imgs_k, N, P) per batch
    else:
        b = Mat(off=4, bs=K * N, rs=P, cs=1, cdiv=P, cso=K * P)  # (imgs_n, K, P) per batch
    c = Mat(off=4, bs=M * N, rs=P, cs=1, cdiv=P, cso=M * P)  # (imgs_n, M, P) per batch
    A64 = rng.standard_normal((batch, M, K))
    B64 = rng.standard_normal((batch, K, N))
    C0 = rng.standard_normal((batch, M, N)).astype(np.float32)
    (abuf, _), (bbuf, _) = _scatter(A64.astype(np.float32), a, 4), _scatter(B64.astype(np.float32), b, 4)
    cbuf, cidx = _scatter(C0, c, 4)
    A, B, C = (clnet.tensor(x, dev) for x in (abuf, bbuf, cbuf))
    if ksplit is None:
        gemm.gemm(M, N, K, A, a, B, b, C, c, alpha=0.5, beta=2.0, batch=batch)
    else:
        cfg = tuning.gemm_config(dev, M, N, K, batch)
        gemm._gemm_choice(dev, dict(cfg=cfg, ksplit=ksplit), M, N, K, A, a, B, b, C, c, 0.5, 2.0, batch, None, 0,
                          0, False, "test")
    expected = 0.5 * np.einsum("bmk,bkn->bmn", A64.astype(np.float32).astype(np.float64),
                               B64.astype(np.float32).astype(np.float64)) + 2.0 * C0
    out = C.numpy()
    assert_close(out[cidx], expected, "C", tol=1e-5)
    untouched = np.ones(out.size, bool)
    untouched[cidx] = False
    assert np.isnan(out[untouched]).all()


def test_library_named_differently_by_an_icd_file_is_not_registered_twice(tmp_path, monkeypatch):
    """An ICD file naming the same library by its versioned file counts as registering it (PoCL appeared twice)."""
    vendors, libdir = tmp_path / "vendors", tmp_path / "lib"
    vendors.mkdir()
    libdir.mkdir()
    (libdir / "libpocl.so.2.12.0").write_text("")
    os.symlink(libdir / "libpocl.so.2.12.0", libdir / "libpocl.so.2")
    (vendors / "pocl.icd").write_text(str(libdir / "libpocl.so.2.12.0") + "\n")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(vendors))
    monkeypatch.setattr(device_mod, "LIBRARY_DIRS", (str(libdir),))
    monkeypatch.setattr(device_mod, "_ldconfig_paths", lambda: {})
    monkeypatch.setenv("LD_LIBRARY_PATH", "")
    assert device_mod._find_unregistered_libraries() == (str(vendors), [])


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("ksplit", [1, 3])
@pytest.mark.parametrize("P", [11, 12])
def test_gemm_with_transposed_operands(dev, rng, ta, tb, ksplit, P):
    """The tuner may copy a k-fast operand to a transposed buffer first; with A split over (image, pixel) as dy is in a
    weight gradient, batched over groups, and B stored (N, K). With 12 pixels both are fetched as float4s where they
    are not transposed (the copies, 5 and 37 wide, are not)."""
    from clnet import tuning
    if not dev.is_gpu:  # the GPU-shaped tiles this forces (Intel's runtime built 7 programs, 24 s cold)
        skip_other_class_unless_first(dev, "gemm_tiled with transposed operands")
    G, Mg, imgs, N = 2, 5, 3, 37
    K = imgs * P
    dy = rng.standard_normal((imgs, G * Mg, P)).astype(np.float32)
    Bt = rng.standard_normal((G, N, K)).astype(np.float32)
    C0 = rng.standard_normal((G, Mg, N)).astype(np.float32)
    C = clnet.tensor(C0, dev)
    choice = dict(cfg=dict(tuning.GEMM_TILED_SMALL, TK=32, LBUF=1), ksplit=ksplit, ta=ta, tb=tb)
    a, b = Mat(bs=Mg * P, rs=P, cs=1, cdiv=P, cso=G * Mg * P), Mat(bs=N * K, rs=1, cs=K)
    assert gemm._vec_a(a) == gemm._vec_b(b) == (P % 4 == 0)
    gemm._gemm_choice(dev, choice, Mg, N, K, clnet.tensor(dy, dev), a, clnet.tensor(Bt, dev), b, C,
                      Mat(bs=Mg * N, rs=N, cs=1), 1.0, 1.0, G, None, 0, 0, False, "test")
    A64 = dy.astype(np.float64).reshape(imgs, G, Mg, P).transpose(1, 2, 0, 3).reshape(G, Mg, K)
    expected = np.einsum("gmk,gnk->gmn", A64, Bt.astype(np.float64)) + C0
    assert_close(C.numpy(), expected, "C", tol=1e-5)


def test_argument_sets_are_kept_by_their_bits(dev):
    """Kernels keep clones with arguments set, keyed by value: -0.0 and 0.0, or 2 and 2.0, are different bits."""
    from clnet import kernels
    t = clnet.tensor(np.ones(5, np.float32), dev)
    ops.fill(t, 0.0)
    ops.fill(t, -0.0)
    assert np.signbit(t.numpy()).all()
    assert kernels._key_arg(2) != kernels._key_arg(2.0) and kernels._key_arg(0.0) != kernels._key_arg(-0.0)
    A = clnet.tensor(np.ones((3, 3), np.float32), dev)
    C = clnet.tensor(np.zeros((3, 3), np.float32), dev)
    for alpha in (2, 2.0, 3.0):  # an integer alpha is a float to the kernel too
        gemm.gemm(3, 3, 3, A, Mat(rs=3, cs=1), A, Mat(rs=3, cs=1), C, Mat(rs=3, cs=1), alpha=alpha)
        assert np.all(C.numpy() == 3 * alpha)


def test_argument_sets_go_before_the_buffers_they_name(dev, rng):
    """A kernel's kept argument sets are keyed by their buffers' ids (tensor._Storage.key), so the pool drops every
    set before it releases a buffer: a buffer made later may get a released one's id, and must not find a set that
    names the released memory. Each round's sum reads fresh tensors made after the pool let the last round's go."""
    from clnet.tensor import pool
    released, reused = set(), 0
    for _ in range(6):
        a, b = rng.standard_normal((2, 999)).astype(np.float32)
        x, y = clnet.tensor(a, dev), clnet.tensor(b, dev)
        z = x + y
        keys = {x.storage.key, y.storage.key, z.storage.key}
        reused += len(keys & released)
        assert_close(z.numpy(), a.astype(np.float64) + b, "x + y", tol=1e-6)
        del x, y, z
        pool(dev).release_cached()
        released |= keys
    assert reused, "no buffer got a released one's id: the case this test is for did not happen"


def test_deep_products_stay_accurate(dev, rng, cache_dir):
    """A Linear layer with 32,768 inputs after a ReLU (all inputs >= 0): a plain float32 running sum over k drifts
    (2.4e-6 normwise for 36,864 inputs on PoCL, where NumPy's BLAS gives 3.2e-7); the kernels must sum in stages
    (CPU: per 256-deep slice, then the slices; GPU: split-K), which keeps this at NumPy's level. The default and
    every tuning candidate."""
    from clnet import tuning
    M, N, K = 96, 1024, 32768
    if not dev.is_gpu:
        assert tuning.gemm_default(dev, M, N, K, 1)["ksplit"] == 1  # the one long sum per work-item is what's checked
    A = np.maximum(rng.standard_normal((M, K)), 0).astype(np.float32)
    B = (rng.uniform(-1, 1, (K, N)) / np.sqrt(K)).astype(np.float32)
    expected = A.astype(np.float64) @ B.astype(np.float64)
    a, b, c = Mat(rs=K, cs=1), Mat(rs=N, cs=1), Mat(rs=N, cs=1)
    At, Bt = clnet.tensor(A, dev), clnet.tensor(B, dev)
    for choice in tuning.gemm_candidates(dev, M, N, K, 1, True, False):
        tuning.store(dev, {gemm.gemm_key(M, N, K, 1, a, b, c): choice})
        C = clnet.tensor(np.zeros((M, N), np.float32), dev)
        gemm.gemm(M, N, K, At, a, Bt, b, C, c)
        assert_close(C.numpy(), expected, f"C by {tuning.describe(choice)}", tol=1e-6)


SKINNY_CASES = [(1, 1, 7), (1, 3, 64), (1, 33, 2049), (1, 257, 130), (1, 120, 4100),  # one row: gemv
                (1, 5, 1), (5, 1, 1), (130, 257, 1), (33, 7, 1)]                         # depth one: rank-1


@pytest.mark.parametrize("O,I", [(1, 1), (7, 33), (130, 257), (600, 5)])
@pytest.mark.parametrize("beta,masked,with_db", [(0.0, False, True), (1.0, True, True), (1.0, False, False)])
def test_a_dense_layers_batch_one_backward_is_one_launch_on_gpus(dev, rng, kernel_shape, O, I, beta, masked,
                                                                 with_db):
    """A Linear's backward at batch 1 (input, weight and bias gradients, accumulating or not, through a fused ReLU's
    mask) takes one gemv_rank1 launch on a GPU, with the same bits as the separate gemv and rank-1 launches, and
    matches float64; a CPU keeps gemv_cpu.cl's launches."""
    from clnet import tuning
    x, w, dy = (rng.standard_normal(shape).astype(np.float32) for shape in ((1, I), (O, I), (1, O)))
    mask = rng.standard_normal(O).astype(np.float32)
    mask[:: 3] = 0.0  # a ReLU output of exactly 0 masks too
    dw0, db0 = rng.standard_normal((O, I)).astype(np.float32), rng.standard_normal(O).astype(np.float32)
    tx, tw, tdy, tmask = (clnet.tensor(a, dev) for a in (x, w, dy, mask))

    def backward():
        dw, db = clnet.tensor(dw0, dev), clnet.tensor(db0, dev) if with_db else None
        with launched() as names:
            dx = conv.linear_backward(tx, tw, tdy, dw, db, betas=(beta, beta), relu_y=tmask if masked else None)
        return names, dx.numpy(), dw.numpy(), db.numpy() if with_db else None
    names, dx, dw, db = backward()
    g = dy[0] * (mask > 0) if masked else dy[0]
    g64 = g.astype(np.float64)
    # each element against the size of the terms it sums: a 1 x 1 product plus its old value can cancel to far below
    # them (seed 1609351655: -0.0057 from terms near 1, 2e-6 off relative to the result)
    w64, x64 = w.astype(np.float64), x[0].astype(np.float64)
    assert_close_to_terms(dx[0], g64 @ w64, np.abs(g64) @ np.abs(w64), "dx", 1e-6)
    assert_close_to_terms(dw, np.outer(g64, x64) + beta * dw0, np.outer(np.abs(g64), np.abs(x64)) + beta * np.abs(dw0),
                          "dw", 1e-6)
    if with_db:
        assert_close_to_terms(db, g64 + beta * db0, np.abs(g64) + beta * np.abs(db0), "db", 1e-6)
    if tuning.cpu_shaped(dev):
        assert "gemv_rank1" not in names, names
        return
    assert names == ["gemv_rank1"], names
    assert O * I <= conv.FUSED_BACKWARD_MAX
    # the separate launches the fused one replaces: the rank-1 weight gradient (with the bias gradient) and the gemv
    dw_apart, db_apart = clnet.tensor(dw0, dev), clnet.tensor(db0, dev) if with_db else None
    dx_apart = clnet.tensor(np.zeros((1, I), np.float32), dev)
    with launched() as apart:
        gemm.gemm(O, I, 1, tdy, Mat(rs=1, cs=O), tx, Mat(rs=I, cs=1), dw_apart, Mat(rs=I, cs=1), beta=beta,
                  rowsum=db_apart, rowsum_beta=beta, a_mask=tmask if masked else None)
        gemm.gemm(1, I, O, tdy, Mat(rs=O, cs=1), tw, Mat(rs=I, cs=1), dx_apart, Mat(rs=I, cs=1),
                  a_mask=tmask if masked else None)
    assert apart == ["gemm_rank1", "gemv" if O > 1 else "gemm_rank1"], apart  # a sum of one term: a rank-1 product
    assert np.array_equal(dx, dx_apart.numpy()) and np.array_equal(dw, dw_apart.numpy())
    if with_db:
        assert np.array_equal(db, db_apart.numpy())


@pytest.mark.parametrize("M,N,K", SKINNY_CASES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("bias_mode,beta,relu", [(2, 0.0, False), (1, 2.0, True), (0, 1.0, False)])
def test_one_row_and_depth_one_products(dev, rng, kernel_shape, M, N, K, trans_a, trans_b, bias_mode, beta, relu):
    """Products of one row (a dense layer's forward and input gradient at batch 1) and of depth one (its weight
    gradient, accumulating) take one launch of gemv.cl in every layout (gemv_cpu.cl's one or two on a CPU), against
    float64, with the epilogue's bias (per row or per column), beta and ReLU; the GPU's work-group reductions run
    here too (kernel_shape)."""
    A = rng.standard_normal((K, M) if trans_a else (M, K)).astype(np.float32)
    B = rng.standard_normal((N, K) if trans_b else (K, N)).astype(np.float32)
    C0 = rng.standard_normal((M, N)).astype(np.float32)
    bias = rng.standard_normal(M if bias_mode == 1 else N).astype(np.float32)
    a = Mat(rs=1, cs=M) if trans_a else Mat(rs=K, cs=1)
    b = Mat(rs=1, cs=K) if trans_b else Mat(rs=N, cs=1)
    C = clnet.tensor(C0, dev)
    tA, tB, tbias = clnet.tensor(A, dev), clnet.tensor(B, dev), clnet.tensor(bias, dev)
    with launched() as names:
        gemm.gemm(M, N, K, tA, a, tB, b, C, Mat(rs=N, cs=1), alpha=0.5, beta=beta,
                  bias=tbias if bias_mode else None, bias_mode=bias_mode, relu=relu)
    from clnet import tuning
    if not tuning.cpu_shaped(dev):
        assert names == ["gemv" if M == 1 and K > 1 else "gemm_rank1"], names
    else:  # gemv_cpu.cl: B's rows as dot products where its k stride is 1, else as partial rows and their sum
        assert names == (["rank1_rows"] if K == 1 else ["gemv_dot"] if b.rs == 1 else ["gemv_axpy", "gemv_sum"]), names
    A64, B64 = (A.T if trans_a else A).astype(np.float64), (B.T if trans_b else B).astype(np.float64)
    b64 = (bias[:, None] if bias_mode == 1 else bias[None, :]) if bias_mode else 0.0
    expected = 0.5 * A64 @ B64 + beta * C0 + b64
    if relu:
        expected = np.maximum(expected, 0)
    terms = 0.5 * np.abs(A64) @ np.abs(B64) + abs(beta) * np.abs(C0) + np.abs(b64)
    assert_close_to_terms(C.numpy(), expected, terms, "C", tol=1e-6)


def test_a_large_dense_layers_batch_one_backward_keeps_its_separate_launches(dev, rng, kernel_shape, monkeypatch):
    """Above conv.FUSED_BACKWARD_MAX weights a GPU runs the rank-1 weight gradient and the gemv apart (the fused
    launch's few work-groups write a large gradient slowly); results as float64."""
    from clnet import tuning
    monkeypatch.setattr(conv, "FUSED_BACKWARD_MAX", 7 * 33 - 1)
    O, I = 7, 33
    x, w, dy = (rng.standard_normal(shape).astype(np.float32) for shape in ((1, I), (O, I), (1, O)))
    dw, db = clnet.tensor(np.zeros((O, I), np.float32), dev), clnet.tensor(np.zeros(O, np.float32), dev)
    with launched() as names:
        dx = conv.linear_backward(clnet.tensor(x, dev), clnet.tensor(w, dev), clnet.tensor(dy, dev), dw, db,
                                  betas=(0.0, 0.0))
    assert "gemv_rank1" not in names, names
    if not tuning.cpu_shaped(dev):
        assert names == ["gemm_rank1", "gemv"], names
    g64 = dy[0].astype(np.float64)
    assert_close(dx.numpy()[0], g64 @ w.astype(np.float64), "dx", tol=1e-6)
    assert_close(dw.numpy(), np.outer(g64, x[0]), "dw", tol=1e-6)
    assert_close(db.numpy(), g64, "db", tol=1e-6)
