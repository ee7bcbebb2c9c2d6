"""`clnet bench`: time training iterations of a zoo model the way convnet-benchmarks did, optionally beside PyTorch.

Protocol: warm-up iterations first (kernel builds never counted), then N timed iterations. Each phase (forward,
backward, update) is timed by wall clock with the queue finished, and reported as the median. Per-layer times come
from OpenCL profiling events of extra profiled iterations. FLOPs are counted from the shapes.
"""
import datetime
import json
import platform
import statistics
import sys
import time
import warnings

import click
import numpy as np

from . import kernels, models, nn, optim, rng, tuning
from .devices import DeviceNotFound, device as get_device
from .tensor import reset_transfer_stats, tensor, transfer_stats
from .tune import tune_first
from .version import __version__


def layer_flops(layer, in_shape):
    """Forward multiply-adds x 2 for conv and dense layers; backward is twice that (data and weights)."""
    if isinstance(layer, nn.Conv2d):
        s = layer.conv_shape(in_shape)
        return 2 * s.N * s.O * s.OH * s.OW * (s.C // s.G) * s.KH * s.KW
    if isinstance(layer, nn.Linear):
        return 2 * in_shape[0] * layer.in_features * layer.out_features
    return 0


def describe(model, in_shape):
    """(name, input shape, output shape, forward FLOPs) per layer."""
    rows, shape = [], tuple(in_shape)
    for i, layer in enumerate(model):
        out = layer.output_shape(shape)
        rows.append(dict(index=i, layer=repr(layer), input=list(shape), output=list(out),
                         forward_flop=layer_flops(layer, shape), backward_flop=2 * layer_flops(layer, shape)))
        shape = out
    return rows


def _tag(where, phase):
    """Attribute the following launches to `where` in the per-layer profile (the model tags its own layers)."""
    if kernels.profiler is not None:
        kernels.profiler.tag = (where, phase)


class ClnetRunner:
    def __init__(self, model, dev, x, labels):
        # The batch stays on the device, as PyTorch's does in run_torch: both engines time the same work.
        self.model, self.dev = model.to(dev), dev
        self.x, self.labels = tensor(x, dev), tensor(labels, dev)
        self.loss_fn = nn.CrossEntropyLoss()
        self.opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def iteration(self, forward_only=False):
        """One training iteration; returns per-phase wall ms with the queue finished after each phase."""
        q, t = self.dev.queue, {}
        t0 = time.perf_counter()
        out = self.model(self.x)
        _tag("loss", "forward")
        loss = self.loss_fn(out, self.labels)
        q.finish()
        t1 = time.perf_counter()
        t["forward"] = (t1 - t0) * 1e3
        if not forward_only:
            _tag("update", "zero_grad")
            self.opt.zero_grad()
            self.model.backward(self.loss_fn.backward(), input_grad=False)
            q.finish()
            t2 = time.perf_counter()
            _tag("update", "update")
            self.opt.step()
            q.finish()
            t3 = time.perf_counter()
            t["backward"], t["update"] = (t2 - t1) * 1e3, (t3 - t2) * 1e3
        t["loss"] = float(loss)
        return t


def _median_phases(samples, phases):
    return {p: statistics.median(s[p] for s in samples) for p in phases}


def run_clnet(model, dev, x, labels, iterations, warmup, forward_only, progress=True):
    runner = ClnetRunner(model, dev, x, labels)
    phases = ["forward"] if forward_only else ["forward", "backward", "update"]
    t_warmup = time.perf_counter()
    with click.progressbar(range(warmup), label=f"clnet warm-up ({dev.name})", file=sys.stderr,
                           hidden=not progress) as bar:
        for _ in bar:
            runner.iteration(forward_only)
    dev.synchronize()
    warmup_s = time.perf_counter() - t_warmup
    reset_transfer_stats()
    launches = kernels.launch_count
    samples = []
    with click.progressbar(range(iterations), label="clnet timed", file=sys.stderr, hidden=not progress) as bar:
        for _ in bar:
            samples.append(runner.iteration(forward_only))
    launches = (kernels.launch_count - launches) / iterations
    transfers = {k: v / iterations for k, v in transfer_stats().items()}
    # Per-layer kernel times from profiling events, over a few extra iterations.
    prof = kernels.Profiler()
    kernels.profiler = prof
    tuning.used = choices = {}
    profiled = min(iterations, 5)
    try:
        for _ in range(profiled):
            runner.iteration(forward_only)
    finally:
        kernels.profiler = None
        tuning.used = None
    per_layer, per_kernel = {}, {}
    for tag, name, ms in prof.times_ms():
        key = (tag[0], tag[1]) if tag else ("other", "other")
        per_layer.setdefault(key, []).append(ms)
        per_kernel.setdefault(key, {}).setdefault(name, 0.0)
        per_kernel[key][name] += ms / profiled
    layer_ms = {k: sum(v) / profiled for k, v in per_layer.items()}
    return dict(phases=_median_phases(samples, phases), layer_ms=layer_ms, launches_per_iteration=launches,
                transfers_per_iteration=transfers, warmup_s=warmup_s,
                choices={tag: sorted(set(c.values())) for tag, c in choices.items() if tag}, kernel_ms=per_kernel)


# ---- PyTorch side -------------------------------------------------------------------------------------------------

def to_torch(model):
    """The same network as torch.nn.Sequential, built from clnet's own definition, with identical weights."""
    import torch
    tnn = torch.nn
    layers = []
    for layer in model:
        if isinstance(layer, nn.Conv2d):
            layers.append(tnn.Conv2d(layer.in_channels, layer.out_channels, layer.kernel_size, layer.stride,
                                     layer.padding, layer.dilation, layer.groups, layer.bias is not None))
        elif isinstance(layer, nn.Linear):
            layers.append(tnn.Linear(layer.in_features, layer.out_features, layer.bias is not None))
        elif isinstance(layer, nn.MaxPool2d):
            layers.append(tnn.MaxPool2d(layer.kernel_size, layer.stride, layer.padding, ceil_mode=layer.ceil_mode))
        elif isinstance(layer, nn.AvgPool2d):
            layers.append(tnn.AvgPool2d(layer.kernel_size, layer.stride, layer.padding, layer.ceil_mode,
                                        layer.count_include_pad))
        elif isinstance(layer, nn.Flatten):
            layers.append(tnn.Flatten(layer.start_dim, layer.end_dim))
        elif isinstance(layer, nn.Dropout):
            layers.append(tnn.Dropout(layer.p))
        elif isinstance(layer, (nn.ReLU, nn.Sigmoid, nn.Tanh)):
            layers.append({"relu": tnn.ReLU, "sigmoid": tnn.Sigmoid, "tanh": tnn.Tanh}[layer.kind]())
        elif isinstance(layer, (nn.Softmax, nn.LogSoftmax)):
            layers.append((tnn.LogSoftmax if layer.log else tnn.Softmax)(layer.dim))
        else:
            raise TypeError(f"no PyTorch equivalent for {layer!r}")
    tm = tnn.Sequential(*layers)
    tm.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    return tm


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _torch_grads(tm, tdev, x, labels, dtype):
    """PyTorch's output and parameter gradients for one batch, computed in dtype, returned in float64."""
    import torch
    tm.zero_grad()
    out = tm(torch.from_numpy(x).to(tdev, dtype))
    torch.nn.functional.cross_entropy(out, torch.from_numpy(labels.astype(np.int64)).to(tdev)).backward()
    grads = {"output": out.detach().cpu().double().numpy()}
    grads.update({"grad " + k: p.grad.detach().cpu().double().numpy() for k, p in tm.named_parameters()})
    return grads


def check_agreement(model, dev, tm, tdev, x, labels):
    """One forward and backward from the same weights and batch in clnet, in PyTorch float32, and in PyTorch float64.

    Returns, per quantity, the relative error of clnet against PyTorch float32 ('vs_torch'), and of each float32 engine
    against float64 ('clnet_vs_fp64', 'torch_vs_fp64'): a long reduction (the first layer's weight gradient sums
    N*OH*OW terms) legitimately differs between two float32 engines, and float64 says which is closer.
    """
    import copy

    import torch
    loss_fn = nn.CrossEntropyLoss()
    model.zero_grad()
    out = model(tensor(x, dev))
    loss_fn(out, labels)
    model.backward(loss_fn.backward())
    ours = {"output": out.numpy()}
    ours.update({"grad " + k: p.grad.numpy() for k, p in model.named_parameters()})
    t32 = _torch_grads(tm, tdev, x, labels, torch.float32)
    t64 = _torch_grads(copy.deepcopy(tm).double(), tdev, x, labels, torch.float64)
    return {k: dict(vs_torch=_rel_err(ours[k], t32[k]), clnet_vs_fp64=_rel_err(ours[k], t64[k]),
                    torch_vs_fp64=_rel_err(t32[k], t64[k])) for k in ours}


def disagreements(agreement, tolerance):
    """Quantities where clnet is off by more than float32 allows: beyond the tolerance against float64 and also
    clearly worse than PyTorch's own float32 result."""
    return {k: v for k, v in agreement.items()
            if v["clnet_vs_fp64"] > tolerance and v["clnet_vs_fp64"] > 2 * v["torch_vs_fp64"]}


def run_torch(tm, tdev, x, labels, iterations, warmup, forward_only, progress=True):
    """Same protocol in PyTorch: CUDA events on a GPU, wall clock with synchronisation on the CPU."""
    import torch
    cuda = tdev.type == "cuda"
    xt = torch.from_numpy(x).to(tdev)
    yt = torch.from_numpy(labels.astype(np.int64)).to(tdev)
    opt = torch.optim.SGD(tm.parameters(), lr=0.01, momentum=0.9)
    layers = list(tm)
    marks = {}

    def clock():
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def elapsed(a, b):
        return a.elapsed_time(b) if cuda else (b - a) * 1e3

    def sync():
        if cuda:
            torch.cuda.synchronize()

    hooks = []
    for i, m in enumerate(layers):
        hooks.append(m.register_forward_pre_hook(lambda mod, inp, i=i: marks.__setitem__((i, "f0"), clock())))
        hooks.append(m.register_forward_hook(lambda mod, inp, out, i=i: marks.__setitem__((i, "f1"), clock())))
        if not forward_only:
            hooks.append(m.register_full_backward_pre_hook(
                lambda mod, g, i=i: marks.__setitem__((i, "b0"), clock())))
            hooks.append(m.register_full_backward_hook(
                lambda mod, gi, go, i=i: marks.__setitem__((i, "b1"), clock())))

    def iteration(record_layers):
        marks.clear()
        t0 = clock()
        # Neither engine computes d loss / d input in the timed iterations (clnet: input_grad=False). PyTorch's
        # per-layer hooks only fire around the first layer's backward when its input wants a gradient, so the
        # per-layer iterations ask for it: PyTorch's layer-0 backward time in the table includes it, its totals not.
        out = tm(xt.detach().requires_grad_(True) if record_layers else xt)
        loss = torch.nn.functional.cross_entropy(out, yt)
        t1 = clock()
        if forward_only:
            sync()
            return {"forward": elapsed(t0, t1)}, None
        opt.zero_grad()
        with warnings.catch_warnings():  # unrecorded iterations: the hooks' marks are not read, let them misfire
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()
        t2 = clock()
        opt.step()
        t3 = clock()
        sync()
        res = {"forward": elapsed(t0, t1), "backward": elapsed(t1, t2), "update": elapsed(t2, t3)}
        lay = None
        if record_layers:
            lay = {}
            for i in range(len(layers)):
                if (i, "f0") in marks and (i, "f1") in marks:
                    lay[(i, "forward")] = elapsed(marks[(i, "f0")], marks[(i, "f1")])
                if (i, "b0") in marks and (i, "b1") in marks:
                    lay[(i, "backward")] = elapsed(marks[(i, "b0")], marks[(i, "b1")])
        return res, lay

    phases = ["forward"] if forward_only else ["forward", "backward", "update"]
    try:
        with click.progressbar(range(warmup), label=f"PyTorch warm-up ({tdev})", file=sys.stderr,
                               hidden=not progress) as bar:
            for _ in bar:
                iteration(False)
        samples, layer_samples = [], []
        with click.progressbar(range(iterations), label="PyTorch timed", file=sys.stderr, hidden=not progress) as bar:
            for _ in bar:
                s, _ = iteration(False)
                samples.append(s)
        for _ in range(min(iterations, 5)):
            layer_samples.append(iteration(True)[1] or {})
    finally:
        for h in hooks:
            h.remove()
    layer_ms = {}
    for k in (layer_samples[0] if layer_samples else {}):
        layer_ms[k] = statistics.median(ls[k] for ls in layer_samples if k in ls)
    return dict(phases=_median_phases(samples, phases), layer_ms=layer_ms)


# ---- reporting ----------------------------------------------------------------------------------------------------

def _fmt(v, digits=3):
    return "-" if v is None else f"{v:.{digits}f}"


def render_table(result, markdown=False):
    rows = []
    cmp = result.get("compare")
    head = ["#", "layer", "output", "fwd ms", "bwd ms", "fwd GFLOP/s", "bwd GFLOP/s", "kernels fwd | bwd"]
    if cmp:
        head += [f"{cmp['engine']} fwd ms", f"{cmp['engine']} bwd ms"]
    for L in result["layers"]:
        f, b = L["clnet_forward_ms"], L["clnet_backward_ms"]
        gf = L["forward_flop"] / (f * 1e6) if f and L["forward_flop"] else None
        gb = L["backward_flop"] / (b * 1e6) if b and L["backward_flop"] else None
        kinds = " | ".join(", ".join(L.get("clnet_choices", {}).get(p, [])) or "-" for p in ("forward", "backward"))
        row = [str(L["index"]), L["layer"][:48], "x".join(map(str, L["output"][1:])), _fmt(f), _fmt(b),
               _fmt(gf, 0), _fmt(gb, 0), kinds if kinds != "- | -" else "-"]
        if cmp:
            row += [_fmt(L.get("torch_forward_ms")), _fmt(L.get("torch_backward_ms"))]
        rows.append(row)
    c = result["clnet"]["phases"]
    total = sum(c.values())
    lines = []
    if markdown:
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths)))
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
    lines.append("")
    n = result["batch"]
    summary = [f"{result['model']} batch {n}, clnet on {result['env']['device']}: "
               + ", ".join(f"{k} {v:.3f} ms" for k, v in c.items())
               + f"; total {total:.3f} ms; {n / total * 1e3:.0f} images/s; "
               f"{result['clnet']['launches_per_iteration']:.0f} kernel launches per iteration"]
    t = result["clnet"]["transfers_per_iteration"]
    summary.append(f"host<->device per iteration: {t['host_to_device_bytes']:.0f} B up in "
                   f"{t['host_to_device_count']:.0f} copies (the batch stays on the device, as PyTorch's), "
                   f"{t['device_to_host_bytes']:.0f} B down in {t['device_to_host_count']:.0f} copies (the loss)")
    if cmp:
        tp = cmp["phases"]
        ttotal = sum(tp.values())
        summary.append(f"{cmp['engine']}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in tp.items())
                       + f"; total {ttotal:.3f} ms; {n / ttotal * 1e3:.0f} images/s")
        summary.append(f"clnet / {cmp['engine']} time ratio: {total / ttotal:.2f} "
                       f"(clnet speed is {ttotal / total:.2f}x {cmp['engine']}'s)")
        ag = cmp["agreement"]
        worst = max(ag, key=lambda k: ag[k]["clnet_vs_fp64"])
        summary.append(f"agreement: largest relative error against float64 {ag[worst]['clnet_vs_fp64']:.2e} for clnet, "
                       f"{ag[worst]['torch_vs_fp64']:.2e} for PyTorch float32 ({worst}); clnet vs PyTorch float32 "
                       f"at most {max(v['vs_torch'] for v in ag.values()):.2e}; tolerance {cmp['tolerance']:.0e}")
    lines += [("- " if markdown else "") + s for s in summary]
    return "\n".join(lines)


