"""Module and ModuleList: the PyTorch-shaped frame that every layer and user network fills in (Sequential, which
fuses ReLUs into the layers it knows, lives with those layers in layers.py).

Assigning a Parameter, a Module or None to an attribute registers it, as in PyTorch; `register_buffer` adds state
that is saved but not trained (batch norm's running statistics). `forward` is plain code over tensors: autograd
records what it does, and `loss.backward()` differentiates it.
"""
from collections import OrderedDict

import numpy as np

from ..devices import device as _device
from ..tensor import Parameter, Tensor


# What a layer keeps derived from its attributes, dropped whenever one is set or deleted: its repr (layers name
# themselves in every forward's messages) and a Conv2d's shapes by input shape (nn.Conv2d.conv_shape)
_DERIVED = ("_repr", "_shapes")


class _Handle:
    def __init__(self, hooks, key):
        self.hooks, self.key = hooks, key

    def remove(self):
        self.hooks.pop(self.key, None)


class Module:
    """Base of every layer and network: configuration and parameters in __init__, computation in forward."""

    # True where the output always has the input's shape (activations, dropout): then the default output_shape is
    # this layer's geometry, and a Sequential of such layers and of layers with their own output_shape can check the
    # whole chain before running it.
    keeps_shape = False

    def __init__(self):
        d = self.__dict__
        d["_parameters"], d["_buffers"], d["_modules"] = OrderedDict(), OrderedDict(), OrderedDict()
        d["_forward_pre_hooks"], d["_forward_hooks"] = OrderedDict(), OrderedDict()
        d["training"], d["device"] = True, None

    # -- registration --------------------------------------------------------------------------------------------
    def __setattr__(self, name, value):
        d = self.__dict__
        for derived in _DERIVED:  # any attribute may be configuration that these derive from
            d.pop(derived, None)
        if "_parameters" not in d:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        params, buffers, modules = d["_parameters"], d["_buffers"], d["_modules"]
        if isinstance(value, (Parameter, Module)):
            for table in (d, params, buffers, modules):
                table.pop(name, None)
            (params if isinstance(value, Parameter) else modules)[name] = value
        elif name in params or name in modules:
            if value is not None:
                kind = "parameter" if name in params else "submodule"
                raise TypeError(f"{type(self).__name__}.{name} is a {kind}: assign a "
                                f"{'Parameter' if kind == 'parameter' else 'Module'} or None, not "
                                f"{type(value).__name__}")
            (params if name in params else modules)[name] = None
        elif name in buffers:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"{type(self).__name__}.{name} is a buffer: assign a clnet tensor or None")
            buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for derived in _DERIVED:
            self.__dict__.pop(derived, None)
        for table in ("_parameters", "_buffers", "_modules"):
            if name in self.__dict__[table]:
                del self.__dict__[table][name]
                return
        object.__delattr__(self, name)

    def register_buffer(self, name, tensor, persistent=True):
        """Adds state that state_dict saves (when persistent) and .to(device) moves, but no optimizer trains."""
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"{type(self).__name__}.register_buffer({name!r}): expected a clnet tensor or None, got "
                            f"{type(tensor).__name__}")
        self.__dict__.pop(name, None)
        self._buffers[name] = tensor
        if not persistent:
            self.__dict__.setdefault("_non_persistent", set()).add(name)

    def register_parameter(self, name, param):
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"{type(self).__name__}.register_parameter({name!r}): expected a Parameter or None")
        self._parameters[name] = param

    def add_module(self, name, module):
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(self).__name__}.add_module({name!r}): {type(module).__name__} is not a Module")
        self._modules[name] = module

    # -- structure -----------------------------------------------------------------------------------------------
    def named_modules(self, prefix=""):
        seen = set()
        stack = [(prefix, self)]
        while stack:
            name, m = stack.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            yield name, m
            children = [(name + ("." if name else "") + k, c) for k, c in m._modules.items() if c is not None]
            stack.extend(reversed(children))

    def modules(self):
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named(self, table, prefix):
        seen = set()
        for path, m in self.named_modules(prefix):
            for name, t in m.__dict__[table].items():
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    yield (path + "." if path else "") + name, t

    def named_parameters(self, prefix=""):
        yield from self._named("_parameters", prefix)

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix=""):
        yield from self._named("_buffers", prefix)

    def buffers(self):
        return [b for _, b in self.named_buffers()]

    def to(self, dev):
        """Moves every parameter and buffer to dev in place (their identities are kept) and returns self."""
        dev = _device(dev)
        for m in self.modules():
            m.__dict__["device"] = dev
            for t in list(m._parameters.values()) + list(m._buffers.values()):
                if t is not None and not getattr(t, "stays_on_host", False):
                    t._place(dev)
        return self

    def train(self, mode=True):
        for m in self.modules():
            m.__dict__["training"] = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad_(flag)
        return self

    def zero_grad(self, set_to_none=True):
        """Marks every parameter's gradient that exists as None (set_to_none, PyTorch's default) or as zero, as
        Optimizer.zero_grad does: marked, not written (kept allocated: an optimizer's flat buffers stay in place)."""
        for p in self.parameters():
            p._mark_grad_zero(set_to_none)

    # -- weights -------------------------------------------------------------------------------------------------
    def _state_items(self):
        """(key, tensor) of parameters and persistent buffers, module by module as PyTorch orders its state_dict."""
        seen = set()
        for path, m in self.named_modules():
            skip = m.__dict__.get("_non_persistent", ())
            items = list(m._parameters.items()) + [(k, b) for k, b in m._buffers.items() if k not in skip]
            for name, t in items:
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    yield (path + "." if path else "") + name, t

    def state_dict(self):
        """Parameters and persistent buffers by PyTorch's key names, as NumPy arrays (integer buffers as int64)."""
        out = OrderedDict()
        for k, t in self._state_items():
            a = t.numpy()
            out[k] = a.astype(np.int64) if a.dtype.kind == "i" else a
        return out

    def load_state_dict(self, state_dict, strict=True):
        """Loads weights and buffers by PyTorch's key names and layouts, from NumPy arrays or torch tensors; every key,
        shape and value is checked before anything changes."""
        own = dict(self._state_items())
        missing = [k for k in own if k not in state_dict]
        extra = [k for k in state_dict if k not in own]
        if strict and (missing or extra):
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing keys {missing}, unexpected keys {extra}")
        arrays = {}
        for k, t in own.items():
            if k not in state_dict:
                continue
            v = state_dict[k]
            a = np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v)
            if a.shape != t.shape:
                raise ValueError(f"{type(self).__name__}.load_state_dict: {k!r} has shape {a.shape}, the model "
                                 f"expects {t.shape}")
            if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
                raise ValueError(f"{type(self).__name__}.load_state_dict: {k!r} holds NaN or infinite values")
            if t.dtype.kind == "i" and a.dtype.kind not in "iub":
                raise TypeError(f"{type(self).__name__}.load_state_dict: {k!r} is an integer buffer, got {a.dtype}")
            arrays[k] = a
        for k, a in arrays.items():
            own[k].write(a)

    # -- computation ---------------------------------------------------------------------------------------------
    def output_shape(self, input_shape):
        """The output shape for an input shape, or a ValueError naming the layer and the fix. Pure Python; layers
        that know their geometry override it."""
        return tuple(input_shape)

    def register_forward_pre_hook(self, hook):
        """hook(module, args) runs before forward."""
        key = object()
        self._forward_pre_hooks[key] = hook
        return _Handle(self._forward_pre_hooks, key)

    def register_forward_hook(self, hook):
        """hook(module, args, output) runs after forward."""
        key = object()
        self._forward_hooks[key] = hook
        return _Handle(self._forward_hooks, key)

    def __call__(self, *args, **kwargs):
        x = args[0] if args else None
        if isinstance(x, Tensor):
            if x.device is None:
                raise ValueError(f"{self._name()}: the input is not on a device; make it with clnet.tensor(array, "
                                 "device=...)")
            if self.device is None:
                self.to(x.device)
            elif self.device is not x.device:
                raise ValueError(f"{self._name()}: the input is on {x.device.name} but the module is on "
                                 f"{self.device.name}; move one of them with .to(device)")
        elif args and not isinstance(x, (list, tuple, dict)):
            raise TypeError(f"{self._name()}: expected a clnet tensor, got {type(x).__name__}; wrap host data with "
                            "clnet.tensor(array, device=...)")
        d = self.__dict__
        if d["_forward_pre_hooks"]:  # most calls have none: no list is made for them (this runs per layer per step)
            for hook in list(d["_forward_pre_hooks"].values()):
                hook(self, args)
        out = self.forward(*args, **kwargs)
        if d["_forward_hooks"]:
            for hook in list(d["_forward_hooks"].values()):
                hook(self, args, out)
        return out

    def _name(self):
        return repr(self).split("\n")[0] + (")" if self._modules else "")

    def forward(self, *args):
        raise NotImplementedError(f"{type(self).__name__} defines no forward()")

    def extra_repr(self):
        return ""

    def __repr__(self):
        children = [f"  ({name}): " + repr(m).replace("\n", "\n  ") for name, m in self._modules.items()]
        if not children:  # kept until an attribute is set: layers name themselves in every forward's messages
            r = self.__dict__.get("_repr")
            if r is None:
                r = self.__dict__["_repr"] = f"{type(self).__name__}({self.extra_repr()})"
            return r
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + "\n" + "\n".join(children) + "\n)"


class ModuleList(Module):
    """A list of modules, registered (so their parameters are found), with no forward of its own."""

    def __init__(self, modules=()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module):
        self.add_module(str(len(self._modules)), module)
        return self

    def extend(self, modules):
        for m in modules:
            self.append(m)
        return self

    def __getitem__(self, i):
        if isinstance(i, slice):
            return ModuleList(list(self._modules.values())[i])
        return list(self._modules.values())[i]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())
