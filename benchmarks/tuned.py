"""The tuned side of a bare-against-tuned measurement: a small grid per method and seed, scored on validation data
only, the chosen point then trained on the real partition and reported on test as the bare run is.

The project's rule (docs/algorithms/lora.md, issue 46): a method that wins only with settings found by hand has not
won, so each claim is reported bare (every key at its default, one shared step size) and tuned (each method's own
best point of a small grid). What the grid is scored on is ``pflx tune``'s validation carve
(:func:`pfl_cli.tune.split.validation_partition`, the same salt as ``pflx tune --seed``): from the partition's train
clients only, a share ``val_fraction`` of each client's train samples becomes its validation samples, and for
new-client benchmarks a share ``val_clients`` of the train clients becomes *validation clients*, never trained on,
served by the method's new-client protocol and scored on their validation half. The partition's test splits and
its holdout clients are not in the carve, so the point chosen cannot depend on them. The score is ``pflx tune``'s:
the run's selected round's mean accuracy on the group asked (``train``: the train clients' validation samples,
``holdout``: the validation clients). A run that diverges scores minus infinity; ties go to the earlier point
of the grid (list the default first).

This is a hand grid over the Python API rather than ``pflx tune``: the benchmarks' partitions live in memory, the
new-client benchmarks score every method on validation clients (``pflx tune`` scores on them only the methods whose
headline is new clients), and one process avoids a study database per method and seed.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence


def grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    """Every combination of the axes' values, the first axis varying slowest: ``grid(lr=[.1, .3], lora_rank=[4])``."""
    keys = list(axes)
    return [dict(zip(keys, values)) for values in itertools.product(*(axes[k] for k in keys))]


def describe(point: Mapping[str, Any]) -> str:
    """``lr=0.1, lora_rank=8``: a point as the docs' tables print it."""
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in point.items()) or "(defaults)"


@dataclass(frozen=True)
class Choice:
    """The grid's point with the highest validation score, that score, and every point's score (grid order)."""

    point: dict
    score: float
    scores: tuple

    def table(self) -> str:
        return "; ".join(f"{describe(p)}: {'diverged' if s == -math.inf else f'{100 * s:.1f}'}"
                         for p, s in self.scores)


def select(points: Sequence[Mapping[str, Any]], score: Callable[[Mapping[str, Any]], float]) -> Choice:
    """The point of ``points`` whose ``score(point)`` is highest (the first on ties); a NaN score counts as minus
    infinity. Refused when no point scores a finite value."""
    if not points:
        raise ValueError("select: the grid is empty")
    scores = []
    for p in points:
        s = float(score(p))
        scores.append((dict(p), -math.inf if math.isnan(s) else s))
    best = max(range(len(scores)), key=lambda i: (scores[i][1], -i))
    if not math.isfinite(scores[best][1]):
        raise RuntimeError(f"select: no point of the grid scored a finite value ({scores})")
    return Choice(point=scores[best][0], score=scores[best][1], scores=tuple(scores))


def validation_carve(x, y, part, *, seed: int, val_fraction: float = 0.2, val_clients: float = 0.0):
    """``pflx tune --seed SEED``'s validation partition of ``part`` (train clients only; see the module docstring)."""
    from pfl_cli.privacy.randomness import noise_source
    from pfl_cli.tune.split import validation_partition

    rng = noise_source("seeded", seed).numpy("tune-validation")
    return validation_partition(part, val_fraction=val_fraction, val_clients=val_clients, rng=rng, x=x, y=y)


def tune(x, y, num_classes: int, part, base_cfg, points: Sequence[Mapping[str, Any]], *, group: str = "train",
         val_fraction: float = 0.2, val_clients: float = 0.0, metric: str = "mean_accuracy",
         train: Callable | None = None, **fixed) -> Choice:
    """The point of ``points`` (keys of ``base_cfg`` to replace) that scores best on the validation carve of
    ``part``, each trained as ``base_cfg`` with that point and ``fixed`` (e.g. fewer ``rounds`` for the
    selection runs). ``group``: ``train`` (validation samples of the clients trained on) or ``holdout``
    (validation clients: needs ``val_clients`` > 0). ``train``: ``pfl_cli.fl.train_federated`` unless given."""
    import torch

    from pfl_cli.fl.api import validate_train_config
    from pfl_cli.fl.loop import TrainingDiverged

    if group == "holdout" and val_clients <= 0:
        raise ValueError("tune: group 'holdout' scores validation clients; give val_clients > 0")
    if train is None:
        from pfl_cli.fl import train_federated as train
    vpart = validation_carve(x, y, part, seed=base_cfg.seed, val_fraction=val_fraction, val_clients=val_clients)

    def score(point: Mapping[str, Any]) -> float:
        cfg = dataclasses.replace(base_cfg, **fixed, **point)
        validate_train_config(cfg)
        try:
            run = train(x, y, num_classes, vpart, cfg, device=torch.device("cpu"))
        except TrainingDiverged:
            return -math.inf
        summary = run.outcome.best.summaries().get(group)
        return math.nan if summary is None else float(summary[metric])

    return select(points, score)
