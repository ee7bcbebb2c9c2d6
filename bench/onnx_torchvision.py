"""torchvision's classifiers through ONNX into clnet (issue 25's table): each network, with random weights, is exported
at batch 16 by PyTorch's TorchScript exporter in eval and training modes and by its dynamo exporter in eval mode,
loaded by `clnet.onnx.load` on one device and compared with ONNX Runtime (CPU) on the same input.

Phases, in this order, so that a run cut short keeps what matters most:
  ts-eval   every model: load time, largest relative error against ONNX Runtime (max |ours - ort| / max |ort|), the
            eval forward's median time against PyTorch's on --torch-device (TF32 off, cudnn.benchmark on)
  ts-train  the training-mode file (dropout and stochastic depth set to p=0 first, so that both sides are
            deterministic; batch norm with the batch's statistics): its output against ONNX Runtime's, then one step
            (cross-entropy on the first output, backward, SGD, lr 0.01): each parameter's gradient against
            PyTorch's (float64, CPU), max |g - g_pt| / max |g_pt|, and the parameters after the step against
            p - lr * g_pt
  reexport  the eval import written back by `clnet.onnx.export`, run in ONNX Runtime, against the first file's output
  dynamo    the dynamo exporter's eval file: load time and error against ONNX Runtime

Beside each error against ONNX Runtime the record holds PyTorch's own (float32, CPU: `torch_ort_err`), and beside
each gradient error PyTorch float32's distance from float64 by the same measure (`torch32_grad_err`): the yardsticks.
Every file's output is also held against the torchvision model run in float64 on the CPU (`model.double()`, the same
weights and input; batch statistics for the training file), max |x - ref64| / max |ref64|, for ONNX Runtime's output
(`ort_ref64_err`), PyTorch float32's (`torch_ref64_err`) and clnet's (`ref64_err`): where ONNX Runtime itself is
farther than 1e-5 from float64, no engine can be held to 1e-5 against it, and clnet's distance from float64 beside
ONNX Runtime's is the measure.

Exports (and ONNX Runtime's references, and PyTorch's gradients) are made by a pool of worker processes ahead of the
main process, which runs clnet. Each model runs under a time limit (--model-limit) and none starts after --deadline
seconds; each result is a JSON line appended to --out/onnx-torchvision.jsonl as it comes, and the markdown table
(--out/table.md) is rewritten after each.

    python bench/onnx_torchvision.py --device gpu --torch-device cuda --out $OUT            # the H200 run
    python bench/onnx_torchvision.py --family zoo --models lenet,resnet8 --batch 2 --device 0 --torch-device cpu \
        --out /tmp/tv                                                          # a CPU check without torchvision

--family zoo takes the networks from clnet's zoo built in PyTorch (`models.build(name, lib=torch)`), a stand-in where
torchvision is not installed. For a CPU device (PoCL on the H200 machine's cores): --iterations 0 leaves out the timing,
--no-step makes ts-train the training-mode file's forward only (no backward, no PyTorch gradients).

--layers MODEL[,MODEL] instead finds where along a network the engines part from float64: the TorchScript eval file
with every module's output made a graph output (a module's output is its last node's, the node's scope naming the
module), each against the float64 model's output of that module (a forward hook), for ONNX Runtime, PyTorch float32
and clnet; modules whose ONNX tensor is not PyTorch's (a batch norm folded into the convolution before it) are left
out, as are modules that no node names. One line a module in --out/layers.jsonl, the main ones printed.

--shared-relu MODEL[,MODEL] instead asks whether a gradient far from float64 comes from ReLU decisions taken the other
way within float32 rounding of the kink: the training-mode file with every Relu node's input made a graph output, one
step in clnet, and PyTorch's step in float64 twice, plainly and with relu(x) replaced by x * (clnet's input > 0)
(the k-th nn.ReLU call taking the k-th Relu node), and PyTorch float32's beside them; the decisions that differ are
counted, each with its distance from the kink over its call's largest input; then a third float64 step with
clnet's max-pool choices shared too (each window's argmax of clnet's input, the float64 input gathered there). One
line a model in --out/shared-relu.jsonl.
"""
import argparse
import contextlib
import copy
import gc
import io
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

# Issue 25's seventeen, the ones that failed before issue 25 first within each phase
TORCHVISION = ["mobilenet_v3_small", "efficientnet_b0", "regnet_y_400mf", "shufflenet_v2_x1_0", "convnext_tiny",
               "vit_b_16", "resnet18", "mobilenet_v2", "squeezenet1_1", "mnasnet1_0", "googlenet", "alexnet",
               "resnet50", "densenet121", "resnext50_32x4d", "inception_v3", "vgg11_bn"]
# the training phase smallest first (PyTorch's float64 reference step is the slow part of its export)
TRAIN_ORDER = ["mobilenet_v3_small", "shufflenet_v2_x1_0", "squeezenet1_1", "regnet_y_400mf", "mnasnet1_0",
               "mobilenet_v2", "efficientnet_b0", "resnet18", "googlenet", "alexnet", "densenet121", "resnet50",
               "resnext50_32x4d", "inception_v3", "convnext_tiny", "vit_b_16", "vgg11_bn"]
PHASES = ["ts-eval", "ts-train", "reexport", "dynamo"]
LR = 0.01
SEED = 25


