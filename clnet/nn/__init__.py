"""Layers and losses with PyTorch's names and semantics."""
from .layers import (AvgPool2d, Conv2d, Dropout, Flatten, Linear, LogSoftmax, MaxPool2d, ReLU, Sigmoid, Softmax,
                     Tanh)
from .loss import CrossEntropyLoss
from .module import Module, Parameter, Sequential

__all__ = ["AvgPool2d", "Conv2d", "CrossEntropyLoss", "Dropout", "Flatten", "Linear", "LogSoftmax", "MaxPool2d",
           "Module", "Parameter", "ReLU", "Sequential", "Sigmoid", "Softmax", "Tanh"]
