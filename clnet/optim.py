"""Optimizers (SGD, Adam, AdamW, RMSprop) with PyTorch's arguments, parameter groups and updates, run as kernels.

Parameter groups are PyTorch's: `SGD([{"params": backbone, "lr": 0.01}, {"params": head}], lr=0.1, momentum=0.9)`
gives each group the constructor's hyperparameters except those its dict names; `param_groups[i]["lr"]` (and every
other hyperparameter) can be changed between steps, eager or replayed, and an lr_scheduler does exactly that.

On its first use an optimizer moves every parameter, its gradient and its state (momentum, Adam's moments) into one
flat buffer each, group after group (a parameter's memory and its .grad become regions of those), so that `step`
is one launch per group whatever the number of parameters: for a small network the launches, not the arithmetic,
are the cost of an update. The hyperparameters reach the kernels as kernels.Live arguments that the step's host
action sets from the groups, so a replayed clnet.Graph step reads the groups as they are at that replay.
`zero_grad` launches nothing: it marks the gradients zero (Tensor.grad), and the next backward overwrites them.
The parameters keep their identity; only their memory moves.

`state_dict()` follows PyTorch's layout: {"state": {index: {name: array}}, "param_groups": [{hyperparameters,
"params": [indices]}, ...]}, indices counting the parameters group after group; Adam's step count is its group's
"step" entry (one count per group, all of whose parameters step together).
"""
import sys
import weakref

import numpy as np

from . import autograd, kernels, lr_scheduler, ops
from .graph import CaptureError
from .tensor import Parameter, Tensor, note_in_place, pool, region_alignment

sys.modules[__name__ + ".lr_scheduler"] = lr_scheduler  # `from clnet.optim.lr_scheduler import StepLR`, as torch's

_flat_grads = weakref.WeakValueDictionary()  # id(storage) -> an optimizer's flat gradient tensor over it


