"""Defaults that learn (issues 33 and 39, slow tier): every registered algorithm, bare, reaches a floor set by a
per-client label prior and by FedAvg's level on four small tasks.

"Bare" means the algorithm's config class as it ships: only ``rounds`` is shrunk (to ``ROUNDS``, so the
suite takes minutes; most defaults are the papers' 500-5000) and evaluation happens once, at the end.
Everything else (lr, cohort, local steps or epochs, batch, widths) is the default a user gets from
``pflx train --algorithm NAME``. Two kinds of algorithms need inputs no default can give:

- the local-DP ones (``dp_required``) need ``--dp``: they get their paper's budget and clip (HyperFL App.
  D.1: eps = 4, delta = 1e-5, C = 0.04), the paper code's Poisson rate B / n_i (32 of ~38 records: 0.8),
  ``normalize=false`` and inputs scaled by the public bound 16 of digits' pixels, as ``--dp`` asks, and
  ``ROUNDS_LOCAL_DP`` rounds (DP-SGD's per-sample gradients make theirs the costliest rounds);
- HyperFL-LPM needs a pre-trained backbone file (``backbone``, ``backbone_weights``): it is left out here,
  and the test below checks that it refuses to run bare, so leaving it out is not a silent skip.

The tasks (``builtin:digits``, 30 clients of ~60 samples, 6 of them new clients, 30 % test samples):
IID, Dirichlet alpha = 0.3, two classes a client, and IID with each client's images rotated by one of
0/90/180/270 degrees (the thesis's rotated-MNIST layout, ch. 5, all clients labeled).

The floor of a cell (an algorithm, a task, a group of clients) is the better of two references, each trained
or computed on the same partition in the same run:

- the **per-client label prior**: each client predicts its most frequent training label (no features, no
  federation); ~10 % on the IID tasks, 37-58 % on the label-skewed ones;
- the **reference algorithm's level minus a margin**: FedAvg, or LDP-FedAvg for the local-DP algorithms
  (the same budget: a non-private FedAvg is no reference for them), trained bare here as every algorithm is.
  The margin is ``SEED_MARGIN`` = 10 points: twice the largest difference between two seeds of FedAvg's
  mean accuracy on these tasks (4.6 points, the 6 new clients of digits IID: 92.6 vs 97.2; the train
  clients differ by at most 1.8), so a run within noise of the reference passes and one far below fails.

Cells measured below the reference minus the margin (seed 0) are news about a method at 100 bare rounds,
not noise: each is listed in ``BELOW_REFERENCE`` with its measured gap, and its floor is the reference minus
(that gap + the margin), so it still fails if the method gets worse. docs/algorithms/defaults.md gives
the causes. The reference algorithms' own floor is the label prior; LDP-FedAvg, a global model under
local DP, stays below the per-client prior on label-skewed clients (``BELOW_PRIOR``): its floor there is
twice chance. Each test prints the cell's margin over its floor (``pytest -s``); ``python
tests/algorithms/test_defaults_learn.py`` prints the whole table with floors and margins.
"""

from __future__ import annotations

import functools
import sys
import time

import pytest

from pfl_cli import registry

