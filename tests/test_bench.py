"""`clnet bench`: runs, reports every field, counts exactly the expected transfers, names its rows by module path, and
compares with PyTorch."""
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner

import clnet
from clnet import bench, kernels, models, nn
from clnet.cli import main

from conftest import HAVE_TORCH, needs_torch, no_launch


def run(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def markdown_table(output):
    """The Markdown table's lines, each split into its cells (an escaped \\| is inside a cell)."""
    lines = [line for line in output.splitlines() if line.startswith("|")]
    return [re.split(r"(?<!\\)\|", line.strip())[1:-1] for line in lines]


def test_bench_lenet_json(tmp_path, dev):
    path = tmp_path / "lenet.json"
    r = run(["bench", "lenet", "--device", str(dev.index), "--batch", "8", "--iterations", "2", "--warmup", "1",
             "--json", str(path)])
    assert r.exit_code == 0, r.output
    assert "images/s" in r.output and "kernel launches per iteration" in r.output
    d = json.loads(path.read_text())
    for key in ("model", "batch", "iterations", "env", "clnet", "layers", "expected_transfer_bytes"):
        assert key in d
    for key in ("device", "platform", "driver", "opencl", "clnet", "date"):
        assert d["env"][key]
    assert set(d["clnet"]["phases"]) == {"forward", "backward", "update"}
    assert all(v > 0 for v in d["clnet"]["phases"].values())
    # one row per module that launched kernels, named by its path in the Sequential (Flatten launches nothing)
    assert [L["path"] for L in d["layers"]] == ["0", "1", "2", "3", "5", "6", "7"]
    first = d["layers"][0]
    assert first["module"] == "Conv2d" and first["input"] == [8, 1, 28, 28] and first["output"] == [8, 20, 24, 24]
    assert first["forward_flop"] == 2 * 8 * 20 * 24 * 24 * 25
    assert first["backward_flop"] == first["forward_flop"]  # fed the batch: the weight gradient only
    assert d["layers"][2]["backward_flop"] == 2 * d["layers"][2]["forward_flop"]
    assert first["clnet_forward_ms"] > 0 and first["clnet_backward_ms"] > 0 and first["clnet_choices"]["forward"]
    assert d["clnet"]["loss_and_update_ms"]["update"] > 0 and d["clnet"]["loss_and_update_ms"]["unattributed"] is None
    t = d["clnet"]["transfers_per_iteration"]
    # The batch is uploaded once, as PyTorch's is: an iteration copies only the 4-byte loss back.
    assert t == dict(host_to_device_bytes=0, host_to_device_count=0, device_to_host_bytes=4, device_to_host_count=1)
    # weights, their gradients and SGD's momentum at least, each 4 bytes a parameter
    parameters = sum(p.size for p in models.build("lenet").state_dict().values())
    memory = d["clnet"]["memory"]
    assert memory["eager_peak_bytes"] >= 3 * 4 * parameters and memory["with_graph_bytes"] >= memory["eager_peak_bytes"]
    assert f"peak device memory of the eager step: clnet {memory['eager_peak_bytes'] / 1e6:.1f} MB" in r.output


def test_bench_list():
    r = run(["bench", "--list"])
    assert r.exit_code == 0
    lines = r.output.splitlines()
    assert len(lines) == len(models.MODELS)  # one line each, however long the model's docstring
    for name, entry in models.MODELS.items():
        assert any(line.startswith(name + " ") and f"batch {entry['batch']:4d}" in line for line in lines), name


def test_bench_unknown_model():
    r = run(["bench", "resnet-9000"])
    assert r.exit_code == 2 and "unknown model" in r.output


def test_compare_cuda_without_cuda_exits_2():
    if HAVE_TORCH:
        import torch
        if torch.cuda.is_available():
            import pytest
            pytest.skip("a CUDA device is present")
    r = run(["bench", "lenet", "--iterations", "1", "--compare", "cuda"])
    assert r.exit_code == 2
    assert ("needs a CUDA device" if HAVE_TORCH else "needs PyTorch, which is not installed") in r.output, r.output
    assert "Traceback" not in r.output


class Twice(nn.Module):
    """A container with an op of its own (the add) around a layer it calls twice."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.head = nn.Sequential(nn.ReLU(), nn.Linear(4, 3))

    def forward(self, x):
        h = self.fc(self.fc(x))
        return self.head(h + x)


def test_module_rows_follow_paths_and_hooks_go_away(dev):
    clnet.manual_seed(0)
    model = Twice()
    described = bench.describe(model, (5, 4), dev)
    assert [m["path"] for m in described] == ["", "fc", "head", "head.0", "head.1"]  # first-call order
    fc = described[1]
    assert fc["calls"] == 2 and fc["forward_flop"] == 2 * (2 * 5 * 4 * 4)
    assert fc["backward_flop"] == 2 * 5 * 4 * 4 + 2 * (2 * 5 * 4 * 4)  # the first call is fed the batch
    assert described[0]["output"] == [5, 3] and not described[0]["leaf"] and described[1]["leaf"]
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    res = bench.run_clnet(model, dev, x, np.array([0, 1, 2, 0, 1], np.int32), 1, 0, False, progress=False)
    rows = {r["path"]: r for r in bench.profile_rows(described, res)}
    assert set(rows) == {"", "fc", "head.0", "head.1"}  # head (a Sequential) launches nothing of its own
    assert "axpby" in rows[""]["clnet_kernel_ms"]["forward"]  # the container's add is in the container's row
    assert rows["fc"]["clnet_forward_ms"] > 0 and rows["fc"]["clnet_backward_ms"] > 0
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert kernels.profiler is None


def test_peak_memory_grows_with_the_batch_as_the_activations(dev):
    """The pool's high-water mark of a step: going from batch 4 to 36 adds at least the largest module output for the
    32 more images and at most a few times all of them (their gradients, the masks, the lowered inputs of the
    convolutions), not what earlier work left cached. Not every output is alive at once: the first convolution's
    goes once the pooling after it has its maximums (the pooling keeps their indices), and the pool's arena hands
    that memory to what comes later."""
    peaks, outputs, largest = {}, {}, {}
    for batch in (4, 36):
        clnet.manual_seed(0)
        model = models.build("lenet")
        described = bench.describe(model, (batch, 1, 28, 28), dev)
        sizes = [int(np.prod(m["output"])) * 4 for m in described if m["leaf"] and m["output"]]
        outputs[batch], largest[batch] = sum(sizes), max(sizes)
        x = np.random.default_rng(batch).standard_normal((batch, 1, 28, 28)).astype(np.float32)
        res = bench.run_clnet(model, dev, x, np.arange(batch, dtype=np.int32) % 10, 1, 1, False, progress=False)
        peaks[batch] = res["memory"]["eager_peak_bytes"]
    grown, counted = peaks[36] - peaks[4], outputs[36] - outputs[4]
    assert largest[36] - largest[4] <= grown <= 6 * counted, (grown, counted)


def test_memory_line_names_each_measure():
    """With PyTorch on a GPU, both sides' peaks, each named by what it measures (figures as --compare cuda fills)."""
    result = dict(clnet=dict(memory=dict(eager_peak_bytes=3_210_000_000, with_graph_bytes=3_300_000_000)),
                  compare=dict(engine="cuDNN", memory=dict(eager_peak_bytes=980_000_000,
                                                           eager_peak_reserved_bytes=1_100_000_000,
                                                           with_graph_reserved_bytes=2_050_000_000)))
    line = bench.memory_line(result)
    assert line.startswith("peak device memory of the eager step: clnet 3.21 GB (its buffer pool's high-water mark")
    assert "3.30 GB with the step captured" in line
    assert "cuDNN 1.10 GB held by PyTorch's caching allocator (torch.cuda.max_memory_reserved" in line
    assert "980.0 MB in tensors at most (max_memory_allocated)" in line and "2.05 GB held with its CUDA graph" in line
    result["compare"]["memory"] = None  # PyTorch on the CPU: no allocator figures
    assert "PyTorch" not in bench.memory_line(result) and "cuDNN" not in bench.memory_line(result)


@needs_torch
def test_agreement_switches_dropout_and_stochastic_depth_off(dev, rng):
    """Two engines draw different dropout masks: the agreement check runs every random layer as identity (batch norm
    still in training mode), in clnet, PyTorch float32 and float64 alike, and puts them back in training mode."""
    import torch
    from clnet.models import modern_blocks

    def net(lib):
        # no bias before the batch norm: its gradient would be 0 up to rounding (the norm takes the mean out), and
        # a relative error of rounding noise means nothing (it failed at 5.5e-5, seed 1384418209)
        return lib.nn.Sequential(lib.nn.Linear(6, 8, bias=False), lib.nn.ReLU(), lib.nn.BatchNorm1d(8),
                                 lib.nn.Dropout(0.5),
                                 modern_blocks(lib)["StochasticDepth"](0.5), lib.nn.Linear(8, 3))
    clnet.manual_seed(0)
    model = net(clnet).to(dev)
    tm = net(torch)
    tm.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in model.state_dict().items()})
    x = rng.standard_normal((16, 6)).astype(np.float32)
    labels = rng.integers(0, 3, 16).astype(np.int32)
    agreement = bench.check_agreement(model, dev, tm, torch.device("cpu"), x, labels)
    assert max(v["clnet_vs_fp64"] for v in agreement.values()) < 1e-5, agreement
    assert max(v["vs_torch"] for v in agreement.values()) < 1e-5, agreement
    assert all(m.training for m in model.modules()) and all(m.training for m in tm.modules())


