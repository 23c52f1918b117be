"""Benchmark: hypernetwork-generated LoRA adapters for new clients against FedIT + fine-tuning and FedSA-LoRA (issue 46,
item 3 (c)).

The task, defined here only (no test reads it): scikit-learn's digits split once (``--data-seed``) into a public pool of
``--public`` images and a federated pool of the rest. A base MLP 64-64-10 is trained centrally on the public pool
(Adam, 400 steps: the "pre-trained model" LoRA adapts) and frozen; the federated pool is partitioned per seed with a
Dirichlet(``--alpha``) label skew over ``--clients`` clients, ``--holdout`` of them never seen in training. Every
method adapts the same base (``lora_base_weights``), raw inputs (``normalize=false``, as the base was trained),
adapters of rank 4 on fc1 and the classifier, with the same round budget (rounds, cohort, local steps, client lr).

New clients are served by each method's own protocol (``pflx predict --clients holdout``):

- ``pefll-lora``: its adapters and classifier from one descriptor and one hypernetwork forward pass (no step);
- ``pfedhn-lora``: a fresh embedding fitted ``embed_rounds`` rounds, hypernetwork frozen;
- ``fedit``: the global adapter (0 steps), and it fine-tuned ``--finetune-steps`` steps (``predict --finetune-steps``);
- ``fedsa-lora``: the global A frozen, a fresh B and classifier trained ``new_client_epochs`` (20) epochs.

Targets (the claim of thesis §7.3's proposal that pflx makes): over the seeds, PeFLL-LoRA's new clients take 0 optimizer
steps and reach a mean accuracy at least that of FedIT's global adapter (the other zero-step protocol); the others are
printed beside it, without a target.

``--tuned`` adds each protocol tuned (benchmarks/tuned.py) beside its bare figure: per protocol and seed, a 6-point
grid, the client lr in {``--lr``, ``--lr`` / 2.5, 2 ``--lr``} (0.05, 0.02, 0.1 by default; the bare one first) times
one key of the method's own: PeFLL-LoRA's hypernetwork step ``server_lr`` in {2e-4 (its default), 1e-3}, pFedHN-LoRA's
``server_lr`` in {0.01 (its default), 0.03}, FedIT's ``lora_rank`` in {4, 8}, FedIT + fine-tuning's
``finetune_steps`` in {20, 5} (the predict-time steps), FedSA-LoRA's ``new_client_epochs`` in {20, 5}. Each point
trains ``--select-rounds`` rounds (default ``--rounds``) on ``pflx tune``'s validation carve of the seed's partition
restricted to its train clients: 20 % of them (6 of 30) become validation clients, never trained on, served by the
protocol and scored on half their samples (the partition's holdout clients and test splits are not in the carve);
the best point is then trained on the partition and its holdout clients served as the bare run serves them. The
target is checked on the bare and on the tuned figures (exit 1 on a miss of either).

    python benchmarks/hn_lora_new_clients.py [--seeds 0,1] [--rounds 150] [--out DIR] [--tuned]

Exits 1 when a figure misses its target.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tuned  # noqa: E402


def build_task(root: Path, args) -> tuple[Path, Path, float]:
    """The federated pool as an npz dataset, the base net pre-trained on the public pool (a state dict) and that
    net's accuracy on the federated pool."""
    import numpy as np
    import torch
    from sklearn.datasets import load_digits

    from pfl_cli.models import build, client_spec

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(args.data_seed).permutation(len(y))
    public, federated = order[:args.public], order[args.public:]
    data = root / "federated.npz"
    x = x / 16.0  # pixel values 0..16 scaled to [0, 1], for the pre-training and the (unnormalized) federated runs
    np.savez(data, x=x[federated].astype(np.float32), y=y[federated].astype(np.int64))
    torch.manual_seed(args.data_seed)
    net = build(client_spec("mlp", (64,), 10, (64,)))
    xs = torch.as_tensor(x[public], dtype=torch.float32)
    ys = torch.as_tensor(y[public])
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(args.data_seed)
    for _ in range(400):
        idx = torch.randint(0, len(ys), (64,), generator=gen)
        loss = torch.nn.functional.cross_entropy(net(xs[idx]), ys[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    base = root / "base.pt"
    torch.save({k: v.detach().clone() for k, v in net.state_dict().items()}, base)
    with torch.no_grad():  # the frozen base with its own classifier, no federated step: where the adapters start
        pooled = torch.as_tensor(x[federated], dtype=torch.float32)
        accuracy = float((net(pooled).argmax(1) == torch.as_tensor(y[federated])).float().mean())
    return data, base, accuracy


def pflx(*args) -> None:
    from pfl_cli.cli.app import main

    code = main([str(a) for a in args])
    if code != 0:
        raise SystemExit(f"hn_lora_new_clients.py: pflx {' '.join(map(str, args[:3]))} ... exited {code}")


def grids(args) -> dict:
    """``--tuned``: protocol -> (algorithm, its grid); every grid's first point is the bare run's."""
    lrs = [args.lr, round(args.lr / 2.5, 6), round(2 * args.lr, 6)]
    return {"pefll-lora": ("pefll-lora", tuned.grid(lr=lrs, server_lr=[2e-4, 1e-3])),
            "pfedhn-lora": ("pfedhn-lora", tuned.grid(lr=lrs, server_lr=[0.01, 0.03])),
            "fedit": ("fedit", tuned.grid(lr=lrs, lora_rank=[4, 8])),
            "fedit + fine-tuning": ("fedit", tuned.grid(lr=lrs, finetune_steps=[args.finetune_steps, 5])),
            "fedsa-lora": ("fedsa-lora", tuned.grid(lr=lrs, new_client_epochs=[20, 5]))}


def choose(part: Path, model: Path, points: list, args) -> tuned.Choice:
    """The point of ``points`` best on validation clients carved from ``part``'s train clients, each trained as the
    bare run ``model`` was (its config.yaml) with that point, ``--select-rounds`` rounds."""
    from pfl_cli.cli.common import train_stage_config
    from pfl_cli.data.location import load_partition_dataset

    cfg = train_stage_config(config_file=model / "config.yaml", flags={}, sets=[])
    p, _info, _art, ds = load_partition_dataset(part)
    return tuned.tune(ds.x, ds.y, ds.num_classes, p, cfg, points, group="holdout", val_clients=0.2,
                      rounds=args.select_rounds, eval_every=args.select_rounds)


def serve(root: Path, part: Path, name: str, seed: int, shared: list, sets: dict, predict_flags: list, tag: str):
    """Train ``name`` with ``sets`` (bare: none), serve the holdout clients: (mean accuracy, optimizer steps)."""
    model = root / f"{name}-{seed}{tag}"
    if not (model / "manifest.json").exists():
        pflx("train", "--partition", part, "--algorithm", name, *shared,
             *[f for k, v in sets.items() for f in ("--set", f"{k}={v}")], "--out", model)
    pred = root / f"{name}-{seed}{tag}-pred{len(predict_flags)}"
    pflx("predict", "--model", model, "--partition", part, "--clients", "holdout", *predict_flags, "--out", pred,
         "--format", "quiet")
    m = json.loads((pred / "metrics.json").read_text())
    return m["mean_accuracy"], m["optimizer_steps"], model


def run_seed(root: Path, data: Path, base: Path, seed: int, args) -> tuple[dict, dict]:
    """Holdout mean accuracy and new-client optimizer steps of every protocol on the partition of ``seed``, bare;
    and with ``--tuned`` the same tuned, with the chosen point (else an empty dict)."""
    part = root / f"part-{seed}"
    pflx("partition", "--dataset", f"npz:{data}", "--scheme", "dirichlet", "--alpha", args.alpha, "--num-clients",
         args.clients, "--holdout-clients", args.holdout, "--seed", seed, "--out", part, "--format", "quiet")
    shared = ["--rounds", args.rounds, "--eval-every", args.rounds, "--clients-per-round", args.cohort, "--seed", seed,
              "--device", "cpu", "--format", "quiet", "--set", f"local_steps={args.local_steps}",
              "--set", f"lr={args.lr}", "--set", "mlp_hidden=[64]", "--set", "lora_rank=4",
              "--set", f"lora_base_weights={base}", "--set", "normalize=false"]
    out, best = {}, {}
    protocols = {"pefll-lora": [[]], "pfedhn-lora": [[]], "fedit": [[], ["--finetune-steps", args.finetune_steps]],
                 "fedsa-lora": [[]]}
    tuned_as = {("fedit", True): "fedit + fine-tuning"}
    for name, predicts in protocols.items():
        for extra in predicts:
            label = name + (f" + {args.finetune_steps} fine-tuning steps" if extra else "")
            acc, steps, model = serve(root, part, name, seed, shared, {}, extra, "")
            out[label] = (acc, steps)
            if not args.tuned:
                continue
            protocol = tuned_as.get((name, bool(extra)), name)
            choice = choose(part, model, grids(args)[protocol][1], args)
            sets = dict(choice.point)
            flags = ["--finetune-steps", sets.pop("finetune_steps")] if "finetune_steps" in sets else []
            acc, steps, _ = serve(root, part, name, seed, shared, sets, flags,
                                  "-tuned-" + "-".join(f"{k}{v}" for k, v in sets.items()))
            best[protocol] = (acc, steps, choice)
            print(f"seed {seed} tuned {protocol}: chose {tuned.describe(choice.point)} (validation clients "
                  f"{choice.score:.1%}); holdout {acc:.1%}\n    validation grid: {choice.table()}", flush=True)
    return out, best


def report(results: list, seeds: list, prefix: str) -> bool:
    """Print each protocol's accuracy per seed, mean and optimizer steps (and, for tuned rows, the grid point chosen
    per seed), then the targets: PeFLL-LoRA takes 0 steps and reaches FedIT's global adapter. True when both hold."""
    chosen = len(next(iter(results[0].values()))) > 2  # tuned rows carry their selection
    print(f"{'protocol':<42} " + " ".join(f"{'seed ' + str(s):>8}" for s in seeds) + f" {'mean':>8} {'steps':>8}"
          + ("  chosen (per seed)" if chosen else ""))
    means = {}
    for label in results[0]:
        accs = [r[label][0] for r in results]
        means[label] = sum(accs) / len(accs)
        steps = sum(r[label][1] for r in results) / len(results)
        picks = "  " + " | ".join(tuned.describe(r[label][2].point) for r in results) if chosen else ""
        print(f"{label:<42} " + " ".join(f"{a:>8.1%}" for a in accs) + f" {means[label]:>8.1%} {steps:>8.0f}{picks}")
    steps = max(r["pefll-lora"][1] for r in results)
    print(f"{prefix}pefll-lora new-client optimizer steps: {steps} (target 0) {'ok' if steps == 0 else 'MISS'}")
    hit = means["pefll-lora"] >= means["fedit"]
    print(f"{prefix}pefll-lora mean accuracy {means['pefll-lora']:.1%} vs {prefix}fedit's global adapter "
          f"{means['fedit']:.1%} (target >=) {'ok' if hit else 'MISS'}")
    return steps == 0 and hit


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--rounds", type=int, default=150)
    p.add_argument("--cohort", type=int, default=5)
    p.add_argument("--local-steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--finetune-steps", type=int, default=20)
    p.add_argument("--clients", type=int, default=40)
    p.add_argument("--holdout", type=int, default=10)
    p.add_argument("--alpha", type=float, default=0.3)
    p.add_argument("--public", type=int, default=400)
    p.add_argument("--data-seed", type=int, default=2026)
    p.add_argument("--out", type=Path, default=None, help="keep the artifacts here (default: a temp dir)")
    p.add_argument("--tuned", action="store_true", help="also each protocol tuned on validation clients (see above)")
    p.add_argument("--select-rounds", type=int, default=None, help="rounds of each --tuned selection run "
                   "(default --rounds)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    args.select_rounds = args.select_rounds or args.rounds
    import torch

    torch.set_num_threads(1)
    root = args.out or Path(tempfile.mkdtemp(prefix="hn-lora-"))
    root.mkdir(parents=True, exist_ok=True)
    data, base, base_accuracy = build_task(root, args)
    both = [run_seed(root, data, base, s, args) for s in seeds]
    results = [r for r, _ in both]
    print(f"new clients ({args.holdout} holdout of {args.clients}, digits Dirichlet({args.alpha}), base MLP pre-trained "
          f"on {args.public} public images, LoRA r 4; {args.rounds} rounds x {args.cohort} clients x "
          f"{args.local_steps} steps, lr {args.lr}; seeds {args.seeds})")
    print(f"the pre-trained base alone (its own classifier, no federated step) on the federated pool: "
          f"{base_accuracy:.1%}")
    ok = report(results, seeds, "")
    if args.tuned:
        print(f"\ntuned (each protocol's grid point chosen per seed on validation clients, {args.select_rounds} "
              f"selection rounds):")
        ok &= report([b for _, b in both], seeds, "tuned ")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