# ---- the worker processes: build, export, references ---------------------------------------------------------------

def build(family, name, seed):
    """(PyTorch model with seeded random weights, input shape without the batch, number of classes)."""
    import torch
    torch.manual_seed(seed)
    if family == "zoo":
        from clnet import models
        entry = models.MODELS[name]
        return models.build(name, lib=torch), tuple(entry["input_shape"]), entry["classes"]
    import torchvision
    kw = {}
    if name in ("googlenet", "inception_v3"):  # the auxiliary heads are training-only extra outputs: left out
        kw = dict(aux_logits=False, init_weights=True)
    model = getattr(torchvision.models, name)(weights=None, **kw)
    return model, ((3, 299, 299) if name == "inception_v3" else (3, 224, 224)), 1000


def informative(model, shape, batch, seed):
    """Random weights whose outputs tell engines apart. torchvision initialises some classifier heads to zero
    (vit_b_16's: every logit 0), and with batch norm's stored statistics at their initial 0 and 1 a deep network's
    activations can shrink to nothing in eval mode (googlenet's logits came out as its bias, equal on every engine).
    So: weight matrices that are all zero get normal(0, 0.02) values, and each batch norm's stored statistics are set
    from one batch of other random data (momentum 1 for that forward). Returns the number of tensors changed."""
    import torch
    changed = 0
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and not p.any():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
                changed += 1
        norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        saved = [m.momentum for m in norms]
        for m in norms:
            m.momentum = 1.0
        was = model.training
        model.train()
        model(torch.randn((batch, *shape), generator=gen))
        model.train(was)
        for m, mom in zip(norms, saved):
            m.momentum = mom
    return changed + len(norms)


def no_dropout(model):
    """Dropout and stochastic depth to p=0, so that a training-mode step is deterministic on every engine."""
    changed = 0
    for m in model.modules():
        kind = type(m).__name__
        if ("Dropout" in kind or kind == "StochasticDepth") and isinstance(getattr(m, "p", None), float):
            if m.p:
                changed += 1
            m.p = 0.0
    return changed


def first_output(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def prepare(family, name, phase, batch, folder, threads, step=True):
    """In a worker: export the file for (name, phase) and compute ONNX Runtime's output on a seeded input, the float64
    model's output (ref64) and, for ts-train with step, PyTorch's float64 gradients. Returns a dict of paths and facts,
    or {"error": ...}; never raises."""
    try:
        import torch
        import onnx
        import onnxruntime
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        model, shape, classes = build(family, name, SEED)
        info = dict(input_shape=[batch, *shape], informative=informative(model, shape, batch, SEED))
        training = phase == "ts-train"
        if training:
            info["dropouts_zeroed"] = no_dropout(model)
            model.train()
        else:
            model.eval()
        rng = np.random.default_rng(SEED)
        x = rng.standard_normal((batch, *shape)).astype(np.float32)
        labels = rng.integers(0, classes, batch)
        sub = os.path.join(folder, f"{name}-{phase}")  # one folder a file: the dynamo exporter's external data
        os.makedirs(sub, exist_ok=True)
        path = os.path.join(sub, "model.onnx")
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # the exporters' progress lines
            warnings.simplefilter("ignore")
            if phase == "dynamo":
                torch.onnx.export(model, (torch.from_numpy(x),), path, dynamo=True, input_names=["input"])
            else:
                mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
                torch.onnx.export(model, (torch.from_numpy(x),), path, dynamo=False, training=mode,
                                  do_constant_folding=not training, opset_version=17, input_names=["input"])
        info["export_s"] = round(time.perf_counter() - t0, 2)
        proto = onnx.load(path, load_external_data=False)
        info["opset"] = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=None)
        info["nodes"] = len(proto.graph.node)
        info["ops"] = sorted({n.op_type for n in proto.graph.node})
        del proto
        t1 = time.perf_counter()
        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = threads
        sess = onnxruntime.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        ort = sess.run(None, {sess.get_inputs()[0].name: x})
        info["ort_s"] = round(time.perf_counter() - t1, 2)
        # how much the first output varies across the batch, relative to its size: 0 means a degenerate check
        info["output_spread"] = float(np.abs(ort[0] - ort[0].mean(0)).max() / max(np.abs(ort[0]).max(), 1e-30))
        info["x"] = os.path.join(sub, "x.npy")
        info["ort"] = os.path.join(sub, "ort.npz")
        np.save(info["x"], x)
        np.savez(info["ort"], *ort)
        if not training:
            t2 = time.perf_counter()
            with torch.no_grad():
                out32 = first_output(model(torch.from_numpy(x))).numpy()
                m = copy.deepcopy(model).double().eval()  # the same weights and input in float64
                ref64 = first_output(m(torch.from_numpy(x).double())).numpy()
                del m
            info["torch_ort_err"] = rel_err(out32, ort[0])
            info["ref64_s"] = round(time.perf_counter() - t2, 2)
        if training:  # PyTorch's step in float64 (the reference) and float32 (the yardstick), or only the forward
            t2 = time.perf_counter()
            grads = {}
            for dtype in (torch.float64, torch.float32):  # float32: PyTorch's own distance from the reference
                m = copy.deepcopy(model).to(dtype).train()
                with contextlib.nullcontext() if step else torch.no_grad():
                    out = m(torch.from_numpy(x).to(dtype))
                    first = first_output(out)
                    loss = torch.nn.functional.cross_entropy(first, torch.from_numpy(labels))
                if step:
                    loss.backward()
                    grads[dtype] = {n: p.grad.numpy() for n, p in m.named_parameters() if p.grad is not None}
                if dtype == torch.float32:  # PyTorch's own distance from ONNX Runtime: the yardstick of "err"
                    out32 = first.detach().numpy()
                    info["torch_ort_err"] = rel_err(out32, ort[0])
                if dtype == torch.float64:
                    ref64 = first.detach().numpy()
                    info["torch_loss"] = float(loss.detach())
                    info["torch_params"] = sum(1 for _ in m.parameters())
                del m, out, first, loss
        # every engine's distance from float64: ONNX Runtime's and PyTorch float32's here, clnet's in the main process
        info["ort_ref64_err"] = rel_err(ort[0], ref64)
        info["torch_ref64_err"] = rel_err(out32, ref64)
        info["ref64"] = os.path.join(sub, "ref64.npy")
        np.save(info["ref64"], ref64)
        if training and step:
            ref = grads[torch.float64]
            info["torch32_grad_err"], info["torch32_worst_param"] = grad_err(grads[torch.float32].items(), ref)
            info["grads"] = os.path.join(sub, "grads.npz")
            np.savez(info["grads"], **{k: v.astype(np.float32) for k, v in ref.items()})
        if training:
            info["labels"] = os.path.join(sub, "labels.npy")
            np.save(info["labels"], labels.astype(np.int32))
            info["ref_s"] = round(time.perf_counter() - t2, 2)
        info["path"] = path
        return info
    except Exception as e:  # the main process records it as this model's failure
        return {"error": f"{type(e).__name__}: {str(e).strip()[:600]}",
                "traceback": traceback.format_exc()[-2000:]}