AGREEMENT_TOLERANCE = 1e-3
TUNE_BUDGET_S = 120.0  # first-run tuning inside `clnet bench`; `clnet tune` has its own budget


@click.command()
@click.argument("model", required=False)
@click.option("--device", "device_spec", default="auto", show_default=True, help="auto, gpu, cpu, an index or a name")
@click.option("--batch", type=int, default=None, help="batch size [default: the model's, as convnet-benchmarks]")
@click.option("--iterations", type=int, default=10, show_default=True)
@click.option("--warmup", type=int, default=3, show_default=True)
@click.option("--forward-only", is_flag=True, help="time inference only")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write every figure to this file")
@click.option("--markdown", is_flag=True, help="print the table as Markdown")
@click.option("--compare", type=click.Choice(["cuda", "torch-cpu"]), help="run PyTorch beside clnet")
@click.option("--tf32", is_flag=True, help="with --compare cuda: also time PyTorch with its TF32 defaults")
@click.option("--list", "list_models", is_flag=True, help="list the models and their default batch sizes")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--tune/--no-tune", default=None,
              help="autotune shapes missing from the cache first [default: on GPUs, where it takes seconds]")
@click.option("--less-accurate", is_flag=True,
              help="let the tuner pick algorithms with a larger float32 error than the default's (Winograd "
                   "F(4x4,3x3): 4-5x per layer), as cudnn.benchmark does")
