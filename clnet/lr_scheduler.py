"""Learning-rate schedules (clnet.optim.lr_scheduler) with torch.optim.lr_scheduler's names, arguments and step().

A scheduler sets `group["lr"]` of each of its optimizer's parameter groups (OneCycleLR also the momentum, or Adam's
beta1). The optimizers read their groups at every step, eager or replayed (their per-step action, kernels.per_step),
so a scheduler stepped between replays of a captured clnet.Graph changes the steps that follow exactly as it changes
eager ones. A scheduler's step() called inside a capture is itself a per-step action: every replay steps it again.

The values follow PyTorch's, operation for operation: the recursive (chainable) form each schedule uses in step(),
and the closed form where PyTorch uses one (step(epoch), SequentialLR's milestones), so the sequences agree with
torch's to the last bit of a Python float. `state_dict()` is every attribute but the optimizer, as PyTorch's.
"""
import bisect
import math
from collections import Counter

from . import kernels

__all__ = ["CosineAnnealingLR", "LRScheduler", "LinearLR", "MultiStepLR", "OneCycleLR", "SequentialLR", "StepLR"]


def _groups(who, optimizer):
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list) or not all(isinstance(g, dict) and "lr" in g for g in groups):
        raise TypeError(f"{who}: {type(optimizer).__name__} is not an optimizer (pass a clnet.optim optimizer, whose "
                        "param_groups hold each group's lr)")
    return groups


def _per_group(who, name, optimizer, value):
    """One value per parameter group: a list or tuple as long as param_groups, or one value for all."""
    n = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"{who}: {name} has {len(value)} values, the optimizer has {n} parameter groups; give "
                             "one per group or a single number")
        return list(value)
    return [value] * n


