"""A run's Byzantine clients: who they are, what they upload, and what the run measures about them.

The malicious clients are ``round(attack_fraction * train clients)`` train clients drawn once from the seed's
stream ``byzantine-clients``; an attack's random draws in round ``t`` come from the stream ``byzantine-round-t``.
Both depend on the seed and the round only, so a resumed run draws exactly what the uninterrupted run drew.
"""

from __future__ import annotations

import math

import numpy as np

from pfl_cli.fl.byzantine.attacks import ATTACKS
from pfl_cli.rng import make_rng, torch_generator


def malicious_clients(cfg, train_clients: np.ndarray) -> np.ndarray:
    """The store positions of the run's malicious clients, sorted."""
    k = int(math.floor(cfg.attack_fraction * len(train_clients) + 0.5))
    chosen = make_rng(cfg.seed, "byzantine-clients").choice(len(train_clients), size=k, replace=False)
    return np.sort(np.asarray(train_clients)[chosen])


class Threat:
    """The attack of a run on ``store``: built by :func:`prepare_threat` before the algorithm."""

    def __init__(self, cfg, store, malicious: np.ndarray) -> None:
        self.attack = ATTACKS[cfg.attack]
        self.seed, self.scale = cfg.seed, cfg.attack_scale
        self.server_lr = getattr(cfg, "server_lr", None)
        self.malicious = malicious
        self.client_id = np.asarray(store.client_id)
        self.is_malicious = np.zeros(store.num_clients, dtype=bool)
        self.is_malicious[malicious] = True
        self.backdoor = None

    def scale_for(self, n: int, f: int, default_server_lr: float) -> float:
        if self.scale is not None:
            return float(self.scale)
        lr = self.server_lr if self.server_lr is not None else default_server_lr
        return float(self.attack.default_scale(n=n, f=f, server_lr=lr))

    def corrupt(self, t: int, cohort, reference: dict, theta: dict, *, default_server_lr: float = 1.0) -> dict:
        """The cohort's models ``theta`` (c, ...) as the server receives them in round ``t``: the malicious rows'
        deltas from ``reference`` replaced by the attack's; the honest rows are the same tensors' values."""
        import torch

        if not self.attack.corrupts_updates or len(cohort) == 0:
            return theta
        mal = torch.as_tensor(self.is_malicious[cohort.cpu().numpy()], device=cohort.device)
        if not bool(mal.any()):
            return theta
        n, keys = len(cohort), list(theta)
        D = torch.cat([(theta[k] - reference[k]).reshape(n, -1) for k in keys], dim=1)
        gen = torch_generator(self.seed, f"byzantine-round-{t}")
        scale = self.scale_for(n, int(mal.sum()), default_server_lr)
        bad = self.attack.corrupt(D, mal, scale=scale, gen=gen).to(D.dtype)
        rows = torch.nonzero(mal).flatten()
        out = {}
        for k, part in zip(keys, bad.split([reference[k].numel() for k in keys], dim=1)):
            v = theta[k].clone()
            v[rows] = reference[k] + part.view(len(rows), *reference[k].shape)
            out[k] = v
        return out

    # ------------------------------------------------------------------ what the run measures
    def honest(self, clients: np.ndarray) -> np.ndarray:
        return ~self.is_malicious[np.asarray(clients, dtype=np.int64)]

    def evaluation_rows(self, alg, ev, round_: int) -> list[list]:
        """metrics.csv rows of an evaluation: the honest train clients' accuracy (``group`` honest) and, under
        the backdoor, its success rate on their models (``group`` backdoor, ``attack_success_rate``)."""
        rows = []
        summary = self.honest_summary(ev)
        if summary is not None:
            rows += [[round_, "honest", m, summary[m]] for m in ("mean_accuracy", "pooled_accuracy")]
        if self.backdoor is not None:
            rows.append([round_, "backdoor", "attack_success_rate", self.success_rate(alg, round_)])
        return rows

    def honest_summary(self, ev) -> dict | None:
        from pfl_cli.fl.evaluate import _take

        train = ev.groups.get("train")
        if train is None:
            return None
        keep = np.flatnonzero(self.honest(train.clients))
        return _take(train, keep).summary() if len(keep) else None

    def success_rate(self, alg, round_: int) -> float:
        """The share of the honest train clients' triggered test samples (true label not the target) that
        their models classify as the target."""
        from pfl_cli.fl.evaluate import personalize_and_evaluate
        from pfl_cli.fl.store import ROLE_TRAIN

        clients = alg.store.clients(ROLE_TRAIN)
        clients = clients[self.honest(clients)]
        if len(clients) == 0:
            return float("nan")
        evals, _, _ = personalize_and_evaluate(alg, clients, ("backdoor",), torch_generator(
            self.seed, f"backdoor-evaluate-{round_}"), with_global_model=False)
        ev = evals["backdoor"]
        total = int(ev.n.sum())
        return float(ev.correct.sum() / total) if total else float("nan")

    def metrics(self, outcome, history: list) -> dict:
        """metrics.json's ``byzantine`` object, at the selected evaluation."""
        best = outcome.best
        out = {"attack": self.attack.name, "malicious_clients": [int(self.client_id[c]) for c in self.malicious]}
        train = best.groups.get("train")
        if train is not None:
            keep = self.honest(train.clients)
            summary = self.honest_summary(best)
            out["honest"] = None if summary is None else {m: summary[m] for m in ("mean_accuracy", "pooled_accuracy",
                                                                                   "num_clients")}
            acc = train.accuracy(False)
            out["honest_client_accuracy"] = {str(int(self.client_id[c])): float(a)
                                             for c, a, h in zip(train.clients, acc, keep) if h and np.isfinite(a)}
        if self.backdoor is not None:
            rates = [r[3] for r in history if r[0] == best.round and r[1] == "backdoor"]
            out["backdoor_attack_success_rate"] = rates[-1] if rates else None
        return out


def prepare_threat(cfg, store):
    """Before the algorithm is built: the run's malicious clients, their data poisoned where the attack does
    so, and the backdoor's evaluation split; None without an attack."""
    from pfl_cli.fl.byzantine.poison import backdoor_split, poison_fit
    from pfl_cli.fl.store import ROLE_TRAIN

    if cfg.attack == "none":
        return None
    from pfl_cli.errors import InputError
    from pfl_cli.fl.distributed import world

    if world()[1] > 1:
        raise InputError(f"--nproc / torchrun: attack {cfg.attack} runs in one process only (a rank holds only its "
                         "own clients' samples to poison and score); drop --nproc.")
    train = store.clients(ROLE_TRAIN)
    threat = Threat(cfg, store, malicious_clients(cfg, train))
    if threat.attack.poisons_data:
        poison_fit(store, threat.malicious, threat.attack.name)
    if threat.attack.name == "backdoor":
        store.backdoor = backdoor_split(store, train[threat.honest(train)])
        threat.backdoor = True
    return threat