def bench(model, device_spec, batch, iterations, warmup, forward_only, json_path, markdown, compare, tf32,
          list_models, seed, tune, less_accurate):
    """Time training iterations of MODEL (forward, backward, update), layer by layer."""
    if list_models or model is None:
        for name, entry in models.MODELS.items():
            click.echo(f"{name:12s} batch {entry['batch']:4d}  input {'x'.join(map(str, entry['input_shape']))}  "
                       f"{entry['doc']}")
        if model is None and not list_models:
            raise click.UsageError("name a MODEL (see --list)")
        return
    if model not in models.MODELS:
        raise click.BadParameter(f"unknown model {model!r}; known: {', '.join(models.MODELS)}", param_hint="MODEL")
    if iterations < 1 or warmup < 0:
        raise click.BadParameter("--iterations must be at least 1 and --warmup non-negative")
    tdev = None
    if compare:
        try:
            import torch
        except ImportError:
            click.echo(f"clnet bench: --compare {compare} needs PyTorch, which is not installed "
                       "(pip install torch)", err=True)
            sys.exit(2)
        if compare == "cuda":
            if not torch.cuda.is_available():
                click.echo("clnet bench: --compare cuda needs a CUDA device, and PyTorch sees none", err=True)
                sys.exit(2)
            tdev = torch.device("cuda")
            torch.backends.cudnn.benchmark = True
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        else:
            tdev = torch.device("cpu")
    try:
        dev = get_device(device_spec)
    except DeviceNotFound as e:
        raise click.ClickException(str(e))
    entry = models.MODELS[model]
    batch = batch or entry["batch"]
    rng.manual_seed(seed)
    net = models.build(model)
    in_shape = (batch,) + entry["input_shape"]
    layers = describe(net, in_shape)
    data_rng = np.random.default_rng(seed)
    x = data_rng.standard_normal(in_shape).astype(np.float32)
    classes = layers[-1]["output"][1]
    labels = data_rng.integers(0, classes, batch).astype(np.int32)
    click.echo(f"clnet bench {model}: batch {batch}, {iterations} iterations after {warmup} warm-up, on "
               f"{dev.name} ({dev.platform_name}, driver {dev.driver_version})", err=True)
    tuning.allow_less_accurate = less_accurate
    tune_report = tune_first(net, in_shape, dev, tune, TUNE_BUDGET_S, lambda line: click.echo(line, err=True),
                             progress=lambda line: click.echo("tune " + line, err=True))
    builds = kernels.build_count
    cl_res = run_clnet(net, dev, x, labels, iterations, warmup, forward_only, progress=True)
    result = dict(
        model=model, batch=batch, iterations=iterations, warmup=warmup, forward_only=forward_only,
        less_accurate=less_accurate,
        env=dict(device=dev.name, platform=dev.platform_name, driver=dev.driver_version, opencl=dev.version,
                 device_type=dev.kind, compute_units=dev.compute_units, clnet=__version__,
                 python=platform.python_version(), host=platform.node(),
                 date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")),
        clnet=dict(phases=cl_res["phases"], total_ms=sum(cl_res["phases"].values()),
                   launches_per_iteration=cl_res["launches_per_iteration"],
                   transfers_per_iteration=cl_res["transfers_per_iteration"],
                   kernel_builds=kernels.build_count - builds, warmup_s=cl_res["warmup_s"],
                   tuning=tune_report and dict(seconds=tune_report["seconds"], tuned=tune_report["tuned"],
                                               cached=tune_report["cached"], left=tune_report["left"])),
        expected_transfer_bytes=dict(input=0, labels=0, loss=4),
        layers=layers)
    for L in layers:
        L["clnet_choices"] = {p: cl_res["choices"][(L["index"], p)] for p in ("forward", "backward")
                              if (L["index"], p) in cl_res["choices"]}
        L["clnet_kernel_ms"] = {p: cl_res["kernel_ms"][(L["index"], p)] for p in ("forward", "backward")
                                if (L["index"], p) in cl_res["kernel_ms"]}
        L["clnet_forward_ms"] = cl_res["layer_ms"].get((L["index"], "forward"))
        L["clnet_backward_ms"] = cl_res["layer_ms"].get((L["index"], "backward"))
    result["clnet"]["loss_and_update_ms"] = {
        "loss_forward": cl_res["layer_ms"].get(("loss", "forward")),
        "zero_grad": cl_res["layer_ms"].get(("update", "zero_grad")),
        "update": cl_res["layer_ms"].get(("update", "update"))}
    status = 0
    if compare:
        import torch
        # Agreement on fresh weights: both engines start from one new state, untouched by the timed steps above.
        rng.manual_seed(seed + 1)
        fresh = models.build(model).to(dev)
        tm = to_torch(fresh).to(tdev)
        agreement = check_agreement(fresh, dev, tm, tdev, x, labels)
        t_res = run_torch(tm, tdev, x, labels, iterations, warmup, forward_only)
        result["compare"] = dict(engine="cuDNN" if compare == "cuda" else "torch-cpu", torch=torch.__version__,
                                 cudnn=torch.backends.cudnn.version() if compare == "cuda" else None,
                                 torch_device=torch.cuda.get_device_name() if compare == "cuda" else "cpu",
                                 tf32=False, phases=t_res["phases"], total_ms=sum(t_res["phases"].values()),
                                 agreement=agreement, tolerance=AGREEMENT_TOLERANCE,
                                 ratio_time=result["clnet"]["total_ms"] / sum(t_res["phases"].values()))
        if compare == "torch-cpu":
            result["compare"]["threads"] = torch.get_num_threads()
        for L in layers:
            L["torch_forward_ms"] = t_res["layer_ms"].get((L["index"], "forward"))
            L["torch_backward_ms"] = t_res["layer_ms"].get((L["index"], "backward"))
        if tf32 and compare == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            t32 = run_torch(tm, tdev, x, labels, iterations, warmup, forward_only, progress=False)
            result["compare"]["tf32_phases"] = t32["phases"]
            result["compare"]["tf32_total_ms"] = sum(t32["phases"].values())
        if disagreements(agreement, AGREEMENT_TOLERANCE):
            status = 1
    click.echo(render_table(result, markdown))
    if compare and "tf32_total_ms" in result["compare"]:
        click.echo(f"PyTorch with TF32 allowed: total {result['compare']['tf32_total_ms']:.3f} ms")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        click.echo(f"wrote {json_path}", err=True)
    if status:
        for k, v in disagreements(result["compare"]["agreement"], AGREEMENT_TOLERANCE).items():
            click.echo(f"ERROR: clnet disagrees with the float64 reference on {k}: relative error "
                       f"{v['clnet_vs_fp64']:.2e} (PyTorch float32: {v['torch_vs_fp64']:.2e}), tolerance "
                       f"{AGREEMENT_TOLERANCE:.0e}", err=True)
        sys.exit(1)
