"""Reverse-mode automatic differentiation over device tensors.

An op is a `Function` subclass with `forward` and `backward` side by side (clnet/ops.py holds the table). While any
tensor input of an op requires a gradient and gradients are enabled, `Function.apply` records the op on its output
(`out.grad_fn`), with its inputs and whatever `forward` saved. `backward(root)` walks the recorded ops from the root
in reverse topological order, hands each its output's gradient (summed over every use of that output) and
accumulates (+=) what reaches a leaf into the leaf's `.grad`. Every op's inputs and saved tensors are released as
soon as its backward has run, so the graph holds device memory for one step only.

A backward that produces a leaf's gradient by a matrix product can write straight into the leaf's `.grad`
(`Function.grad_sink`): with `beta = 1` it costs no extra pass to accumulate, and after zero_grad (which only marks
each `.grad` as zero) `beta = 0` overwrites it without reading it. Inside a Graph capture, only a zero_grad of the
captured step itself earns the overwrite (`settle_grad`).

Grad mode (`no_grad`, `is_grad_enabled`) is per thread, as PyTorch's is (kernels.context).

Tensor's gradient attributes are this module's, installed on the class at import (tensor.py, below, knows no op):
`grad` (which fills a .grad that zero_grad marked), `backward`, and the hooks below.

`register_post_accumulate_grad_hook(leaf, hook)` (PyTorch's name; also a Tensor method) calls ``hook(leaf)`` during
backward as soon as the last op that feeds the leaf has run its backward: its `.grad` is complete (queued on the
device) while earlier layers' backward is still to come. clnet.distributed starts its all-reduce there. While such
hooks run, an op may have left the leaf's gradient unwritten (`deferral`: a CPU's batch-1 dense weight gradient,
which an SGD step in the hook takes in one pass over the weight, PyTorch's optimizer-in-backward pattern); reading
`.grad` writes it, and so does the end of the hooks unless a zero_grad has marked it since (Tensor._settle_pending).

Tensor hooks, as PyTorch's: `register_hook(t, fn)` calls ``fn(grad)`` with t's whole gradient of the backward (a
leaf's summed over its uses first, then accumulated; a computed tensor's before its op's backward), and a tensor fn
returns replaces it; `retain_grad(t)` keeps a computed tensor's gradient, after its hooks, in t.grad. A computed
tensor's hooks live on its op (`Function.hooks`), a leaf's on the leaf. A tensor hook is refused inside a Graph
capture (its Python would not run at replay); retain_grad is replayed (the copy into t.grad is a recorded launch). A
post-accumulate-grad hook runs once, at the capture: the launches it makes are recorded and replayed, its host work
is not (clnet.distributed's hook, whose all-reduce is host work, refuses a capture itself).
"""
import itertools
import sys
import types
import weakref

import numpy as np

from . import kernels
from .elementwise import VW, _elementwise, _map, add, fill, full, full_like
from .graph import CaptureError
from .tensor import Tensor, empty, in_place_writes, written_since

_context = kernels.context  # grad mode is per thread (context.grad_enabled), as PyTorch's is
_hooked = 0  # leaves with post-accumulate-grad hooks; backward counts uses only when there are any


class _Module(types.ModuleType):
    """autograd._enabled, the name other modules have read and set, is this thread's grad mode."""
    _enabled = property(lambda m: _context.grad_enabled, lambda m, v: setattr(_context, "grad_enabled", bool(v)))


sys.modules[__name__].__class__ = _Module


def is_grad_enabled():
    """Whether ops run by this thread now record themselves for backward."""
    return _context.grad_enabled


class no_grad:
    """Context manager (and decorator) under which this thread's ops record nothing and keep no saved tensors."""

    def __enter__(self):
        self._previous, _context.grad_enabled = _context.grad_enabled, False

    def __exit__(self, *exc):
        _context.grad_enabled = self._previous

    def __call__(self, fn):
        def wrapped(*args, **kwargs):
            with no_grad():
                return fn(*args, **kwargs)
        wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
        return wrapped