@pytest.mark.parametrize("batch_first", [True, False])
def test_attention_flops_count_projections_and_both_products(dev, batch_first):
    """An attention of 5 queries over 3 keys (N 2, E 8): q, k, v projections and q k^T and the weights times v, the
    out_proj in its own row."""
    class Cross(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=batch_first)

        def forward(self, x):
            keys = x[:, :3] if batch_first else x[:3]
            return self.attn(x, keys, keys, need_weights=False)[0]
    rows = {m["path"]: m for m in bench.describe(Cross(), (2, 5, 8) if batch_first else (5, 2, 8), dev)}
    n, q, k, e = 2, 5, 3, 8
    assert rows["attn"]["forward_flop"] == 2 * n * q * e * e + 2 * 2 * n * k * e * e + 2 * 2 * n * q * k * e
    assert rows["attn.out_proj"]["forward_flop"] == 2 * n * q * e * e


def test_disagreements_judge_zero_gradients_by_pytorchs_noise():
    """Ordinary quantities: more than the tolerance and twice PyTorch float32's error. A quantity zero by construction
    (PyTorch float32 at 1 or more from float64): more than ten times PyTorch's noise (3.1x was seen on the H200)."""
    def q(clnet, torch):
        return dict(clnet_vs_fp64=clnet, torch_vs_fp64=torch, vs_torch=clnet)
    agreement = {"fine": q(5e-3, 4e-3), "bad": q(5e-3, 1e-4), "small": q(5e-4, 1e-6),
                 "zero noise": q(6e8, 1.9e8), "zero wrong": q(1e17, 2e8)}
    assert set(bench.disagreements(agreement, 1e-3)) == {"bad", "zero wrong"}


