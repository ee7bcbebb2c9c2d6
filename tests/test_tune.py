"""The autotuner: winners land in the cache under this device's key, later runs use them, results stay right."""
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

import clnet
from clnet import conv, nn, tune, tuning
from clnet.cli import main
from clnet.gemm import Mat, _gemm_choice, _transposed, gemm, gemm_key

import reference as ref
from conftest import assert_close


def small_model():
    # A 3x3 convolution with enough channels for Winograd (an algorithm choice) and products with split-K choices.
    return nn.Sequential(nn.Conv2d(16, 17, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(17 * 5 * 6, 3))


def test_tune_stores_winners_that_later_runs_use(dev, rng, cache_dir):
    clnet.manual_seed(0)
    model = small_model()
    report = tune.tune_module(model, (2, 16, 5, 6), dev, repeats=1)
    assert report["tuned"] and not report["left"]
    assert any(k.startswith("conv2d_fwd") for k in report["tuned"])  # the algorithm was timed, not only products
    stored = json.loads((cache_dir / f"tuning-v{tuning.CACHE_VERSION}.json").read_text())
    mine = stored[tuning.device_key(dev)]
    assert set(report["tuned"]) <= set(mine)
    # A fresh process (forget) reads the file back and every op takes the stored choice.
    tuning.forget()
    tuning.used = used = {}
    try:
        x = rng.standard_normal((2, 16, 5, 6)).astype(np.float32)
        y = model(clnet.tensor(x, dev)).numpy()
    finally:
        tuning.used = None
    ran = {k: v for per_tag in used.values() for k, v in per_tag.items()}
    both = set(mine) & set(ran)  # the forward's sites ran (this check runs no backward)
    assert any(k.startswith("conv2d_fwd") for k in both) and any(k.startswith("gemm") for k in both), ran
    for key in both:
        assert ran[key] == tuning.describe(mine[key])
    # and the tuned network still computes the right thing
    conv, lin = model[0], model[3]
    h = np.maximum(ref.conv2d(x, conv.weight.numpy(), conv.bias.numpy(), (1, 1), (1, 1), (2, 2), (1, 1), 1), 0)
    expected = h.reshape(2, -1) @ lin.weight.numpy().astype(np.float64).T + lin.bias.numpy()
    assert_close(y, expected, "tuned forward", tol=1e-5)
    # second run: everything is cached, nothing is timed again
    again = tune.tune_module(model, (2, 16, 5, 6), dev, repeats=1)
    assert not again["tuned"] and again["cached"] == again["sites"]


def test_budget_leaves_the_rest_at_defaults(dev, cache_dir):
    clnet.manual_seed(0)
    report = tune.tune_module(small_model(), (1, 16, 5, 6), dev, budget_s=0.0)
    assert not report["tuned"] and report["left"]
    assert tuning.entries(dev) == {}


@pytest.mark.parametrize("M,N,K", [(20, 25, 9216), (100, 100, 65536), (64, 108, 200704), (512, 512, 300),
                                   (64, 576, 586),  # slices rounded up to a tile depth
                                   (96, 1024, 32768)])  # one slice on a CPU: only staged sums may run it
def test_no_candidate_sums_longer_runs_than_the_default(dev, M, N, K):
    """No candidate may make longer float32 running sums than the default (tuning.run_length: a slice of K, or a
    stage of gemm_block's two-level sum), whatever its tile shape (smaller tiles fill the device with fewer slices)."""
    default = tuning.gemm_default(dev, M, N, K, 1)
    candidates = tuning.gemm_candidates(dev, M, N, K, 1, True, True)
    assert candidates[0] == default
    for c in candidates:
        # the slices as the launch cuts them (rounded up to whole tile depths)
        assert tuning.run_length(c["cfg"], K, c["ksplit"]) <= tuning.run_length(default["cfg"], K, default["ksplit"]), c
        assert tuning.valid_gemm(dev, c, M, N, K, 1, False)


def test_a_cached_choice_is_what_runs(dev, rng, cache_dir):
    """An entry written for a product is the one the product uses (and it computes the right thing)."""
    M, N, K = 33, 65, 17
    a, b, c = Mat(rs=K, cs=1), Mat(rs=N, cs=1), Mat(rs=N, cs=1)
    key = gemm_key(M, N, K, 1, a, b, c)
    default = tuning.gemm_default(dev, M, N, K, 1)
    other = next(x for x in tuning.gemm_candidates(dev, M, N, K, 1) if x["cfg"] != default["cfg"])
    tuning.store(dev, {key: other})
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C = clnet.tensor(np.zeros((M, N), np.float32), dev)
    tuning.used = used = {}
    try:
        gemm(M, N, K, clnet.tensor(A, dev), a, clnet.tensor(B, dev), b, C, c)
    finally:
        tuning.used = None
    assert used[None][key] == tuning.describe(other) != tuning.describe(default)
    assert_close(C.numpy(), A.astype(np.float64) @ B, "C", tol=1e-5)


def test_memoised_choices_give_way_to_entries_stored_later(dev, rng, cache_dir, monkeypatch):
    """Products and convolutions remember their choice per shape (no tuner or benchmark watching: the common path),
    and an entry stored afterwards is what the next call runs: a product's tile shape, a convolution's algorithm."""
    import clnet.gemm as gemm_module
    from conftest import launched
    M, N, K = 33, 65, 17
    a, b, c = Mat(rs=K, cs=1), Mat(rs=N, cs=1), Mat(rs=N, cs=1)
    default = tuning.gemm_default(dev, M, N, K, 1)
    other = next(x for x in tuning.gemm_candidates(dev, M, N, K, 1) if x["cfg"] != default["cfg"])
    ran, inner = [], gemm_module._gemm
    monkeypatch.setattr(gemm_module, "_gemm", lambda dev, cfg, *rest: (ran.append(cfg), inner(dev, cfg, *rest)))
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    for want in (default, default, other):
        if want is other:
            tuning.store(dev, {gemm_key(M, N, K, 1, a, b, c): other})
        C = clnet.tensor(np.zeros((M, N), np.float32), dev)
        gemm(M, N, K, clnet.tensor(A, dev), a, clnet.tensor(B, dev), b, C, c)
        assert ran[-1] == want["cfg"]
        assert_close(C.numpy(), A.astype(np.float64) @ B, "C", tol=1e-5)
    layer = nn.Conv2d(16, 17, 3, padding=1).to(dev)
    x = clnet.tensor(rng.standard_normal((2, 16, 9, 10)).astype(np.float32), dev)
    key = conv._conv_key("conv2d_fwd", layer.conv_shape(x.shape))
    for algorithm in ("im2col", "winograd"):
        tuning.store(dev, {key: algorithm})
        with launched() as names:
            layer(x)
        assert any(n.startswith("winograd") for n in names) == (algorithm == "winograd"), (algorithm, names)


def test_invalid_cached_entries_fall_back_to_the_default_with_a_warning(dev, cache_dir):
    M, N, K = 8, 8, 4096
    a = b = c = Mat(rs=8, cs=1)
    key = gemm_key(M, N, K, 1, a, b, c)
    default = tuning.gemm_default(dev, M, N, K, 1)
    # a misspelt kernel, a missing split, a split of 0, and a real tile whose running sums are longer than the
    # default's (GPU: the default tile with fewer slices; CPU: a tile without staged sums)
    longest = tuning.run_length(default["cfg"], K, default["ksplit"])
    longer = next(dict(cfg=cfg, ksplit=ks) for cfg in tuning.GEMM_CANDIDATES[tuning.device_class(dev)]
                  for ks in (1, max(1, default["ksplit"] // 2)) if tuning.run_length(cfg, K, ks) > longest)
    bad = [dict(cfg=dict(kernel="gemm_blocked"), ksplit=1), dict(cfg=default["cfg"]),
           dict(cfg=default["cfg"], ksplit=0), longer]
    for entry in bad:
        tuning.store(dev, {key: entry})
        with pytest.warns(UserWarning, match="ignoring the tuning cache"):
            choice = tuning.choose(dev, key, lambda: default, valid=lambda x: tuning.valid_gemm(dev, x, M, N, K, 1,
                                                                                                False))
        assert choice == default


def test_an_unwritable_cache_warns_and_keeps_the_choices_in_memory(dev, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("CLNET_CACHE_DIR", str(blocker / "sub"))  # a folder below a file cannot be made
    tuning.forget()
    try:
        with pytest.warns(UserWarning, match="cannot write the tuning cache"):
            tuning.store(dev, {"k": "im2col"})
        assert tuning.entries(dev)["k"] == "im2col"
    finally:
        tuning.forget()


@pytest.mark.parametrize("text", ["{not json", "[]", '{"a device": []}'])
def test_damaged_cache_is_set_aside_with_a_warning(dev, cache_dir, text):
    path = cache_dir / f"tuning-v{tuning.CACHE_VERSION}.json"
    path.write_text(text)
    with pytest.warns(UserWarning, match="moved to .*damaged"):
        assert tuning.entries(dev) == {}
    aside, = cache_dir.glob("*.damaged-*")
    assert aside.read_text() == text and not path.exists()
    tuning.store(dev, {"k": "im2col"})  # and tuning carries on with a fresh file
    tuning.forget()
    assert tuning.entries(dev) == {"k": "im2col"}


def test_processes_tuning_at_once_keep_every_entry(dev, cache_dir):
    """Two processes storing 300 keys each, one at a time, into one cache: all 600 are in the file afterwards."""
    import subprocess
    import sys
    script = ("import sys, clnet; from clnet import tuning; dev = clnet.device(int(sys.argv[1]))\n"
              "for i in range(300): tuning.store(dev, {f'{sys.argv[2]} {i}': 'im2col'})")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(dev.index), name]) for name in ("a", "b")]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    tuning.forget()
    keys = set(tuning.entries(dev))
    assert {f"{n} {i}" for n in "ab" for i in range(300)} <= keys


def test_cli_tune_reports_and_rejects_unknown_models(cache_dir):
    r = CliRunner().invoke(main, ["tune", "lenet", "--device", "cpu", "--batch", "2", "--budget", "0"])
    assert r.exit_code == 0, r.output
    assert "left at their defaults" in r.output
    r = CliRunner().invoke(main, ["tune", "resnet-1000", "--device", "cpu"])
    assert r.exit_code != 0 and "unknown model" in r.output


def test_public_autotune_uses_the_models_device(dev, cache_dir):
    model = nn.Sequential(nn.Linear(300, 7)).to(dev)
    before = model[0].weight.numpy()
    report = clnet.autotune(model, (5, 300))
    assert report["device"] == tuning.device_key(dev) and report["sites"] >= 1
    np.testing.assert_array_equal(model[0].weight.numpy(), before)  # weights untouched


def test_tuning_leaves_the_models_state_as_it_found_it(dev, cache_dir):
    """The recorded training iteration moves batch norm's running statistics; tuning puts every buffer back."""
    clnet.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).to(dev)
    before = model.state_dict()
    clnet.autotune(model, (2, 3, 6, 6))
    after = model.state_dict()
    assert list(after) == list(before)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


def test_autotune_accepts_any_output_and_refuses_another_device(dev, cache_dir):
    """No loss is involved: a feature extractor (4-D output) tunes too; a model elsewhere is not moved."""
    features = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).to(dev)
    assert clnet.autotune(features, (2, 3, 6, 6))["sites"] >= 1
    others = [d for d in clnet.list_devices() if d["usable"] and clnet.device(d["index"]) is not dev]
    if others:
        with pytest.raises(ValueError, match="move it"):
            clnet.autotune(features, (2, 3, 6, 6), device=clnet.device(others[0]["index"]))


