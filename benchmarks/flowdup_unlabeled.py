"""Benchmark: FLowDUP against FedAvg, LD-FedAvg and FedTTA on unlabeled new clients (thesis Table 5.2, CPU stand-in).

The stand-in for Rotated (Fashion-)MNIST (thesis §5.6.1): scikit-learn's 8x8 digits, every
image once in each of the four rotations 0/90/180/270 degrees (4 x 1,797 images), each
rotation's copy split IID over 60 clients (~30 images each, 70 % fit / 30 % test), so 240
clients of one rotation each; 48 of them, drawn at random, are the new clients, and a
fraction p of the other 192 keep their labels. Every method serves the 48 new clients
from their unlabeled fit samples (FLowDUP: one forward pass of h; FedTTA: adaptation
steps on its learned loss; FedAvg / LD-FedAvg: the global model) and is scored on their
test samples against the hidden labels (an oracle the methods never see).

Why not the 60-client layout of ``recipes/flowdup/rotated-digits.yaml``: at p = 0.1 it has
5 labeled clients, and on seeds 0 and 1 a whole rotation has none (seed 0: no labeled
client of 270 degrees, which 5 of the 12 new clients have), so the comparison measures
guesses on a rotation nobody labeled. The thesis has 600 clients of 100 images, 60 labeled
at p = 0.1.

Every method runs its config class's defaults (the thesis's C.1.2: T = 500, E = 1, B = 50;
FLowDUP alpha = 0.9, e = 256, k = min(10^4, d) = d = 2,410 for the MLP 64-32-10) except the
cohort (10 clients a round by default, for the CPU; ``--cohort 100`` is the thesis's) and its
local lr, tuned as the thesis does (C.1.2: "we tune the local learning rate on validation
clients") on the same grid for every method: the new clients of another draw of the stand-in
(seed 100), once per cohort (``TUNED_LR``).

    python benchmarks/flowdup_unlabeled.py              # seeds 0 and 1, p = 0.1 and 0.2 (~15 min on one core)
    python benchmarks/flowdup_unlabeled.py --cohort 100 # the thesis's cohort (~40 min on one core)
    python benchmarks/flowdup_unlabeled.py --tune       # the lr grid on the validation draw (~25 min)

It prints each mean accuracy beside the thesis's Rotated Fashion-MNIST figure and exits 1
when FLowDUP does not beat both FedAvg and LD-FedAvg in some (p, seed).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

METHODS = ("fedavg", "ld-fedavg", "fedtta", "flowdup")
LR_GRID = (0.1, 0.3, 1.0)
VALIDATION_SEED = 100
# Each method's local lr picked on the validation draw (``--tune [--cohort N]``), per cohort and label prevalence p.
TUNED_LR = {
    10: {0.1: {"fedavg": 1.0, "ld-fedavg": 1.0, "fedtta": 1.0, "flowdup": 1.0},
         0.2: {"fedavg": 1.0, "ld-fedavg": 0.3, "fedtta": 1.0, "flowdup": 0.1}},
    100: {0.1: {"fedavg": 1.0, "ld-fedavg": 0.3, "fedtta": 1.0, "flowdup": 0.3},
          0.2: {"fedavg": 0.3, "ld-fedavg": 1.0, "fedtta": 1.0, "flowdup": 1.0}},
}
# Thesis Table 5.2, Rotated Fashion-MNIST (mean over 3 seeds), for the printout.
THESIS = {0.1: {"fedavg": 77.7, "ld-fedavg": 76.1, "fedtta": 78.3, "flowdup": 81.5},
          0.2: {"fedavg": 79.2, "ld-fedavg": 78.8, "fedtta": 80.2, "flowdup": 83.3}}
# The thesis's C.1.2 protocol for all methods (FedAvg's own defaults are PeFLL's), cohort 10 for the CPU.
COMMON = dict(rounds=500, local_epochs=1, batch_size=50, clients_per_round=10, eval_every=500,
              evaluate_hidden_labels=True, val_fraction=0.0)


def rotated_digits(seed: int, p: float, *, per_rotation: int = 60, new_clients: int = 48):
    """The stand-in: (rotated x (4n, 64), y (4n,), partition) for ``seed`` and label prevalence ``p``."""
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.partition.base import Partition
    from pfl_cli.partition.prevalence import labeled_clients
    from pfl_cli.partition.rotation import rotate_clients
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    n = len(ds.y)
    copies = [partition_labels(ds.y, PartitionConfig(scheme="iid", num_clients=per_rotation, test_fraction=0.3),
                               num_classes=10, rng=make_rng(seed, f"partition-rotation-{r}")) for r in range(4)]

    def joined(offsets: str, indices: str):
        """The four copies' CSR arrays end to end, copy r's sample indices shifted by r * n."""
        sizes = np.concatenate([np.diff(getattr(q, offsets)) for q in copies])
        return (np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                np.concatenate([getattr(q, indices) + r * n for r, q in enumerate(copies)]).astype(np.int64))

    m = 4 * per_rotation
    rng = make_rng(seed, "standin-roles")
    role = np.zeros(m, np.uint8)
    role[rng.choice(m, new_clients, replace=False)] = 1
    labeled, _ = labeled_clients(role, p, rng)
    (tro, tri), (teo, tei) = joined("train_offsets", "train_indices"), joined("test_offsets", "test_indices")
    part = Partition(client_id=np.arange(m, dtype=np.int64), role=role, train_offsets=tro, train_indices=tri,
                     test_offsets=teo, test_indices=tei, labeled=labeled.astype(np.uint8),
                     rotation=np.repeat(np.array([0, 90, 180, 270], np.int16), per_rotation))
    y = np.concatenate([ds.y] * 4)
    part.check(len(y))
    return rotate_clients(np.concatenate([ds.x] * 4), part), y, part


def new_client_accuracy(method: str, p: float, seed: int, lr: float,
                        cohort: int = COMMON["clients_per_round"]) -> float:
    """Mean accuracy (%) over the stand-in's new clients of ``method`` trained with its defaults at ``lr``."""
    from pfl_cli import registry
    from pfl_cli.fl import train_federated

    x, y, part = rotated_digits(seed, p)
    cfg = registry.train_config(method, lr=lr, seed=seed, **{**COMMON, "clients_per_round": cohort})
    run = train_federated(x, y, 10, part, cfg, device="cpu")
    return 100 * run.outcome.best.summaries()["holdout"]["mean_accuracy"]


