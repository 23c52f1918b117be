"""The prediction nets of :mod:`pfl_cli.algorithms.feddpa`, apart so that importing the algorithm (its config, a
refusal) does not import torch.

Both wrap the dual LoRA client net (:class:`pfl_cli.models.lora.LoRANet` with ``dual``) under the prefix ``net.``,
so that ``functional_call`` swaps in each client's adapters (and, for :class:`DPANet`, its reference direction).
The instance's representation is the input of the net's classifier (the last hidden layer, as the paper's
last-token hidden state, Yang et al., NeurIPS 2024, §4.3), read by a forward pre-hook: any base net with a named
classifier has one (built-in nets, transformers checkpoints).
"""

from __future__ import annotations

import torch
from torch import nn

from pfl_cli.models.lora import set_mix

LOCAL_ONLY = (0.0, 1.0)


def _representation(net: nn.Module, x, mix):
    """The classifier's input (batch, d) of ``net`` on ``x`` with the adapters weighted ``mix``, and its output."""
    seen = []
    head = net.get_submodule(net.classifier)
    hook = head.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    set_mix(net, mix)
    try:
        out = net(x)
    finally:
        hook.remove()
        set_mix(net, None)
    h = seen[-1]
    return h.reshape(h.shape[0], -1), out


class DPAFeatures(nn.Module):
    """The unit-norm representation of each instance under the local adapter alone (the reference side of §4.3)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        h, _ = _representation(self.net, x, LOCAL_ONLY)
        return torch.nn.functional.normalize(h, dim=-1)


class DPANet(nn.Module):
    """FedDPA's prediction (§4.3): the instance's weight of the local adapter ``lam(x) = w * clamp(s(x), 0, 1)``, with
    ``s(x)`` its mean cosine similarity to the client's own training instances, and the global adapter's ``1 -
    lam(x)``.

    The mean of the cosines is the cosine against the mean of the training instances' unit representations
    (``reference``, one vector per client, a buffer that ``functional_call`` swaps in), so one dot product per
    instance replaces a pass over the client's data; ``max_weight`` (w) travels the same way, with the client's
    adapters into what ``predict --save-models`` writes.
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("reference", torch.zeros(1))
        self.register_buffer("max_weight", torch.zeros(()))

    def local_weight(self, x):
        h, _ = _representation(self.net, x, LOCAL_ONLY)
        s = torch.nn.functional.normalize(h, dim=-1) @ self.reference
        return self.max_weight * s.clamp(0.0, 1.0)

    def forward(self, x):
        lam = self.local_weight(x)
        set_mix(self.net, (1.0 - lam, lam))
        try:
            return self.net(x)
        finally:
            set_mix(self.net, None)
