"""Logits calibrated by a per-client, per-class margin during local training (FedLC).

FedLC (Zhang, Li, Li, Xu, Wu, Ding, Wu, ICML 2022, §4, the calibrated loss) trains each client on
the cross-entropy of the calibrated logits ``f(x) - tau * n_{i,y}^{-1/4}``: every class y's logit
is lowered by a margin that grows as client i holds fewer samples of y, so that a local update no
longer pushes down the classes the client rarely sees (the pairwise label margin
``tau (n_{i,y}^{-1/4} - n_{i,y'}^{-1/4})`` between a label and each other class). Evaluation reads
the plain logits ``f(x)``.

:class:`CalibratedNet` is the client net with that margin subtracted: it shares the net's modules
(the same parameter names, so the cohort engine's stacked parameters plug in unchanged) and reads
the margin from a buffer :data:`MARGIN`, which :func:`pfl_cli.fl.cohort.local_sgd` gets per client
through ``fixed`` (c, C); local SGD over the cohort stays one vmapped (or client-major) computation.
"""

from __future__ import annotations

import torch
from torch import nn

MARGIN = "lc_margin"  # the buffer holding one client's margins (C,): not a parameter name of any client net
ABSENT_COUNT = 1e-8   # n_{i,y} of a class the client does not hold: margin tau * 100, its softmax weight e^{-100 tau}


class CalibratedNet(nn.Module):
    """``net(x) - margin``: the client net's logits calibrated by :data:`MARGIN` (C,), zero unless given."""

    def __init__(self, net: nn.Module, num_classes: int) -> None:
        super().__init__()
        own = [k for k, _ in net.named_parameters(recurse=False)] + [k for k, _ in net.named_buffers(recurse=False)]
        if own:  # its top-level tensors would not be swapped by functional_call through the shared children
            raise ValueError(f"CalibratedNet: {type(net).__name__} holds tensors outside its submodules: {own}")
        for name, child in net.named_children():
            self.add_module(name, child)  # the same module objects: functional_call swaps the net's own tensors
        self.__dict__["_net"] = net  # not a submodule (its tensors are already registered under their own names)
        self.register_buffer(MARGIN, torch.zeros(num_classes, device=next(net.parameters()).device))

    def forward(self, x):
        return self._net(x) - getattr(self, MARGIN)


def calibration_margin(store, clients, tau: float):
    """``tau * n_{i,y}^{-1/4}`` (c, C) for ``clients``: n_{i,y} each client's labeled fit samples of class y.

    A class the client does not hold has n = :data:`ABSENT_COUNT` (the paper's n^{-1/4} is undefined at
    0): a margin of 100 tau, which removes it from the client's softmax in effect (its logit takes no gradient).
    """
    from pfl_cli.fl.heads import class_counts

    held = store.holds(store.fit.rows(clients)[0])  # split across ranks (--nproc): the rows this rank trains
    if held is None or bool(held.all()):
        counts = class_counts(store, clients)
    else:  # another rank holds (and trains) the other rows: their margins are never read here
        counts = torch.zeros(len(clients), store.num_classes, device=held.device)
        if bool(held.any()):
            counts[held] = class_counts(store, clients[held])
    return tau * counts.clamp_min(ABSENT_COUNT).pow(-0.25)
