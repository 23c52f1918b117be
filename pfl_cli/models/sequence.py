"""Sequence models on token codes: LEAF's Shakespeare LSTM as a client net and as PeFLL's embedding net.

- :class:`CharLSTM` -- the next-character model of LEAF (Caldas et al. 2018, "LEAF: A Benchmark for
  Federated Settings", §4 / its reference implementation's stacked LSTM): each of the 80 input characters
  is embedded in 8 dimensions, two LSTM layers of 256 units read the sequence, and a linear layer maps the
  last step's output to logits over the 80 characters. PeFLL uses it as the client model for Shakespeare
  (Scott et al., PeFLL thesis App. B.1.3).
- :class:`LSTMEmbedding` -- "the LSTM model ... as the embedding network" (App. B.1.3): the same layers,
  the last producing the descriptor-sized embedding instead of logits. With labels (``"lstm"``) the
  sample's next character is read as one more step of the sequence: for next-character data the label
  is a continuation of the text, so the embedding reads the client's text as it is; ``"lstm-x"`` reads
  the 80 input characters only (label-free descriptors, as ``cnn-x`` / ``mlp-x``).

Inputs are int64 token codes (B, L), never standardized: the client store keeps text data as codes
(:class:`pfl_cli.fl.store.ClientStore`, ``vocab_size``).

Under ``torch.func.vmap`` the recurrence is written out (one matrix product per step for the hidden
state, the input projection of all steps at once): vmap has no batching rule for ``aten::lstm``, and the
engine runs a cohort's local steps under vmap (:mod:`pfl_cli.fl.cohort`); elsewhere the fused kernel
runs on the same weights. The
parameters keep ``torch.nn.LSTM``'s names and layout (``lstm.weight_ih_l0`` (4H, E), gate order i, f, g,
o, two biases per layer), so a state dict loads into ``nn.LSTM`` and the tests hold the two equal.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pfl_cli.errors import check_param
from pfl_cli.models.client import check_hidden, check_int

LEAF_EMBED = 8  # LEAF's Shakespeare model: an 8-dimensional character embedding
LEAF_HIDDEN = (256, 256)  # two LSTM layers of 256 units


def _lstm_layer(x: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor,
                b_hh: torch.Tensor) -> torch.Tensor:
    """One LSTM layer over a batch (B, L, E) from zero state: the outputs of every step (B, L, H).

    ``torch.nn.LSTM``'s equations (gates i, f, g, o stacked in that order along the 4H rows).
    """
    hidden = w_hh.shape[1]
    pre = F.linear(x, w_ih, b_ih + b_hh)  # every step's input projection in one product
    h = pre.new_zeros(pre.shape[:-2] + (hidden,))
    c = h
    outs = []
    for t in range(pre.shape[-2]):
        i, f, g, o = (pre[..., t, :] + F.linear(h, w_hh)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outs.append(h)
    return torch.stack(outs, dim=-2)


def _batched(t: torch.Tensor) -> bool:
    """Whether ``t`` is a tensor inside ``torch.func.vmap`` (which has no rule for the fused LSTM)."""
    return torch._C._functorch.is_batchedtensor(t)


class _StackedLSTM(nn.Module):
    """Character embedding + stacked LSTM; :meth:`encode` gives the last step's output (B, H_last)."""

    def __init__(self, vocab: int, hidden: Sequence[int], embed: int):
        super().__init__()
        self.vocab = check_int("vocab_size", vocab, 2)
        self.hidden = check_hidden("lstm_hidden", hidden)
        check_param("lstm_hidden", len(self.hidden) >= 1, "must name at least one LSTM layer", list(hidden))
        check_param("lstm_hidden", len(set(self.hidden)) == 1, "must give every LSTM layer the same width "
                    "(torch.nn.LSTM's layout)", list(hidden))
        self.embed = nn.Embedding(self.vocab, check_int("embed", embed, 1))
        self.lstm = nn.LSTM(embed, self.hidden[0], num_layers=len(self.hidden), batch_first=True)

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens.long())
        weights = [getattr(self.lstm, f"{w}_l{layer}") for layer in range(self.lstm.num_layers)
                   for w in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        if not any(_batched(t) for t in (x, *weights)):
            # Outside vmap the fused kernel (the weights as given, so functional_call's are the ones used):
            # 4-7x faster than the written-out steps on a CPU (one client, batch 10, widths 32 / 256).
            zeros = x.new_zeros(self.lstm.num_layers, x.shape[0], self.hidden[0])
            out = torch.lstm(x, (zeros, zeros), weights, True, self.lstm.num_layers, 0.0, self.training, False,
                             True)[0]
            return out[:, -1]
        for layer in range(self.lstm.num_layers):
            x = _lstm_layer(x, *weights[4 * layer:4 * layer + 4])
        return x[..., -1, :]  # LEAF predicts from the last step's output


class CharLSTM(_StackedLSTM):
    """LEAF's Shakespeare LSTM: embed 8, LSTM layers ``hidden`` (256, 256), linear to ``num_classes`` logits.

    Parameters
    ----------
    vocab : int
        Number of token codes (80 for LEAF's Shakespeare alphabet).
    num_classes : int
        Width of the output layer (80: the next character).
    hidden : sequence of int, default (256, 256)
        LSTM widths, one per layer (all equal).
    embed : int, default 8
        Character embedding size.

    Notes
    -----
    Parameters ``embed.weight``, ``lstm.{weight_ih,weight_hh,bias_ih,bias_hh}_l{k}``, ``fc.weight``,
    ``fc.bias``; no buffers. LEAF's sizes have 819,920 parameters. The head (``classifier``) is ``fc``,
    so body/head methods (FedRep, FedPer, FedBABU, LG-FedAvg ...) split it as the LeNet.

    Examples
    --------
    >>> CharLSTM(80, 80, (16, 16))(torch.zeros(2, 80, dtype=torch.long)).shape
    torch.Size([2, 80])
    """

    classifier = "fc"

    def __init__(self, vocab: int, num_classes: int, hidden: Sequence[int] = LEAF_HIDDEN, embed: int = LEAF_EMBED):
        super().__init__(vocab, hidden, embed)
        self.fc = nn.Linear(self.hidden[-1], check_int("num_classes", num_classes, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (B, num_classes) of token codes (B, L)."""
        return self.fc(self.features(x))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The last LSTM step's output (B, H): what the head reads (kNN-Per's feature space)."""
        return self.encode(x)

    def head(self) -> nn.Module:
        return self.fc


class LSTMEmbedding(_StackedLSTM):
    """PeFLL's embedding network for text (App. B.1.3): the client LSTM with the last layer of size ``dim``.

    ``forward(x, y_onehot)`` gives per-sample embeddings (B, dim). With ``use_labels`` the label
    (a character code below ``vocab``) is read as the sequence's next step.
    """

    uses_inputs = True

    def __init__(self, vocab: int, num_classes: int, dim: int, hidden: Sequence[int] = LEAF_HIDDEN,
                 embed: int = LEAF_EMBED, *, use_labels: bool = True):
        super().__init__(vocab, hidden, embed)
        num_classes = check_int("num_classes", num_classes, 2)
        if use_labels:  # the label is read as a token: it must be one
            check_param("embedding", num_classes <= self.vocab, f"'lstm' reads the label as the next token, so the "
                        f"classes must be token codes (at most vocab_size = {self.vocab}); use lstm-x",
                        f"{num_classes} classes")
        self.uses_labels = bool(use_labels)
        self.fc = nn.Linear(self.hidden[-1], check_int("embed_dim", dim, 1))

    def forward(self, x: torch.Tensor, y_onehot: torch.Tensor) -> torch.Tensor:
        tokens = x.long()
        if self.uses_labels:
            tokens = torch.cat((tokens, y_onehot.argmax(-1, keepdim=True)), dim=-1)
        return self.fc(self.encode(tokens))  # no output nonlinearity, as Table B.2's FC3