@pytest.mark.parametrize("k,fwd,wgt,data", [
    (3, "winograd", "winograd", "winograd"), (3, "im2col", "winograd", "im2col"), (3, "winograd", "im2col", "winograd"),
    (3, "im2col", "im2col", "winograd"), (3, "direct", "im2col", "im2col"), (3, "direct", "winograd", "winograd"),
    (3, "winograd4", "winograd", "winograd4"), (3, "im2col", "winograd4", "im2col"),
    (5, "winograd", "winograd", "winograd"), (5, "direct", "winograd", "im2col")])
def test_every_mix_of_convolution_algorithms_is_right(dev, rng, cache_dir, monkeypatch, k, fwd, wgt, data):
    """Forward, weight gradient and data gradient choose their algorithms separately (from the cache here)."""
    monkeypatch.setattr(tuning, "allow_less_accurate", True)  # F(4x4, 3x3) is among them
    layer = nn.Conv2d(16, 17, k, padding=(k // 2, k // 2 + 1)).to(dev)
    x = rng.standard_normal((2, 16, 7, 6)).astype(np.float32)
    s = layer.conv_shape(x.shape)
    tuning.store(dev, {conv._conv_key("conv2d_fwd", s): fwd, conv._conv_key("conv2d_bwd_weights", s): wgt,
                       conv._conv_key("conv2d_bwd_data", s): data})
    tuning.used = used = {}
    try:
        xt = clnet.tensor(x, dev, requires_grad=True)
        y = layer(xt)
        dy = rng.standard_normal(y.shape).astype(np.float32)
        y.backward(clnet.tensor(dy, dev))
        dx = xt.grad
    finally:
        tuning.used = None
    ran = {k.split()[0]: v for per_tag in used.values() for k, v in per_tag.items() if not k.startswith("gemm")}
    assert ran == {"conv2d_fwd": fwd, "conv2d_bwd_weights": wgt, "conv2d_bwd_data": data}
    ry, rdx, rdw, rdb = ref.conv2d(x, layer.weight.numpy(), layer.bias.numpy(), (1, 1), (k // 2, k // 2 + 1),
                                   (k // 2 * 2, k // 2 * 2 + 2), (1, 1), 1, dy)
    assert_close(y.numpy(), ry, "y", tol=1e-5)
    assert_close(dx.numpy(), rdx, "dx", tol=1e-5)
    assert_close(layer.weight.grad.numpy(), rdw, "dw", tol=1e-5)
    assert_close(layer.bias.grad.numpy(), rdb, "db", tol=1e-5)


def test_less_accurate_algorithms_need_consent(dev, rng, cache_dir, monkeypatch):
    """F(4x4, 3x3) (4-5x F(2x2, 3x3)'s float32 error) is neither tried by the tuner nor taken from the cache unless
    tuning.allow_less_accurate is set (`--less-accurate`)."""
    layer = nn.Conv2d(16, 17, 3, padding=1).to(dev)
    x = clnet.tensor(rng.standard_normal((2, 16, 8, 8)).astype(np.float32), dev)
    key = conv._conv_key("conv2d_fwd", layer.conv_shape(x.shape))

    def offered():  # the forward's candidates, as the tuner records them
        sites = tune.record(lambda: layer(x))
        return list(sites[key][0])
    assert "winograd4" not in offered()
    monkeypatch.setattr(tuning, "allow_less_accurate", True)
    assert "winograd4" in offered()
    tuning.store(dev, {key: "winograd4"})
    monkeypatch.setattr(tuning, "allow_less_accurate", False)
    tuning.forget()
    tuning.used = used = {}
    try:
        with pytest.warns(UserWarning, match="less accurate than the default"):
            layer(x)
    finally:
        tuning.used = None
    ran = [v for per_tag in used.values() for k, v in per_tag.items() if k == key]
    assert ran and "winograd4" not in ran


@pytest.mark.parametrize("max_items", [1024, 256, 128, 64])
def test_gpus_with_small_work_groups_get_kernels_that_fit(dev, rng, monkeypatch, max_items):
    """A GPU whose work-groups hold fewer work-items than a tile needs gets a GEMM default that fits (the CPU-shaped
    kernel below 256), and transposed copies in blocks that fit; the products stay right (run here on this device
    with its limit lowered)."""
    monkeypatch.setattr(dev, "max_work_group_size", min(max_items, dev.max_work_group_size))
    monkeypatch.setattr(dev, "is_gpu", True)
    tuning.forget()
    M, N, K = 70, 37, 45
    default = tuning.gemm_default(dev, M, N, K, 1)
    assert tuning.fits(dev, default["cfg"])
    assert (default["cfg"]["kernel"] == "gemm_block") == (dev.max_work_group_size < 256)
    assert tuning.valid_gemm(dev, default, M, N, K, 1, False)  # a tuned cache may keep the default
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C = clnet.tensor(np.zeros((M, N), np.float32), dev)
    gemm(M, N, K, clnet.tensor(A, dev), Mat(rs=K, cs=1), clnet.tensor(B, dev), Mat(rs=N, cs=1), C, Mat(rs=N, cs=1))
    assert_close(C.numpy(), A.astype(np.float64) @ B, "C", tol=1e-5)
    At = _transposed(dev, clnet.tensor(A, dev), Mat(rs=K, cs=1), M, K, 1)
    assert np.array_equal(At.numpy().reshape(K, M), A.T)
    tuning.forget()


# ---- a candidate's launches count against it ---------------------------------------------------------------------

@pytest.mark.parametrize("saved_launches", [1.5, 2.5])
def test_a_candidate_pays_the_hosts_cost_for_each_launch(dev, rng, cache_dir, monkeypatch, saved_launches):
    """Two candidates with the same result, one launch against three: the three-launch one is faster on the device
    by saved_launches launches' host cost (tuning.LAUNCH_COST_MS). It wins only when that pays for its two extra
    launches."""
    x = clnet.tensor(rng.standard_normal(1000).astype(np.float32), dev)
    cost = tuning.launch_cost_ms(dev)
    device_time = {"1": 1.0, "3": 1.0 - saved_launches * cost}
    ran = []

    def run(choice):
        ran.append(choice)
        launches = int(choice)
        with clnet.no_grad():
            y = x * 1.0
            for _ in range(launches - 1):
                y = y * 1.0
        return y

    def device_ms(dev, fn, repeats=1):
        fn()
        return device_time[ran[-1]]
    monkeypatch.setattr(tune.kernels, "device_ms", device_ms)
    report = tune.tune_sites(dev, {"test site": (["1", "3"], run)}, repeats=1)
    want = "3" if saved_launches > 2 else "1"
    assert report["tuned"]["test site"]["choice"] == want, report
    assert report["tuned"]["test site"]["ms"] == pytest.approx(device_time[want] + int(want) * cost)


# ---- every candidate's output is checked against the default's before it is timed --------------------------------

def _fastest(monkeypatch, victim, ran):
    """Times every run at 1 ms except the victim's, at 0.001 ms: without the check, the victim would be stored."""
    def device_ms(dev, fn, repeats=1):
        fn()
        return 0.001 if ran[-1] == victim else 1.0
    monkeypatch.setattr(tune.kernels, "device_ms", device_ms)


CORRUPTIONS = {  # how a miscompiled candidate might be wrong
    "off by 0.1%": lambda y: y * 1.001,
    "one element": lambda y: np.where(np.arange(y.size).reshape(y.shape) == y.size // 2, y + np.abs(y).max(), y),
    "NaN": lambda y: np.where(np.arange(y.size).reshape(y.shape) == 0, np.nan, y),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_a_candidate_with_wrong_numbers_is_skipped_and_never_stored(dev, rng, cache_dir, monkeypatch, corruption):
    """Fault injection on a recorded convolution: one algorithm's output is corrupted after it runs (as a miscompiled
    kernel's would be) and timed fastest; the tuner reports it, skips it and keeps the default. The real
    algorithms (im2col, Winograd, direct) all pass the same check."""
    layer = nn.Conv2d(16, 17, 3, padding=1).to(dev)
    x = clnet.tensor(rng.standard_normal((2, 16, 8, 8)).astype(np.float32), dev)
    key = conv._conv_key("conv2d_fwd", layer.conv_shape(x.shape))
    candidates, run = tune.record(lambda: layer(x))[key]
    assert len(candidates) >= 3
    victim, ran = candidates[1], []

    def miscompiled(choice):
        ran.append(choice)
        y = run(choice)
        if choice == victim:
            y.write(CORRUPTIONS[corruption](y.numpy()))
        return y
    _fastest(monkeypatch, victim, ran)
    lines = []
    report = tune.tune_sites(dev, {key: (candidates, miscompiled)}, repeats=1, progress=lines.append)
    assert [r["choice"] for r in report["rejected"][key]] == [victim], report["rejected"]
    assert any(f"{victim} disagrees with the default" in line for line in lines), lines
    assert tuning.entries(dev)[key] == candidates[0] and report["tuned"][key]["choice"] == candidates[0]
    tuning.forget()
    assert tuning.entries(dev)[key] == candidates[0]  # on disk too
    assert report["unchecked"] == []


def test_products_that_accumulate_are_checked_from_the_same_start(dev, rng, cache_dir, monkeypatch):
    """A product that adds into C (beta = 1, as a weight gradient adds into .grad) returns C itself: the tuner puts C
    back before each candidate, so the honest candidates agree (each would otherwise add on top of the last), and
    one that computes a wrong product is still caught."""
    M, N, K = 33, 65, 600
    a, b, c = Mat(rs=K, cs=1), Mat(rs=N, cs=1), Mat(rs=N, cs=1)
    A = clnet.tensor(rng.standard_normal((M, K)).astype(np.float32), dev)
    B = clnet.tensor(rng.standard_normal((K, N)).astype(np.float32), dev)
    C = clnet.tensor(rng.standard_normal((M, N)).astype(np.float32), dev)
    candidates = tuning.gemm_candidates(dev, M, N, K, 1)
    assert len(candidates) >= 3
    victim, ran = candidates[-1], []

    def run(choice):
        ran.append(choice)
        # the victim drops the last 8 terms of every sum, as a kernel losing a tail slice of K would
        k = K - 8 if choice == victim else K
        _gemm_choice(dev, choice, M, N, k, A, a, B, b, C, c, 1.0, 1.0, 1, None, 0, 0, False, "test")
        return C
    _fastest(monkeypatch, victim, ran)
    key = gemm_key(M, N, K, 1, a, b, c)
    report = tune.tune_sites(dev, {key: (candidates, run)}, repeats=1)
    assert [r["choice"] for r in report["rejected"][key]] == [tuning.describe(victim)], report["rejected"]
    assert tuning.entries(dev)[key] != victim


def test_one_wrong_element_in_a_large_output_is_caught(dev, cache_dir, monkeypatch):
    """A single element 5% off (a tile edge a kernel gets wrong) hides in a large output's norm (5e-4 here, under the
    1e-3 of a site whose key names no sum length) but not from the worst-element check."""
    base = np.ones(10000, np.float32)
    victim, ran = "wrong-edge", []

    def run(choice):
        ran.append(choice)
        out = base.copy()
        if choice == victim:
            out[-1] = 1.05
        return clnet.tensor(out, dev)
    _fastest(monkeypatch, victim, ran)
    report = tune.tune_sites(dev, {"synthetic site": (["right", victim], run)}, repeats=1)
    rejected, = report["rejected"]["synthetic site"]
    assert rejected["error"] < rejected["tolerance"] < rejected["worst"] and rejected["choice"] == victim
    assert tuning.entries(dev)["synthetic site"] == "right"


def test_the_tolerance_follows_the_length_of_each_sum():
    """The check's tolerance comes from the key: a product's K; a convolution's window per group (forward), its
    window over the output channels per group (data gradient), its images times output pixels (weight gradient)."""
    s = nn.Conv2d(6, 8, (3, 5), padding=1, groups=2).conv_shape((4, 6, 10, 12))
    assert tuning.sum_length(conv._conv_key("conv2d_fwd", s)) == 3 * 15
    assert tuning.sum_length(conv._conv_key("conv2d_bwd_data", s)) == 4 * 15
    assert tuning.sum_length(conv._conv_key("conv2d_bwd_weights", s)) == 4 * s.OH * s.OW
    assert tuning.sum_length(gemm_key(7, 9, 4099, 3, Mat(rs=4099), Mat(rs=9), Mat(rs=9))) == 4099
    assert tuning.sum_length("something else") is None
    assert tuning.agreement_tolerance(gemm_key(7, 9, 45, 1, Mat(rs=45), Mat(rs=9), Mat(rs=9))) == \
        tuning.AGREEMENT_FLOOR
    # ResNet-50's deepest sums (a weight gradient over 64 images of 56x56 pixels) still refuse a result 0.1% off
    deep = tuning.agreement_tolerance(gemm_key(7, 9, 64 * 56 * 56, 1, Mat(rs=64 * 56 * 56), Mat(rs=9), Mat(rs=9)))
    assert tuning.AGREEMENT_FLOOR < deep < 1e-3


def test_tune_first_says_how_many_choices_were_skipped(dev, monkeypatch):
    report = dict(tuned={"k": {}}, cached=0, left=[], seconds=0.5, rejected={"k": [{}, {}]}, unchecked=[])
    monkeypatch.setattr(tune, "tune_module", lambda *args, **kwargs: report)
    said = []
    tune.tune_first(None, (1, 1, 2, 2), dev, True, said.append, budget_s=1.0)
    assert "2 kernel choices skipped: their results disagreed with the default's" in said[0]
    assert "budget" not in said[0]


def test_tune_first_keeps_to_its_budget_and_says_what_it_left(dev, monkeypatch, cache_dir):
    """A first run tunes for a few seconds only; the shapes left keep their defaults, and the line says so."""
    seen = {}

    def tune_module(*args, budget_s, **kwargs):
        seen["budget_s"] = budget_s
        return dict(tuned={}, cached=0, left=["a", "b"], seconds=budget_s, rejected={}, unchecked=[])
    monkeypatch.setattr(tune, "tune_module", tune_module)
    said = []
    tune.tune_first(None, (1, 1, 2, 2), dev, True, said.append)
    assert seen["budget_s"] == tune.FIRST_RUN_BUDGET_S <= 10
    assert "2 left at defaults" in said[0] and "budget ran out: `clnet tune` tunes the rest" in said[0]


def test_a_second_run_does_not_spend_the_first_run_budget_again(dev, monkeypatch, cache_dir):
    """Where the first run's budget left shapes at defaults, the next run of that model and shape starts at once; the
    user's --tune, another shape or another model still tune."""
    calls = []

    def tune_module(model, input_shape, *args, **kwargs):
        calls.append((model, input_shape))
        return dict(tuned={}, cached=0, left=["a"], seconds=1.0, rejected={}, unchecked=[])
    monkeypatch.setattr(tune, "tune_module", tune_module)
    monkeypatch.setattr(dev, "is_gpu", True)  # first runs tune by themselves on GPUs only
    said = []
    for _ in range(2):
        tune.tune_first("model A", (1, 1, 2, 2), dev, None, said.append)
    assert calls == [("model A", (1, 1, 2, 2))] and "an earlier run spent" in said[1]
    mark, = [k for k in tuning.own_entries(dev) if k.startswith(tuning.FIRST_RUN_MARK)]
    tuning.forget()  # a new process reads the mark from the cache file
    tune.tune_first("model A", (1, 1, 2, 2), dev, None, said.append)
    tune.tune_first("model A", (1, 1, 2, 2), dev, True, said.append)
    tune.tune_first("model A", (2, 1, 2, 2), dev, None, said.append)
    tune.tune_first("model B", (1, 1, 2, 2), dev, None, said.append)
    assert calls[1:] == [("model A", (1, 1, 2, 2)), ("model A", (2, 1, 2, 2)), ("model B", (1, 1, 2, 2))]
    # the mark is the user's cache's: one in a shipped table (no shipped table holds any) does not stop tuning
    table = cache_dir / "table.json"
    table.write_text(json.dumps(dict(cache_version=tuning.CACHE_VERSION,
                                     devices={tuning.family_key(tuning.device_key(dev)): {mark: True}})))
    monkeypatch.setattr(tuning, "SHIPPED_TABLE", str(table))
    monkeypatch.setenv("CLNET_CACHE_DIR", str(cache_dir / "fresh"))
    tuning.forget()
    tune.tune_first("model A", (1, 1, 2, 2), dev, None, said.append)
    assert len(calls) == 5


def test_the_shipped_table_holds_no_run_of_anybody(dev):
    """No first-run marks (a run's, not a device's) and only entries of this cache version."""
    with open(tuning.SHIPPED_TABLE) as f:
        table = json.load(f)
    assert table["cache_version"] == tuning.CACHE_VERSION
    marks = [k for found in table["devices"].values() for k in found if k.startswith(tuning.FIRST_RUN_MARK)]
    assert not marks, marks


def test_the_shipped_table_names_only_choices_this_version_offers():
    """Every shipped GEMM entry is a tile the GPUs' tuner offers (with a split-K factor, and transposes as flags), and
    every convolution entry an algorithm the convolutions run: a candidate dropped or renamed without a new
    CACHE_VERSION would leave the table's entries ignored (tuning.choose warns and takes the default) on the very
    devices they were measured on, which CI, having none, would never see."""
    with open(tuning.SHIPPED_TABLE) as f:
        table = json.load(f)
    tiles = [json.dumps(cfg, sort_keys=True) for cfg in tuning.GEMM_CANDIDATES["gpu"]]
    algorithms = {"im2col", "direct", "depthwise", "conv1x1", *conv.WINOGRAD_TILE}
    stale = []
    for family, found in table["devices"].items():
        for key, choice in found.items():
            kind = key.split()[0]
            if kind == "gemm":
                ok = (set(choice) <= {"cfg", "ksplit", "ta", "tb"}
                      and json.dumps(choice["cfg"], sort_keys=True) in tiles
                      and type(choice["ksplit"]) is int and choice["ksplit"] >= 1
                      and all(type(choice.get(t, False)) is bool for t in ("ta", "tb")))
            else:
                ok = kind in ("conv2d_fwd", "conv2d_bwd_data", "conv2d_bwd_weights") and choice in algorithms
            if not ok:
                stale.append(f"{family}: {key}: {choice}")
    assert not stale, "\n".join(stale[:10])


def test_the_shipped_table_fills_what_the_cache_lacks(dev, cache_dir, tmp_path, monkeypatch):
    # The table is keyed by driver family: this device under a later release of the same driver finds its entries.
    later = tuning.device_key(dev).rsplit(" | ", 1)[0] + " | " + dev.driver_version.split(".")[0] + ".999"
    table = tmp_path / "tuning_table.json"
    table.write_text(json.dumps(dict(cache_version=tuning.CACHE_VERSION,
                                     devices={tuning.family_key(later): {"a": "im2col", "b": "winograd"}})))
    monkeypatch.setattr(tuning, "SHIPPED_TABLE", str(table))
    tuning.forget()
    try:
        assert tuning.entries(dev) == {"a": "im2col", "b": "winograd"}
        assert tuning.choose(dev, "a", lambda: "direct") == "im2col"
        tuning.store(dev, {"b": "direct"})  # the user's own tuning wins, and only it is written
        tuning.forget()
        assert tuning.entries(dev) == {"a": "im2col", "b": "direct"}
        on_disk = json.loads((cache_dir / f"tuning-v{tuning.CACHE_VERSION}.json").read_text())
        assert on_disk == {tuning.device_key(dev): {"b": "direct"}}
        # a table of another cache version is not used: its choices may name kernels this version lacks
        table.write_text(json.dumps(dict(cache_version=tuning.CACHE_VERSION - 1,
                                         devices={tuning.family_key(later): {"c": "im2col"}})))
        tuning.forget()
        assert tuning.entries(dev) == {"b": "direct"}
    finally:
        tuning.forget()


def test_the_budget_stops_a_site_between_candidate_builds(dev, cache_dir):
    """Building a site's candidates can take seconds each (alexnet's on a fresh H200: one site took 25 s of a 10 s
    budget): the budget is checked before each build, and a site it stops keeps its default, stored nowhere."""
    import time
    built = []

    def run(choice):
        built.append(choice)
        time.sleep(0.3)
        return clnet.tensor(np.ones(8, np.float32), dev)
    sites = {"first": (["a", "b", "c"], run), "second": (["a", "b"], run)}
    report = tune.tune_sites(dev, sites, budget_s=0.8, repeats=1)
    assert "b" in built and "c" not in built and len(built) <= 4  # the default runs twice, "b" once or twice
    assert report["left"] == ["first", "second"] and not report["tuned"] and tuning.entries(dev) == {}


def test_the_largest_products_are_tuned_first(dev, cache_dir):
    """Products before the other sites, the most multiply-adds first, the others as recorded: a budget that runs out
    has tuned the products that cost a step most."""
    seen = []

    def site(name):
        def run(choice):
            if not seen or seen[-1] != name:
                seen.append(name)
            return clnet.tensor(np.ones(8, np.float32), dev)
        return (["a"], run)
    keys = ["conv2d_fwd late", "gemm 4x4x4x1 Am Bn C", "conv2d_fwd early", "gemm 64x8x8x2 Am Bn C",
            "gemm 16x16x16x1 Am Bn C"]
    tune.tune_sites(dev, {k: site(k) for k in keys}, repeats=1)
    assert seen == ["gemm 64x8x8x2 Am Bn C", "gemm 16x16x16x1 Am Bn C", "gemm 4x4x4x1 Am Bn C", "conv2d_fwd late",
                    "conv2d_fwd early"]


# ---- the cache and the table as files another user, or a careless edit, could shape ----------------------------

def _cache_file(cache_dir):
    return cache_dir / f"tuning-v{tuning.CACHE_VERSION}.json"


def _gemm_site(dev, K=4096):
    M = N = 8
    a = b = c = Mat(rs=8, cs=1)
    return gemm_key(M, N, K, 1, a, b, c), tuning.gemm_default(dev, M, N, K, 1), \
        (lambda x: tuning.valid_gemm(dev, x, M, N, K, 1, False))


def test_a_cached_entry_runs_as_the_tuners_own_candidate(dev, cache_dir):
    """Only values the tuner offers reach a kernel's defines: a choice read back from the file is replaced by the
    candidate it names; one that names none (a split of 10^9, a tile size written 48.0) is ignored with a warning."""
    key, default, valid = _gemm_site(dev)
    candidates = tuning.gemm_candidates(dev, 8, 8, 4096, 1, True, True)
    other = next((x for x in candidates if x != default), default)
    tuning.store(dev, {key: json.loads(json.dumps(other))})
    tuning.forget()  # as a new process: the entry comes from the file
    choice = tuning.choose(dev, key, lambda: default, valid=valid)
    assert choice == other and any(choice["cfg"] is c for c in tuning.GEMM_CANDIDATES[tuning.device_class(dev)])
    as_float = dict(default, cfg={k: float(v) if type(v) is int else v for k, v in default["cfg"].items()})
    for entry in [dict(default, ksplit=10 ** 9), dict(default, ksplit=default["ksplit"] + 1000), as_float,
                  dict(default, ksplit=float(default["ksplit"])), dict(default, ksplit=True) if default["ksplit"] == 1
                  else dict(default, ksplit=-1)]:
        tuning.store(dev, {key: entry})
        tuning.forget()
        with pytest.warns(UserWarning, match="ignoring the tuning cache"):
            choice = tuning.choose(dev, key, lambda: default, valid=valid)
        assert choice is default, entry


@pytest.mark.parametrize("where", ["whole file", "one entry"])
def test_a_deeply_nested_cache_is_set_aside_not_a_crash(dev, cache_dir, where):
    """JSON nested past Python's recursion limit (the C decoder's own), or within it but past what any walk of the
    cache (json.dump's, when the next store rewrites the file) can take: one warning, the file kept aside."""
    depth = 100000 if where == "whole file" else 900
    text = '{"another device": {"k": ' + "[" * depth + "]" * depth + "}}"
    if where == "one entry":
        assert json.loads(text)  # parses: only the shape check catches it
    _cache_file(cache_dir).write_text(text)
    with pytest.warns(UserWarning, match="moved to .*damaged"):
        assert tuning.entries(dev) == {}
    tuning.store(dev, {"k": "im2col"})
    aside, = cache_dir.glob("*.damaged-*")
    assert aside.read_text() == text and json.loads(_cache_file(cache_dir).read_text()) == \
        {tuning.device_key(dev): {"k": "im2col"}}


def test_a_cache_damaged_while_a_run_stores_is_set_aside_not_overwritten(dev, cache_dir):
    """store() rereads the file to merge: a file damaged since the first read keeps its bytes aside, with a warning
    (it used to be replaced silently, losing every other device's entries)."""
    assert tuning.entries(dev) == {}
    _cache_file(cache_dir).write_text('{"another device": {"k": "im2col"}')
    with pytest.warns(UserWarning, match="is not valid JSON.*moved to .*damaged"):
        tuning.store(dev, {"k": "direct"})
    aside, = cache_dir.glob("*.damaged-*")
    assert aside.read_text() == '{"another device": {"k": "im2col"}'


@pytest.mark.parametrize("text,why", [("{not json", "not valid JSON"), ("[" * 100000, "nested too deeply"),
                                      ('{"cache_version": 2, "devices": []}', "clnet's format")],
                         ids=["not-json", "deep", "wrong-shape"])
def test_a_damaged_shipped_table_is_named_not_silently_dropped(dev, cache_dir, tmp_path, monkeypatch, text, why):
    table = tmp_path / "tuning_table.json"
    table.write_text(text)
    monkeypatch.setattr(tuning, "SHIPPED_TABLE", str(table))
    tuning.forget()
    with pytest.warns(UserWarning, match=f"shipped tuning table {table} cannot be used.*{why}"):
        assert tuning.entries(dev) == {}


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_cache_folder_others_can_write_is_neither_read_nor_written(dev, cache_dir, mode):
    """Another user who can write the folder could plant entries, or swap the lock and temporary files for links."""
    planted = {tuning.device_key(dev): {"k": "winograd"}}
    _cache_file(cache_dir).write_text(json.dumps(planted))
    cache_dir.chmod(mode)
    try:
        with pytest.warns(UserWarning, match=f"not read.*{cache_dir}: it can be written by"):
            assert tuning.entries(dev) == {}
        with pytest.warns(UserWarning, match=f"last for this process only.*chmod go-w {cache_dir}"):
            tuning.store(dev, {"k": "im2col"})
        assert tuning.entries(dev) == {"k": "im2col"}  # in memory
        assert json.loads(_cache_file(cache_dir).read_text()) == planted
        assert not (cache_dir / f"tuning-v{tuning.CACHE_VERSION}.json.lock").exists()
    finally:
        cache_dir.chmod(0o700)


def test_a_cache_folder_another_user_owns_is_refused(dev, cache_dir, monkeypatch):
    if os.geteuid() == 0:
        os.chown(cache_dir, 65534, 65534)
    else:  # the process pretends to be someone else: its own folder then belongs to another user
        real = os.geteuid()
        monkeypatch.setattr(os, "geteuid", lambda: real + 1)
    with pytest.warns(UserWarning, match="belongs to user id"):
        tuning.store(dev, {"k": "im2col"})
    monkeypatch.undo()
    assert not _cache_file(cache_dir).exists()


def test_a_link_in_place_of_the_lock_file_is_not_followed(dev, cache_dir, tmp_path):
    """Neither created nor opened at the link's target (root's `clnet tune` used to create any file so named)."""
    target = tmp_path / "created-through-the-link"
    os.symlink(target, cache_dir / f"tuning-v{tuning.CACHE_VERSION}.json.lock")
    with pytest.warns(UserWarning, match="cannot write the tuning cache"):
        tuning.store(dev, {"k": "im2col"})
    assert not target.exists() and not _cache_file(cache_dir).exists()


def test_the_lock_file_is_private(dev, cache_dir):
    """Whoever can open the lock can hold it and stall every tuning run: 0600 (less the umask)."""
    tuning.store(dev, {"k": "im2col"})
    assert os.stat(cache_dir / f"tuning-v{tuning.CACHE_VERSION}.json.lock").st_mode & 0o777 == 0o600
