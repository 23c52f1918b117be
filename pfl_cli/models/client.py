"""Client (target) networks: the models a hypernetwork generates and clients train.

- :class:`LeNet` -- the CIFAR / FEMNIST client model of PeFLL Table B.1 (thesis App. B).
- :class:`MLP` -- a fully connected net on flattened inputs (the digits model of §7.2).
- :func:`client_model` -- builds either from a dataset's input shape, with ``"auto"`` choosing.

Both modules output logits (the softmax of Table B.1 lives in the cross-entropy loss), have plain
parameter names and hold **no buffers**, so that a hypernetwork's output dict maps one to one
onto ``dict(model.named_parameters())`` and ``torch.func.functional_call`` can run them.
"""

from __future__ import annotations

from math import prod
from numbers import Integral
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pfl_cli.errors import InputError, check_param

CLIENT_ARCHS = ("auto", "lenet", "mlp", "hyperfl-cnn", "mlp-bn", "lenet-bn", "lstm", "pfllib-cnn", "resnet18-cifar")
# -bn: models.normalized (FedBN); lstm: models.sequence (LEAF's Shakespeare LSTM, for text: token-code sequences);
# pfllib-cnn, resnet18-cifar: models.papers (the papers' tables' nets)
LENET_KERNELS = 16  # Conv1 filters of Table B.1; pFedHN's S / M / L targets use 8 / 16 / 32 (App. B)

MIN_IMAGE_SIZE = 28  # MNIST / FEMNIST; smaller images go to the MLP
LENET_SIZE = 32  # Table B.1 input: 32 -> 28 -> 14 -> 10 -> 5, FC1 = 32 * 5 * 5 = 800


# --------------------------------------------------------------------------------------
# validation helpers (shared with embedding.py and spec.py)
# --------------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int, or :class:`InputError` unless it is an integer ``>= minimum``."""
    check_param(name, _is_int(value) and value >= minimum, f"must be an integer >= {minimum}", value)
    return int(value)


def check_input_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    """``input_shape`` as a tuple of positive ints (one sample's shape, no batch dimension)."""
    try:
        shape = tuple(input_shape)
    except TypeError:
        shape = None
    ok = bool(shape) and all(_is_int(s) and s >= 1 for s in shape)
    check_param("input_shape", ok, "must be a non-empty sequence of positive integers", input_shape)
    return tuple(int(s) for s in shape)


def check_hidden(name: str, hidden: Sequence[int]) -> tuple[int, ...]:
    """Hidden-layer widths as a tuple of positive ints (may be empty: a linear model)."""
    if _is_int(hidden):
        hidden = (hidden,)
    try:
        sizes = tuple(hidden)
    except TypeError:
        sizes = None
    ok = sizes is not None and all(_is_int(h) and h >= 1 for h in sizes)
    check_param(name, ok, "must be a sequence of positive integers", hidden)
    return tuple(int(h) for h in sizes)


def check_image_size(image_size: int | Sequence[int]) -> tuple[int, int]:
    """``image_size`` as (H, W), or :class:`InputError` unless both are integers >= 28."""
    try:
        size = (image_size, image_size) if _is_int(image_size) else tuple(image_size)
    except TypeError:
        size = ()
    ok = len(size) == 2 and all(_is_int(s) and s >= MIN_IMAGE_SIZE for s in size)
    check_param(
        "image_size", ok, f"must be an int or (H, W) of integers >= {MIN_IMAGE_SIZE}", image_size
    )
    return int(size[0]), int(size[1])


def is_image_shape(input_shape: Sequence[int]) -> bool:
    """True for ``(C, H, W)`` with ``H, W >= 28``: the inputs the LeNet-style nets accept."""
    shape = tuple(input_shape)
    return len(shape) == 3 and shape[1] >= MIN_IMAGE_SIZE and shape[2] >= MIN_IMAGE_SIZE


def require_image(param: str, value: str, input_shape: Sequence[int]) -> None:
    """:class:`InputError` unless ``input_shape`` is an image that LeNet-style nets accept."""
    if not is_image_shape(input_shape):
        raise InputError(
            f"{param} {value!r} needs images (C, H, W) of at least {MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE}; "
            f"got input shape {tuple(input_shape)!r}."
        )


