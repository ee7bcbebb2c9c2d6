"""Optimizers; their updates run as kernels on the device."""
from . import ops
from .tensor import empty


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
        self.buffers = [None] * len(self.params)

    def zero_grad(self):
        for p in self.params:
            if p.grad is not None:
                ops.fill(p.grad, 0.0)

    def step(self):
        for i, p in enumerate(self.params):
            if p.data is None:
                raise RuntimeError("SGD.step: a parameter is not on a device yet; call model.to(device) first")
            first = False
            if self.momentum and self.buffers[i] is None:
                self.buffers[i] = empty(p.shape, p.data.device)
                first = True
            buf = self.buffers[i] if self.momentum else p.grad  # unused without momentum
            ops.sgd_step(p.data, p.grad, buf, self.lr, self.momentum, self.weight_decay, self.nesterov, first)

    def state_dict(self):
        return dict(lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay, nesterov=self.nesterov,
                    buffers=[None if b is None else b.numpy() for b in self.buffers])

    def load_state_dict(self, state):
        buffers = state["buffers"]
        if len(buffers) != len(self.params):
            raise ValueError(f"SGD.load_state_dict: {len(buffers)} momentum buffers for {len(self.params)} parameters")
        for i, (p, b) in enumerate(zip(self.params, buffers)):
            if b is not None and tuple(b.shape) != tuple(p.shape):
                raise ValueError(f"SGD.load_state_dict: buffer {i} has shape {b.shape}, parameter has {p.shape}")
        self.lr, self.momentum = state["lr"], state["momentum"]
        self.weight_decay, self.nesterov = state["weight_decay"], state["nesterov"]
        for i, (p, b) in enumerate(zip(self.params, buffers)):
            if b is None:
                self.buffers[i] = None
            else:
                self.buffers[i] = empty(p.shape, p.data.device).write(b)
