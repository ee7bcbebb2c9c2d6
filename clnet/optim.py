"""Optimizers; their updates run as kernels on the device.

On its first use SGD moves every parameter, its gradient and its momentum into one flat buffer each (a parameter's
`data` and `grad` become sub-buffers of those), so that `step` is one launch and `zero_grad` one fill, whatever the
number of parameters: for a small network the launches, not the arithmetic, are the cost of an update.
"""
import numpy as np

from . import ops
from .tensor import region_alignment


class SGD:
    """Stochastic gradient descent with momentum, weight decay and Nesterov, as torch.optim.SGD (dampening 0)."""

    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0, nesterov=False):
        self.params = list(params)
        if lr <= 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"SGD: lr must be positive and momentum, weight_decay non-negative (got lr={lr}, "
                             f"momentum={momentum}, weight_decay={weight_decay})")
        if nesterov and momentum == 0:
            raise ValueError("SGD: nesterov=True needs momentum > 0")
        self.lr, self.momentum, self.weight_decay, self.nesterov = float(lr), float(momentum), float(weight_decay), \
            bool(nesterov)
        self._flat = None      # (data, grad, momentum) flat tensors once on a device
        self._layout = None    # the parameters' data tensors the flat buffers were made for
        self.buffers = [None] * len(self.params)  # per-parameter momentum views
        self._pending = None   # momentum loaded before the flat buffers exist

    def _flatten(self):
        """(Re)builds the flat buffers when the parameters are new or were moved; copies their values in."""
        if self._layout is not None and all(p.data is d for p, d in zip(self.params, self._layout)):
            return
        if any(p.data is None for p in self.params):
            raise RuntimeError("SGD: a parameter is not on a device yet; call model.to(device) first")
        dev = self.params[0].data.device
        if any(p.data.device is not dev for p in self.params):
            raise RuntimeError("SGD: the parameters are on different devices; move the whole model with .to(device)")
        step = region_alignment(dev) // 4
        offsets, total = [], 0
        for p in self.params:
            offsets.append(total)
            total += -(-max(p.data.size, 1) // step) * step
        data, grad = ops.zeros((total,), dev), ops.zeros((total,), dev)
        mom = ops.zeros((total,), dev) if self.momentum else None  # zero momentum makes the first step PyTorch's
        old_momentum = [None if b is None else b.numpy() for b in self.buffers]
        self.buffers = [None] * len(self.params)
        for i, (p, off) in enumerate(zip(self.params, offsets)):
            new_data, new_grad = data.region(off, p.shape), grad.region(off, p.shape)
            new_data.copy_from(p.data)
            new_grad.copy_from(p.grad)
            p.data, p.grad = new_data, new_grad
            if mom is not None:
                self.buffers[i] = mom.region(off, p.shape)
                if old_momentum[i] is not None:
                    self.buffers[i].write(old_momentum[i])
        self._flat, self._layout = (data, grad, mom), [p.data for p in self.params]
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._load_buffers(pending)

    def zero_grad(self):
        if not self.params:
            return
        self._flatten()
        ops.fill(self._flat[1], 0.0)

    def step(self):
        if not self.params:
            return
        self._flatten()
        data, grad, mom = self._flat
        ops.sgd_step(data, grad, mom if mom is not None else grad, self.lr, self.momentum, self.weight_decay,
                     self.nesterov)

    def state_dict(self):
        if self._pending is not None:  # loaded, not yet on the device: hand back what was loaded
            buffers = [None if b is None else b.copy() for b in self._pending]
        else:
            buffers = [None if b is None or not self.momentum else b.numpy() for b in self.buffers]
        return dict(lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay, nesterov=self.nesterov,
                    buffers=buffers)

    def load_state_dict(self, state):
        buffers = state["buffers"]
        if len(buffers) != len(self.params):
            raise ValueError(f"SGD.load_state_dict: {len(buffers)} momentum buffers for {len(self.params)} parameters")
        for i, (p, b) in enumerate(zip(self.params, buffers)):
            if b is not None and tuple(b.shape) != tuple(p.shape):
                raise ValueError(f"SGD.load_state_dict: buffer {i} has shape {b.shape}, parameter has {p.shape}")
        if bool(state["momentum"]) != bool(self.momentum) and self._flat is not None:
            self._layout = None  # momentum buffers appear or vanish: rebuild
        self.lr, self.momentum = state["lr"], state["momentum"]
        self.weight_decay, self.nesterov = state["weight_decay"], state["nesterov"]
        if self._flat is None or self._layout is None:
            self._pending = [None if b is None else np.array(b, dtype=np.float32) for b in buffers]
        else:
            self._load_buffers(buffers)

    def _load_buffers(self, buffers):
        for view, b in zip(self.buffers, buffers):
            if view is not None:
                if b is None:
                    ops.fill(view, 0.0)
                else:
                    view.write(b)