class Function:
    """One differentiable op. Subclasses define ``forward(self, *inputs, **options)``, returning a tensor (or a tuple
    whose first element is the differentiable output), and ``backward(self, grad_output)``, returning one gradient
    (or None) per positional input. ``self.needs[i]`` says whether input i wants a gradient; ``self.save(...)``
    keeps tensors for backward only when the op is recorded."""

    unit_grad = False  # backward accepts grad_output None, meaning ones (the implicit gradient of a scalar loss)
    # backward(grad_output, pending) takes, per input, the gradient its producer has received so far from its other
    # uses (or None), and returns that sum plus its own gradient where given (ops.Cat)
    adds_into_pending = False

    __slots__ = ("needs", "inputs", "saved", "saved_at", "tag", "out_shape", "out_device", "hooks")

    @classmethod
    def apply(cls, *inputs, **options):
        fn = cls()
        needs = None
        if _context.grad_enabled:
            needs = tuple([getattr(t, "requires_grad", False) for t in inputs])  # a list first: no generator
            if True not in needs:
                needs = None
        fn.needs, fn.saved = needs, None
        out = fn.forward(*inputs, **options)
        if needs is not None:
            result = out[0] if type(out) is tuple else out
            # Edges, not tensors: a leaf that wants a gradient (its .grad is where backward adds), the op that made
            # a computed input, None for the rest. Holding the computed inputs themselves would keep every
            # activation alive until backward, where only what forward saved is needed.
            fn.inputs = tuple([None if not need else (t if t.grad_fn is None else t.grad_fn)
                               for t, need in zip(inputs, needs)])
            fn.out_shape, fn.out_device, fn.hooks = result.shape, result.device, None
            prof = _context.profiler
            fn.tag = prof.tag[0] if prof is not None and prof.tag else None
            saved = fn.saved
            if saved is not None:
                for s in saved:  # a loop: any() over a generator costs ~0.2 us more (mul and every unary save)
                    if s is result:
                        # An op that saves its own output (relu, sigmoid, softmax) keeps its memory, not the tensor:
                        # the tensor would point back at fn (grad_fn), a cycle that only the garbage collector frees,
                        # at random times, so a forward whose graph is dropped without backward would hand its buffers
                        # back late and the next forward would get other buffers, missing every launch's argument
                        # cache (kernels.py)
                        fn.saved = tuple([s.detach() if s is result else s for s in saved])
                        break
            result.requires_grad, result.grad_fn = True, fn
        return out

    @property
    def recording(self):
        return self.needs is not None

    def save(self, *tensors):
        if self.needs is not None:
            self.saved, self.saved_at = tensors, in_place_writes[0]

    def grad_sink(self, i):
        """(The .grad of input i, beta) when input i is a leaf that wants a gradient, so that backward can write into
        it directly and return None for it: beta 1 adds to what it holds, beta 0 overwrites it (a new .grad, or one
        that zero_grad marked as zero; the caller must then write every element). (None, 1.0) otherwise (backward
        returns a new tensor)."""
        t = self.inputs[i]
        if t is None or isinstance(t, Function) or t.__dict__.get("_grad_hooks"):  # its hooks see the gradient first
            return None, 1.0
        if t._grad_pending is not None:  # a second use of a leaf whose first use deferred its gradient
            t._settle_pending()
        if _context.capturing is not None:
            settle_grad(t)
        t._grad_none = False  # written now
        if t._grad is None:
            t.grad = empty(t.shape, t.device)
            return t._grad, 0.0
        if t._grad_zeroed:
            t._grad_zeroed = False
            return t._grad, 0.0
        return t._grad, 1.0

    def forward(self, *inputs, **options):
        raise NotImplementedError

    def backward(self, grad_output):
        raise NotImplementedError

    def __repr__(self):
        return f"<{type(self).__name__} backward>"


def _check_saved(fn):
    """Refuses fn's backward where a tensor it saved took an in-place write since (its gradient would be computed from
    the new values), as PyTorch's version counters do."""
    for t in fn.saved:
        if isinstance(t, Tensor) and written_since(t, fn.saved_at):
            raise RuntimeError(f"{type(fn).__name__} backward: a tensor of shape {t.shape} that this op saved for its "
                               "gradient was changed in place since (an in-place op, x[...] = value, write() or an "
                               "optimizer's step), so "
                               "the gradient would be computed from the new values; change a copy (x.clone()) "
                               "instead, or run backward before the change")