def resolve_arch(arch: str, input_shape: Sequence[int], vocab: int | None = None) -> str:
    """The concrete client architecture for ``arch`` and the input.

    ``vocab`` is the number of token codes of text data (sequences of int codes, e.g. LEAF
    Shakespeare's 80 characters), None for numeric inputs. ``"auto"`` picks ``"lstm"`` for text,
    ``"lenet"`` for images ``(C, H, W)`` with ``H, W >= 28`` and ``"mlp"`` otherwise. A net that
    reads numbers asked of text, or the LSTM asked of numbers, raises :class:`InputError`: the
    MLP would read character codes as magnitudes.
    """
    from pfl_cli.fl.config import model_kind

    if model_kind(arch) is not None:  # (Algorithm's model_arch_spec routes it to its kind)
        raise InputError(f"model_arch {arch!r} is a model kind's net, built by pfl_cli.models.kinds.kind_spec; "
                         f"client_spec builds pflx's own nets: {', '.join(CLIENT_ARCHS)}.")
    check_param("model_arch", arch in CLIENT_ARCHS, f"must be one of {', '.join(CLIENT_ARCHS)}", arch)
    shape = check_input_shape(input_shape)
    if vocab is not None:
        if arch not in ("auto", "lstm"):
            fix = ("pflx has no text net with batch-norm layers (what fedbn keeps local)" if arch.endswith("-bn")
                   else "Use --model-arch lstm (or auto)")
            raise InputError(f"model_arch {arch!r} reads numeric inputs; this data is text (sequences of "
                             f"{vocab} token codes, input shape {shape!r}). {fix}.")
        if len(shape) != 1:
            raise InputError(f"model_arch lstm reads one token sequence per sample; got input shape {shape!r}.")
        return "lstm"
    if arch == "lstm":
        raise InputError(f"model_arch 'lstm' reads text (token-code sequences, e.g. leaf:...?task=shakespeare); "
                         f"this data is numeric (input shape {shape!r}). Use --model-arch auto, lenet or mlp.")
    if arch == "auto":
        return "lenet" if is_image_shape(shape) else "mlp"
    if arch in ("lenet", "hyperfl-cnn", "lenet-bn", "pfllib-cnn"):
        require_image("model_arch", arch, shape)
    if arch == "resnet18-cifar" and (len(shape) != 3 or min(shape[1:]) < 8):
        raise InputError(f"model_arch 'resnet18-cifar' needs images (C, H, W) of at least 8x8 (it downsamples 8x); "
                         f"got input shape {shape!r}.")
    return arch


# --------------------------------------------------------------------------------------
# LeNet geometry (shared with the CNN embedding of Table B.2)
# --------------------------------------------------------------------------------------


def pad_amounts(height: int, width: int) -> tuple[int, int, int, int]:
    """``F.pad`` amounts (left, right, top, bottom) that zero-pad an image up to 32x32.

    Images at least 32 wide / high are not padded along that axis. FEMNIST 28x28 gets 2 on
    each side, as in the authors' code (§2.1).
    """
    pad_w = max(LENET_SIZE - width, 0)
    pad_h = max(LENET_SIZE - height, 0)
    return pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2


def lenet_flat_features(height: int, width: int, kernels: int = LENET_KERNELS) -> int:
    """Input size of FC1: 2 x kernels channels x the spatial size after conv5, pool2, conv5, pool2.

    800 for every image of at most 32x32 (they are padded to 32x32 first, Table B.1).
    """
    h, w = max(height, LENET_SIZE), max(width, LENET_SIZE)
    h, w = (h - 4) // 2, (w - 4) // 2  # Conv1 5x5 (no padding), MaxPool 2
    h, w = (h - 4) // 2, (w - 4) // 2  # Conv2 5x5 (no padding), MaxPool 2
    return 2 * kernels * h * w


