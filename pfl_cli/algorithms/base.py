"""What every algorithm plugs into the round loop (``pfl_cli.fl.loop``).

An algorithm owns its server state and answers four hooks: ``run_round`` (one round on a
cohort), ``personalize`` (models for any clients, seen or not), ``state`` /
``load_state`` (everything a resumed run needs) and ``weights`` (what ``model.pt`` keeps).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from pfl_cli.errors import RunError
from pfl_cli.rng import seed_sequence


def seeded(seed: int, name: str, build):
    """Run ``build()`` with torch's global RNG seeded from a named stream, restoring it afterwards.

    Module constructors draw their default initialization from the global generator;
    forking keeps the caller's global state untouched.
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed_sequence(seed, name).generate_state(1)[0]))
        return build()


def stack(params: dict, c: int) -> dict:
    """Repeat one model's parameters ``c`` times along a new leading cohort axis."""
    return {k: v.detach().unsqueeze(0).expand(c, *v.shape).clone() for k, v in params.items()}


class Algorithm(ABC):
    """Base class: shared client-side training helpers."""

    name = ""
    federated = True          # False: no rounds (Local), evaluation trains per client
    personalized = True       # whether personalize() returns one model per client
    # Differential privacy (issue 10): the privacy unit --dp protects ("client" or "example"),
    # None when the algorithm has no DP variant; dp_required for algorithms that exist only
    # as DP mechanisms. ``dp`` is the calibrated mechanism, set by the engine before training.
    dp_unit: str | None = None
    dp_required = False
    dp_contribution = "update"  # what one client contributes, named in the ledger
    dp = None

    def __init__(self, cfg, store, *, arch: dict | None = None) -> None:
        self.cfg = cfg
        self.store = store
        self.device = store.device
        self.arch = arch if arch is not None else self.resolve_arch(cfg, store)
        self.client_sgd_steps = 0  # local SGD steps taken by personalize() (fine-tuning, Local)
        self.build()

    # ------------------------------------------------------------------ hooks
    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        from pfl_cli.fl.config import hidden_sizes
        from pfl_cli.models import client_spec

        return {"client": client_spec(cfg.model_arch, store.input_shape, store.num_classes, hidden_sizes(cfg.mlp_hidden))}

    @abstractmethod
    def build(self) -> None:
        """Create the networks and the server optimizer."""

    @staticmethod
    def check_dp_config(cfg) -> None:
        """Reject options that would release private data outside the DP mechanism (none by default)."""

    @classmethod
    def plan_dp(cls, cfg, store):
        """The calibrated mechanism under --dp: client-level DP-FedAvg unless an algorithm says otherwise.

        From public inputs only (``cfg``); ``store`` is not read for the calibration.
        """
        from pfl_cli.fl.dp import calibrate_client_dp

        return calibrate_client_dp(cfg, contribution=cls.dp_contribution)

    def sample_cohort(self, clients, size: int, gen):
        """This round's cohort: ``size`` clients uniformly without replacement (DP: the mechanism's sampler)."""
        import torch

        if self.dp is not None:
            return self.dp.sample_cohort(clients, size, gen)
        return clients[torch.randperm(len(clients), generator=gen)[:size].to(clients.device)]

    def run_round(self, t: int, cohort, gen):
        """One round on ``cohort`` (LongTensor of client positions); returns each client's mean loss."""
        raise RunError(f"algorithm {self.name!r} trains no federated rounds; its clients train in personalize().")

    @abstractmethod
    def personalize(self, clients: np.ndarray, gen):
        """``(params, personalized)``: one model per client (stacked), or one global model."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """Copies of everything a resumed run needs (weights, optimizer state)."""

    @abstractmethod
    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`."""

    @abstractmethod
    def weights(self) -> dict[str, Any]:
        """The CPU state dicts ``model.pt`` keeps."""

    @abstractmethod
    def load_weights(self, weights: dict[str, Any]) -> None:
        """Restore :meth:`weights` (prediction)."""

    upload_under_dp = False   # whether upload() models what a client of a --dp run sends

    def upload(self, x, y, *, steps: int, noise_gen=None, start=None) -> tuple[dict, dict]:
        """What a client holding batch ``(x, y)`` sends the server, differentiably in ``x``.

        x (n, b, *input_shape), y (n, b): one batch per simulated client (attack target);
        ``steps`` as in :meth:`local_update`. ``noise_gen``: the simulated client's noise where
        the client itself adds noise (local DP); None gives the noise-free message (the
        attacker's model of it). ``start``: the client model the server sent, when the caller
        knows it (the attacker does); None: the algorithm's own.
        Returns ``(message, start)``: the uploaded tensors by name, each with a leading
        target axis, and the client model ``theta`` the server sent (what an attacker knows).
        Used by ``pflx attack`` (spec B.9) to simulate an honest-but-curious server.
        """
        from pfl_cli.errors import InputError

        raise InputError(f"algorithm {self.name!r}: pflx attack does not model what its clients upload.")

    def local_update(self, start: dict, x, y, steps: int) -> dict:
        """The client's update from ``start`` on (x, y), on the autograd graph, with prefixed names.

        ``steps = 0``: ``grad/<name>``, the gradient of the batch loss at ``start`` (FedSGD, the
        papers' attack setting); ``steps = k``: ``delta/<name>``, theta_new - theta after k of
        this algorithm's local SGD steps (clip, momentum, weight decay as trained).
        """
        from pfl_cli.fl.cohort import batch_gradients, unrolled_sgd

        if steps == 0:
            return {f"grad/{k}": g for k, g in batch_gradients(self.net, start, x, y).items()}
        new = unrolled_sgd(self.net, start, x, y, steps, **self.sgd_options())
        return {f"delta/{k}": new[k] - start[k] for k in start}

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """Floats a cohort client exchanges with the server per round: theta down and delta up."""
        from pfl_cli.models import num_parameters

        return 2 * num_parameters(arch["client"])

    # ------------------------------------------------------------------ shared helpers
    def client_net(self):
        from pfl_cli.models import build

        return seeded(self.cfg.seed, "init-client", lambda: build(self.arch["client"])).to(self.device)

    def sgd_options(self) -> dict:
        c = self.cfg
        return {"lr": c.lr, "momentum": c.momentum, "weight_decay": 2.0 * c.lambda_theta, "clip": c.client_clip}

    def epoch_steps(self, clients, epochs: int):
        """Per-client step counts for ``epochs`` passes over the fit data, and the active-step mask."""
        import torch

        n = self.store.fit.length[clients]
        steps = epochs * torch.ceil(n.to(torch.float64) / self.cfg.batch_size).to(torch.int64).clamp_min(1)
        total = int(steps.max()) if len(steps) else 0
        active = torch.arange(total, device=n.device)[None, :] < steps[:, None]
        return total, active

    def train_clients(self, start: dict, clients: np.ndarray, gen, *, steps: int | None = None,
                      epochs: int | None = None, chunk: int = 64) -> dict:
        """Local SGD from ``start`` (one model) on each client's fit data, ``chunk`` clients at a time."""
        import torch

        from pfl_cli.fl.batches import sample_batches
        from pfl_cli.fl.cohort import local_sgd

        out: dict[str, list] = {k: [] for k in start}
        for lo in range(0, len(clients), chunk):
            sel = torch.as_tensor(clients[lo:lo + chunk], device=self.device)
            if epochs is not None:
                total, active = self.epoch_steps(sel, epochs)
            else:
                total, active = steps, None
            index, mask = sample_batches(self.store.fit, sel, total, self.cfg.batch_size, gen)
            theta, _ = local_sgd(self.net, stack(start, len(sel)), self.store, index, mask, active=active,
                                 **self.sgd_options())
            self.client_sgd_steps += int(active.sum()) if active is not None else total * len(sel)
            for k, v in theta.items():
                out[k].append(v)
        return {k: torch.cat(v) if v else start[k].unsqueeze(0)[:0] for k, v in out.items()}


def descriptor_dim(cfg, num_clients: int) -> int:
    """l = int(1 + n / 4) unless given (``specs/pefll.md`` §2.4)."""
    return int(cfg.embed_dim) if cfg.embed_dim else int(1 + num_clients / 4)


def ceil_div(a: int, b: int) -> int:
    return int(math.ceil(a / b))
