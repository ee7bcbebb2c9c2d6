"""The random stream behind parameter initialisation and dropout masks; `manual_seed` makes runs repeatable."""
import numpy as np

_generator = np.random.default_rng()


def manual_seed(seed):
    global _generator
    _generator = np.random.default_rng(int(seed))


def generator():
    return _generator


def get_state():
    return _generator.bit_generator.state


def set_state(state):
    _generator.bit_generator.state = state
