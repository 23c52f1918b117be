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

    python benchmarks/lora_personal_claims.py [--rounds 30] [--seeds 0,1] [--margin 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdict import Verdicts  # noqa: E402


def train_accuracy(name: str, seed: int, args, **keys) -> tuple[float, float | None]:
    """(mean test accuracy of the train clients, the pooled accuracy of the global model if the run has one)."""
    import torch

    from pfl_cli.data import load_dataset
    from pfl_cli.fl import train_federated
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.registry import train_config
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="pathological", classes_per_client=3, num_clients=24,
                                                  holdout_clients=0, seed=100 + seed, test_fraction=0.3),
                            num_classes=ds.num_classes, rng=make_rng(100 + seed, "partition"), pool=ds.pool)
    cfg = train_config(name, rounds=args.rounds, eval_every=args.eval_every, clients_per_round=8, local_steps=10,
                       lr=0.1, batch_size=16, seed=seed, mlp_hidden=(64,), lora_rank=4, lora_alpha=4.0, **keys)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))
    train = run.outcome.best.summaries()["train"]
    return float(train["mean_accuracy"]), train.get("global_accuracy")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--margin", type=float, default=1.0, help="points above FedIT each claim needs")
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
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