def tune(ps, methods=METHODS, cohort: int = COMMON["clients_per_round"]) -> int:
    for p in ps:
        for method in methods:
            accs = {lr: new_client_accuracy(method, p, VALIDATION_SEED, lr, cohort) for lr in LR_GRID}
            best = max(accs, key=accs.get)
            print(f"p={p} {method:<9} " + "  ".join(f"lr {lr}: {a:5.1f}" for lr, a in accs.items())
                  + f"  -> lr {best}", flush=True)
    return 0


def compare(ps, seeds, methods=METHODS, cohort: int = COMMON["clients_per_round"]) -> int:
    missed = []
    for p in ps:
        for seed in seeds:
            start = time.perf_counter()
            acc = {m: new_client_accuracy(m, p, seed, TUNED_LR[cohort][p][m], cohort) for m in methods}
            for m in methods:
                print(f"p={p} seed={seed} {m:<9} {acc[m]:5.1f}   (thesis RFMNIST {THESIS[p][m]})", flush=True)
            rivals = [acc[m] for m in ("fedavg", "ld-fedavg") if m in acc]
            holds = acc["flowdup"] > max(rivals)
            names = "/".join(m for m in ("FedAvg", "LD-FedAvg") if m.lower() in acc)
            print(f"p={p} seed={seed}: FLowDUP - best of {names} = "
                  f"{acc['flowdup'] - max(rivals):+.1f} (target > 0: "
                  f"{'holds' if holds else 'MISSED'}; {time.perf_counter() - start:.0f} s)", flush=True)
            if not holds:
                missed.append((p, seed))
    return 1 if missed else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tune", action="store_true", help="run the lr grid on the validation draw instead")
    ap.add_argument("--p", default="0.1,0.2", help="label prevalences, comma-separated")
    ap.add_argument("--seeds", default="0,1", help="seeds of the test draws, comma-separated")
    ap.add_argument("--methods", default=",".join(METHODS), help="methods to compare (flowdup and at least one of "
                                                                  "fedavg, ld-fedavg), comma-separated")
    ap.add_argument("--cohort", type=int, default=COMMON["clients_per_round"],
                    help="clients a round (the thesis's C.1.2: 100; the default 10 is the CPU stand-in's)")
    args = ap.parse_args(argv)
    ps = [float(v) for v in args.p.split(",")]
    methods = tuple(args.methods.split(","))
    if "flowdup" not in methods or not {"fedavg", "ld-fedavg"} & set(methods) or set(methods) - set(METHODS):
        ap.error(f"--methods must be among {', '.join(METHODS)}, with flowdup and fedavg or ld-fedavg; "
                 f"got {args.methods}")
    if args.tune:
        return tune(ps, methods, args.cohort)
    if args.cohort not in TUNED_LR:
        ap.error(f"--cohort {args.cohort}: no tuned lrs for it (tuned: {', '.join(map(str, TUNED_LR))}); run --tune "
                 f"--cohort {args.cohort} and add them to TUNED_LR")
    return compare(ps, [int(s) for s in args.seeds.split(",")], methods, args.cohort)


if __name__ == "__main__":
    sys.exit(main())
