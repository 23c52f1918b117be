"""A mixture of k client nets as one module: ``log sum_m pi_m softmax(f_m(x))`` (FedEM's predictor).

Its parameters are ``components.<m>.<name>`` (the k nets) and ``pi`` (k,), the mixture weights, which
training holds fixed (a client's own, from its E-step). Its output is a log-probability vector, so its
cross-entropy is the mixture's negative log-likelihood ``-log sum_m pi_m p_m(y | x)``, and its argmax the
mixture's prediction: the cohort engine trains the k components of a client in one vectorized call.
"""

from __future__ import annotations

import torch


class MixtureNet(torch.nn.Module):
    def __init__(self, build, k: int) -> None:
        super().__init__()
        self.components = torch.nn.ModuleList([build() for _ in range(k)])
        self.pi = torch.nn.Parameter(torch.full((k,), 1.0 / k))

    def forward(self, x):
        logp = torch.stack([torch.log_softmax(c(x), -1) for c in self.components])   # (k, b, C)
        log_pi = torch.log(self.pi.clamp_min(1e-30)).view(-1, *([1] * (logp.dim() - 1)))
        return torch.logsumexp(logp + log_pi, 0)


def component_names(names, m: int) -> dict:
    """``{component parameter name: client net name}`` of component ``m``."""
    prefix = f"components.{m}."
    return {n: n[len(prefix):] for n in names if n.startswith(prefix)}