class LeNetTrunk(nn.Module):
    """The layers of Tables B.1 / B.2: Conv(in,16,5) Conv(16,32,5) FC(., 120) FC(120, 84) FC(84, out).

    Subclasses decide the input channels and what FC3 means (logits or an embedding);
    :meth:`pad` zero-pads small images to 32x32 and :meth:`trunk` runs everything up to FC3.
    """

    def __init__(self, in_channels: int, out_features: int, image_size: tuple[int, int],
                 kernels: int = LENET_KERNELS):
        super().__init__()
        self.image_size = image_size
        self._pad = pad_amounts(*image_size)
        self.conv1 = nn.Conv2d(in_channels, kernels, 5)  # Table B.1/B.2 Conv1: in x 5 x 5 x 16, ReLU
        self.conv2 = nn.Conv2d(kernels, 2 * kernels, 5)  # Conv2: 16 x 5 x 5 x 32, ReLU
        self.fc1 = nn.Linear(lenet_flat_features(*image_size, kernels), 120)  # FC1: 800 x 120, ReLU
        self.fc2 = nn.Linear(120, 84)  # FC2: 120 x 84, ReLU
        self.fc3 = nn.Linear(84, out_features)  # FC3: 84 x C (logits) or 84 x l (embedding)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """Zero-pad a (B, C, H, W) batch to at least 32x32 (no-op for larger images)."""
        return F.pad(x, self._pad) if any(self._pad) else x

    def trunk(self, x: torch.Tensor) -> torch.Tensor:
        """Conv / pool / FC1 / FC2 on an already padded batch: the (B, 84) input of FC3."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return F.relu(self.fc2(x))


# --------------------------------------------------------------------------------------
# client networks
# --------------------------------------------------------------------------------------


class LeNet(LeNetTrunk):
    """LeNet client model of PeFLL Table B.1; outputs logits.

    Parameters
    ----------
    in_channels : int
        Image channels (3 for CIFAR, 1 for MNIST / FEMNIST).
    num_classes : int
        C, the width of FC3; at least 2.
    image_size : int or (int, int)
        Image height and width, each at least 28. Images smaller than 32x32 are zero-padded
        to 32x32 inside :meth:`forward` so FC1 stays 800 x 120; larger images size FC1 from
        their shape.

    Notes
    -----
    Parameters: ``conv1.weight``, ``conv1.bias``, ``conv2.*``, ``fc1.*``, ``fc2.*``,
    ``fc3.*``; no buffers. The count is 120,332 + 85 C for 3-channel images of at most 32x32
    (121,182 for CIFAR-10) and 800 fewer for one channel (124,802 for FEMNIST, C = 62).

    Examples
    --------
    >>> LeNet(3, 10, 32)(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    classifier = "fc3"  # the last layer: pFedHN-PC's personal head, HyperFL's classifier

    def __init__(self, in_channels: int, num_classes: int, image_size: int | Sequence[int] = 32,
                 kernels: int = LENET_KERNELS):
        in_channels = check_int("in_channels", in_channels, 1)
        num_classes = check_int("num_classes", num_classes, 2)
        kernels = check_int("kernels", kernels, 1)
        super().__init__(in_channels, num_classes, check_image_size(image_size), kernels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (B, C) for an image batch of shape (B, in_channels, H, W)."""
        return self.fc3(self.features(x))  # FC3: no nonlinearity (softmax is in the loss)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The (B, 84) representation the head FC3 reads (kNN-Per's feature space)."""
        return self.trunk(self.pad(x))

    def head(self) -> nn.Module:
        return self.fc3


class HyperFLCNN(nn.Module):
    """HyperFL's target CNNs (Guo et al. 2025, App. D.1, and its code), LeakyReLU.

    3-channel images (CIFAR-10, CINIC-10): Conv(3,16,5) Pool Conv(16,32,5,p1) Pool Conv(32,64,3,p1) Pool,
    FC1 576 -> 128, FC2 128 -> C. Other images ((E)MNIST, FMNIST): the first two convolutions only,
    FC1 800 -> 128. The feature extractor is everything up to FC1 (106,400 / 115,776 parameters),
    the classifier is FC2.
    """

    classifier = "fc2"

    def __init__(self, in_channels: int, num_classes: int, image_size: int | Sequence[int] = 32):
        super().__init__()
        in_channels = check_int("in_channels", in_channels, 1)
        num_classes = check_int("num_classes", num_classes, 2)
        h, w = check_image_size(image_size)
        self.conv1 = nn.Conv2d(in_channels, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=1)
        h, w = (h - 4) // 2, (w - 4) // 2
        h, w = (h - 2) // 2, (w - 2) // 2
        self.deep = in_channels == 3  # "adds one more 64-channel convolution layer" for colour images
        if self.deep:
            self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
            h, w = h // 2, w // 2
        self.fc1 = nn.Linear((64 if self.deep else 32) * h * w, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.leaky_relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.leaky_relu(self.conv2(x)), 2)
        if self.deep:
            x = F.max_pool2d(F.leaky_relu(self.conv3(x)), 2)
        x = F.leaky_relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


class MLP(nn.Module):
    """Fully connected client model: flatten, ``Linear + ReLU`` per hidden width, final ``Linear``.

    Parameters
    ----------
    in_features : int
        Size of one flattened input sample.
    num_classes : int
        Width of the output layer (logits); at least 2.
    hidden : sequence of int, default (32,)
        Hidden widths; empty gives a linear (softmax-regression) model.

    Notes
    -----
    Layers are named ``fc1`` ... ``fcN`` (N = ``len(hidden) + 1``), so the parameters are
    ``fc1.weight``, ``fc1.bias``, ..., ``fcN.bias``; no buffers. The digits model
    64 -> 32 -> 10 (the digits tests' net) has 2,410 parameters.

    Examples
    --------
    >>> MLP(64, 10)(torch.zeros(5, 64)).shape
    torch.Size([5, 10])
    """

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (32,)):
        super().__init__()
        in_features = check_int("in_features", in_features, 1)
        num_classes = check_int("num_classes", num_classes, 2)
        self.hidden = check_hidden("mlp_hidden", hidden)
        widths = (in_features, *self.hidden, num_classes)
        self.num_layers = len(widths) - 1
        self.classifier = f"fc{self.num_layers}"
        for i in range(self.num_layers):
            setattr(self, f"fc{i + 1}", nn.Linear(widths[i], widths[i + 1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of shape (B, num_classes) for a batch of shape (B, *input_shape)."""
        return self.head()(self.features(x))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The representation the last layer reads: the last hidden activations (kNN-Per's feature space)."""
        x = torch.flatten(x, 1)
        for i in range(1, self.num_layers):
            x = F.relu(getattr(self, f"fc{i}")(x))
        return x

    def head(self) -> nn.Module:
        return getattr(self, f"fc{self.num_layers}")


def client_model(
    arch: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    hidden: Sequence[int] = (32,),
    kernels: int = LENET_KERNELS,
    vocab: int | None = None,
) -> nn.Module:
    """Build a client network for inputs of one-sample shape ``input_shape``.

    Parameters
    ----------
    arch : {"auto", "lenet", "mlp", "hyperfl-cnn", "mlp-bn", "lenet-bn", "lstm", "pfllib-cnn", "resnet18-cifar"}
        ``"auto"`` is ``"lstm"`` for text (``vocab`` given), ``"lenet"`` for images (C, H, W)
        with H, W >= 28, else ``"mlp"``.
    input_shape : sequence of int
        Shape of one sample, without the batch dimension.
    num_classes : int
        Number of classes C (at least 2).
    hidden : sequence of int, default (32,)
        Hidden widths of the MLP, or the LSTM's layer widths; ignored by LeNet.
    vocab : int, optional
        Number of token codes of text data (the LSTM's embedding rows); None for numeric data.

    Returns
    -------
    torch.nn.Module
        A net whose forward maps (B, *input_shape) to (B, C) logits.

    Raises
    ------
    InputError
        For an unknown ``arch``, ``"lenet"`` on a non-image input, a numeric net on text or the
        LSTM on numbers, ``num_classes < 2`` or a non-positive hidden width.
    """
    resolved = resolve_arch(arch, input_shape, vocab)
    shape = check_input_shape(input_shape)
    if resolved == "lstm":  # LEAF's Shakespeare model (pfl_cli.models.sequence)
        from pfl_cli.models.sequence import CharLSTM

        return CharLSTM(vocab, num_classes, hidden)
    if resolved == "lenet":
        return LeNet(shape[0], num_classes, shape[1:], kernels)
    if resolved == "hyperfl-cnn":
        return HyperFLCNN(shape[0], num_classes, shape[1:])
    if resolved in ("pfllib-cnn", "resnet18-cifar"):
        from pfl_cli.models.papers import CifarResNet18, PFLlibCNN

        if resolved == "pfllib-cnn":
            return PFLlibCNN(shape[0], check_int("num_classes", num_classes, 2), shape[1:])
        return CifarResNet18(shape[0], check_int("num_classes", num_classes, 2))
    if resolved in ("mlp-bn", "lenet-bn"):  # FedBN's batch-norm variants (pfl_cli.models.normalized)
        from pfl_cli.models.normalized import LeNetBN, MLPBN

        if resolved == "lenet-bn":
            return LeNetBN(shape[0], num_classes, shape[1:], kernels)
        return MLPBN(prod(shape), num_classes, hidden)
    return MLP(prod(shape), num_classes, hidden)