ROUNDS = 100
ROUNDS_LOCAL_DP = 50  # DP-SGD's per-sample gradients make these rounds the costliest: shrunk further
CHANCE = 0.1
SEED_MARGIN = 0.10  # 2x FedAvg's largest two-seed difference on these tasks (4.6 points), rounded up
REFERENCE, LOCAL_DP_REFERENCE = "fedavg", "ldp-fedavg"
GROUPS = ("train", "holdout")
# (algorithm, task, group): how far (points) its seed-0 bare run ended below the reference (FedAvg, or
# LDP-FedAvg for the local-DP ones) beyond SEED_MARGIN; measured 2026-11-25/27, causes in
# docs/algorithms/defaults.md ("Below FedAvg"). The floor keeps SEED_MARGIN below the measured level.
BELOW_REFERENCE = {
    ("local", "digits IID", "train"): 28.5, ("local", "digits IID", "holdout"): 15.7,
    ("local", "Dirichlet 0.3", "train"): 15.0, ("local", "Dirichlet 0.3", "holdout"): 15.8,
    ("local", "rotated digits", "train"): 18.7,
    ("hyperfl", "digits IID", "train"): 13.7, ("hyperfl", "rotated digits", "train"): 12.9,
    ("hyperfl", "rotated digits", "holdout"): 13.9,
    ("fedrep", "digits IID", "train"): 16.7, ("fedrep", "digits IID", "holdout"): 10.2,
    ("fedrep", "Dirichlet 0.3", "holdout"): 10.6, ("fedrep", "rotated digits", "train"): 13.4,
    ("lg-fedavg", "digits IID", "train"): 19.0, ("lg-fedavg", "digits IID", "holdout"): 10.2,
    ("lg-fedavg", "Dirichlet 0.3", "holdout"): 10.1, ("lg-fedavg", "rotated digits", "train"): 14.6,
    ("lg-fedavg", "rotated digits", "holdout"): 14.9,
    ("ditto", "digits IID", "train"): 26.2, ("ditto", "Dirichlet 0.3", "train"): 14.7,
    ("ditto", "rotated digits", "train"): 28.0,
    ("apfl", "rotated digits", "train"): 21.3, ("apfl", "rotated digits", "holdout"): 19.5,
    ("perfedavg", "rotated digits", "train"): 21.0, ("perfedavg", "rotated digits", "holdout"): 19.5,
    ("pfedme", "digits IID", "train"): 12.0, ("pfedme", "digits IID", "holdout"): 10.2,
    ("pfedme", "rotated digits", "train"): 36.5, ("pfedme", "rotated digits", "holdout"): 30.6,
    ("flowdup", "rotated digits", "holdout"): 11.1,
    ("fedbabu", "rotated digits", "train"): 15.3,
    ("fedbn", "Dirichlet 0.3", "holdout"): 17.2, ("fedbn", "two classes a client", "holdout"): 32.1,
    ("fedbn", "rotated digits", "train"): 13.9,
    ("feddbe", "two classes a client", "holdout"): 16.2, ("feddbe", "rotated digits", "train"): 15.3,
    ("fedpac", "digits IID", "train"): 14.4, ("fedpac", "digits IID", "holdout"): 14.8,
    ("fedpac", "rotated digits", "train"): 37.3, ("fedpac", "rotated digits", "holdout"): 26.8,
    # FedProto's nearest-prototype inference (its default since 2026-11-27; seed 0: IID 68.3 / 76.9, Dirichlet
    # 76.9 / 84.9, rotated 49.3 / 74.1; the gaps 0.1 wide of them). Its decision layer scored IID 41.2 / 50.0,
    # Dirichlet 75.4 / 76.6, rotated 42.4 / 59.3: the Dirichlet and rotated cells failed before, unmeasured
    ("fedproto", "digits IID", "train"): 18.8, ("fedproto", "digits IID", "holdout"): 5.8,
    ("fedproto", "Dirichlet 0.3", "train"): 10.0, ("fedproto", "Dirichlet 0.3", "holdout"): 3.7,
    ("fedproto", "rotated digits", "train"): 28.5, ("fedproto", "rotated digits", "holdout"): 1.2,
    ("fedlc", "two classes a client", "holdout"): 13.2,
    ("apple", "digits IID", "train"): 13.0, ("apple", "digits IID", "holdout"): 12.0,
    ("qffl", "two classes a client", "holdout"): 1.4,
    # LoRA on a random frozen base (issue 46; measured 2026-11-29, the gaps 0.1 wide of the seed-0 levels)
    ("ffa-lora", "digits IID", "train"): 0.5, ("ffa-lora", "Dirichlet 0.3", "holdout"): 2.2,
    ("ffa-lora", "rotated digits", "train"): 11.9, ("ffa-lora", "rotated digits", "holdout"): 8.6,
    ("fedsa-lora", "digits IID", "train"): 14.2, ("fedsa-lora", "digits IID", "holdout"): 33.6,
    ("fedsa-lora", "Dirichlet 0.3", "train"): 0.2, ("fedsa-lora", "Dirichlet 0.3", "holdout"): 16.0,
    ("fedsa-lora", "rotated digits", "train"): 5.8, ("fedsa-lora", "rotated digits", "holdout"): 43.8,
}
# LDP-FedAvg is its own reference: a global model under local DP (eps 4, 50 rounds) on label-skewed
# clients stays below what a per-client label prior scores (measured 38.8 vs 44.9, 26.9 vs 57.8, 27.6 vs
# 42.8); its floor there is twice chance.
BELOW_PRIOR = {("ldp-fedavg", "Dirichlet 0.3", "train"), ("ldp-fedavg", "Dirichlet 0.3", "holdout"),
               ("ldp-fedavg", "two classes a client", "holdout")}
TASKS = {
    "digits IID": dict(scheme="iid"),
    "Dirichlet 0.3": dict(scheme="dirichlet", alpha=0.3),
    "two classes a client": dict(scheme="pathological", classes_per_client=2),
    "rotated digits": dict(scheme="iid", rotations=[0, 90, 180, 270]),
}
NEEDS_INPUT = {"hyperfl-lpm": "needs a backbone"}  # a pre-trained backbone file: no bare default exists
# The local-DP algorithms' paper setting (HyperFL App. D.1 and its code: eps 4, delta 1e-5, C 0.04, q = B / n_i).
LOCAL_DP = dict(dp_epsilon=4.0, dp_delta=1e-5, dp_clip=0.04, dp_sampling_rate=0.8, dp_noise="seeded",
                normalize=False)


def algorithms() -> list[str]:
    return [name for name in registry.entries() if name not in NEEDS_INPUT]


@functools.lru_cache(maxsize=None)
def task(name: str):
    """(x, y, partition) of a task; rotated images stored rotated, as ``pflx train`` loads them."""
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.partition.rotation import rotate_clients
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    cfg = PartitionConfig(num_clients=30, holdout_clients=6, test_fraction=0.3, **TASKS[name])
    part = partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(0, "partition"), pool=ds.pool)
    x = rotate_clients(ds.x, part) if part.rotation is not None else ds.x
    return x, ds.y, part


