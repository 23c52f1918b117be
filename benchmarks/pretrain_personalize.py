"""Measurement (issue 46, item 3a): LoRA personalization of a pre-trained backbone against the same clients trained
from scratch with pflx's built-in net and against full fine-tuning of the backbone, two seeds.

The task (no test contains it): ``builtin:digits`` split by class. The public part (the even digits by default,
``builtin:digits?classes=0,2,4,6,8``) pre-trains the backbone centrally (``pflx train --algorithm centralized``,
MLP 64-64-5); the private part (the odd digits) is partitioned over ``--clients`` clients by Dirichlet label skew
``--alpha``, ``--holdout`` of them new clients never seen in training. The two parts share no sample and no class:
what transfers is the features of 8x8 pen strokes. Every run below is the chain of pflx commands the recipe
(recipes/pretrain-then-personalize) shows, run through the CLI; all runs of a seed share the partition, the rounds,
the cohort size, the local steps and the client lr (``--lr``; ``--lora-lr`` for the LoRA runs, the same by default):

- ``local`` / ``fedavg`` from scratch: the built-in MLP 64-64-5 at its seeded random init;
- ``fedsa-lora`` on the random base: LoRA (rank ``--rank``) on the same MLP frozen at its random init (what the
  adapters can do without pre-training);
- ``fedavg`` full fine-tuning: the same MLP as a model kind (``factory:pfl_cli.models.client:client_model``, pflx's
  built-in net) started from the pre-trained ``model.pt`` (``model_weights``), every weight trained;
- ``fedit`` / ``fedsa-lora`` on the pre-trained backbone (``lora_base_weights``): the backbone frozen, adapters on
  its hidden layer and the classifier trained.

Figures: the mean test accuracy of the train clients (their own test splits; ``metrics.json``), of the new clients
(``holdout``, each algorithm's own protocol) and the train clients' accuracy at the first evaluation (round
``--eval-every``: the head start pre-training gives), mean over the seeds, and the floats a client uploads a round.
Claims (exit 1 on a miss), for each of fedsa-lora and fedit on the pre-trained backbone: it beats LoRA on the random
base and both from-scratch baselines, and stays within ``--ft-margin`` of full fine-tuning.

``--tuned`` adds each method tuned (benchmarks/tuned.py) beside its bare figures: per method and seed, a 6-point grid,
the client lr in {``--lr``, ``--lr`` / 2.5, 2 ``--lr``} (0.05, 0.02, 0.1 by default; the bare one first) times one key
of the method's own: Local's ``local_epochs`` in {200 (its default), 50}, FedAvg's client ``momentum`` in {0.9, 0.5}
(from scratch and full fine-tuning), LoRA's ``lora_rank`` in {``--rank``, 2 ``--rank``} for FedIT and FedSA-LoRA.
Each point trains the bare run's config (its ``config.yaml``) with that point, the same rounds, on ``pflx tune``'s
validation carve of the private partition (20 % of every train client's train samples become its validation
samples; the test splits and the new clients are not in it), scored by the train clients' mean validation
accuracy; the best point is then trained through the CLI on the partition and reported as the bare run is. The
claims are checked on the bare and on the tuned figures (exit 1 on a miss of either).

    python benchmarks/pretrain_personalize.py [--seeds 0,1] [--rounds 40] [--lr 0.05] [--out runs/bench-pretrain]
        [--tuned]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tuned  # noqa: E402
from verdict import Verdicts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUILTIN_MLP = "factory:pfl_cli.models.client:client_model"  # pflx's own MLP as a model kind: it takes model_weights


def pflx(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    subprocess.run([sys.executable, "-m", "pfl_cli", *args, "--format", "quiet"], check=True, env=env)


def runs(args) -> dict[str, list[str]]:
    """Method -> its train flags (beside the shared ones)."""
    width = f"mlp_hidden=[{args.width}]"
    mlp = ["--set", width]
    lora = ["--lr", str(args.lora_lr), "--set", f"lora_rank={args.rank}", "--set", width]
    return {
        "local, scratch": ["--algorithm", "local", *mlp],
        "fedavg, scratch": ["--algorithm", "fedavg", *mlp],
        "fedsa-lora, random base": ["--algorithm", "fedsa-lora", *lora],
        "fedavg, full fine-tuning": ["--algorithm", "fedavg", "--model-arch", BUILTIN_MLP,
                                     "--set", f"model_kwargs={{arch: mlp, hidden: [{args.width}]}}",
                                     "--set", "model_weights={pre}/model.pt"],
        "fedit, pretrained": ["--algorithm", "fedit", *lora, "--set", "lora_base_weights={pre}/model.pt"],
        "fedsa-lora, pretrained": ["--algorithm", "fedsa-lora", *lora, "--set", "lora_base_weights={pre}/model.pt"],
    }


def grids(args) -> dict[str, list[dict]]:
    """``--tuned``: method -> its grid, the bare point first."""
    lrs = [args.lr, round(args.lr / 2.5, 6), round(2 * args.lr, 6)]
    lora_lrs = [args.lora_lr, round(args.lora_lr / 2.5, 6), round(2 * args.lora_lr, 6)]
    ranks = [args.rank, 2 * args.rank]
    return {"local, scratch": tuned.grid(lr=lrs, local_epochs=[200, 50]),
            "fedavg, scratch": tuned.grid(lr=lrs, momentum=[0.9, 0.5]),
            "fedsa-lora, random base": tuned.grid(lr=lora_lrs, lora_rank=ranks),
            "fedavg, full fine-tuning": tuned.grid(lr=lrs, momentum=[0.9, 0.5]),
            "fedit, pretrained": tuned.grid(lr=lora_lrs, lora_rank=ranks),
            "fedsa-lora, pretrained": tuned.grid(lr=lora_lrs, lora_rank=ranks)}


def choose(partition: Path, run: Path, points: list[dict]) -> tuned.Choice:
    """The point best on the validation carve of ``partition``, each trained as the bare ``run`` (its config.yaml)."""
    from pfl_cli.cli.common import train_stage_config
    from pfl_cli.data.location import load_partition_dataset

    cfg = train_stage_config(config_file=run / "config.yaml", flags={}, sets=[])
    part, _info, _art, ds = load_partition_dataset(partition)
    return tuned.tune(ds.x, ds.y, ds.num_classes, part, cfg, points, group="train")


def first_eval(run: Path, round_: int) -> float:
    with open(run / "metrics.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row["group"] == "train" and row["metric"] == "mean_accuracy" and int(row["round"]) == round_:
                return float(row["value"])
    raise SystemExit(f"{run}/metrics.csv: no train mean_accuracy at round {round_}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--public", default="0,2,4,6,8", help="digits of the public part (pre-training)")
    p.add_argument("--private", default="1,3,5,7,9", help="digits of the clients' private part")
    p.add_argument("--clients", type=int, default=30)
    p.add_argument("--holdout", type=int, default=5)
    p.add_argument("--alpha", type=float, default=0.3)
    p.add_argument("--test-fraction", type=float, default=0.2,
                   help="share of each private client's samples kept for its test split (0.8: scarce train data)")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--pretrain-rounds", type=int, default=40)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lora-lr", type=float, default=None)
    p.add_argument("--ft-margin", type=float, default=0.02)
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="a train key for every run, pre-training included (e.g. normalize=false)")
    p.add_argument("--out", default="runs/bench-pretrain")
    p.add_argument("--tuned", action="store_true", help="also each method tuned on validation data (see above)")
    args = p.parse_args()
    args.lora_lr = args.lr if args.lora_lr is None else args.lora_lr
    out = Path(args.out)
    seeds = [int(s) for s in args.seeds.split(",")]
    methods = runs(args)
    figures: dict[str, dict[str, list[float]]] = {m: {"train": [], "holdout": [], "early": [], "floats": []}
                                                  for m in methods}
    tfig: dict[str, dict[str, list]] = {m: {"train": [], "holdout": [], "chosen": []} for m in methods}
    pre_acc = []
    extra = [f for s in args.sets for f in ("--set", s)]
    for seed in seeds:
        d = out / f"seed{seed}"
        pub, priv, pre = d / "public", d / "private", d / "pretrained"
        pflx("partition", "--dataset", f"builtin:digits?classes={args.public}", "--num-clients", "10",
             "--seed", str(seed), "--out", str(pub), "--force")
        pflx("partition", "--dataset", f"builtin:digits?classes={args.private}", "--dirichlet", str(args.alpha),
             "--num-clients", str(args.clients), "--holdout-clients", str(args.holdout), "--seed", str(seed),
             "--test-fraction", str(args.test_fraction),
             "--out", str(priv), "--force")
        pflx("train", "--partition", str(pub), "--algorithm", "centralized", "--rounds", str(args.pretrain_rounds),
             "--clients-per-round", "10", "--local-steps", str(args.local_steps), "--lr", str(args.lr),
             "--set", f"mlp_hidden=[{args.width}]", "--set", f"eval_every={args.pretrain_rounds}",
             "--seed", str(seed), *extra, "--out", str(pre), "--force")
        pre_acc.append(json.loads((pre / "metrics.json").read_text())["train"]["mean_accuracy"])
        for name, flags in methods.items():
            run = d / name.replace(", ", "-").replace(" ", "-")
            flags = [f.replace("{pre}", str(pre)) for f in flags]
            shared = ["--partition", str(priv), "--lr", str(args.lr), "--seed", str(seed)]
            if name != "local, scratch":  # Local trains each client local_epochs (its own default), no rounds
                shared += ["--rounds", str(args.rounds), "--clients-per-round", "10", "--local-steps",
                           str(args.local_steps), "--set", f"eval_every={args.eval_every}"]
            pflx("train", *shared, *flags, *extra, "--out", str(run), "--force")
            m = json.loads((run / "metrics.json").read_text())
            figures[name]["train"].append(m["train"]["mean_accuracy"])
            figures[name]["holdout"].append(m["holdout"]["mean_accuracy"])
            figures[name]["early"].append(first_eval(run, args.eval_every) if name != "local, scratch" else float("nan"))
            figures[name]["floats"].append(float(m.get("floats_per_client_round") or 0))
            print(f"seed {seed} {name:<26} train {m['train']['mean_accuracy']:.3f} "
                  f"holdout {m['holdout']['mean_accuracy']:.3f}", flush=True)
            if args.tuned:
                import torch

                torch.set_num_threads(1)
                choice = choose(priv, run, grids(args)[name])
                sets = [f for k, v in choice.point.items() for f in ("--set", f"{k}={v}")]
                pflx("train", *shared, *flags, *extra, *sets, "--out", str(run) + "-tuned", "--force")
                m = json.loads((Path(str(run) + "-tuned") / "metrics.json").read_text())
                tfig[name]["train"].append(m["train"]["mean_accuracy"])
                tfig[name]["holdout"].append(m["holdout"]["mean_accuracy"])
                tfig[name]["chosen"].append(tuned.describe(choice.point))
                print(f"seed {seed} {name:<26} tuned: chose {tuned.describe(choice.point)} (validation "
                      f"{choice.score:.3f}); train {m['train']['mean_accuracy']:.3f} holdout "
                      f"{m['holdout']['mean_accuracy']:.3f}\n    validation grid: {choice.table()}", flush=True)

    def mean(xs):
        return statistics.fmean(xs)

    print(f"\npublic digits {args.public} -> backbone (centralized, mean test accuracy "
          f"{mean(pre_acc):.3f}); private digits {args.private}: {args.clients} clients "
          f"(Dirichlet {args.alpha}, {args.holdout} new, test fraction {args.test_fraction}), {args.rounds} rounds of 10 clients x {args.local_steps} "
          f"steps, lr {args.lr} (LoRA {args.lora_lr}, rank {args.rank}); seeds {args.seeds}"
          f"{'; ' + ', '.join(args.sets) if args.sets else ''}\n")
    print(f"| method | train clients | per seed | new clients | round {args.eval_every} | floats up / client-round |")
    print("|---|---|---|---|---|---|")
    for name, f in figures.items():
        per_seed = " / ".join(f"{x:.3f}" for x in f["train"])
        early = "-" if name == "local, scratch" else f"{mean(f['early']):.3f}"
        print(f"| {name} | {mean(f['train']):.3f} | {per_seed} | {mean(f['holdout']):.3f} | {early} | "
              f"{mean(f['floats']):,.0f} |")
    print()
    if args.tuned:
        print("Tuned (each method's grid point chosen per seed on validation data):\n")
        print("| method | train clients | per seed | new clients | chosen (seed by seed) |")
        print("|---|---|---|---|---|")
        for name, f in tfig.items():
            print(f"| {name} | {mean(f['train']):.3f} | {' / '.join(f'{x:.3f}' for x in f['train'])} | "
                  f"{mean(f['holdout']):.3f} | {' / '.join(f['chosen'])} |")
        print()
    v = Verdicts()
    for tag, figs in (("", figures), ("tuned ", tfig)) if args.tuned else (("", figures),):
        ft = mean(figs["fedavg, full fine-tuning"]["train"])
        for method in ("fedsa-lora, pretrained", "fedit, pretrained"):
            lora = mean(figs[method]["train"])
            for other in ("fedsa-lora, random base", "fedavg, scratch", "local, scratch"):
                ref = mean(figs[other]["train"])
                v.check(f"{tag}{method.split(',')[0]} pretrained vs {other}", f"{lora:.3f} vs {ref:.3f}", "higher",
                        lora > ref)
            v.check(f"{tag}{method.split(',')[0]} pretrained vs full fine-tuning", f"{lora:.3f} vs {ft:.3f}",
                    f">= FT - {args.ft_margin}", lora >= ft - args.ft_margin)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