def settle_grad(leaf):
    """Inside a capture, before the step uses leaf's .grad (backward choosing between overwriting and adding to it,
    the optimizer reading it): tells the graph (Graph.note_grad), and where leaf's .grad was absent or marked zero
    before the capture began, makes it real zeros now, outside the recording.

    Such a mark belongs to no step a replay repeats: recorded, its overwrite would make every replay start the
    gradient afresh, where the eager steps the replays stand for add to it (a second micro-step of gradient
    accumulation, or any step without a zero_grad). Settled, the step records the adding form, and a replay after an
    eager zero_grad fills the gradient first (Graph.replay). A mark made by a zero_grad inside the capture is the
    step's own (the graph saw it): its overwrite is recorded, and every replay repeats it."""
    if _context.paused:  # set-up inside the capture: nothing of it is recorded, so nothing to settle or note
        return
    graph = _context.capturing
    if not graph.note_grad(leaf) or not (leaf._grad is None or leaf._grad_zeroed):
        return
    with kernels.set_up():
        if leaf._grad is None:
            leaf.grad = _untouched(graph, leaf.shape, leaf.device)
            leaf._mark_grad_zero()
        fill_marked(leaf)  # here unrecorded


def deferral(leaf):
    """Where an op's backward may leave leaf's gradient unwritten for its post-accumulate-grad hooks: a function that
    takes what will write it (an object with ``write(grad)``, which overwrites grad) and keeps it as the leaf's
    `_grad_pending`; None where the leaf has no such hooks, or has tensor hooks (they are given the gradient itself).
    Only an op that would overwrite the .grad (beta 0) defers it."""
    if not isinstance(leaf, Tensor) or not leaf.__dict__.get("_post_grad_hooks") or leaf.__dict__.get("_grad_hooks"):
        return None

    def defer(pending):
        leaf._grad_pending = pending
    return defer


def _untouched(graph, shape, dev):
    """A new tensor whose buffer no launch the graph recorded has used. A gradient made during a capture that
    replays add to must keep its values from one replay to the next, and a buffer the pool hands out may be one that
    an earlier launch of the step used for a temporary, which every replay writes again: made in set-up (as here,
    inside settle_grad), a tensor gets none of those (tensor.BufferPool._unheld)."""
    t = empty(shape, dev)
    graph._note(t.storage)
    return t


def accumulate(leaf, g):
    """leaf.grad += g (leaf.grad made as a copy of g the first time, or copied over when zero_grad marked it; inside a
    capture, a mark or absence older than the capture is settled first: settle_grad)."""
    if leaf._grad_pending is not None:
        leaf._settle_pending()
    if _context.capturing is not None:  # kernels.capturing without its module property (every accumulation)
        settle_grad(leaf)
    leaf._grad_none = False  # written now
    if leaf._grad is None:
        leaf.grad = empty(leaf.shape, leaf.device).copy_from(g)
        return
    if leaf._grad.shape != leaf.shape:
        raise RuntimeError(f"clnet: the .grad of a tensor of shape {leaf.shape} has shape {leaf._grad.shape}")
    if leaf._grad_zeroed:
        leaf.grad = leaf._grad.copy_from(g)
        return
    _map(leaf.device, _elementwise(leaf.device, "accumulate"), g.size, VW, leaf._grad, g, g.size,  # settled above:
         what="gradient accumulation")  # ._grad is what the .grad property would return, without its call


def check_gradient(y, grad):
    if not isinstance(grad, Tensor):
        raise TypeError(f"backward: the gradient must be a clnet tensor, got {type(grad).__name__}")
    if grad.shape != y.shape or grad.device is not y.device or grad.dtype != np.float32:
        raise ValueError(f"backward: the gradient has shape {grad.shape} on {grad.device.name}, the tensor has shape "
                         f"{y.shape} on {y.device.name}; pass a float32 gradient of the tensor's shape and device")


class RemovableHandle:
    """What register_hook and register_post_accumulate_grad_hook return: ``remove()`` takes the hook out (a second
    call does nothing), as PyTorch's handle."""
    _ids = itertools.count()

    def __init__(self, hooks, counted):
        self.hooks, self.counted, self.id = hooks, counted, next(RemovableHandle._ids)

    def remove(self):
        global _hooked
        if self.hooks.pop(self.id, None) is not None and self.counted and not self.hooks:
            _hooked -= 1


