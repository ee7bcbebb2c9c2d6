"""Optimizers (SGD, Adam, AdamW) with PyTorch's arguments and updates, run as kernels on the device.

On its first use an optimizer moves every parameter, its gradient and its state (momentum, Adam's moments) into one
flat buffer each (a parameter's memory and its .grad become sub-buffers of those), so that `step` is one launch
whatever the number of parameters: for a small network the launches, not the arithmetic, are the cost of an update.
`zero_grad` launches nothing: it marks the gradients zero (Tensor.grad), and the next backward overwrites them.
The parameters keep their identity; only their memory moves.

`state_dict()` follows PyTorch's shape: {"state": {index: {name: array}}, "param_groups": [{hyperparameters}]}.
"""
import numpy as np

from . import autograd, kernels, ops
from .graph import CaptureError
from .tensor import Parameter, Tensor, region_alignment


class Optimizer:
    """The flat-buffer frame shared by every optimizer. Subclasses name their per-parameter state (`state_names`),
    check their hyperparameters and launch their update in `_update(data, grad, state)`."""

    state_names = ()
    defaults = {}

    def __init__(self, params, **hyper):
        self.params = list(params)
        for i, p in enumerate(self.params):
            if not isinstance(p, Tensor) or not p.requires_grad:
                raise TypeError(f"{type(self).__name__}: item {i} of params is not a tensor that requires a gradient "
                                f"(pass model.parameters())")
        # one parameter group, PyTorch's shape: editing param_groups[0]["lr"] (or opt.lr) changes the next step
        self.param_groups = [dict(self.defaults, **hyper, params=self.params)]
        self._flat = None     # (data, grad, {state name: flat tensor}) once on a device
        self._layout = None   # (storage, grad) per parameter that the flat buffers were made for
        self._views = {name: [None] * len(self.params) for name in self.state_names}
        self._pending = None  # state loaded before the flat buffers exist

    @property
    def hyper(self):
        """The hyperparameters (the one group without its params)."""
        return {k: v for k, v in self.param_groups[0].items() if k != "params"}

    def __getattr__(self, name):
        groups = self.__dict__.get("param_groups")
        if groups is not None and name in groups[0] and name != "params":
            return groups[0][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        groups = self.__dict__.get("param_groups")
        if groups is not None and name in groups[0] and name != "params":
            groups[0][name] = value
        else:
            object.__setattr__(self, name, value)

    def _flatten(self):
        """(Re)builds the flat buffers when the parameters are new or were moved; copies their values in."""
        if self._layout is not None and all(p.storage is s and p._grad is g for p, (s, g) in
                                            zip(self.params, self._layout)):
            return
        if any(p.storage is None for p in self.params):
            raise RuntimeError(f"{type(self).__name__}: a parameter is not on a device yet; call model.to(device) "
                               "first")
        dev = self.params[0].device
        if any(p.device is not dev for p in self.params):
            raise RuntimeError(f"{type(self).__name__}: the parameters are on different devices; move the whole "
                               "model with .to(device)")
        if kernels.capturing is not None and kernels.capturing.launches:
            raise CaptureError(f"{type(self).__name__} lays out its parameters at its first zero_grad() or step(); "
                               "inside a capture that has already recorded launches on the old layout, a replay "
                               "would train stale copies: run one step (or call zero_grad()) before capturing")
        with kernels.set_up():  # a capture in progress keeps the new layout, not the copies into it
            step = region_alignment(dev) // 4
            offsets, total = [], 0
            for p in self.params:
                offsets.append(total)
                total += -(-max(p.size, 1) // step) * step
            old_state = {name: [None if v is None else v.numpy() for v in views]
                         for name, views in self._views.items()}
            data, grad = ops.zeros((total,), dev), ops.zeros((total,), dev)
            state = {name: ops.zeros((total,), dev) for name in self.state_names}  # zero state: PyTorch's first step
            for i, (p, off) in enumerate(zip(self.params, offsets)):
                new_data, new_grad = data.region(off, p.shape), grad.region(off, p.shape)
                new_data.copy_from(p)
                if p.grad is not None:
                    new_grad.copy_from(p.grad)
                p.storage, p.grad = new_data.storage, new_grad
                for name in self.state_names:
                    view = self._views[name][i] = state[name].region(off, p.shape)
                    if old_state[name][i] is not None:
                        view.write(old_state[name][i])
            self._flat = (data, grad, state)
            self._layout = [(p.storage, p.grad) for p in self.params]
            if self._pending is not None:
                pending, self._pending = self._pending, None
                self._load_state(pending)

    def zero_grad(self, set_to_none=False):
        """Marks every gradient as zero, writing nothing: the next backward overwrites each instead of adding to it,
        and any other read of a .grad fills it with zeros first (the gradients stay allocated in the optimizer's flat
        buffer: set_to_none is accepted and ignored)."""
        if not self.params:
            return
        self._flatten()
        for p in self.params:
            p._mark_grad_zero()

    def step(self):
        if not self.params:
            return
        self._flatten()
        data, grad, state = self._flat
        if kernels.capturing is not None:  # the update reads every gradient: marks older than the capture settled
            for p in self.params:
                autograd.settle_grad(p)
        unwritten = [p for p in self.params if p._grad_zeroed]  # no backward reached them since zero_grad
        if len(unwritten) == len(self.params):
            ops.fill(grad, 0.0)
            for p in unwritten:
                p._grad_zeroed = False
        else:
            for p in unwritten:
                p.grad  # noqa: B018 -- reading a .grad marked zero fills it
        self._update(data, grad, state)

    def _update(self, data, grad, state):
        raise NotImplementedError

    # -- state ---------------------------------------------------------------------------------------------------
    def _counters(self):
        return {}

    def state_dict(self):
        if self._pending is not None:  # loaded, not yet on the device: hand back what was loaded
            state = {i: dict(s) for i, s in self._pending["state"].items()}
            counters = self._pending.get("counters", {})
        else:
            state = {}
            for i in range(len(self.params)):
                entry = {name: self._views[name][i].numpy() for name in self.state_names
                         if self._views[name][i] is not None}
                if entry:
                    state[i] = entry
            counters = self._counters()
        return {"state": state, "param_groups": [dict(self.hyper, params=list(range(len(self.params))),
                                                      **counters)]}

    def load_state_dict(self, state_dict):
        try:
            group, = state_dict["param_groups"]
            state = {int(i): s for i, s in state_dict["state"].items()}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{type(self).__name__}.load_state_dict: not an optimizer state ({e})") from e
        if len(group.get("params", self.params)) != len(self.params):
            raise ValueError(f"{type(self).__name__}.load_state_dict: state for {len(group['params'])} parameters, "
                             f"this optimizer has {len(self.params)}")
        for i, entry in state.items():
            if not 0 <= i < len(self.params):
                raise ValueError(f"{type(self).__name__}.load_state_dict: no parameter {i}")
            for name, a in entry.items():
                if name not in self.state_names:
                    raise ValueError(f"{type(self).__name__}.load_state_dict: unknown state {name!r} (this optimizer "
                                     f"keeps {list(self.state_names)})")
                if tuple(np.shape(a)) != tuple(self.params[i].shape):
                    raise ValueError(f"{type(self).__name__}.load_state_dict: {name} of parameter {i} has shape "
                                     f"{np.shape(a)}, the parameter has {self.params[i].shape}")
        hyper = {k: group[k] for k in self.hyper if k in group}
        counters = {k: group[k] for k in self._counters() if k in group}
        self._check(dict(self.hyper, **hyper))
        self.param_groups[0].update(hyper)
        loaded = dict(state={i: {n: np.array(a, np.float32) for n, a in s.items()} for i, s in state.items()},
                      counters=counters)
        if self._flat is None:
            self._pending = loaded
        else:
            self._load_state(loaded)

    def _load_state(self, loaded):
        for name in self.state_names:
            for i, view in enumerate(self._views[name]):
                a = loaded["state"].get(i, {}).get(name)
                if a is None:
                    ops.fill(view, 0.0)
                else:
                    view.write(a)
        for k, v in loaded.get("counters", {}).items():
            setattr(self, "_" + k, v)

    def _check(self, hyper):
        pass


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, weight decay and Nesterov, as torch.optim.SGD (dampening 0)."""

    defaults = dict(lr=0.01, momentum=0.0, weight_decay=0.0, nesterov=False)

    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0, nesterov=False):
        hyper = dict(lr=float(lr), momentum=float(momentum), weight_decay=float(weight_decay), nesterov=bool(nesterov))
        self._check(hyper)
        self.state_names = ("momentum_buffer",) if momentum else ()
        super().__init__(params, **hyper)
        self._live = kernels.Live(None), kernels.Live(None)  # lr, weight decay: set by each step's host action
        self._live_set = None  # the (lr, weight decay) they hold: every step's action, eager or replayed, sets both

    def _check(self, h):
        if h["lr"] <= 0 or h["momentum"] < 0 or h["weight_decay"] < 0:
            raise ValueError(f"SGD: lr must be positive and momentum, weight_decay non-negative (got lr={h['lr']}, "
                             f"momentum={h['momentum']}, weight_decay={h['weight_decay']})")
        if h["nesterov"] and h["momentum"] == 0:
            raise ValueError("SGD: nesterov=True needs momentum > 0")

    def load_state_dict(self, state_dict):
        saved = state_dict.get("param_groups", [{}])[0].get("momentum", self.momentum)
        if bool(saved) != bool(self.momentum):
            raise ValueError(f"SGD.load_state_dict: the state was saved with momentum {saved}, this optimizer has "
                             f"{self.momentum}; make the optimizer with the saved run's momentum")
        super().load_state_dict(state_dict)

    def _update(self, data, grad, state):
        h = self.hyper
        buf = state.get("momentum_buffer", grad)
        lr, weight_decay = self._live

        def hyper():  # read at every step, replayed ones too, so a changed param_groups[0]["lr"] takes effect
            group = self.param_groups[0]
            now = (group["lr"], group["weight_decay"])
            if now != self._live_set:
                self._live_set = now
                lr.value, weight_decay.value = np.float32(now[0]), np.float32(now[1])
        kernels.per_step(hyper)
        ops.sgd_step(data, grad, buf, lr, h["momentum"], weight_decay, h["nesterov"])


class Adam(Optimizer):
    """Adam as torch.optim.Adam (weight_decay as an L2 term added to the gradient; amsgrad not offered)."""

    state_names = ("exp_avg", "exp_avg_sq")
    defaults = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False):
        if amsgrad:
            raise ValueError(f"{type(self).__name__}: amsgrad=True is not offered by clnet")
        hyper = dict(lr=float(lr), betas=(float(betas[0]), float(betas[1])), eps=float(eps),
                     weight_decay=float(weight_decay))
        self._check(hyper)
        super().__init__(params, **hyper)
        self._step = 0
        self._live = tuple(kernels.Live(None) for _ in range(5))  # lr, step size, sqrt(1 - b2^t), eps, decay

    def _check(self, h):
        b1, b2 = h["betas"]
        if h["lr"] <= 0 or h["eps"] < 0 or h["weight_decay"] < 0 or not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"{type(self).__name__}: need lr > 0, eps >= 0, weight_decay >= 0 and betas in [0, 1) "
                             f"(got lr={h['lr']}, betas={h['betas']}, eps={h['eps']}, "
                             f"weight_decay={h['weight_decay']})")

    def _counters(self):
        return dict(step=self._step)

    def _update(self, data, grad, state):
        h = self.hyper
        lr, step_size, bc2_sqrt, eps, weight_decay = self._live

        def advance():  # host state of a step: a replayed graph repeats it (and sees param_groups[0] as it is then)
            h = self.param_groups[0]
            self._step += 1
            b1, b2 = h["betas"]
            # PyTorch: p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
            lr.value = np.float32(h["lr"])
            step_size.value = np.float32(h["lr"] / (1.0 - b1 ** self._step))
            bc2_sqrt.value = np.float32((1.0 - b2 ** self._step) ** 0.5)
            eps.value, weight_decay.value = np.float32(h["eps"]), np.float32(h["weight_decay"])
        kernels.per_step(advance)
        b1, b2 = h["betas"]
        dev = data.device
        k = kernels.kernel(dev, "adam.cl", "adam_step", dict(DECOUPLED=self.decoupled))
        ops._map(dev, k, data.size, ops.VW, data, grad, state["exp_avg"], state["exp_avg_sq"], data.size, lr, step_size,
                 bc2_sqrt, float(b1), float(b2), eps, weight_decay, what=f"{type(self).__name__} step")


class AdamW(Adam):
    """AdamW as torch.optim.AdamW: weight decay applied to the parameter (p *= 1 - lr * weight_decay) before the
    Adam update, not through the gradient."""

    defaults = dict(Adam.defaults, weight_decay=1e-2)
    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad)


__all__ = ["Adam", "AdamW", "Optimizer", "Parameter", "SGD"]
