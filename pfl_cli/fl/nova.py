"""Normalized averaging (FedNova: Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020).

A client's local solver writes its round as ``x - x_i = eta G_i a_i``: G_i stacks its tau_i
(stochastic) gradients and a_i holds how much each one moved the model (the paper's
general update rule). FedAvg averages ``x - x_i`` and so weighs client i by ``||a_i||_1``:
with different step counts its fixed point minimizes ``sum_i p_i ||a_i||_1 F_i`` instead of
``sum_i p_i F_i`` (Theorem 1, the objective inconsistency). FedNova divides each client's move by
``||a_i||_1`` (the normalized gradient d_i, Eq. 6) and the server steps
``x <- x - tau_eff sum_i p_i eta d_i`` with ``tau_eff = sum_i p_i ||a_i||_1`` (Eq. 7-8, the
default choice of tau_eff), p_i the clients' data shares.

``||a_i||_1`` of the local solvers pflx runs (the paper's examples of a_i):

- plain SGD, tau_i steps: a_i = [1, ..., 1], ``||a_i||_1 = tau_i``;
- SGD with momentum rho (buffer reset each round, ``buf <- rho buf + g; x <- x - eta buf``): the
  gradient of step k moves the model ``(1 - rho^(tau_i - k + 1)) / (1 - rho)`` in all, so
  ``||a_i||_1 = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)``.

Weight decay and gradient clipping change the gradients, not a_i.
"""

from __future__ import annotations


def solver_norm(steps, momentum: float = 0.0):
    """``||a_i||_1`` of tau_i = ``steps`` (a tensor) local SGD steps with ``momentum`` rho (Wang et al. 2020)."""
    rho = float(momentum)
    steps = steps.double()
    if rho == 0.0:
        return steps
    return (steps - rho * (1.0 - rho ** steps) / (1.0 - rho)) / (1.0 - rho)


def normalized_delta(global_params: dict, theta: dict, share, norm) -> dict:
    """FedNova's server move ``-tau_eff sum_i p_i (x - x_i) / ||a_i||_1`` (Eq. 7-8, tau_eff = sum_i p_i ||a_i||_1).

    ``theta`` {name: (c, *shape)} the cohort's local models, ``share`` (c,) the p_i (summing to 1),
    ``norm`` (c,) the ``||a_i||_1``. Equal norms give FedAvg's weighted mean delta exactly.
    """
    import torch

    norm = norm.to(torch.float64)
    share = share.to(torch.float64)
    tau_eff = (share * norm).sum()
    weight = (tau_eff * share / norm).to(torch.float32)
    return {k: torch.einsum("c,c...->...", weight, theta[k] - g) for k, g in global_params.items()}


def normalized_delta_secure(global_params: dict, theta: dict, size, norm) -> dict:
    """:func:`normalized_delta` from secure sums only (pfl_cli.fl.secagg): client i sends
    ``u_i = n_i (x_i - x) / ||a_i||_1``, ``n_i`` and ``n_i ||a_i||_1``; with their sums U, N and A,
    tau_eff = A / N and sum_i p_i (x_i - x) / ||a_i||_1 = U / N (Wang et al. 2020, Eq. 7-8, p_i = n_i / N), so the
    move is ``A U / N^2``. The cohort's models are spent (audited) once summed."""
    import torch

    from pfl_cli.fl.secagg import WEIGHT, secure_sum

    size, norm = size.to(torch.float64), norm.to(torch.float64)
    scale = (size / norm).to(torch.float32)
    rows = {k: scale.view(-1, *([1] * (theta[k].dim() - 1))) * (theta[k] - g) for k, g in global_params.items()}
    total = secure_sum({**rows, WEIGHT: size, "__work__": size * norm}, spent=(theta, rows)).total()
    n, work = total.pop(WEIGHT), total.pop("__work__")
    factor = (work / (n * n)).to(torch.float32) if float(n) > 0 else torch.zeros((), dtype=torch.float32)
    return {k: factor * total[k] for k in global_params}