@needs_torch
def test_agreement_follows_clnets_relu_decisions_near_the_kink_only(dev, rng):
    """The float64 twin takes clnet's ReLU decisions (a float32 input within rounding of zero can go either way, and
    one flip moves every gradient below it); a decision far from the kink is a wrong ReLU, and check() raises it."""
    import torch
    from clnet.bench import twin as bench_twin
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3)).to(dev)
    state = model.state_dict()
    state["0.weight"][0], state["0.bias"][0] = 0.0, 0.0  # unit 0's input is exactly 0: on the kink
    model.load_state_dict(state)
    x = torch.from_numpy(rng.standard_normal((4, 5))).double()
    for flipped, wrong in [((slice(None), 0), False), (None, True)]:
        t64 = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3)).double()
        t64.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        follow = bench_twin._follow_relu_decisions(model, t64)
        model(clnet.tensor(x.float().numpy(), dev))
        follow.stop_recording()
        seen = follow.seen["1"][0]
        if wrong:  # the largest input, decided the other way
            flipped = np.unravel_index(np.argmax(seen), seen.shape)
            seen[flipped] = -seen[flipped]
        else:  # clnet "rounded" the zeros up: on where float64 is at 0
            seen[flipped] = 1e-9
        t64(x)
        assert follow.flips == (1 if wrong else 4)
        if wrong:
            with pytest.raises(RuntimeError, match="a ReLU computes the wrong side"):
                follow.check()
        else:
            follow.check()


@needs_torch
def test_compare_torch_cpu_agrees(tmp_path, dev):
    path = tmp_path / "cmp.json"
    r = run(["bench", "lenet", "--device", str(dev.index), "--batch", "4", "--iterations", "2", "--warmup", "1",
             "--compare", "torch-cpu", "--json", str(path), "--markdown"])
    assert r.exit_code == 0, r.output
    d = json.loads(path.read_text())
    agreement = d["compare"]["agreement"]
    assert set(agreement) == {"output"} | {f"grad {k}" for k in ("0.weight", "0.bias", "2.weight", "2.bias",
                                                                   "5.weight", "5.bias", "7.weight", "7.bias")}
    assert max(v["clnet_vs_fp64"] for v in agreement.values()) < 1e-4
    assert max(v["vs_torch"] for v in agreement.values()) < 1e-4
    assert d["compare"]["total_ms"] > 0 and np.isfinite(d["compare"]["ratio_time"])
    assert d["compare"]["memory"] is None  # PyTorch's CPU allocator reports no peak
    assert all(L["torch_forward_ms"] is not None for L in d["layers"])  # every row is a leaf
    table = markdown_table(r.output)
    assert table[0][:3] == [" # ", " module ", " type "] and all(len(row) == len(table[0]) for row in table)


