"""User factories for the model-kind suites (``model_arch factory:<this file>:NAME``): tiny nets, any input shape."""

from math import prod

from torch import nn


def mlp(num_classes, input_shape, width=8):
    """Flatten, two hidden Linear + ReLU, a linear head: the smallest net every algorithm can split."""
    return nn.Sequential(nn.Flatten(), nn.Linear(prod(input_shape), width), nn.ReLU(), nn.Linear(width, width),
                         nn.ReLU(), nn.Linear(width, num_classes))


def cnn(num_classes, input_shape, width=4):
    """A conv with BatchNorm and a dropout before the head: the layers whose train / eval behaviour a kind fixes."""
    return nn.Sequential(nn.Conv2d(input_shape[0], width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4 * width, 8), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(8, num_classes))


FILE = __file__


def weights_file(path, width=8, input_shape=(64,), num_classes=10):
    """A state dict of :func:`mlp` (all weights 0.01) at ``path``: a model_weights file."""
    import torch

    net = mlp(num_classes, input_shape, width)
    torch.save({k: torch.full_like(v, 0.01) for k, v in net.state_dict().items()}, path)
    return str(path)