def grad_err(grads, refs):
    """(worst error, its parameter) of (name, gradient) pairs against refs {name: gradient}: each parameter against its
    own largest gradient, floored at 1e-6 of the network's largest (a bias before a batch norm has a gradient that is
    zero but for rounding)."""
    scale = max(float(np.abs(r).max()) for r in refs.values())
    worst, worst_name = 0.0, None
    for k, g in grads:
        ref = np.asarray(refs[k], np.float64)
        e = float(np.abs(np.asarray(g, np.float64) - ref).max() / max(float(np.abs(ref).max()), 1e-6 * scale))
        if e > worst:
            worst, worst_name = e, k
    return worst, worst_name


# ---- the main process: clnet ---------------------------------------------------------------------------------------

class ModelTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise ModelTimeout("the per-model time limit ran out")


def rel_err(ours, ref):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ours.shape != ref.shape:
        raise ValueError(f"output shape {ours.shape}, ONNX Runtime's {ref.shape}")
    return float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))


def outputs_numpy(out):
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def ref64_err(outs, prep):
    """clnet's first output against the float64 model's."""
    return rel_err(outs[0], np.load(prep["ref64"]))


def ort_err(outs, ort_path):
    refs = np.load(ort_path)
    refs = [refs[f"arr_{i}"] for i in range(len(refs.files))]
    if len(outs) != len(refs):
        raise ValueError(f"{len(outs)} outputs, ONNX Runtime gives {len(refs)}")
    return max(rel_err(a, b) for a, b in zip(outs, refs))


def median_ms(fn, warmup, iterations):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iterations):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def torch_ms(args, name, x):
    import torch
    model = build(args.family, name, SEED)[0].eval().to(args.torch_device)
    xt = torch.from_numpy(x).to(args.torch_device)
    sync = torch.cuda.synchronize if args.torch_device.startswith("cuda") else (lambda: None)

    def step():
        with torch.no_grad():
            model(xt)
        sync()
    ms = median_ms(step, args.warmup, args.iterations)
    del model, xt
    if args.torch_device.startswith("cuda"):
        torch.cuda.empty_cache()
    return ms


def run_eval(args, dev, name, prep, rec):
    import clnet
    import clnet.onnx as connx
    from clnet.autograd import no_grad
    t0 = time.perf_counter()
    net = connx.load(prep["path"], device=dev).eval()
    dev.synchronize()
    rec["load_s"] = round(time.perf_counter() - t0, 2)
    x = np.load(prep["x"])
    xd = clnet.tensor(x, dev)
    t1 = time.perf_counter()
    with no_grad():
        outs = outputs_numpy(net(xd))
    rec["first_forward_s"] = round(time.perf_counter() - t1, 2)
    rec["err"] = ort_err(outs, prep["ort"])
    rec["ref64_err"] = ref64_err(outs, prep)
    if rec["phase"] != "ts-eval" or args.iterations == 0:
        return

    def step():
        with no_grad():
            net(xd)
        dev.synchronize()
    rec["clnet_ms"] = round(median_ms(step, args.warmup, args.iterations), 3)
    del net, xd
    gc.collect()
    rec["torch_ms"] = round(torch_ms(args, name, x), 3)
    rec["speed"] = round(rec["torch_ms"] / rec["clnet_ms"], 3)