@needs_torch
def test_branched_model_rows_and_agreement(tmp_path, dev):
    """ResNet-8 (batch norm, residual adds, a module called twice per block): rows by path, the add in the block's
    row, a Markdown table whose rows all have the header's cells, and clnet within float32's error of PyTorch."""
    path = tmp_path / "resnet8.json"
    r = run(["bench", "resnet8", "--device", str(dev.index), "--batch", "2", "--iterations", "1", "--warmup", "0",
             "--compare", "torch-cpu", "--json", str(path), "--markdown"])
    assert r.exit_code == 0, r.output
    d = json.loads(path.read_text())
    rows = {L["path"]: L for L in d["layers"]}
    assert {"conv1", "layer1.0.conv1", "layer1.0.bn1", "layer2.0.downsample.0", "fc"} <= set(rows)
    block = rows["layer1.0"]
    assert block["module"] == "BasicBlock" and not block["leaf"] and "axpby" in block["clnet_kernel_ms"]["forward"]
    assert block["torch_forward_ms"] is None and rows["layer1.0.conv1"]["torch_forward_ms"] is not None
    assert rows["layer1.0.relu"]["calls"] == 2
    assert rows["layer1.0.conv1"]["forward_flop"] == 2 * 2 * 16 * 28 * 28 * 16 * 9
    table = markdown_table(r.output)
    assert len(table) == len(d["layers"]) + 2 and all(len(row) == len(table[0]) for row in table)
    assert any(row[1].strip() == "layer1.0.conv1" for row in table)
    agreement = d["compare"]["agreement"]
    assert "grad layer1.0.bn1.weight" in agreement and not any("running" in k for k in agreement)
    assert max(v["clnet_vs_fp64"] for v in agreement.values()) < 1e-4
    assert not bench.disagreements(agreement, bench.AGREEMENT_TOLERANCE)


@pytest.mark.parametrize("args, option", [
    (["bench", "lenet", "--batch", "0"], "--batch"),
    (["bench", "lenet", "--batch", "-3"], "--batch"),
    (["bench", "lenet", "--iterations", "0"], "--iterations"),
    (["train", "lenet", "--lr", "-1"], "--lr"),
    (["train", "lenet", "--epochs", "0"], "--epochs"),
    (["train", "lenet", "--momentum", "-0.5"], "--momentum"),
    (["train", "lenet", "--test-subset", "0"], "--test-subset"),
    (["tune", "lenet", "--batch", "0"], "--batch"),
    (["tune", "lenet", "--budget", "-1"], "--budget"),
])
def test_commands_refuse_bad_options_in_one_line(args, option):
    """A misused option is refused where it was typed: exit status 2, a line naming the option, no traceback, no
    device work."""
    with no_launch():
        r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, r.output
    assert f"Invalid value for '{option}'" in r.output and "Traceback" not in r.output, r.output


def test_a_batch_past_the_devices_largest_allocation_is_one_line(dev):
    """`clnet bench lenet --batch 200000` on a CPU: its first activation passes the largest buffer the device
    allocates; one line that says which batch should fit, exit status 1."""
    limit = dev.cl_device.max_mem_alloc_size
    batch = int(limit // (20 * 24 * 24 * 4)) + 1000  # the first convolution's output just past that
    r = CliRunner().invoke(main, ["bench", "lenet", "--batch", str(batch), "--device", str(dev.index),
                                  "--iterations", "1"])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "use a smaller batch" in r.output and "should fit" in r.output, r.output


def test_bench_json_that_cannot_be_written_is_refused_before_the_run(tmp_path, dev):
    """--json under a regular file (what a read-only folder is to a user who is not root) fails before anything is
    timed, in one line, and a write that fails after the run says the figures were printed."""
    (tmp_path / "a-file").write_text("")
    path = tmp_path / "a-file" / "out.json"
    r = run(["bench", "lenet", "--device", str(dev.index), "--batch", "8", "--iterations", "1", "--warmup", "0",
             "--json", str(path)])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.output.strip().splitlines()[-1].startswith(f"Error: --json {path} cannot be written"), r.output
    assert "images/s" not in r.output