class LRScheduler:
    """The frame of every schedule: `initial_lr` and `base_lrs` from the groups, `last_epoch`, `step()` and
    `get_last_lr()`. A subclass computes the next learning rates in `get_lr()` (and, where one exists, from the epoch
    alone in `_closed_form()`).

    Parameters
    ----------
    optimizer : clnet.optim.Optimizer
    last_epoch : int
        -1 for a new schedule; a resumed one needs `initial_lr` in every group (from the optimizer's state_dict).
    """

    _is_initial = False

    def __init__(self, optimizer, last_epoch=-1):
        who = type(self).__name__
        groups = _groups(who, optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for g in groups:
                g.setdefault("initial_lr", g["lr"])
        else:
            for i, g in enumerate(groups):
                if "initial_lr" not in g:
                    raise KeyError(f"{who}: last_epoch={last_epoch} resumes a schedule, but param_groups[{i}] has no "
                                   "'initial_lr'; load the optimizer's state_dict first, or pass last_epoch=-1")
        self.base_lrs = [g["initial_lr"] for g in groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self):
        self._step_count = 0
        self._is_initial = True
        try:
            self._advance(None)
        finally:
            self._is_initial = False

    def get_lr(self):
        """The learning rates of the step being taken (one per group), from the groups' current ones."""
        raise NotImplementedError

    def get_last_lr(self):
        """The learning rates the last step set, one per parameter group."""
        return self._last_lr

    def step(self, epoch=None):
        """Advance the schedule one step (or, deprecated in PyTorch, to `epoch`) and set every group's lr. Inside a
        clnet.Graph capture every replay advances it again."""
        kernels.per_step(lambda: self._advance(epoch))

    def _advance(self, epoch):
        self._step_count += 1
        self._update(epoch)

    def _update(self, epoch):
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            values = self._closed_form() if hasattr(self, "_closed_form") else self.get_lr()
        for g, lr in zip(self.optimizer.param_groups, values):
            g["lr"] = lr
        self._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def _lrs(self):
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self):
        """Every attribute but the optimizer, as PyTorch's."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict):
        self.__dict__.update(state_dict)


class StepLR(LRScheduler):
    """Multiply the learning rate by `gamma` every `step_size` steps."""

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        if isinstance(step_size, bool) or not isinstance(step_size, int) or step_size <= 0:
            raise ValueError(f"StepLR: step_size must be a positive integer, got {step_size!r}")
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._lrs()
        return [lr * self.gamma for lr in self._lrs()]

    def _closed_form(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply the learning rate by `gamma` at each milestone (a milestone listed twice multiplies twice)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch not in self.milestones:
            return self._lrs()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._lrs()]

    def _closed_form(self):
        passed = bisect.bisect_right(sorted(self.milestones.elements()), self.last_epoch)
        return [base * self.gamma ** passed for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """Cosine from the initial learning rate down to `eta_min` over `T_max` steps, then back up (PyTorch's recursive
    form, which follows changes others make to the lr)."""

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        if isinstance(T_max, bool) or not isinstance(T_max, int) or T_max <= 0:
            raise ValueError(f"CosineAnnealingLR: T_max must be a positive integer, got {T_max!r}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        t, T, lo = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return self._lrs()
        if self._step_count == 1 and t > 0:  # resumed: the closed form of where it stands
            return [lo + (base - lo) * (1 + math.cos(t * math.pi / T)) / 2 for base in self.base_lrs]
        if (t - 1 - T) % (2 * T) == 0:  # the bottom of a cycle: the recursion's ratio would be 0 / 0
            return [lr + (base - lo) * (1 - math.cos(math.pi / T)) / 2 for base, lr in zip(self.base_lrs, self._lrs())]
        return [(1 + math.cos(math.pi * t / T)) / (1 + math.cos(math.pi * (t - 1) / T)) * (lr - lo) + lo
                for lr in self._lrs()]

    def _closed_form(self):
        t, T, lo = self.last_epoch, self.T_max, self.eta_min
        return [lo + (base - lo) * (1 + math.cos(math.pi * t / T)) / 2 for base in self.base_lrs]


class LinearLR(LRScheduler):
    """Scale the learning rate linearly from `start_factor` to `end_factor` times the initial one over
    `total_iters` steps."""

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1):
        if not 0 < start_factor <= 1:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1], got {start_factor}")
        if not 0 <= end_factor <= 1:
            raise ValueError(f"LinearLR: end_factor must be in [0, 1], got {end_factor}")
        if isinstance(total_iters, bool) or not isinstance(total_iters, int) or total_iters <= 0:
            raise ValueError(f"LinearLR: total_iters must be a positive integer, got {total_iters!r}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        t, a, b = self.last_epoch, self.start_factor, self.end_factor
        if t == 0:
            return [lr * a for lr in self._lrs()]
        if self._is_initial or t > self.total_iters:
            return self._lrs()
        return [lr * (1.0 + (b - a) / (self.total_iters * a + (t - 1) * (b - a))) for lr in self._lrs()]

    def _closed_form(self):
        t, a, b = self.last_epoch, self.start_factor, self.end_factor
        return [base * (a + (b - a) * min(self.total_iters, t) / self.total_iters) for base in self.base_lrs]


class OneCycleLR(LRScheduler):
    """The 1cycle policy: the learning rate rises from max_lr / div_factor to max_lr over the first pct_start of
    `total_steps`, then falls to initial / final_div_factor (three_phase: back to the initial one first), while the
    momentum (SGD's, RMSprop's; Adam's beta1) moves the opposite way between max_momentum and base_momentum. Stepping
    past total_steps is an error, as in PyTorch."""

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None, pct_start=0.3,
                 anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85, max_momentum=0.95, div_factor=25.0,
                 final_div_factor=1e4, three_phase=False, last_epoch=-1):
        groups = _groups("OneCycleLR", optimizer)
        self.optimizer = optimizer

        def positive_int(name, v):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"OneCycleLR: {name} must be a positive integer, got {v!r}")
            return v
        if total_steps is not None:
            self.total_steps = positive_int("total_steps", total_steps)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = positive_int("epochs", epochs) * positive_int("steps_per_epoch", steps_per_epoch)
        else:
            raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: pct_start must be a float in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.anneal_strategy = anneal_strategy
        n = self.total_steps
        rise = dict(end_step=float(pct_start * n) - 1, start_lr="initial_lr", end_lr="max_lr",
                    start_momentum="max_momentum", end_momentum="base_momentum")
        if three_phase:
            self._phases = [rise,
                            dict(end_step=float(2 * pct_start * n) - 2, start_lr="max_lr", end_lr="initial_lr",
                                 start_momentum="base_momentum", end_momentum="max_momentum"),
                            dict(end_step=n - 1, start_lr="initial_lr", end_lr="min_lr",
                                 start_momentum="max_momentum", end_momentum="max_momentum")]
        else:
            self._phases = [rise,
                            dict(end_step=n - 1, start_lr="max_lr", end_lr="min_lr",
                                 start_momentum="base_momentum", end_momentum="max_momentum")]
        max_lrs = _per_group("OneCycleLR", "max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for g, top in zip(groups, max_lrs):
                g["initial_lr"] = top / div_factor
                g["max_lr"] = top
                g["min_lr"] = g["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            defaults = getattr(optimizer, "defaults", {})
            if "momentum" not in defaults and "betas" not in defaults:
                raise ValueError(f"OneCycleLR: {type(optimizer).__name__} has no momentum or betas to cycle; pass "
                                 "cycle_momentum=False")
            self.use_beta1 = "betas" in defaults
            tops = _per_group("OneCycleLR", "max_momentum", optimizer, max_momentum)
            bases = _per_group("OneCycleLR", "base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for g, top, base in zip(groups, tops, bases):
                    self._set_momentum(g, top)
                    g["max_momentum"], g["base_momentum"] = top, base
        super().__init__(optimizer, last_epoch)

    def _set_momentum(self, group, value):
        if self.use_beta1:
            group["betas"] = (value, *group["betas"][1:])
        else:
            group["momentum"] = value

    def _anneal(self, start, end, pct):
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        t = self.last_epoch
        if t > self.total_steps:
            raise ValueError(f"OneCycleLR: stepped {t} times, past total_steps={self.total_steps}; make the "
                             "schedule with the run's number of steps")
        lrs = []
        for g in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._phases):
                end = phase["end_step"]
                if t <= end or i == len(self._phases) - 1:
                    pct = (t - start) / (end - start)
                    lrs.append(self._anneal(g[phase["start_lr"]], g[phase["end_lr"]], pct))
                    if self.cycle_momentum:
                        self._set_momentum(g, self._anneal(g[phase["start_momentum"]], g[phase["end_momentum"]],
                                                           pct))
                    break
                start = end
        return lrs


class SequentialLR(LRScheduler):
    """Run `schedulers` one after another, switching at each of `milestones` (one fewer than schedulers); a
    scheduler taking over starts from its own epoch 0 (its closed form where it has one)."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        groups = _groups("SequentialLR", optimizer)
        schedulers, milestones = list(schedulers), list(milestones)
        if not schedulers:
            raise ValueError("SequentialLR: no schedulers given; pass at least one")
        for i, s in enumerate(schedulers):
            if not isinstance(s, LRScheduler):
                raise TypeError(f"SequentialLR: schedulers[{i}] is a {type(s).__name__}, not a scheduler")
            if s.optimizer is not optimizer:
                raise ValueError(f"SequentialLR: schedulers[{i}] ({type(s).__name__}) drives another optimizer; "
                                 "make every scheduler over the one given")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, got "
                             f"{len(milestones)}")
        self._schedulers, self._milestones = schedulers, milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for g in groups:  # each scheduler's construction stepped the lr: start again from the initial one
            g["lr"] = g["initial_lr"]
        self._undo(self)
        first = self._schedulers[bisect.bisect_right(self._milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    def _undo(self, s):
        """Take back the step each (nested) scheduler's construction made."""
        if isinstance(s, SequentialLR):
            for inner in s._schedulers:
                self._undo(inner)
        else:
            s.last_epoch -= 1

    def step(self):
        kernels.per_step(lambda: self._advance(None))

    def _advance(self, epoch):
        self.last_epoch += 1
        i = bisect.bisect_right(self._milestones, self.last_epoch)
        s = self._schedulers[i]
        if i > 0 and self._milestones[i - 1] == self.last_epoch:
            s._update(0)  # as PyTorch: from its epoch 0, not counted as one of its steps
        else:
            s._advance(None)
        self._last_lr = s.get_last_lr()

    def state_dict(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        inner = state.pop("_schedulers")
        self.__dict__.update(state)
        for s, d in zip(self._schedulers, inner):
            s.load_state_dict(d)