def grad_span(grads):
    """The region of one optimizer's flat gradient buffer that holds exactly `grads` and the zero padding between
    them (so one launch can read or scale them all: nn.utils.clip_grad_norm_), or None where they are not laid out
    so: other tensors, another optimizer's, or with another parameter's gradient between two of them."""
    parent = getattr(grads[0].storage, "parent", None) if grads else None
    flat = _flat_grads.get(id(parent)) if parent is not None else None
    if flat is None or flat.storage is not parent:
        return None
    if any(getattr(g.storage, "parent", None) is not parent for g in grads):
        return None
    align = region_alignment(flat.device)
    pieces = sorted((g.storage.offset, -(-max(g.size, 1) * 4 // align) * align) for g in grads)
    for (offset, taken), (following, _) in zip(pieces, pieces[1:]):
        if following != offset + taken:  # a gap holds another parameter's gradient (or two share one)
            return None
    start, end = pieces[0][0], pieces[-1][0] + pieces[-1][1]
    return flat.region(start // 4, ((end - start) // 4,))


class Optimizer:
    """The flat-buffer frame shared by every optimizer. Subclasses name every state they may keep (`state_names`)
    and those a group's settings need (`_group_state`), normalise and check a group's hyperparameters (`_normalise`,
    `_check`), and launch one group's update in `_update_group`."""

    state_names = ()
    counter_names = ()  # counts a parameter's state entry may hold beside its arrays (Adam's "step")

    def __init__(self, params, defaults):
        object.__setattr__(self, "defaults", dict(defaults))
        self.params = []  # every parameter, group after group: the flat buffers' order and the state's indices
        self.param_groups = []
        if isinstance(params, Tensor):
            raise TypeError(f"{type(self).__name__}: params must be an iterable of tensors or of dicts (parameter "
                            f"groups), got one tensor of shape {params.shape}; pass [t] or model.parameters()")
        params = list(params)
        if params and all(isinstance(g, dict) for g in params):
            groups = params
        elif any(isinstance(g, dict) for g in params):
            raise TypeError(f"{type(self).__name__}: params mixes parameter groups (dicts) and tensors; put every "
                            "tensor in a group's 'params'")
        else:
            groups = [{"params": params}]
        self._flat = None     # (data, grad, {state name: flat tensor}) once on a device
        self._layout = None   # (storage, grad) per parameter that the flat buffers were made for
        self._spans = []      # per group: (first element, element count) in the flat buffers
        self._group_bufs = []  # per group: its regions of the flat data, grad and state (None if it has no elements)
        self._views = {name: [] for name in self.state_names}
        self._pending = None  # state loaded before the flat buffers exist
        for g in groups:
            self.add_param_group(g)
        self._early_layout()

    def _early_layout(self):
        """Lay the flat buffers out now where every parameter is on one device already (else at the first
        zero_grad() or step()): the parameters' own buffers are then given back before the first forward, not held
        through the first step by what that forward saved for backward (resnet50: a step's peak 20% higher)."""
        if self.params and kernels.capturing is None and all(p.storage is not None for p in self.params) and len(
                {id(p.device) for p in self.params}) == 1:
            self._flatten()

    def add_param_group(self, param_group):
        """Add a group (a dict with "params" and any hyperparameters; the others from the constructor's) to train
        with the others; the flat buffers are laid out again at the next step."""
        who = type(self).__name__
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise TypeError(f"{who}: a parameter group is a dict with a 'params' entry, got "
                            f"{type(param_group).__name__}")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError(f"{who}: a group's params is a set, whose order changes between runs; pass a list")
        params = list(params)
        i0 = len(self.param_groups)
        for i, p in enumerate(params):  # a frozen one (requires_grad False) is taken: it has no .grad, and steps
            # pass over it, as PyTorch's
            if not isinstance(p, Tensor) or p.grad_fn is not None:
                raise TypeError(f"{who}: item {i} of params{f' of group {i0}' if i0 else ''} is not a leaf tensor "
                                f"(a parameter: pass model.parameters()), got "
                                f"{'a computed tensor' if isinstance(p, Tensor) else type(p).__name__}")
        seen = {id(p) for p in self.params}
        if len({id(p) for p in params}) != len(params) or any(id(p) in seen for p in params):
            raise ValueError(f"{who}: a parameter appears twice in the parameter groups (group {i0}); give each "
                             "parameter to one group, once")
        for k, v in self.defaults.items():
            group.setdefault(k, v)
        self._normalise(group)
        self._check(group)
        group["params"] = params
        self.param_groups.append(group)
        self.params.extend(params)
        for views in self._views.values():
            views.extend([None] * len(params))
        self._layout = None
        self._group_added()

    def _group_added(self):
        pass

    @property
    def hyper(self):
        """The hyperparameters of the first group (without its params)."""
        return {k: v for k, v in self.param_groups[0].items() if k != "params"}

    # opt.lr and the like: the one group's hyperparameters, as clnet has always offered (PyTorch has none)
    def _group_attr(self, name):
        groups = self.__dict__.get("param_groups")
        if groups and name in groups[0] and name != "params":
            if len(groups) > 1:
                raise AttributeError(f"{type(self).__name__}.{name}: the optimizer has {len(groups)} parameter groups; "
                                     f"use param_groups[i][{name!r}]")
            return groups[0]
        return None

    def __getattr__(self, name):
        group = self._group_attr(name)
        if group is None:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        return group[name]

    def __setattr__(self, name, value):
        group = self._group_attr(name) if not name.startswith("_") else None
        if group is None:
            object.__setattr__(self, name, value)
        else:
            group[name] = value

    def _needed_state(self):
        """The states some group needs now, and those kept so far (a group whose momentum went to 0 keeps its
        buffer, as PyTorch's does)."""
        names = {n for n, views in self._views.items() if any(v is not None for v in views)}
        for g in self.param_groups:
            names.update(self._group_state(g))
        return [n for n in self.state_names if n in names]

    def _flatten(self):
        """(Re)builds the flat buffers when the parameters are new or were moved, or a group now needs a state the
        buffers lack; copies their values (and the state kept so far) in."""
        needed = self._needed_state()
        if self._layout is not None and all(n in self._flat[2] for n in needed) and all(
                p.storage is s and p._grad is g for p, (s, g) in zip(self.params, self._layout)):
            return
        who = type(self).__name__
        if any(p.storage is None for p in self.params):
            raise RuntimeError(f"{who}: a parameter is not on a device yet; call model.to(device) first")
        dev = self.params[0].device
        if any(p.device is not dev for p in self.params):
            raise RuntimeError(f"{who}: the parameters are on different devices; move the whole model with "
                               ".to(device)")
        if kernels.capturing is not None and kernels.capturing.launches:
            raise CaptureError(f"{who} lays out its parameters at its first zero_grad() or step() (and again when a "
                               "group is added or starts to need momentum); inside a capture that has already "
                               "recorded launches on the old layout, a replay would train stale copies: run one step "
                               "(or call zero_grad()) before capturing")
        with kernels.set_up():  # a capture in progress keeps the new layout, not the copies into it
            step = region_alignment(dev) // 4
            offsets, total = [], 0
            for p in self.params:
                offsets.append(total)
                total += -(-max(p.size, 1) // step) * step
            old_state = {name: [None if v is None else v.numpy() for v in views]
                         for name, views in self._views.items()}
            no_grad = [p._grad is None or p._grad_none for p in self.params]  # each reads as None after, as before
            data, grad = ops.zeros((total,), dev), ops.zeros((total,), dev)
            state = {name: ops.zeros((total,), dev) for name in needed}  # zero state: PyTorch's first step
            for i, (p, off) in enumerate(zip(self.params, offsets)):
                new_data, new_grad = data.region(off, p.shape), grad.region(off, p.shape)
                new_data.copy_from(p)
                if p.grad is not None:
                    new_grad.copy_from(p.grad)
                p.storage, p.grad = new_data.storage, new_grad
                if no_grad[i]:
                    p._grad_zeroed = p._grad_none = True
                for name in self.state_names:
                    if name not in state:
                        self._views[name][i] = None
                        continue
                    view = self._views[name][i] = state[name].region(off, p.shape)
                    if old_state[name][i] is not None:
                        view.write(old_state[name][i])
            self._spans, first = [], 0
            for g in self.param_groups:  # a group's span runs from its first parameter to the next group's
                last = first + len(g["params"])
                start = offsets[first] if first < len(offsets) else total
                end = offsets[last] if last < len(offsets) else total
                self._spans.append((start, end - start))
                first = last
            self._group_bufs = [None if not count else (
                data.region(start, (count,)), grad.region(start, (count,)),
                {n: s.region(start, (count,)) for n, s in state.items()}) for start, count in self._spans]
            self._flat = (data, grad, state)
            self._extents = [(off, -(-max(p.size, 1) // step) * step) for p, off in zip(self.params, offsets)]
            _flat_grads[id(grad.storage)] = grad
            self._layout = [(p.storage, p._grad) for p in self.params]
            if self._pending is not None:
                pending, self._pending = self._pending, None
                self._load_state(pending)
        # The parameters' own buffers (and an earlier layout's) are free now, in sizes that nothing else asks for:
        # cached by the pool, they would stay allocated for the process's lifetime (a third of resnet50's pool)
        del new_data, new_grad, data, grad, state
        pool(dev).release_cached()

    def zero_grad(self, set_to_none=True):
        """Marks every gradient, writing nothing: the next backward overwrites each instead of adding to it. As
        PyTorch's: with set_to_none (the default) each .grad reads as None until a backward writes it, and step()
        passes over a parameter whose .grad is None (no momentum, no weight decay: a frozen or unused parameter stays
        as it is); with set_to_none=False each reads as zeros (filled at the first read) and every parameter steps.
        The gradients stay allocated in the optimizer's flat buffer either way."""
        if not self.params:
            return
        self._flatten()
        for p in self.params:
            p._mark_grad_zero(set_to_none)

    def step(self):
        if not self.params:
            return
        self._flatten()
        data, grad, state = self._flat
        skip = [p._grad_none for p in self.params]  # .grad None: passed over, as PyTorch's step does
        if kernels.capturing is not None:  # the update reads these gradients: marks older than the capture settled
            for p, passed in zip(self.params, skip):
                if not passed:
                    autograd.settle_grad(p)
        groups = self.param_groups
        fused = [self._takes_deferred(g) for g in groups]  # a deferred gradient taken in the update's pass
        for g, f in zip(groups, fused):
            for p in g["params"]:
                if p._grad_pending is not None and not f:
                    p._settle_pending()
        unwritten = [p for p, passed in zip(self.params, skip) if p._grad_zeroed and not passed]  # marked zero
        if len(unwritten) == len(self.params):  # (set_to_none=False) and no backward reached them since
            ops.fill(grad, 0.0)
            for p in unwritten:
                p._grad_zeroed = False
        else:
            for p in unwritten:
                p._fill_marked()
        runs = [self._runs(i, skip) for i in range(len(groups))]  # fixed for the launches recorded below
        layout = self._layout
        built = [self._built(g) for g in groups]  # the kernels' defines, fixed for the launches recorded below

        def host():  # every step's action, replayed ones too: the groups as they are now reach the Live arguments
            if self._layout is not layout:
                raise CaptureError(f"{type(self).__name__} laid out its parameters again since this step was "
                                   "captured (a group was added, a group started to need momentum, or the model "
                                   "moved), so a replay would train stale copies; capture the step again")
            for i, (g, b) in enumerate(zip(groups, built)):
                if self._built(g) != b:
                    raise CaptureError(f"{type(self).__name__}: param_groups[{i}] changed {self._what_built} since "
                                       "this step was captured, which its kernel was built for; capture the step "
                                       "again")
                self._set_live(i, g, runs[i])
        kernels.per_step(host)
        for i, bufs in enumerate(self._group_bufs):
            if fused[i]:
                self._deferred_update(i, groups[i])
            elif bufs is not None and runs[i] is None:
                self._update_group(i, groups[i], *bufs)
            elif bufs is not None:
                for run in runs[i]:
                    start = self._extents[run[0]][0]
                    count = self._extents[run[1] - 1][0] + self._extents[run[1] - 1][1] - start
                    self._update_group(i, groups[i], data.region(start, (count,)), grad.region(start, (count,)),
                                       {n: t.region(start, (count,)) for n, t in state.items()}, run)
        for p, passed in zip(self.params, skip):  # written in place: a backward still to come through an op that
            if not passed:  # saved one is refused (autograd._check_saved), as PyTorch's
                note_in_place(p)

    def _runs(self, i, skip):
        """None where group i steps as one (every parameter has a .grad, and _run_key agrees); else the runs
        [(first, end)] of its parameters' indices that step together, those passed over (skip) left out."""
        indices = self._group_indices()[i]
        first = indices[0] if indices else 0
        keys = [None if skip[j] else (self._run_key(j),) for j in indices]
        if None not in keys and len(set(keys)) <= 1:
            return None
        runs = []
        for j, key in zip(indices, keys):
            if key is None:
                continue
            if runs and runs[-1][1] == j and keys[runs[-1][0] - first] == key:
                runs[-1][1] = j + 1
            else:
                runs.append([j, j + 1])
        return [tuple(r) for r in runs]

    def _run_key(self, j):
        """What parameters must share to step in one launch (besides their group): a count of their own steps."""
        return None

    # -- per optimizer -------------------------------------------------------------------------------------------
    _what_built = "a setting"

    def _takes_deferred(self, group):
        """Whether the group's update takes its gradient from what a backward deferred (autograd.deferral), in one
        pass with the update (_deferred_update)."""
        return False

    def _group_state(self, group):
        return self.state_names

    def _built(self, group):
        """The group's settings that are compile-time defines of its kernel."""
        return ()

    def _normalise(self, group):
        pass

    def _check(self, group):
        pass

    def _set_live(self, i, group, runs):
        """Sets group i's kernels.Live arguments for this step (runs: as _runs gave them, fixed at the step)."""
        raise NotImplementedError

    def _update_group(self, i, group, data, grad, state, run=None):
        """Launches group i's update over data, grad and state (the group's regions, or a run's: run=(first, end))."""
        raise NotImplementedError

    # -- state ---------------------------------------------------------------------------------------------------
    def _counters(self, i):
        return {}

    def _set_counters(self, i, counters):
        pass

    def _param_counters(self, j, group_counters):
        """Parameter j's own counters for its state entry, where they differ from its group's."""
        return {}

    def _set_param_counters(self, j, entry):
        pass

    def _group_indices(self):
        out, first = [], 0
        for g in self.param_groups:
            out.append(list(range(first, first + len(g["params"]))))
            first += len(g["params"])
        return out

    def state_dict(self):
        if self._pending is not None:  # loaded, not yet on the device: hand back what was loaded
            state = {i: dict(s) for i, s in self._pending["state"].items()}
            counters = self._pending["counters"]
        else:
            state = {}
            counters = [self._counters(i) for i in range(len(self.param_groups))]
            for g, indices, c in zip(self.param_groups, self._group_indices(), counters):
                names = self._group_state(g)
                for i in indices:
                    entry = {name: self._views[name][i].numpy() for name in self.state_names
                             if name in names and self._views[name][i] is not None}
                    entry.update(self._param_counters(i, c))
                    if entry:
                        state[i] = entry
        groups = [dict({k: v for k, v in g.items() if k != "params"}, params=idx, **c)
                  for g, idx, c in zip(self.param_groups, self._group_indices(), counters)]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        who = f"{type(self).__name__}.load_state_dict"
        try:
            groups = list(state_dict["param_groups"])
            state = {int(i): s for i, s in state_dict["state"].items()}
            if not all(isinstance(g, dict) for g in groups):
                raise TypeError("a group is not a dict")
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{who}: not an optimizer state ({e})") from e
        if len(groups) != len(self.param_groups):
            raise ValueError(f"{who}: the state has {len(groups)} parameter groups, this optimizer "
                             f"{len(self.param_groups)}; make the optimizer with the saved run's groups")
        for i, (saved, group) in enumerate(zip(groups, self.param_groups)):
            n = len(saved.get("params", group["params"]))
            if n != len(group["params"]):
                where = f"group {i}" if len(groups) > 1 else "the optimizer"
                raise ValueError(f"{who}: state for {n} parameters, {where} has {len(group['params'])}")
        for i, entry in state.items():
            if not 0 <= i < len(self.params):
                raise ValueError(f"{who}: no parameter {i}")
            for name, a in entry.items():
                if name in self.counter_names:
                    v = np.asarray(a)
                    if v.size != 1 or not np.isfinite(v).all() or float(v.reshape(-1)[0]) < 0 or \
                            float(v.reshape(-1)[0]) != int(v.reshape(-1)[0]):
                        raise ValueError(f"{who}: {name} of parameter {i} is {a!r}, expected a whole number >= 0")
                    continue
                if name not in self.state_names:
                    raise ValueError(f"{who}: unknown state {name!r} (this optimizer keeps {list(self.state_names)})")
                if tuple(np.shape(a)) != tuple(self.params[i].shape):
                    raise ValueError(f"{who}: {name} of parameter {i} has shape {np.shape(a)}, the parameter has "
                                     f"{self.params[i].shape}")
        counter_names = set(self._counters(0)) if self.param_groups else set()
        new_groups = []
        for saved, group in zip(groups, self.param_groups):
            new = dict(group, **{k: v for k, v in saved.items() if k != "params" and k not in counter_names})
            self._normalise(new)
            self._check(new)
            new_groups.append(new)
        for group, new in zip(self.param_groups, new_groups):  # all checked: now change them
            group.update({k: v for k, v in new.items() if k != "params"})
        loaded = dict(state={i: {n: np.array(a, np.float32) for n, a in s.items()} for i, s in state.items()},
                      counters=[{k: g[k] for k in counter_names if k in g} for g in groups])
        self._pending = loaded
        if self._flat is not None:
            self._flatten()  # lays out again only if the loaded groups need a state the buffers lack
            if self._pending is not None:
                pending, self._pending = self._pending, None
                self._load_state(pending)

    def _load_state(self, loaded):
        for name in self.state_names:
            for i, view in enumerate(self._views[name]):
                if view is None:
                    continue
                a = loaded["state"].get(i, {}).get(name)
                if a is None:
                    ops.fill(view, 0.0)
                else:
                    view.write(a)
        for i, c in enumerate(loaded["counters"]):
            self._set_counters(i, c)
        for i, entry in loaded["state"].items():
            self._set_param_counters(i, entry)


def _live(n):
    return tuple(kernels.Live(None) for _ in range(n))


def _f32(*values):
    return tuple(np.float32(v) for v in values)


class _Counted(Optimizer):
    """An optimizer that counts each parameter's steps (Adam's bias corrections), as PyTorch does: a step passes over
    a parameter whose .grad is None, and its count stays. Parameters of a group whose counts agree step in one launch
    (Optimizer._runs). Saved as the group's "step" (the largest count of its parameters) and, for a parameter whose
    count differs from it, as that parameter's own "step", as PyTorch's state keeps it."""
    counter_names = ("step",)

    def _group_added(self):
        self._steps.extend([0] * (len(self.params) - len(self._steps)))  # per parameter
        self._live.append(_live(self.live_count))

    def _counters(self, i):
        indices = self._group_indices()[i] if i < len(self.param_groups) else []
        return dict(step=max((self._steps[j] for j in indices), default=0))

    def _set_counters(self, i, counters):
        if "step" in counters:
            for j in self._group_indices()[i]:
                self._steps[j] = int(counters["step"])

    def _param_counters(self, j, group_counters):
        return {} if self._steps[j] == group_counters["step"] else dict(step=self._steps[j])

    def _set_param_counters(self, j, entry):
        if "step" in entry:
            self._steps[j] = int(np.asarray(entry["step"]).reshape(-1)[0])

    def _run_key(self, j):
        return self._steps[j]

    def _set_live(self, i, g, runs):
        """Counts the step of each parameter that steps, and sets the Live arguments of the group (runs None) or of
        each run from its parameters' count."""
        indices = self._group_indices()[i]
        spans = runs if runs is not None else [(indices[0], indices[-1] + 1)] if indices else []
        for a, b in spans:
            if self._run_key(a) is not None and len(set(self._steps[a:b])) > 1:  # only a replay (an eager step's
                # runs are made from the counts), and only where the update reads the count (Adam's)
                raise CaptureError(f"{type(self).__name__}: parameters {a}-{b - 1} (param_groups[{i}]) share one "
                                   "launch in this captured step, but have stepped different numbers of times since "
                                   "(another step passed over some of them), so one launch cannot give each its own "
                                   "bias correction; capture the step again")
            for j in range(a, b):
                self._steps[j] += 1
            live = self._live[i] if runs is None else self._run_live(i, (a, b))
            for box, v in zip(live, self._live_values(g, self._steps[a])):
                box.value = v

    def _run_live(self, i, run):
        """The Live arguments of a run of group i's parameters (kept: a captured step's launches name them)."""
        lives = self.__dict__.setdefault("_run_lives", {})
        if (i, run) not in lives:
            lives[(i, run)] = _live(self.live_count)
        return lives[(i, run)]

    def _lives(self, i, run):
        return self._live[i] if run is None else self._run_live(i, run)


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, weight decay and Nesterov, as torch.optim.SGD (dampening 0)."""

    state_names = ("momentum_buffer",)
    _what_built = "whether momentum is 0, or nesterov,"

    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0, nesterov=False):
        self._live = []  # per group: Live (lr, momentum, weight decay), set by each step's host action
        self._live_set = []  # per group: the values they hold (converted only when one changed)
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov))

    def _group_added(self):
        self._live.append(_live(3))
        self._live_set.append(None)

    def _normalise(self, g):
        g["lr"], g["momentum"], g["weight_decay"] = float(g["lr"]), float(g["momentum"]), float(g["weight_decay"])
        g["nesterov"] = bool(g["nesterov"])

    def _check(self, h):
        if h["lr"] < 0 or h["momentum"] < 0 or h["weight_decay"] < 0:  # lr 0: a schedule's end, as PyTorch's
            raise ValueError(f"SGD: lr, momentum and weight_decay must be non-negative (got lr={h['lr']}, "
                             f"momentum={h['momentum']}, weight_decay={h['weight_decay']})")
        if h["nesterov"] and h["momentum"] == 0:
            raise ValueError("SGD: nesterov=True needs momentum > 0")

    def _group_state(self, g):
        return ("momentum_buffer",) if g["momentum"] else ()

    def load_state_dict(self, state_dict):
        saved_groups = state_dict.get("param_groups", []) if isinstance(state_dict, dict) else []
        for i, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            saved = saved.get("momentum", group["momentum"]) if isinstance(saved, dict) else group["momentum"]
            if bool(saved) != bool(group["momentum"]):
                where = f" in group {i}" if len(self.param_groups) > 1 else ""
                raise ValueError(f"SGD.load_state_dict: the state was saved with momentum {saved}, this optimizer "
                                 f"has {group['momentum']}{where}; make the optimizer with the saved run's momentum")
        super().load_state_dict(state_dict)

    def _built(self, g):
        return g["momentum"] != 0, bool(g["nesterov"])

    def _set_live(self, i, g, runs):
        now = (g["lr"], g["momentum"], g["weight_decay"])
        if now != self._live_set[i]:
            self._live_set[i] = now
            for live, v in zip(self._live[i], _f32(*now)):
                live.value = v

    def _takes_deferred(self, g):
        # a group of one parameter, as PyTorch's optimizer-in-backward pattern makes: an optimizer per parameter,
        # stepped in its post-accumulate-grad hook (conv.DeferredWeightGrad)
        params = g["params"]
        return len(params) == 1 and hasattr(params[0]._grad_pending, "sgd_step")

    def _deferred_update(self, i, g):
        lr, momentum, weight_decay = self._live[i]
        p = g["params"][0]
        buf = self._views["momentum_buffer"][self._group_indices()[i][0]] if g["momentum"] else None
        p._grad_pending.sgd_step(p, buf, lr, momentum, weight_decay, g["nesterov"])

    def _update_group(self, i, g, data, grad, state, run=None):
        lr, momentum, weight_decay = self._live[i]
        buf = state.get("momentum_buffer", grad) if g["momentum"] else grad
        k = kernels.kernel(data.device, "sgd.cl", "sgd_step", dict(MOMENTUM=g["momentum"] != 0,
                                                                   NESTEROV=g["nesterov"]))
        ops._map(data.device, k, data.size, ops.VW, data, grad, buf, data.size, lr, momentum, weight_decay,
                 what="SGD step")


class Adam(_Counted):
    """Adam as torch.optim.Adam (weight_decay as an L2 term added to the gradient; amsgrad not offered)."""

    state_names = ("exp_avg", "exp_avg_sq")
    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False):
        if amsgrad:
            raise ValueError(f"{type(self).__name__}: amsgrad=True is not offered by clnet")
        self._steps = []  # per parameter (_Counted)
        self._live = []   # per group: Live (lr, step size, sqrt(1 - b2^t), b1, b2, eps, decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    live_count = 7

    def _normalise(self, g):
        try:
            b1, b2 = g["betas"]
        except (TypeError, ValueError) as e:
            raise ValueError(f"{type(self).__name__}: betas must be a pair (b1, b2), got {g['betas']!r}") from e
        g["lr"], g["betas"], g["eps"] = float(g["lr"]), (float(b1), float(b2)), float(g["eps"])
        g["weight_decay"] = float(g["weight_decay"])

    def _check(self, h):
        b1, b2 = h["betas"]
        if h["lr"] < 0 or h["eps"] < 0 or h["weight_decay"] < 0 or not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"{type(self).__name__}: need lr >= 0, eps >= 0, weight_decay >= 0 and betas in [0, 1) "
                             f"(got lr={h['lr']}, betas={h['betas']}, eps={h['eps']}, "
                             f"weight_decay={h['weight_decay']})")

    def _live_values(self, g, t):
        b1, b2 = g["betas"]
        # PyTorch: p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
        return _f32(g["lr"], g["lr"] / (1.0 - b1 ** t), (1.0 - b2 ** t) ** 0.5, b1, b2, g["eps"], g["weight_decay"])

    def _update_group(self, i, g, data, grad, state, run=None):
        k = kernels.kernel(data.device, "adam.cl", "adam_step", dict(DECOUPLED=self.decoupled))
        ops._map(data.device, k, data.size, ops.VW, data, grad, state["exp_avg"], state["exp_avg_sq"], data.size,
                 *self._lives(i, run), what=f"{type(self).__name__} step")


class AdamW(Adam):
    """AdamW as torch.optim.AdamW: weight decay applied to the parameter (p *= 1 - lr * weight_decay) before the
    Adam update, not through the gradient."""

    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad)


class RMSprop(_Counted):
    """RMSprop as torch.optim.RMSprop: a running mean of squared gradients (weight `alpha`) divides each gradient;
    `centered` subtracts the squared running mean of the gradients first; `momentum` keeps a buffer of the divided
    gradients."""

    state_names = ("square_avg", "momentum_buffer", "grad_avg")
    _what_built = "whether momentum is 0, or centered,"

    def __init__(self, params, lr=0.01, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False):
        self._steps = []  # per parameter (_Counted)
        self._live = []  # per group: Live (lr, alpha, eps, weight decay, momentum)
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered))

    live_count = 5

    def _normalise(self, g):
        for k in ("lr", "alpha", "eps", "weight_decay", "momentum"):
            g[k] = float(g[k])
        g["centered"] = bool(g["centered"])

    def _check(self, h):
        if not (h["lr"] >= 0 and h["eps"] >= 0 and h["weight_decay"] >= 0 and h["momentum"] >= 0
                and 0 <= h["alpha"] <= 1):
            raise ValueError(f"RMSprop: need lr >= 0, eps >= 0, weight_decay >= 0, momentum >= 0 and alpha in [0, 1] "
                             f"(got lr={h['lr']}, alpha={h['alpha']}, eps={h['eps']}, "
                             f"weight_decay={h['weight_decay']}, momentum={h['momentum']})")

    def _group_state(self, g):
        return ("square_avg",) + (("momentum_buffer",) if g["momentum"] else ()) + \
            (("grad_avg",) if g["centered"] else ())

    def _built(self, g):
        return g["momentum"] != 0, bool(g["centered"])

    def _live_values(self, g, t):
        return _f32(g["lr"], g["alpha"], g["eps"], g["weight_decay"], g["momentum"])

    def _run_key(self, j):
        return None  # its update reads no count: every run of a group shares the group's Live arguments

    def _update_group(self, i, g, data, grad, state, run=None):
        momentum, centered = self._built(g)
        k = kernels.kernel(data.device, "rmsprop.cl", "rmsprop_step", dict(MOMENTUM=momentum, CENTERED=centered))
        ops._map(data.device, k, data.size, ops.VW, data, grad, state["square_avg"],
                 state["momentum_buffer"] if momentum else grad, state["grad_avg"] if centered else grad, data.size,
                 *self._lives(i, run), what="RMSprop step")


__all__ = ["Adam", "AdamW", "Optimizer", "Parameter", "RMSprop", "SGD", "lr_scheduler"]
