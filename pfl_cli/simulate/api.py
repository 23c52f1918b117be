"""The validated public entry point of the ``simulate`` stage (thesis §3.1, §3.4).

Simulated clients are built from server-side (centralized) data so that hyperparameters
can be tuned without live clients. Each simulated client first gets a class histogram,
then that many samples of each class are dealt from the server data
(:mod:`pfl_cli.simulate.draw`):

- ``mdm`` -- histograms drawn from a fitted MDM: component, size, proportions, counts.
- ``iid`` -- the thesis's fully IID baseline: a size drawn from the true size
  distribution (the model's size marginal, or the true clients' sizes), then ``m``
  samples IID from the server data, i.e. counts ~ Mult(m, central class marginal).
- ``conditional-iid`` -- the thesis's oracle: simulated client ``i`` copies true client
  ``i``'s histogram exactly.

Test data and holdout clients work as in ``partition``: with an official test pool each
client's test samples follow its train labels; otherwise each client also gets about
``test_fraction`` of its samples as test data with the same class proportions, so its
*train* histogram is exactly the simulated one. Either way no sample is both a train sample
(of any client) and a test sample (of any client), DESIGN.md section 5: without an official
test pool each class's samples are split once into a train pool and a test pool
(:func:`pfl_cli.simulate.draw.deal`).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pfl_cli.errors import ConfigError, InfeasibleError, InputError, PflxWarning
from pfl_cli.mdm.model import MDMParams
from pfl_cli.mdm.sample import sample_clients, sample_sizes
from pfl_cli.partition._alloc import split_counts
from pfl_cli.partition.base import Partition
from pfl_cli.partition.split import holdout_count, mark_holdout, match_test_pool
from pfl_cli.schema import register_choices
from pfl_cli.simulate.draw import SHORTAGE_POLICIES, deal

MODES = ("mdm", "iid", "conditional-iid")
DEFAULT_TEST_FRACTION = 0.2


@dataclass(frozen=True)
class SimulateConfig:
    """Options of ``pflx simulate``; each field is the flag of the same name."""

    dataset: str = "builtin:digits"
    mode: str = "mdm"
    num_clients: int | None = None
    replacement: bool = True
    shortage: str = "cap"
    test_fraction: float | None = None
    holdout_clients: float = 0
    plot: bool = False
    seed: int = 0


register_choices(SimulateConfig, mode=lambda: MODES, shortage=SHORTAGE_POLICIES)


def validate_config(cfg: SimulateConfig, *, has_model: bool, like_clients: int | None, has_labels: bool) -> SimulateConfig:
    """Check the options against the inputs before any draw; return the resolved config."""
    if cfg.mode not in MODES:
        raise ConfigError(f"mode must be one of {', '.join(MODES)}; got {cfg.mode!r}.")
    if cfg.shortage not in SHORTAGE_POLICIES:
        raise ConfigError(f"shortage must be one of {', '.join(SHORTAGE_POLICIES)}; got {cfg.shortage!r}.")
    if not has_labels:
        raise ConfigError(f"simulate deals samples by class, and the dataset {cfg.dataset} has no labels.")
    if cfg.mode == "mdm" and not has_model:
        raise ConfigError("mode mdm needs --model MDMDIR (the output of pflx mdm-fit).")
    if cfg.mode == "iid" and not has_model and like_clients is None:
        raise ConfigError("mode iid draws client sizes from --model MDMDIR or from the true clients of --like PARTITION_DIR; give one.")
    num = cfg.num_clients
    if cfg.mode == "conditional-iid":
        if like_clients is None:
            raise ConfigError("mode conditional-iid copies each true client's histogram: give --like PARTITION_DIR.")
        if num is not None and num != like_clients:
            raise ConfigError(f"mode conditional-iid makes one client per true client ({like_clients}); got --num-clients {num}. "
                              "Omit --num-clients.")
        num = like_clients
    if num is None:
        raise ConfigError(f"mode {cfg.mode} needs --num-clients N.")
    if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num < 1:
        raise ConfigError(f"num-clients must be an integer >= 1; got {num!r}.")
    if cfg.test_fraction is not None and not (0 <= cfg.test_fraction < 1):
        raise ConfigError(f"test-fraction must be in [0, 1); got {cfg.test_fraction!r}.")
    h = cfg.holdout_clients
    if isinstance(h, bool) or not isinstance(h, (int, float)) or h < 0 or (h >= 1 and float(h) != int(h)):
        raise ConfigError(f"holdout-clients must be a fraction in [0, 1) or a whole number of clients; got {h!r}.")
    if holdout_count(h, int(num)) >= int(num):
        raise InfeasibleError(f"holdout-clients {h} leaves no train client out of {num}; use fewer holdout clients.")
    return dataclasses.replace(cfg, num_clients=int(num))


def _train_counts(cfg: SimulateConfig, num_classes: int, marginal: np.ndarray, model: MDMParams | None,
                  like_counts: np.ndarray | None, rng: np.random.Generator) -> tuple[np.ndarray, dict[str, Any]]:
    n = cfg.num_clients
    if cfg.mode == "mdm":
        drawn = sample_clients(model, n, rng=rng)
        info = {"components": np.bincount(drawn.component, minlength=model.num_components).tolist()}
        return drawn.counts, info
    if cfg.mode == "conditional-iid":
        return like_counts.copy(), {"like_clients": int(len(like_counts))}
    if model is not None:
        comp = rng.choice(model.num_components, size=n, p=model.tau)
        sizes, source = sample_sizes(model, comp, rng), "model size marginal"
    else:
        true_sizes = like_counts.sum(axis=1)
        true_sizes = true_sizes[true_sizes > 0]
        sizes, source = rng.choice(true_sizes, size=n, replace=True), "true clients' sizes (--like)"
    return rng.multinomial(sizes, marginal), {"size_source": source}


def simulate_partition(
    labels: np.ndarray,
    cfg: SimulateConfig,
    *,
    num_classes: int,
    rng: np.random.Generator,
    model: MDMParams | None = None,
    like_counts: np.ndarray | None = None,
    pool: np.ndarray | None = None,
    x: np.ndarray | None = None,
    on_progress: Callable[[int, int, dict], None] | None = None,
) -> Partition:
    """Build simulated clients from server data as a :class:`~pfl_cli.partition.Partition`.

    Parameters
    ----------
    labels : ndarray of shape (n_samples,)
        Class of every server sample, in ``[0, num_classes)``.
    cfg : SimulateConfig
        Already validated by :func:`validate_config`.
    num_classes : int
    rng : numpy.random.Generator
    model : MDMParams, optional
        The fitted MDM (mode ``mdm``; sizes for mode ``iid``).
    like_counts : ndarray of shape (n_true, num_classes), optional
        True clients' train histograms (mode ``conditional-iid``; sizes for ``iid``).
    pool : ndarray of shape (n_samples,), optional
        0 = train pool, 1 = official test pool.
    x : ndarray of shape (n_samples, ...), optional
        The server samples' features. Given, samples holding the same content (features and
        label, :func:`pfl_cli.data.digest.sample_digests`) count as one sample: they all go to
        the train pool or all to the test pool when test samples are drawn from the server data.
    on_progress : callable(done, total, status), optional
        Called after each of ``num_classes + 2`` steps: the histograms drawn, each class dealt to
        every client (:func:`~pfl_cli.simulate.draw.deal`), the test split; ``status`` =
        ``{"step": name}``.

    Returns
    -------
    Partition
        ``info`` records the mode, the sampling regime and any shortage.

    Raises
    ------
    InputError
        A model or true histograms whose category count differs from ``num_classes``.
    InfeasibleError
        A class runs short under ``shortage="error"``.
    """
    labels = np.asarray(labels, dtype=np.int64)
    for name, c in (("model", None if model is None else model.num_categories),
                    ("like partition", None if like_counts is None else like_counts.shape[1])):
        if c is not None and c != num_classes:
            raise InputError(f"the {name} has {c} categories but the server dataset has {num_classes} classes; "
                             "use the dataset the model was fitted on (or one with the same classes).")
    n_all = len(labels)
    pool = np.zeros(n_all, dtype=np.uint8) if pool is None else np.asarray(pool)
    train_pool, test_pool = np.flatnonzero(pool == 0), np.flatnonzero(pool == 1)
    r_counts, r_deal, r_test, r_roles = rng.spawn(4)
    total = num_classes + 2

    def step(done: int, name: str) -> None:
        if on_progress is not None:
            on_progress(done, total, {"step": name})

    def dealt(c: int) -> None:
        if c == 0:  # reported once deal has checked the request: a refusal comes before any progress
            step(1, f"histograms of {cfg.num_clients} clients drawn ({cfg.mode})")
        step(2 + c, f"class {c + 1}/{num_classes} dealt")

    marginal = np.bincount(labels[train_pool], minlength=num_classes) / max(len(train_pool), 1)
    train_counts, mode_info = _train_counts(cfg, num_classes, marginal, model, like_counts, r_counts)
    use_pool = cfg.test_fraction is None and len(test_pool) > 0
    fraction = 0.0 if use_pool else (DEFAULT_TEST_FRACTION if cfg.test_fraction is None else cfg.test_fraction)
    sizes = train_counts.sum(axis=1)
    # Test counts with the train proportions, about `fraction` of the client's samples in all.
    n_test = np.floor(sizes * fraction / (1 - fraction) + 0.5).astype(np.int64)
    props = np.where(sizes[:, None] > 0, train_counts / np.maximum(sizes, 1)[:, None], 0.0)
    test_counts = split_counts(props, n_test) if fraction > 0 else np.zeros_like(train_counts)
    same = None
    if x is not None and test_counts.any():  # copies of one sample must not land in both pools
        from pfl_cli.data.digest import sample_digests

        same = np.unique(sample_digests(x, labels, train_pool), axis=0, return_inverse=True)[1].reshape(-1)
    train, test, shortage = deal(train_counts, test_counts, labels[train_pool], train_pool,
                                 replacement=cfg.replacement, shortage=cfg.shortage, rng=r_deal, same=same,
                                 on_class=dealt)
    if use_pool:
        from pfl_cli.partition.stats import label_histograms

        hist = label_histograms(train[0], train[1], labels, num_classes)
        test = match_test_pool(hist, labels[test_pool], test_pool, r_test)
        test_split = "official test pool, matched to each client's train labels"
    else:
        test_split = f"extra samples with each client's train proportions, fraction {fraction} of its samples"
    role = mark_holdout(cfg.num_clients, holdout_count(cfg.holdout_clients, cfg.num_clients), rng=r_roles)
    step(total, "test split and holdout clients")
    info = {
        "scheme": "simulate", "mode": cfg.mode, "replacement": cfg.replacement, "test_split": test_split,
        "shortage": shortage, **mode_info,
        "requested_train_samples": int(sizes.sum()),
    }
    part = Partition(client_id=np.arange(cfg.num_clients, dtype=np.int64), role=role, train_offsets=train[0],
                     train_indices=train[1], test_offsets=test[0], test_indices=test[1], info=info)
    part.check(n_all)
    if shortage["short_classes"] and cfg.shortage != "error":
        verb = "capped" if cfg.shortage == "cap" else "reused"
        count = shortage["samples_capped"] if cfg.shortage == "cap" else shortage["samples_reused"]
        warnings.warn(
            f"classes {shortage['short_classes']} ran short of server samples: {count} samples {verb} for "
            f"{shortage['clients_affected']} clients (--shortage {cfg.shortage}; recorded in stats.json).",
            PflxWarning, stacklevel=2,
        )
    return part