def _add_leaf_hook(leaf, name, hook):
    """hook added to the leaf's dict `name` of hooks; _hooked counts the leaves' non-empty dicts (backward counts the
    uses of hooked leaves only while there are any)."""
    global _hooked
    hooks = leaf.__dict__.setdefault(name, {})
    if not hooks:
        _hooked += 1
    handle = RemovableHandle(hooks, counted=True)
    hooks[handle.id] = hook
    return handle


def register_post_accumulate_grad_hook(leaf, hook):
    """Call ``hook(leaf)`` in every backward once the leaf's `.grad` has received all of that backward's
    contributions (as PyTorch's Tensor.register_post_accumulate_grad_hook), after the leaf's `register_hook` hooks.
    Returns a handle with ``remove()``."""
    if leaf.grad_fn is not None or not leaf.requires_grad:
        raise RuntimeError(f"register_post_accumulate_grad_hook: a tensor of shape {leaf.shape} that is "
                           + ("computed (not a leaf)" if leaf.grad_fn is not None else "not requiring a gradient")
                           + "; only a leaf tensor that requires a gradient has one (a parameter, or a tensor made "
                           "with requires_grad=True)")
    return _add_leaf_hook(leaf, "_post_grad_hooks", hook)


class _NodeHooks:
    """A computed tensor's hooks, kept on the op that made it (its grad_fn): register_hook's, in order, then
    retain_grad's (a weak reference: the op must not keep the tensor alive)."""
    __slots__ = ("pre", "retain")

    def __init__(self):
        self.pre, self.retain = {}, None


def register_hook(t, hook):
    """Call ``hook(grad)`` in every backward with the gradient of t (summed over all of t's uses); a tensor it
    returns replaces that gradient, for t's own .grad (a leaf, or retain_grad) and for everything before t, as
    PyTorch's Tensor.register_hook. Hooks run in the order registered, each given what the one before returned.
    Returns a handle with ``remove()``. Refused inside a Graph capture, whose replays would not call it."""
    if not t.requires_grad:
        raise RuntimeError(f"register_hook: a tensor of shape {t.shape} does not require a gradient, so no gradient "
                           "reaches it; make the leaf with requires_grad=True (or register on a tensor computed from "
                           "one)")
    if t.grad_fn is None:
        return _add_leaf_hook(t, "_grad_hooks", hook)
    node = t.grad_fn.hooks
    if node is None:
        node = t.grad_fn.hooks = _NodeHooks()
    handle = RemovableHandle(node.pre, counted=False)
    node.pre[handle.id] = hook
    return handle


def retain_grad(t):
    """Keep the gradient of computed tensor t in t.grad after backward (accumulated over backward calls, after t's
    hooks), as PyTorch's Tensor.retain_grad; a leaf keeps its .grad anyway. A tensor computed inside a Graph capture
    gets its gradient of each replayed step, as the new tensor of an eager step would."""
    if not t.requires_grad:
        raise RuntimeError(f"retain_grad: a tensor of shape {t.shape} does not require a gradient, so no gradient "
                           "reaches it; make the leaf with requires_grad=True")
    if t.grad_fn is None:
        return
    node = t.grad_fn.hooks
    if node is None:
        node = t.grad_fn.hooks = _NodeHooks()
    node.retain = weakref.ref(t)


def _retains_grad(t):
    return t.grad_fn is not None and t.grad_fn.hooks is not None and t.grad_fn.hooks.retain is not None


def _run_hooks(hooks, g, t_shape):
    """g through each of the hooks in turn (a None result keeps the gradient)."""
    if kernels.recording() is not None:
        raise CaptureError("register_hook: a tensor hook runs Python in backward, which a replay of the Graph would "
                           "not run again; remove it (handle.remove()) before the capture, or run this backward "
                           "eagerly")
    for hook in list(hooks.values()):
        out = hook(g)
        if out is not None:
            if not isinstance(out, Tensor) or out.shape != t_shape or out.dtype != g.dtype:
                what = f"shape {out.shape} {out.dtype}" if isinstance(out, Tensor) else type(out).__name__
                raise RuntimeError(f"register_hook: the hook {getattr(hook, '__name__', hook)!r} returned {what} "
                                   f"for the gradient of a tensor of shape {t_shape}; return a float32 tensor of that "
                                   "shape, or None to keep the gradient")
            g = out
    return g


