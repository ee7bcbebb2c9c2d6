"""Module, Parameter and Sequential: the PyTorch-shaped frame that every layer fills in."""
import numpy as np

from .. import kernels, ops
from ..devices import device as _device
from ..tensor import Tensor, tensor


class Parameter:
    """A trainable array: ``data`` and ``grad`` are device tensors once the owning module is moved to a device."""

    def __init__(self, array):
        self._host = np.ascontiguousarray(array, dtype=np.float32)
        self.shape = self._host.shape
        self.data = None
        self.grad = None

    def to(self, dev):
        if self.data is not None and self.data.device is dev:
            return
        host = self._host if self.data is None else self.data.numpy()
        self.data = tensor(host, dev)
        self.grad = ops.zeros(self.shape, dev)
        self._host = None

    def numpy(self):
        return self._host.copy() if self.data is None else self.data.numpy()

    def load(self, array):
        if self.data is None:
            self._host = np.array(array, dtype=np.float32)
        else:
            self.data.write(array)

    def __repr__(self):
        return f"Parameter(shape={self.shape})"


class Module:
    """Base of every layer: configuration in __init__, parameters in ``_parameters``, children in ``_modules``."""

    takes_relu = False  # whether forward(x, relu=True) can absorb a ReLU that follows this layer

    def __init__(self):
        self._parameters = {}
        self._modules = {}
        self.training = True
        self.device = None

    # -- structure -----------------------------------------------------------------------------------------------
    def named_parameters(self, prefix=""):
        for name, p in self._parameters.items():
            yield prefix + name, p
        for name, m in self._modules.items():
            yield from m.named_parameters(prefix + name + ".")

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def modules(self):
        yield self
        for m in self._modules.values():
            yield from m.modules()

    def to(self, dev):
        dev = _device(dev)
        for m in self.modules():
            m.device = dev
            for p in m._parameters.values():
                p.to(dev)
        return self

    def train(self, mode=True):
        for m in self.modules():
            m.training = mode
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        for p in self.parameters():
            if p.grad is not None:
                ops.fill(p.grad, 0.0)

    # -- weights -------------------------------------------------------------------------------------------------
    def state_dict(self):
        return {name: p.numpy() for name, p in self.named_parameters()}

    def load_state_dict(self, state_dict):
        """Load weights by PyTorch's key names and layouts; every key and shape is checked before anything changes."""
        own = dict(self.named_parameters())
        missing = [k for k in own if k not in state_dict]
        extra = [k for k in state_dict if k not in own]
        if missing or extra:
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing keys {missing}, unexpected keys {extra}")
        arrays = {}
        for k, p in own.items():
            a = np.asarray(state_dict[k].detach().cpu().numpy() if hasattr(state_dict[k], "detach") else state_dict[k])
            if a.shape != p.shape:
                raise ValueError(f"{type(self).__name__}.load_state_dict: {k!r} has shape {a.shape}, "
                                 f"the model expects {p.shape}")
            if not np.all(np.isfinite(a)):
                raise ValueError(f"{type(self).__name__}.load_state_dict: {k!r} holds NaN or infinite values")
            arrays[k] = a
        for k, a in arrays.items():
            own[k].load(a)

    # -- computation ---------------------------------------------------------------------------------------------
    def output_shape(self, input_shape):
        """The output shape for an input shape, or a ValueError naming the layer and the fix. Pure Python."""
        return tuple(input_shape)

    def __call__(self, x):
        if not isinstance(x, Tensor):
            raise TypeError(f"{self!r}: expected a clnet tensor, got {type(x).__name__}; "
                            "wrap host data with clnet.tensor(array, device=...)")
        if self.device is None:
            self.to(x.device)
        elif self.device is not x.device:
            raise ValueError(f"{self!r}: the input is on {x.device.name} but the layer is on {self.device.name}; "
                             "move one of them with .to(device)")
        self.output_shape(x.shape)
        return self.forward(x)

    def forward(self, x):
        raise NotImplementedError

    def backward(self, grad_output, input_grad=True):
        """Adds d loss / d parameter into each parameter's grad and returns d loss / d input, or None when
        input_grad is False (the first layer of a training step: nobody uses its input gradient)."""
        raise NotImplementedError

    def _check_grad(self, grad_output, expected_shape):
        if not isinstance(grad_output, Tensor):
            raise TypeError(f"{self!r}.backward: expected a clnet tensor, got {type(grad_output).__name__}")
        if expected_shape is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        if tuple(grad_output.shape) != tuple(expected_shape):
            raise ValueError(f"{self!r}.backward: gradient has shape {grad_output.shape}, the forward output had "
                             f"{tuple(expected_shape)}")

    def extra_repr(self):
        return ""

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"


class Sequential(Module):
    """Layers applied in order; backward runs them in reverse."""

    def __init__(self, *layers):
        super().__init__()
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential: item {i} is a {type(layer).__name__}, not a clnet layer")
            self._modules[str(i)] = layer
        self._folded = set()  # indices of ReLUs folded into the layer before them in the last forward

    def __getitem__(self, i):
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def output_shape(self, input_shape):
        shape = tuple(input_shape)
        for i, layer in enumerate(self):
            try:
                shape = layer.output_shape(shape)
            except ValueError as e:
                raise ValueError(f"layer {i}: {e}") from None
        return shape

    def forward(self, x):
        """Runs the layers in order; a ReLU right after a layer that takes it is folded into that layer's matrix
        product epilogue: one launch and one pass over the activations fewer. Backward still applies the mask."""
        layers = list(self)
        self._folded = set()
        for i, layer in enumerate(layers):
            if i in self._folded:
                continue
            if kernels.profiler is not None:
                kernels.profiler.tag = (i, "forward")
            nxt = layers[i + 1] if i + 1 < len(layers) else None
            if layer.takes_relu and getattr(nxt, "kind", None) == "relu":
                x = layer.forward(x, relu=True)
                self._folded.add(i + 1)
            else:
                x = layer.forward(x)
        return x

    def backward(self, grad_output, input_grad=True):
        g = grad_output
        for i, layer in reversed(list(enumerate(self))):
            if i in self._folded:
                continue  # its layer's backward applies the ReLU mask
            if kernels.profiler is not None:
                kernels.profiler.tag = (i, "backward")
            g = layer.backward(g, input_grad or i > 0)
        return g

    def __repr__(self):
        inner = "\n".join(f"  ({i}): {layer!r}" for i, layer in enumerate(self))
        return f"Sequential(\n{inner}\n)"