def run_train(args, dev, name, prep, rec):
    import clnet
    import clnet.onnx as connx
    from clnet import nn, optim
    t0 = time.perf_counter()
    net = connx.load(prep["path"], device=dev)
    dev.synchronize()
    rec["load_s"] = round(time.perf_counter() - t0, 2)
    rec["loads_in_train"] = bool(net.training)
    net.train()
    x, labels = np.load(prep["x"]), np.load(prep["labels"])
    xd, ld = clnet.tensor(x, dev), clnet.tensor(labels, dev)
    params = dict(net.named_parameters())
    before = {k: p.numpy().copy() for k, p in params.items()}
    opt = optim.SGD(list(params.values()), lr=LR)
    opt.zero_grad()
    t1 = time.perf_counter()
    out = net(xd)
    first = out[0] if isinstance(out, tuple) else out
    outs = outputs_numpy(out)
    rec["err"] = ort_err(outs, prep["ort"])
    rec["ref64_err"] = ref64_err(outs, prep)
    loss = nn.CrossEntropyLoss()(first, ld)
    if not args.step:  # the training-mode forward only
        rec["loss"] = float(loss.numpy())
        rec["loss_err"] = abs(rec["loss"] - prep["torch_loss"]) / abs(prep["torch_loss"])
        return
    loss.backward()
    opt.step()
    dev.synchronize()
    rec["step_s"] = round(time.perf_counter() - t1, 2)
    rec["loss"] = float(loss.numpy())
    rec["loss_err"] = abs(rec["loss"] - prep["torch_loss"]) / abs(prep["torch_loss"])
    npz = np.load(prep["grads"])
    refs = {k: npz[k] for k in npz.files}
    pairs, step_worst, unmatched = [], 0.0, []
    for k, p in params.items():
        key = k if k in refs else getattr(net, "file_names", {}).get(k)
        if key not in refs:
            unmatched.append(k)
            continue
        g = p.grad.numpy() if p.grad is not None else np.zeros_like(before[k])
        after = p.numpy()
        # the update itself: the parameter after the step against p - lr * g with clnet's own g
        want = before[k].astype(np.float64) - LR * g
        step_worst = max(step_worst, float(np.abs(after - want).max() / max(np.abs(want).max(), 1e-30)))
        if g.shape != refs[key].shape and g.T.shape == refs[key].shape:  # held transposed (MatMul/Gemm transB=0)
            g = g.T
        if g.shape != refs[key].shape:
            unmatched.append(f"{k} {g.shape} vs {refs[key].shape}")
            continue
        pairs.append((key, g))
    matched = len(pairs)
    worst, worst_name = grad_err(pairs, refs)
    rec["torch32_grad_err"], rec["torch32_worst_param"] = prep["torch32_grad_err"], prep["torch32_worst_param"]
    rec.update(grad_err=worst, grad_worst_param=worst_name, sgd_err=step_worst, params_matched=matched,
               params_torch=prep["torch_params"], params_unmatched=unmatched[:8], n_unmatched=len(unmatched))


def run_reexport(args, dev, name, prep, rec):
    import clnet
    import clnet.onnx as connx
    import onnxruntime
    net = connx.load(prep["path"], device=dev).eval()
    x = np.load(prep["x"])
    t0 = time.perf_counter()
    path = os.path.join(os.path.dirname(prep["path"]), "reexported.onnx")
    connx.export(net, path, clnet.tensor(x, dev))
    rec["export_s"] = round(time.perf_counter() - t0, 2)
    sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    outs = sess.run(None, {sess.get_inputs()[0].name: x})
    rec["err"] = ort_err(outs, prep["ort"])


def module_outputs(proto):
    """{module's qualified name: the output of its last node} from the scope in each node's name: the TorchScript
    exporter names a node "/features/features.3/squeeze/Conv" for module features.3.squeeze (a child of a
    Sequential repeats its parent's name in front of its own)."""
    last = {}
    for node in proto.graph.node:
        qual = ""
        for part in node.name.split("/")[1:-1]:
            qual = part if not qual or part.startswith(qual + ".") else f"{qual}.{part}"
            last[qual] = node.output[0]
    return last


