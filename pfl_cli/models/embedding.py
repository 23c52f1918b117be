"""Embedding networks phi(x, y) of PeFLL (thesis §4.3, Table B.2).

Every module here maps a batch to **per-sample** embeddings of shape (B, dim); the caller
averages them over the batch into the client descriptor v(B) = mean_b phi(x_b, y_b). All share
one signature, ``forward(x, y_onehot)``, with ``x`` the normalized float input batch of shape
(B, *input_shape) and ``y_onehot`` a float (B, num_classes) one-hot label matrix, and two
boolean attributes saying which of the two they read: ``uses_inputs`` and ``uses_labels``.

Kinds (:data:`EMBEDDINGS`):

- ``"cnn"`` -- LeNet-style ConvNet of Table B.2 whose Conv1 also sees C constant label planes.
- ``"cnn-x"`` -- the same ConvNet on the image only (the unlabeled variant of Table 4.2).
- ``"linear"`` -- one linear map of the one-hot label (the CIFAR-100 embedding; image ignored).
- ``"mlp"`` -- MLP on ``[flatten(x), y_onehot]``: (d + C) -> 64 -> 64 -> dim (§7.2).
- ``"mlp-x"`` -- the same MLP on ``flatten(x)`` only.
- ``"lstm"`` / ``"lstm-x"`` -- for text: LEAF's Shakespeare LSTM with the last layer of size l
  (App. B.1.3), reading the label as the next character, or not (:mod:`pfl_cli.models.sequence`).
"""

from __future__ import annotations

from math import prod
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pfl_cli.errors import InputError, check_param
from pfl_cli.models.client import (
    LeNetTrunk,
    check_image_size,
    check_input_shape,
    check_int,
    is_image_shape,
    require_image,
)

EMBEDDINGS = ("auto", "cnn", "cnn-x", "linear", "mlp", "mlp-x", "lstm", "lstm-x")


class CNNEmbedding(LeNetTrunk):
    """LeNet-style embedding network of PeFLL Table B.2.

    Parameters
    ----------
    in_channels : int
        Image channels.
    num_classes : int
        C; with ``use_labels`` Conv1 takes ``in_channels + C`` channels.
    dim : int
        Embedding size l (the width of FC3).
    image_size : int or (int, int)
        Image height and width (each >= 28); smaller than 32x32 is zero-padded to 32x32.
    use_labels : bool, default True
        Append one constant H x W plane per one-hot entry to the (padded) image, as in the
        authors' ``CNNEmbed`` (§2.2). False gives the image-only ``"cnn-x"`` network.

    Notes
    -----
    Parameters ``conv1.*``, ``conv2.*``, ``fc1.*``, ``fc2.*``, ``fc3.*``; FC3 is 84 x l with no
    output nonlinearity. CIFAR-10 (3x32x32, C = 10) with l = 26 has 126,542 parameters with
    label planes and 122,542 without.
    """

    uses_inputs = True

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        dim: int,
        image_size: int | Sequence[int] = 32,
        *,
        use_labels: bool = True,
    ):
        in_channels = check_int("in_channels", in_channels, 1)
        num_classes = check_int("num_classes", num_classes, 2)
        dim = check_int("embed_dim", dim, 1)
        conv_in = in_channels + (num_classes if use_labels else 0)  # Table B.2 Conv1: (3 + C) x 5 x 5 x 16
        super().__init__(conv_in, dim, check_image_size(image_size))
        self.uses_labels = bool(use_labels)

    def forward(self, x: torch.Tensor, y_onehot: torch.Tensor) -> torch.Tensor:
        """Per-sample embeddings (B, dim) of images (B, C_in, H, W) and labels (B, C)."""
        x = self.pad(x)
        if self.uses_labels:
            b, _, h, w = x.shape
            planes = y_onehot.to(x.dtype).reshape(b, -1, 1, 1).expand(b, y_onehot.shape[-1], h, w)
            x = torch.cat((x, planes), dim=1)
        return self.fc3(self.trunk(x))  # FC3: 84 x l, no nonlinearity


class LinearEmbedding(nn.Module):
    """Linear label embedding: ``phi(x, y) = W y + b`` on the one-hot label, image ignored.

    The second embedding of §2.2 (the authors' ``MLPEmbed``): a descriptor is then an affine
    function of the batch's label histogram. Parameters ``fc.weight`` (dim x C), ``fc.bias``.
    """

    uses_inputs = False
    uses_labels = True

    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        num_classes = check_int("num_classes", num_classes, 2)
        dim = check_int("embed_dim", dim, 1)
        self.fc = nn.Linear(num_classes, dim, bias=True)

    def forward(self, x: torch.Tensor, y_onehot: torch.Tensor) -> torch.Tensor:
        """Per-sample embeddings (B, dim); ``x`` is not read."""
        return self.fc(y_onehot)


