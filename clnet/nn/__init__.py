"""Layers and losses with PyTorch's names and semantics; `clnet.nn.functional` holds the same ops as functions."""
from . import functional
from .layers import (AdaptiveAvgPool2d, AvgPool2d, BatchNorm2d, Conv2d, Dropout, Flatten, Identity, Linear,
                     LocalResponseNorm, LogSoftmax, MaxPool2d, ReLU, ReLU6, Sigmoid, Softmax, Tanh)
from .loss import CrossEntropyLoss
from .module import Module, ModuleList, Sequential
from ..tensor import Parameter

__all__ = ["AdaptiveAvgPool2d", "AvgPool2d", "BatchNorm2d", "Conv2d", "CrossEntropyLoss", "Dropout", "Flatten",
           "Identity", "Linear", "LocalResponseNorm", "LogSoftmax", "MaxPool2d", "Module", "ModuleList", "Parameter",
           "ReLU", "ReLU6", "Sequential", "Sigmoid", "Softmax", "Tanh", "functional"]