def _node_gradient(fn, g, node):
    """The gradient of fn's output after its hooks, and kept in its .grad when it retains one."""
    if g is None:
        g = full(fn.out_shape, fn.out_device, 1.0)
    if node.pre:
        g = _run_hooks(node.pre, g, fn.out_shape)
    if node.retain is not None:
        t = node.retain()
        if t is not None and t._grad is None:  # a copy: inside a capture, every replay writes that step's t.grad
            t.grad = empty(t.shape, t.device).copy_from(g)
        elif t is not None:
            accumulate(t, g)
    return g


def _leaf_gradient(leaf, g):
    """A leaf's whole gradient of this backward: through its hooks, into its .grad, then its post-accumulate hooks."""
    hooks = leaf.__dict__.get("_grad_hooks")
    if hooks:
        g = _run_hooks(hooks, g, leaf.shape)
    accumulate(leaf, g)
    _post_accumulate(leaf)


def _post_accumulate(leaf):
    """leaf's post-accumulate-grad hooks, then its deferred gradient written unless they took it."""
    for hook in list(leaf.__dict__.get("_post_grad_hooks", {}).values()):
        hook(leaf)
    if leaf._grad_pending is not None:
        leaf._settle_pending()


def _hooked_uses(order):
    """id(leaf) -> [edges left, leaf, gradient summed so far or None] for every hooked leaf that these ops feed."""
    uses = {}
    for fn in order:
        for edge in fn.inputs or ():
            if edge is not None and not isinstance(edge, Function) and (
                    edge.__dict__.get("_post_grad_hooks") or edge.__dict__.get("_grad_hooks")):
                entry = uses.setdefault(id(edge), [0, edge, None])
                entry[0] += 1
    return uses


def _used(fn, uses):
    """fn's backward is done: the leaves it was the last user of get their gradient (hooks first) and their
    post-accumulate hooks."""
    for edge in fn.inputs or ():
        entry = uses.get(id(edge)) if edge is not None else None
        if entry is not None:
            entry[0] -= 1
            if entry[0] == 0:
                leaf, g = entry[1], entry[2]
                if g is not None:
                    _leaf_gradient(leaf, g)
                else:  # nothing to add (written in place through grad_sink, or no gradient reached it)
                    _post_accumulate(leaf)


def _topological(root_fn):
    """Recorded ops reachable from root_fn, every op before the ops that produced its inputs.

    Depth-first post-order, an op marked when it is expanded, not when it is first pushed: marked on push, an op
    reached first from a direct edge and again through a longer path (x + f(x), with x the first operand) was
    finished before the ops on the longer path, so its backward ran before f's gradient reached it."""
    order, done, stack = [], set(), [(root_fn, False)]
    while stack:
        fn, expanded = stack.pop()
        if expanded:
            order.append(fn)
            continue
        if fn in done:  # an op is its own key (hashed by identity, with no id() call)
            continue
        done.add(fn)
        stack.append((fn, True))
        for child in fn.inputs or ():
            if isinstance(child, Function) and child not in done:
                stack.append((child, False))
    order.reverse()
    return order


_FREED = ("clnet: backward through a graph whose saved tensors were already released: each forward's graph serves "
          "one backward; run the forward again (or pass retain_graph=True to the first backward)")


