"""Label prevalence: which clients keep their labels (thesis §5.5 "label prevalence p", PeFLL Table 4.2).

``round(p * n_train)`` train clients, chosen uniformly at random, keep their labels (at
least one, so training has labeled clients); the other train clients and every holdout
client are unlabeled: their samples' labels are hidden from training and prediction, and
only an evaluator asked for it (``predict --evaluate-hidden-labels``) reads them.
"""

from __future__ import annotations

import numpy as np

from pfl_cli.errors import ConfigError
from pfl_cli.partition.base import ROLE_TRAIN


def check_prevalence(p) -> float:
    """``p`` as a float in (0, 1], or :class:`ConfigError` naming the rule."""
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not np.isfinite(p) or not 0.0 < p <= 1.0:
        raise ConfigError(f"label-prevalence must be a fraction of labeled train clients in (0, 1]; got {p!r}.")
    return float(p)


def labeled_clients(role: np.ndarray, prevalence: float, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """Bool (n_clients,): the clients that keep their labels, and what was done (for stats.json)."""
    train = np.flatnonzero(role == ROLE_TRAIN)
    count = min(len(train), max(1, int(round(prevalence * len(train)))))
    labeled = np.zeros(len(role), dtype=bool)
    labeled[rng.choice(train, size=count, replace=False)] = True
    info = {"label_prevalence": prevalence, "labeled_train_clients": int(count),
            "unlabeled_train_clients": int(len(train) - count),
            "unlabeled_holdout_clients": int(np.sum(role != ROLE_TRAIN))}
    return labeled, info