def label_prior_accuracy(task_name: str) -> dict[str, float]:
    """Each client predicts its most frequent training label: the mean over clients of that guess's test accuracy."""
    import numpy as np

    _, y, part = task(task_name)
    out = {}
    for group, role in zip(GROUPS, (0, 1)):
        accs = []
        for j in np.flatnonzero(np.asarray(part.role) == role):
            test = y[part.test_of(j)]
            if len(test):
                accs.append(float(np.mean(test == np.bincount(y[part.train_of(j)], minlength=10).argmax())))
        out[group] = float(np.mean(accs))
    return out


def reference_of(algorithm: str) -> str:
    return LOCAL_DP_REFERENCE if registry.get(algorithm).algorithm.dp_required else REFERENCE


@functools.lru_cache(maxsize=None)
def cached_run(algorithm: str, task_name: str) -> tuple[tuple[str, float], ...]:
    return tuple(bare_run(algorithm, task_name).items())


def floor(algorithm: str, task_name: str, group: str) -> tuple[float, str]:
    """The cell's floor and what set it (the label prior, the reference minus its margin, or twice chance)."""
    if (algorithm, task_name, group) in BELOW_PRIOR:
        return 2 * CHANCE, "2x chance"
    prior = label_prior_accuracy(task_name)[group]
    reference = reference_of(algorithm)
    if algorithm == reference:
        return prior, "label prior"
    gap = SEED_MARGIN + BELOW_REFERENCE.get((algorithm, task_name, group), 0.0) / 100
    level = dict(cached_run(reference, task_name))[group] - gap
    return (prior, "label prior") if prior >= level else (level, f"{reference} - {100 * gap:.1f}")


def bare_run(algorithm: str, task_name: str) -> dict[str, float]:
    """The unmasked mean accuracy of the train and holdout clients after a bare run (and its seconds)."""
    from pfl_cli.fl import train_federated

    entry = registry.get(algorithm)
    x, y, part = task(task_name)
    keys: dict = dict(rounds=ROUNDS, eval_every=ROUNDS) if entry.algorithm.federated else {}
    if entry.algorithm.dp_required:
        keys.update(LOCAL_DP, rounds=ROUNDS_LOCAL_DP, eval_every=ROUNDS_LOCAL_DP)
        x = x / 16.0  # digits' pixels lie in [0, 16]: a public bound
    start = time.perf_counter()
    run = train_federated(x, y, 10, part, registry.train_config(algorithm, **keys), device="cpu")
    s = run.outcome.best.summaries()
    return {"train": s["train"]["mean_accuracy"], "holdout": s["holdout"]["mean_accuracy"],
            "seconds": time.perf_counter() - start}


@pytest.mark.slow
@pytest.mark.parametrize("task_name", list(TASKS))
@pytest.mark.parametrize("algorithm", algorithms())
def test_bare_defaults_end_far_above_chance(algorithm, task_name):
    acc = dict(cached_run(algorithm, task_name))
    report = []
    for group in GROUPS:
        level, source = floor(algorithm, task_name, group)
        report.append((group, acc[group], level, source))
        # the cell, its floor and the margin over it, seen with pytest -s
        print(f"{algorithm} | {task_name} | {group}: {100 * acc[group]:.1f} floor {100 * level:.1f} ({source}) "
              f"margin {100 * (acc[group] - level):+.1f}")
    assert all(value >= level for _, value, level, _ in report), report


def test_the_floor_tables_name_registered_algorithms_and_tasks():
    """A renamed algorithm or task must not silently drop its measured gap (its floor would tighten unseen)."""
    for name, task_name, group in set(BELOW_REFERENCE) | BELOW_PRIOR:
        assert name in algorithms() and task_name in TASKS and group in GROUPS, (name, task_name, group)


def test_the_algorithms_left_out_cannot_run_bare(digits_clients):
    """HyperFL-LPM is left out of the suite because it refuses to run without a backbone file, not silently."""
    from pfl_cli.errors import ConfigError
    from pfl_cli.fl.store import build_store

    ds, part = digits_clients
    store = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=None, device="cpu")
    for name, message in NEEDS_INPUT.items():
        entry = registry.get(name)
        with pytest.raises(ConfigError, match=message):
            entry.algorithm(registry.train_config(name), store)


def main() -> int:
    """Print the task x algorithm table of docs/algorithms/defaults.md: train / new clients (%), each cell's
    margin over its floor in brackets."""
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else algorithms()
    print("| algorithm | " + " | ".join(TASKS) + " |")
    print("|---|" + "---|" * len(TASKS))
    for name in names:
        cells = []
        for t in TASKS:
            acc = dict(cached_run(name, t))
            margins = [100 * (acc[g] - floor(name, t, g)[0]) for g in GROUPS]
            cells.append(f"{100 * acc['train']:.1f} / {100 * acc['holdout']:.1f} "
                         f"({margins[0]:+.1f} / {margins[1]:+.1f})")
            print(f"  {name} {t}: {acc['seconds']:.0f} s", file=sys.stderr, flush=True)
        print(f"| `{name}` | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