def backward(root, grad=None, retain_graph=False):
    """d root / d leaves, accumulated into each leaf's .grad; `grad` is d loss / d root (None: ones, for a scalar)."""
    if grad is None and root.size != 1:
        raise RuntimeError(f"clnet: backward() of a tensor of shape {root.shape} needs its gradient: call "
                           "y.backward(grad) with a tensor of that shape, or reduce y to one element first (y.sum())")
    if grad is not None:
        check_gradient(root, grad)
    if root.grad_fn is None:
        if not root.requires_grad:
            raise RuntimeError("clnet: backward() of a tensor that does not require a gradient and was not computed "
                               "from one that does (make the leaf with requires_grad=True)")
        _leaf_gradient(root, grad if grad is not None else full_like(root, 1.0))
        return
    if root.grad_fn.inputs is None:
        raise RuntimeError(_FREED)
    pending = {root.grad_fn: grad}  # op -> the gradient of its output summed so far
    profiling = _context.profiler is not None
    order = _topological(root.grad_fn)
    uses = _hooked_uses(order) if _hooked else None
    for fn in order:
        if fn not in pending:  # no gradient reached it (an input's backward returned None)
            if uses:
                _used(fn, uses)
            if not retain_graph:
                fn.inputs = fn.saved = None
            continue
        g = pending.pop(fn)
        if fn.inputs is None:
            raise RuntimeError(_FREED)
        if fn.hooks is not None:
            g = _node_gradient(fn, g, fn.hooks)
        elif g is None and not fn.unit_grad:
            g = full(fn.out_shape, fn.out_device, 1.0)
        if profiling:
            _context.profiler.tag = (fn.tag, "backward")
        if fn.saved is not None and fn.saved_at != in_place_writes[0]:
            _check_saved(fn)
        if fn.adds_into_pending:
            into = _pending_of_inputs(fn.inputs, pending)
            grads = fn.backward(g, into)
        else:
            into = None
            grads = fn.backward(g)
        if type(grads) is not tuple:
            grads = (grads,)
        for i, (edge, gi) in enumerate(zip(fn.inputs, grads)):
            if edge is None or gi is None:
                continue
            if isinstance(edge, Function):
                previous = pending.get(edge)
                if previous is None or (into is not None and into[i] is previous):  # the op added it in
                    pending[edge] = gi
                else:
                    pending[edge] = add(previous, gi)
            elif uses and id(edge) in uses and edge.__dict__.get("_grad_hooks"):
                entry = uses[id(edge)]  # its hooks see the sum over every use, once (as PyTorch's)
                entry[2] = gi if entry[2] is None else add(entry[2], gi)
            else:
                accumulate(edge, gi)
        if uses:
            _used(fn, uses)
        if not retain_graph:
            fn.inputs = fn.saved = None


def _pending_of_inputs(inputs, pending):
    """For an op that adds into its inputs' pending gradients: the sum so far of each computed input, at its first
    place among the op's inputs only (a later place of the same input adds to what the first returned)."""
    into, seen = [], set()
    for edge in inputs:
        if isinstance(edge, Function) and edge not in seen:
            seen.add(edge)
            into.append(pending.get(edge))
        else:
            into.append(None)
    return into


def _grad(t):
    """Tensor.grad: the gradient backward accumulated (a device tensor, for leaves), or None. One that zero_grad marked
    as zero (Tensor._mark_grad_zero) is filled with zeros at its first read, one an op deferred is written; one
    marked None (zero_grad(set_to_none=True)) reads as None until a backward writes it."""
    if t._grad_none:
        return None
    return fill_marked(t)


def fill_marked(t):
    """t's .grad buffer with what a read of it must see: a deferred gradient written, a mark of zero filled (also
    under a mark of None, which only Tensor.grad's reads heed: a graph settling or ending a step fills it here)."""
    if t._grad_pending is not None:
        t._settle_pending()
    if t._grad_zeroed:
        t._grad_zeroed = False
        if _context.capturing is not None:
            _context.capturing.note_grad(t)
        fill(t._grad, 0.0)
    return t._grad


def _set_grad(t, g):
    t._grad, t._grad_zeroed, t._grad_pending, t._grad_none = g, False, None, False


def _backward(self, grad=None, retain_graph=False):
    """Accumulates d self / d leaf into each leaf's .grad; grad is d loss / d self (None for a one-element tensor:
    ones)."""
    backward(self, grad, retain_graph)


_backward.__name__ = "backward"


# Tensor's gradient attributes are autograd's (tensor.py, below this module, knows no op)
Tensor.grad, Tensor.backward = property(_grad, _set_grad), _backward
Tensor._fill_marked = fill_marked  # for graph.py, which autograd builds on
Tensor.register_post_accumulate_grad_hook = register_post_accumulate_grad_hook
Tensor.register_hook = register_hook
Tensor.retain_grad = retain_grad
Tensor.retains_grad = property(_retains_grad)
