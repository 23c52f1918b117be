"""Measurement: FedSA-LoRA and FedDPA against FedIT on the training clients under label skew, two seeds (issue 46,
item 3 b).

The claim of both papers: a personal part of the adapter beats one global adapter when the clients' data differ
(FedSA-LoRA, Guo et al., ICLR 2025, §5, Table 1: personal B matrices over FedIT under Dirichlet label skew; FedDPA,
Yang et al., NeurIPS 2024, §5, Tables 1-2: a local adapter beside the global one over FedIT on each client's own
task). The task, defined here only: digits over 24 clients with 3 classes each (pathological label skew; the
partition seed is the run's seed + 100), none held out; the frozen base is a random MLP 64-64-10 (pflx's
default base: model_arch's net at its seeded start); LoRA rank 4 on both layers; 30 rounds of 8 clients x 10 local
steps at lr 0.1, batch 16. The figure: the train clients' mean test accuracy of the model selected on their
validation split, mean over the seeds; the claims: FedSA-LoRA and FedDPA each above FedIT by ``--margin`` points
(default 1). Exit 1 on a miss. Also printed, as context: FedDPA's own global adapter alone (its
``global_accuracy``, FedIT's model inside FedDPA) and FedDPA with the similarity scale w = 1.

``--tuned`` adds, beside each method's bare figure, its tuned one (benchmarks/tuned.py): per method and seed, a
grid of the client lr in {0.1, 0.03, 0.3} (the bare 0.1 first) times LoRA's rank ``lora_rank`` in {4, 8}
(``lora_alpha`` stays 4: the scale alpha / r halves at rank 8, as in LoRA), 6 points for FedIT and FedSA-LoRA; FedDPA
also its similarity scale ``dpa_max_weight`` w in {0.5, 1}, 12 points (the bare "w = 1" row is in its grid; the
larger grid can only favour FedDPA's claim). Each point trains the same ``--rounds`` on
``pflx tune``'s validation carve of that seed's partition (20 % of every client's train samples become its
validation samples; the test splits are not in it) and is scored by the train clients' mean validation accuracy;
the best point is then trained on the whole partition and reported on test as the bare run is. The claims are
checked on the bare and on the tuned figures (exit 1 on a miss of either).

    python benchmarks/lora_personal_claims.py [--rounds 30] [--seeds 0,1] [--margin 1] [--tuned]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tuned  # noqa: E402
from verdict import Verdicts  # noqa: E402


#: per method, its tuned grid (``--tuned``): the client lr (the bare 0.1 first) times LoRA's rank, and FedDPA's w
GRIDS = {"fedit": tuned.grid(lr=[0.1, 0.03, 0.3], lora_rank=[4, 8]),
         "fedsa-lora": tuned.grid(lr=[0.1, 0.03, 0.3], lora_rank=[4, 8]),
         "feddpa": tuned.grid(lr=[0.1, 0.03, 0.3], lora_rank=[4, 8], dpa_max_weight=[0.5, 1.0])}


def task(name: str, seed: int, args, **keys):
    """The dataset, the seed's partition and the method's bare config with ``keys``."""
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.registry import train_config
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="pathological", classes_per_client=3, num_clients=24,
                                                  holdout_clients=0, seed=100 + seed, test_fraction=0.3),
                            num_classes=ds.num_classes, rng=make_rng(100 + seed, "partition"), pool=ds.pool)
    bare = dict(rounds=args.rounds, eval_every=args.eval_every, clients_per_round=8, local_steps=10, lr=0.1,
                batch_size=16, seed=seed, mlp_hidden=(64,), lora_rank=4, lora_alpha=4.0)
    return ds, part, train_config(name, **{**bare, **keys})


def train_accuracy(name: str, seed: int, args, **keys) -> tuple[float, float | None]:
    """(mean test accuracy of the train clients, the pooled accuracy of the global model if the run has one)."""
    import torch

    from pfl_cli.fl import train_federated

    ds, part, cfg = task(name, seed, args, **keys)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))
    train = run.outcome.best.summaries()["train"]
    return float(train["mean_accuracy"]), train.get("global_accuracy")


def tuned_accuracy(name: str, seed: int, args) -> tuple[float, tuned.Choice]:
    """The method's grid point chosen on validation data, and its mean test accuracy trained on the partition."""
    ds, part, cfg = task(name, seed, args)
    choice = tuned.tune(ds.x, ds.y, ds.num_classes, part, cfg, GRIDS[name], group="train")
    acc, _ = train_accuracy(name, seed, args, **choice.point)
    return acc, choice


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--margin", type=float, default=1.0, help="points above FedIT each claim needs")
    ap.add_argument("--tuned", action="store_true", help="also each method tuned on validation data (see above)")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    v = Verdicts()
    print(f"digits, 24 clients x 3 classes (pathological), MLP 64-64-10 frozen, LoRA r=4, {args.rounds} rounds x 8 "
          f"clients x 10 steps, seeds {seeds}; train clients' mean test accuracy")
    runs = {"fedit": ("fedit", {}), "fedsa-lora": ("fedsa-lora", {}), "feddpa": ("feddpa", {}),
            "feddpa w=1": ("feddpa", {"dpa_max_weight": 1.0})}
    got = {}
    for label, (name, keys) in runs.items():
        accs, glob = [], []
        for s in seeds:
            acc, g = train_accuracy(name, s, args, **keys)
            accs.append(100 * acc)
            if g is not None and name == "feddpa":
                glob.append(100 * g)
        got[label] = statistics.mean(accs)
        v.note(f"{label}: mean accuracy", f"{got[label]:.1f} % ({', '.join(f'{a:.1f}' for a in accs)})")
        if glob:
            v.note(f"{label}: global adapter alone, pooled", f"{statistics.mean(glob):.1f} % "
                                                         f"({', '.join(f'{a:.1f}' for a in glob)})")
    for label in ("fedsa-lora", "feddpa"):
        gain = got[label] - got["fedit"]
        v.check(f"{label} - fedit", f"{gain:+.1f} points", f">= +{args.margin:g}", gain >= args.margin)
    if args.tuned:
        best = {}
        for name in GRIDS:
            accs = []
            for s in seeds:
                acc, choice = tuned_accuracy(name, s, args)
                accs.append(100 * acc)
                v.note(f"tuned {name}, seed {s}: chose", f"{tuned.describe(choice.point)} "
                       f"(validation {100 * choice.score:.1f} %)")
                print(f"    validation grid: {choice.table()}", flush=True)
            best[name] = statistics.mean(accs)
            v.note(f"tuned {name}: mean accuracy", f"{best[name]:.1f} % ({', '.join(f'{a:.1f}' for a in accs)})")
        for label in ("fedsa-lora", "feddpa"):
            gain = best[label] - best["fedit"]
            v.check(f"tuned {label} - tuned fedit", f"{gain:+.1f} points", f">= +{args.margin:g}",
                    gain >= args.margin)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