def layers(args, dev):
    import torch
    import onnx
    import onnxruntime
    import clnet
    import clnet.onnx as connx
    from clnet.autograd import no_grad
    torch.set_num_threads(args.threads)
    path_out = os.path.join(args.out, "layers.jsonl")
    for name in args.layers.split(","):
        model, shape, _ = build(args.family, name, SEED)
        informative(model, shape, args.batch, SEED)
        model.eval()
        x = np.random.default_rng(SEED).standard_normal((args.batch, *shape)).astype(np.float32)  # prepare's input
        folder = tempfile.mkdtemp(prefix="onnx-layers-")
        path = os.path.join(folder, "model.onnx")
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.from_numpy(x),), path, dynamo=False, opset_version=17,
                              input_names=["input"])
        proto = onnx.load(path)
        last = module_outputs(proto)
        seen = {}
        for dtype, m in ((torch.float32, model), (torch.float64, copy.deepcopy(model).double())):
            got = seen[dtype] = {}
            hooks = [mod.register_forward_hook(lambda _m, _i, o, q=q: got.__setitem__(q, o))
                     for q, mod in m.named_modules() if q in last]
            with torch.no_grad():
                m(torch.from_numpy(x).to(dtype))
            for h in hooks:
                h.remove()
        quals = [q for q in seen[torch.float64] if torch.is_tensor(seen[torch.float64][q])
                 and seen[torch.float64][q].is_floating_point()]
        graph_outputs = [o.name for o in proto.graph.output]
        extra = list(dict.fromkeys(last[q] for q in quals if last[q] not in graph_outputs))
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(proto).graph.value_info}
        extra = [t for t in extra if t in inferred]
        proto.graph.output.extend(inferred[t] for t in extra)
        names = graph_outputs + extra
        onnx.save(proto, path)
        sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        ort = dict(zip(names, sess.run(names, {"input": x})))
        net = connx.load(path, device=dev).eval()
        with no_grad():
            ours = dict(zip(names, outputs_numpy(net(clnet.tensor(x, dev)))))
        shutil.rmtree(folder, ignore_errors=True)
        ops = {n.output[0]: n.op_type for n in proto.graph.node}
        rows, left_out = [], 0
        for q in quals:
            t = last[q]
            ref = seen[torch.float64][q].numpy()
            t32 = seen[torch.float32][q].numpy()
            if ort[t].shape != ref.shape or rel_err(t32, ort[t]) > 1e-3:  # not this module's tensor (folded away)
                left_out += 1
                continue
            row = dict(model=name, module=q, op=ops.get(t), shape=list(ref.shape), ort_ref64_err=rel_err(ort[t], ref),
                       torch_ref64_err=rel_err(t32, ref), ref64_err=rel_err(ours[t], ref))
            rows.append(row)
        with open(path_out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        print(f"{name}: {len(rows)} modules compared, {left_out} left out (their ONNX tensor is not PyTorch's)")
        print(f"{'module':50s} {'op':18s} {'ORT':>8s} {'PyTorch':>8s} {'clnet':>8s}")
        top = {q for q in (r["module"] for r in rows) if "." not in q}
        def ratio(r):  # clnet's distance from float64 over the farther of the other two engines'
            return r["ref64_err"] / max(r["ort_ref64_err"], r["torch_ref64_err"], 1e-12)
        worst = sorted(rows, key=lambda r: -ratio(r))[:8]
        for r in rows:
            if r["module"] in top or r in worst:
                print(f"{r['module'][:50]:50s} {str(r['op']):18s} {r['ort_ref64_err']:8.1e} "
                      f"{r['torch_ref64_err']:8.1e} {r['ref64_err']:8.1e}  x{ratio(r):.2f}", flush=True)


def relu_inputs(proto):
    """The input tensor of each Relu node, in the graph's order (the TorchScript exporter writes nodes in the order the
    forward ran them, so the k-th is the k-th nn.ReLU call)."""
    return [n.input[0] for n in proto.graph.node if n.op_type == "Relu"]


class SharedRelu:
    """Forward hooks on every nn.ReLU of a float64 model (inplace turned off, so the hook sees the input) that replace
    relu(x) by x * (clnet's input > 0), clnet's inputs taken in call order (torchvision reuses one nn.ReLU several
    times in a block, so the order of calls, not the module, matches an ONNX Relu node). Each decision that differs
    from float64's own (given the shared decisions above it) is counted, with |x| at it over the call's max |x|."""

    def __init__(self, model, ours, pools=None):
        self.ours, self.calls, self.rows = ours, 0, []
        self.pools, self.pool_calls, self.pool_rows = pools, 0, []
        for m in model.modules():
            if type(m).__name__ == "ReLU":
                m.inplace = False
                m.register_forward_hook(self.follow)
            if pools is not None and type(m).__name__ == "MaxPool2d":
                m.register_forward_hook(self.follow_pool)

    def follow_pool(self, m, args, out):
        """Max pooling with clnet's choice in each window: the argmax of clnet's input (its float32 values, exact in
        float64), the float64 input gathered there. A choice that differs from float64's own is a flip."""
        import torch
        import torch.nn.functional as F
        v = args[0]
        k = self.pool_calls
        self.pool_calls += 1
        ours = torch.from_numpy(self.pools[k]).to(v.dtype)
        kw = dict(kernel_size=m.kernel_size, stride=m.stride, padding=m.padding, dilation=m.dilation,
                  ceil_mode=m.ceil_mode, return_indices=True)
        idx = F.max_pool2d(ours, **kw)[1]
        own = F.max_pool2d(v.detach(), **kw)[1]
        differ = idx != own
        flat = v.detach().flatten(2)
        n = int(differ.sum())
        gap = 0.0
        if n:  # how far apart float64 holds the two candidates, over the call's max |x|
            a, b = flat.gather(2, own.flatten(2)), flat.gather(2, idx.flatten(2))
            gap = float((a - b).abs().flatten()[differ.flatten()].max()) / max(float(flat.abs().max()), 1e-300)
        self.pool_rows.append(dict(call=k, windows=int(idx.numel()), flips=n, worst_gap=gap))
        return v.flatten(2).gather(2, idx.flatten(2)).view(idx.shape)

    def follow(self, m, args, out):
        import torch
        v = args[0]
        k = self.calls
        self.calls += 1
        if k >= len(self.ours):
            raise RuntimeError(f"nn.ReLU call {k + 1}: clnet's file has only {len(self.ours)} Relu nodes")
        ours = torch.from_numpy(self.ours[k])
        if tuple(ours.shape) != tuple(v.shape):
            raise RuntimeError(f"nn.ReLU call {k}: shape {tuple(v.shape)}, clnet's Relu input {tuple(ours.shape)}")
        on = ours > 0
        d = v.detach()
        differ = on != (d > 0)
        scale = float(d.abs().max())
        n = int(differ.sum())
        gap = float(d.abs()[differ].max()) / max(scale, 1e-300) if n else 0.0
        self.rows.append(dict(call=k, numel=int(d.numel()), flips=n, worst_gap=gap,
                              input_err=rel_err(self.ours[k], d.numpy())))
        return v * on.to(v.dtype)


def shared_relu(args, dev):
    """--shared-relu: for each model, the training-mode TorchScript file's one step in clnet (with every Relu node's
    input made a graph output) against PyTorch float64's step, plain and with clnet's ReLU decisions imposed; PyTorch
    float32's step beside it against both; then with clnet's max-pool choices shared as well."""
    import torch
    import onnx
    import clnet
    import clnet.onnx as connx
    from clnet import nn
    torch.set_num_threads(args.threads)
    path_out = os.path.join(args.out, "shared-relu.jsonl")
    for name in args.shared_relu.split(","):
        t0 = time.perf_counter()
        rec = dict(model=name, phase="ts-train", shared="relu, then relu and max-pool")
        model, shape, classes = build(args.family, name, SEED)
        informative(model, shape, args.batch, SEED)
        no_dropout(model)
        model.train()
        rng = np.random.default_rng(SEED)  # prepare's input and labels
        x = rng.standard_normal((args.batch, *shape)).astype(np.float32)
        labels = rng.integers(0, classes, args.batch)
        folder = tempfile.mkdtemp(prefix="onnx-shared-")
        path = os.path.join(folder, "model.onnx")
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(copy.deepcopy(model), (torch.from_numpy(x),), path, dynamo=False,
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              opset_version=17, input_names=["input"])
        proto = onnx.load(path)
        relus = relu_inputs(proto)
        pool_in = [n.input[0] for n in proto.graph.node if n.op_type == "MaxPool"]
        n_out = len(proto.graph.output)
        inferred = {v.name: v for v in onnx.shape_inference.infer_shapes(proto).graph.value_info}
        missing = [t for t in relus + pool_in if t not in inferred]
        if missing:
            raise RuntimeError(f"no inferred shape for Relu inputs {missing[:4]}")
        proto.graph.output.extend(inferred[t] for t in relus + pool_in)
        onnx.save(proto, path)
        rec["relu_nodes"] = len(relus)
        rec["maxpool_nodes"] = sum(1 for n in proto.graph.node if n.op_type == "MaxPool")
        # clnet's step, its Relu inputs from the same forward
        net = connx.load(path, device=dev).train()
        shutil.rmtree(folder, ignore_errors=True)
        params = dict(net.named_parameters())
        out = net(clnet.tensor(x, dev))
        outs = out if isinstance(out, tuple) else (out,)
        ours = [o.numpy() for o in outs[n_out:n_out + len(relus)]]
        pools = [o.numpy() for o in outs[n_out + len(relus):]]
        loss = nn.CrossEntropyLoss()(outs[0], clnet.tensor(labels.astype(np.int32), dev))
        loss.backward()
        dev.synchronize()
        rec["loss"] = float(loss.numpy())
        clgrads = []
        for k, p in params.items():
            key = k if k in dict(model.named_parameters()) else getattr(net, "file_names", {}).get(k)
            g = p.grad.numpy() if p.grad is not None else np.zeros(p.shape, np.float32)
            clgrads.append((key, g))
        del net, out, outs, loss
        # PyTorch: float64 plain, float64 with clnet's decisions, float32 plain
        grads = {}
        for label, dtype, share in (("f64", torch.float64, False), ("f64_shared", torch.float64, True),
                                    ("f64_shared_pool", torch.float64, True), ("f32", torch.float32, False)):
            m = copy.deepcopy(model).to(dtype).train()
            follow = SharedRelu(m, ours, pools if label == "f64_shared_pool" else None) if share else None
            y = first_output(m(torch.from_numpy(x).to(dtype)))
            torch.nn.functional.cross_entropy(y, torch.from_numpy(labels)).backward()
            grads[label] = {n: p.grad.numpy() for n, p in m.named_parameters() if p.grad is not None}
            if share:
                if follow.calls != len(ours):
                    raise RuntimeError(f"{follow.calls} nn.ReLU calls, {len(ours)} Relu nodes in the file")
                if follow.pools is not None and follow.pool_calls != len(pools):
                    raise RuntimeError(f"{follow.pool_calls} nn.MaxPool2d calls, {len(pools)} MaxPool nodes")
                if follow.pools is None:
                    rows = follow.rows
                else:
                    pool_rows = follow.pool_rows
            del m, y
        params64 = grads["f64"]
        pairs = [(k, g.T if g.shape != params64[k].shape and g.T.shape == params64[k].shape else g)
                 for k, g in clgrads if k in params64]
        rec["params_matched"], rec["params_torch"] = len(pairs), len(params64)
        rec["flips"] = sum(r["flips"] for r in rows)
        rec["calls_with_flips"] = sum(1 for r in rows if r["flips"])
        rec["relu_inputs"] = sum(r["numel"] for r in rows)
        rec["worst_flip_gap"] = max(r["worst_gap"] for r in rows)
        rec["worst_relu_input_err"] = max(r["input_err"] for r in rows)  # clnet's Relu input against float64's
        rec["flip_calls"] = [r for r in rows if r["flips"]][:40]
        rec["maxpool_flips"] = sum(r["flips"] for r in pool_rows)
        rec["maxpool_windows"] = sum(r["windows"] for r in pool_rows)
        rec["maxpool_worst_gap"] = max((r["worst_gap"] for r in pool_rows), default=0.0)
        rec["maxpool_calls"] = pool_rows
        for ref in ("f64", "f64_shared", "f64_shared_pool"):
            rec[f"grad_err_{ref}"], rec[f"grad_worst_{ref}"] = grad_err(pairs, grads[ref])
            rec[f"torch32_grad_err_{ref}"], rec[f"torch32_worst_{ref}"] = grad_err(grads["f32"].items(), grads[ref])
        rec["wall_s"] = round(time.perf_counter() - t0, 2)
        with open(path_out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(json.dumps({k: v for k, v in rec.items() if k != "flip_calls"}), flush=True)
        print(f"{name}: {rec['flips']} of {rec['relu_inputs']} ReLU decisions flipped in {rec['calls_with_flips']} "
              f"of {len(rows)} calls (worst {rec['worst_flip_gap']:.1e} of the call's max |x| from the kink); "
              f"grad err vs float64 {rec['grad_err_f64']:.1e} (PyTorch float32 {rec['torch32_grad_err_f64']:.1e}), "
              f"vs float64 with clnet's decisions {rec['grad_err_f64_shared']:.1e} "
              f"(PyTorch float32 {rec['torch32_grad_err_f64_shared']:.1e}); worst {rec['grad_worst_f64_shared']}; "
              f"{rec['maxpool_flips']} of {rec['maxpool_windows']} max-pool choices flipped (worst "
              f"{rec['maxpool_worst_gap']:.1e}), with them shared too {rec['grad_err_f64_shared_pool']:.1e}, worst "
              f"{rec['grad_worst_f64_shared_pool']}",
              flush=True)
        gc.collect()


RUNNERS = {"ts-eval": run_eval, "ts-train": run_train, "reexport": run_reexport, "dynamo": run_eval}


def fmt(v, kind="e"):
    if v is None:
        return "-"
    return f"{v:.1e}" if kind == "e" else f"{v:.{kind}f}"


def table(records):
    """The markdown table: one row a model, the phases side by side."""
    by = {}
    for r in records:
        by.setdefault(r["model"], {})[r["phase"]] = r

    def cell(r, what):
        if r is None:
            return "not run"
        if r.get("status") != "ok":
            return "FAIL: " + r.get("stage", "") + " " + r.get("error", r.get("status", "?"))[:120].replace("|", "/")
        return what(r)
    def vs(r):  # clnet's error against ONNX Runtime, PyTorch's own in brackets
        return f"{fmt(r['err'])} ({fmt(r.get('torch_ort_err'))})"

    def f64(r):  # each engine's distance from the float64 model: ONNX Runtime / PyTorch float32 / clnet
        if r is None or r.get("status") != "ok" or "ref64_err" not in r:
            return "-"
        return f"{fmt(r.get('ort_ref64_err'))} / {fmt(r.get('torch_ref64_err'))} / {fmt(r['ref64_err'])}"

    def train(r):
        text = f"{vs(r)}"
        if "grad_err" in r:
            text += f", {fmt(r['grad_err'])} ({fmt(r.get('torch32_grad_err'))}), {fmt(r['sgd_err'])}"
            if r["n_unmatched"]:
                text += f" ({r['n_unmatched']} params unmatched)"
        return text
    lines = ["| model | TorchScript eval: load s, err vs ORT (PyTorch's) | vs float64: ORT / PyTorch / clnet | "
             "clnet ms | PyTorch ms | speed | "
             "TorchScript train: err vs ORT (PyTorch's), grad err (PyTorch float32's), SGD err | "
             "vs float64: ORT / PyTorch / clnet | re-export err vs ORT | dynamo eval: load s, err (PyTorch's) | "
             "vs float64: ORT / PyTorch / clnet |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, ph in by.items():
        ev = ph.get("ts-eval")
        ok = ev is not None and ev.get("status") == "ok"
        lines.append("| " + " | ".join([
            model,
            cell(ev, lambda r: f"{fmt(r['load_s'], '1')}, {vs(r)}"),
            f64(ev),
            fmt(ev.get("clnet_ms"), "2") if ok else "-",
            fmt(ev.get("torch_ms"), "2") if ok else "-",
            (fmt(ev.get("speed"), "2") + "x") if ok and ev.get("speed") else "-",
            cell(ph.get("ts-train"), train),
            f64(ph.get("ts-train")),
            cell(ph.get("reexport"), lambda r: fmt(r["err"])),
            cell(ph.get("dynamo"), lambda r: f"{fmt(r['load_s'], '1')}, {vs(r)}"),
            f64(ph.get("dynamo")),
        ]) + " |")
    return "\n".join(lines) + "\n"


def host_cpu():
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=["torchvision", "zoo"], default="torchvision")
    ap.add_argument("--models", default=",".join(TORCHVISION))
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--train-models", default=None,
                    help="models of the ts-train phase, in order (default --models, smallest first)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--device", default="gpu", help="clnet's device")
    ap.add_argument("--torch-device", default="cuda")
    ap.add_argument("--iterations", type=int, default=5, help="timed eval forwards (0: no timing)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4, help="export processes")
    ap.add_argument("--threads", type=int, default=3, help="threads of each export process (PyTorch, ONNX Runtime)")
    ap.add_argument("--model-limit", type=int, default=60, help="seconds for one model's clnet work")
    ap.add_argument("--no-step", dest="step", action="store_false",
                    help="ts-train: the training-mode forward against ONNX Runtime only, no backward or SGD step")
    ap.add_argument("--deadline", type=float, default=380, help="no model starts after this many seconds")
    ap.add_argument("--out", default="/tmp/onnx-torchvision")
    ap.add_argument("--layers", default=None, help="models whose modules' outputs are compared with float64 (alone)")
    ap.add_argument("--shared-relu", default=None,
                    help="models whose training step is compared with float64 run with clnet's ReLU decisions (alone)")
    args = ap.parse_args()
    start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    if args.layers:
        import clnet
        layers(args, clnet.device(args.device))
        sys.stdout.flush()
        os._exit(0)
    if args.shared_relu:
        import clnet
        shared_relu(args, clnet.device(args.device))
        sys.stdout.flush()
        os._exit(0)
    jsonl = os.path.join(args.out, "onnx-torchvision.jsonl")
    names = args.models.split(",")
    if args.train_models:
        train_names = args.train_models.split(",")
    else:
        train_names = [n for n in TRAIN_ORDER if n in names] + [n for n in names if n not in TRAIN_ORDER]
    phases = args.phases.split(",")
    jobs = [(p, n) for p in phases for n in (train_names if p == "ts-train" else names)]
    folder = tempfile.mkdtemp(prefix="onnx-tv-")
    pool = multiprocessing.get_context("spawn").Pool(args.workers)
    # the worker jobs in the order the main process takes them (re-export reuses the eval file)
    pending = {}
    for p, n in jobs:
        if p != "reexport":
            pending[(p, n)] = pool.apply_async(prepare, (args.family, n, p, args.batch, folder, args.threads,
                                                           args.step))

    import torch
    import onnxruntime
    import clnet
    if args.torch_device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
    dev = clnet.device(args.device)
    header = dict(kind="header", clnet_device=dev.name, platform=dev.platform_name, driver=dev.driver_version,
                  torch=torch.__version__, onnxruntime=onnxruntime.__version__, family=args.family,
                  batch=args.batch, argv=sys.argv[1:], host_cpu=host_cpu(), cpu_count=os.cpu_count(),
                  torch_device=(torch.cuda.get_device_name() if args.torch_device.startswith("cuda")
                                else args.torch_device))
    try:
        import torchvision
        header["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    print(json.dumps(header), flush=True)
    with open(jsonl, "a") as f:
        f.write(json.dumps(header) + "\n")
    signal.signal(signal.SIGALRM, _alarm)
    records, preps = [], {}
    for phase, name in jobs:
        rec = dict(model=name, phase=phase)
        left = args.deadline - (time.perf_counter() - start)
        t0 = time.perf_counter()
        if left < 5:
            rec.update(status="skipped", error=f"not started: {left:.0f} s left before the deadline")
        else:
            try:
                rec["stage"] = "export"
                key = ("ts-eval", name) if phase == "reexport" else (phase, name)
                if key not in preps:
                    if key not in pending:
                        raise RuntimeError(f"{key[0]} of {name} was not run")
                    preps[key] = pending[key].get(timeout=max(left, 1))
                prep = preps[key]
                if "error" in prep:
                    rec.update(status="export failed", error=prep["error"], traceback=prep.get("traceback"))
                else:
                    for k in ("opset", "nodes", "ops", "dropouts_zeroed", "input_shape", "informative",
                              "output_spread", "torch_ort_err", "ort_ref64_err", "torch_ref64_err"):
                        if k in prep:
                            rec[k] = prep[k]
                    if phase != "reexport":
                        rec["torch_export_s"] = prep.get("export_s")
                    rec["stage"] = "clnet"
                    signal.alarm(max(1, int(min(args.model_limit, args.deadline + 15 - (time.perf_counter()
                                                                                          - start)))))
                    try:
                        RUNNERS[phase](args, dev, name, prep, rec)
                    finally:
                        signal.alarm(0)
                    rec["status"] = "ok"
                    del rec["stage"]
            except multiprocessing.TimeoutError:
                rec.update(status="export not ready", error="the export was not ready before the deadline")
            except (Exception, ModelTimeout) as e:
                rec.update(status="failed", error=f"{type(e).__name__}: {str(e).strip()[:600]}",
                           traceback=traceback.format_exc()[-2000:])
        rec["wall_s"] = round(time.perf_counter() - t0, 2)
        gc.collect()
        if args.torch_device.startswith("cuda"):
            torch.cuda.empty_cache()
        records.append(rec)
        with open(jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")
        with open(os.path.join(args.out, "table.md"), "w") as f:
            f.write(table(records))
        short = {k: v for k, v in rec.items() if k not in ("traceback", "ops", "params_unmatched")}
        print(json.dumps(short), flush=True)
    pool.terminate()
    shutil.rmtree(folder, ignore_errors=True)
    print(table(records), flush=True)
    sys.stdout.flush()
    os._exit(0)  # any export still running goes with the process


if __name__ == "__main__":
    main()