class MLPEmbedding(nn.Module):
    """MLP embedding on ``[flatten(x), y_onehot]`` (or ``flatten(x)`` alone).

    Parameters
    ----------
    in_features : int
        Size of one flattened input sample d.
    num_classes : int
        C, appended to the input when ``use_labels``.
    dim : int
        Embedding size l.
    hidden : int, default 64
        Width of both hidden layers: (d + C) -> hidden -> hidden -> l with ReLU between
        ("74->64->64->l" for digits); no output nonlinearity.
    use_labels : bool, default True
        False gives the label-free ``"mlp-x"`` network on d inputs.

    Notes
    -----
    Parameters ``fc1.*``, ``fc2.*``, ``fc3.*``.
    """

    uses_inputs = True

    def __init__(
        self, in_features: int, num_classes: int, dim: int, hidden: int = 64, *, use_labels: bool = True
    ):
        super().__init__()
        in_features = check_int("in_features", in_features, 1)
        num_classes = check_int("num_classes", num_classes, 2)
        dim = check_int("embed_dim", dim, 1)
        hidden = check_int("embed_hidden", hidden, 1)
        self.uses_labels = bool(use_labels)
        n_in = in_features + (num_classes if use_labels else 0)
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, y_onehot: torch.Tensor) -> torch.Tensor:
        """Per-sample embeddings (B, dim) of inputs (B, *input_shape) and labels (B, C)."""
        x = torch.flatten(x, 1)
        if self.uses_labels:
            x = torch.cat((x, y_onehot.to(x.dtype)), dim=1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def resolve_embedding(kind: str, input_shape: Sequence[int], vocab: int | None = None) -> str:
    """The concrete embedding kind for ``kind`` and the input (``"auto"`` resolved).

    ``"auto"`` is ``"lstm"`` for text (``vocab``: the number of token codes), ``"cnn"`` for
    images (C, H, W) with H, W >= 28 and ``"mlp"`` otherwise; ``"cnn"`` / ``"cnn-x"`` on a
    non-image input, ``"mlp"`` / ``"mlp-x"`` on text and the LSTMs on numbers raise
    :class:`InputError` (``"linear"`` reads the label only and takes either).
    """
    check_param("embedding", kind in EMBEDDINGS, f"must be one of {', '.join(EMBEDDINGS)}", kind)
    shape = check_input_shape(input_shape)
    if vocab is not None:
        if kind not in ("auto", "lstm", "lstm-x", "linear"):
            raise InputError(f"embedding {kind!r} reads numeric inputs; this data is text (sequences of {vocab} "
                             f"token codes). Use --embedding lstm, lstm-x, linear (or auto).")
        return "lstm" if kind == "auto" else kind
    if kind in ("lstm", "lstm-x"):
        raise InputError(f"embedding {kind!r} reads text (token-code sequences); this data is numeric (input shape "
                         f"{shape!r}). Use --embedding auto, cnn, mlp or linear.")
    if kind == "auto":
        return "cnn" if is_image_shape(shape) else "mlp"
    if kind in ("cnn", "cnn-x"):
        require_image("embedding", kind, shape)
    return kind


def embedding_net(
    kind: str,
    input_shape: Sequence[int],
    num_classes: int,
    dim: int,
    *,
    hidden: int | Sequence[int] = 64,
    vocab: int | None = None,
) -> nn.Module:
    """Build an embedding network phi for inputs of one-sample shape ``input_shape``.

    Parameters
    ----------
    kind : {"auto", "cnn", "cnn-x", "linear", "mlp", "mlp-x"}
        See the module docstring; ``"auto"`` is ``"cnn"`` for images, else ``"mlp"``.
    input_shape : sequence of int
        Shape of one sample, without the batch dimension.
    num_classes : int
        Number of classes C (width of the one-hot labels).
    dim : int
        Embedding (descriptor) size l, at least 1.
    hidden : int or sequence of int, default 64
        Hidden width of the ``"mlp"`` / ``"mlp-x"`` kinds, the LSTM's layer widths for
        ``"lstm"`` / ``"lstm-x"``; ignored by the others.
    vocab : int, optional
        Number of token codes of text data; None for numeric data.

    Returns
    -------
    torch.nn.Module
        Its ``forward(x, y_onehot)`` returns per-sample embeddings of shape (B, dim).

    Raises
    ------
    InputError
        For an unknown ``kind``, a CNN kind on non-image input, ``dim < 1`` or
        ``num_classes < 2``.
    """
    resolved = resolve_embedding(kind, input_shape, vocab)
    shape = check_input_shape(input_shape)
    check_int("embed_dim", dim, 1)
    if resolved in ("lstm", "lstm-x"):
        from pfl_cli.models.sequence import LSTMEmbedding

        return LSTMEmbedding(vocab, num_classes, dim, hidden, use_labels=resolved == "lstm")
    if resolved in ("cnn", "cnn-x"):
        return CNNEmbedding(shape[0], num_classes, dim, shape[1:], use_labels=resolved == "cnn")
    if resolved == "linear":
        return LinearEmbedding(num_classes, dim)
    return MLPEmbedding(prod(shape), num_classes, dim, hidden, use_labels=resolved == "mlp")
