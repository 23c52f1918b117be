"""Defaults that learn (issue 33, slow tier): every registered algorithm, bare, ends far above chance on four
small tasks.

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

The floor is twice chance, 20 % of 10 classes, on the unmasked mean accuracy of both the train clients
and the new (holdout) clients. Why that margin: an untrained model scores chance give or take a few
points (the seeded initializations score 7-13 % here), and ``train`` warns below chance + 5 points; 2x
chance is clearly out of that band, so a run above it has learned, while still failing the defaults that
ended at chance in issue 33 (FLowDUP, LD-FedAvg and FedTTA at lr 2e-3: 15-17 % here). The measured
accuracies are in docs/algorithms/defaults.md (``python tests/algorithms/test_defaults_learn.py``
prints that table).
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
FLOOR = 2 * CHANCE
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
    acc = bare_run(algorithm, task_name)
    print(f"{algorithm} | {task_name}: train {100 * acc['train']:.1f} / new {100 * acc['holdout']:.1f} "
          f"({acc['seconds']:.0f} s)")  # the docs table's cell, seen with pytest -s
    assert acc["train"] >= FLOOR and acc["holdout"] >= FLOOR, (algorithm, task_name, acc)


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
    """Print the task x algorithm table of docs/algorithms/defaults.md (train / new clients, %)."""
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else algorithms()
    print("| algorithm | " + " | ".join(TASKS) + " |")
    print("|---|" + "---|" * len(TASKS))
    for name in names:
        cells = []
        for t in TASKS:
            acc = bare_run(name, t)
            cells.append(f"{100 * acc['train']:.1f} / {100 * acc['holdout']:.1f}")
            print(f"  {name} {t}: {acc['seconds']:.0f} s", file=sys.stderr, flush=True)
        print(f"| `{name}` | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
