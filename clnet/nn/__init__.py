"""Layers and losses with PyTorch's names and semantics; `clnet.nn.functional` holds the same ops as functions."""
from . import functional
from .layers import (AdaptiveAvgPool2d, AvgPool2d, BatchNorm2d, Conv2d, Dropout, Flatten, Identity, Linear,
                     LocalResponseNorm, LogSoftmax, MaxPool2d, ReLU, ReLU6, Sequential, Sigmoid, Softmax, Tanh)
from .loss import BCELoss, BCEWithLogitsLoss, CrossEntropyLoss, L1Loss, MSELoss, NLLLoss, SmoothL1Loss
from . import modern, utils
from .modern import *  # noqa: F401,F403  (the layers since 2016: modern.__all__)
from .module import Module, ModuleList
from ..tensor import Parameter

__all__ = modern.__all__ + ["AdaptiveAvgPool2d", "AvgPool2d", "BCELoss", "BCEWithLogitsLoss", "BatchNorm2d", "Conv2d",
    "CrossEntropyLoss", "Dropout", "Flatten", "Identity", "L1Loss", "Linear", "LocalResponseNorm", "LogSoftmax",
    "MSELoss", "MaxPool2d", "Module", "ModuleList", "NLLLoss", "Parameter", "ReLU", "ReLU6", "Sequential", "Sigmoid",
    "SmoothL1Loss", "Softmax", "Tanh", "functional", "utils"]
