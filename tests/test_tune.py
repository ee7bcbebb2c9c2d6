"""The autotuner: winners land in the cache under this device's key, later runs use them, results stay right."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

import clnet
from clnet import nn, ops, tune, tuning
from clnet.cli import main

import reference as ref
from conftest import assert_close


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CLNET_CACHE_DIR", str(tmp_path))
    tuning.forget()
    yield tmp_path
    tuning.forget()


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
    for key, description in ran.items():
        if key in mine:
            assert description == tuning.describe(mine[key])
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


def test_tuning_never_shortens_split_k_below_the_default(dev):
    """Fewer K slices than the default means longer float32 sums: the tuner may not trade accuracy for speed."""
    M, N, K = 20, 25, 9216
    default = tuning.gemm_default(dev, M, N, K, 1)
    for c in tuning.gemm_candidates(dev, M, N, K, 1):
        assert c["ksplit"] >= tuning.k_splits(dev, c["cfg"], M, N, K, 1)
    assert tuning.gemm_candidates(dev, M, N, K, 1)[0] == default


def test_unreadable_cache_names_the_file_and_the_fix(dev, cache_dir):
    (cache_dir / f"tuning-v{tuning.CACHE_VERSION}.json").write_text("{not json")
    with pytest.raises(RuntimeError, match="delete it"):
        tuning.entries(dev)


def test_cli_tune_reports_and_rejects_unknown_models(cache_dir):
    r = CliRunner().invoke(main, ["tune", "lenet", "--device", "cpu", "--batch", "2", "--budget", "0"])
    assert r.exit_code == 0, r.output
    assert "left at their defaults" in r.output
    r = CliRunner().invoke(main, ["tune", "resnet-1000", "--device", "cpu"])
    assert r.exit_code != 0 and "unknown model" in r.output


def test_public_autotune_uses_the_models_device(dev, cache_dir):
    model = nn.Sequential(nn.Linear(300, 7)).to(dev)
    report = clnet.autotune(model, (5, 300))
    assert report["device"] == tuning.device_key(dev) and report["sites"] >= 1
