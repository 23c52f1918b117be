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

    python benchmarks/hn_lora_new_clients.py [--seeds 0,1] [--rounds 150] [--out DIR]

Exits 1 when a figure misses its target.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


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


def run_seed(root: Path, data: Path, base: Path, seed: int, args) -> dict:
    """Holdout mean accuracy and new-client optimizer steps of every protocol on the partition of ``seed``."""
    part = root / f"part-{seed}"
    pflx("partition", "--dataset", f"npz:{data}", "--scheme", "dirichlet", "--alpha", args.alpha, "--num-clients",
         args.clients, "--holdout-clients", args.holdout, "--seed", seed, "--out", part, "--format", "quiet")
    shared = ["--rounds", args.rounds, "--eval-every", args.rounds, "--clients-per-round", args.cohort, "--seed", seed,
              "--device", "cpu", "--format", "quiet", "--set", f"local_steps={args.local_steps}",
              "--set", f"lr={args.lr}", "--set", "mlp_hidden=[64]", "--set", "lora_rank=4",
              "--set", f"lora_base_weights={base}", "--set", "normalize=false"]
    out = {}
    protocols = {"pefll-lora": [[]], "pfedhn-lora": [[]], "fedit": [[], ["--finetune-steps", args.finetune_steps]],
                 "fedsa-lora": [[]]}
    for name, predicts in protocols.items():
        model = root / f"{name}-{seed}"
        pflx("train", "--partition", part, "--algorithm", name, *shared, "--out", model)
        for extra in predicts:
            label = name + (f" + {args.finetune_steps} fine-tuning steps" if extra else "")
            pred = root / f"{name}-{seed}-pred{len(extra)}"
            pflx("predict", "--model", model, "--partition", part, "--clients", "holdout", *extra, "--out", pred,
                 "--format", "quiet")
            m = json.loads((pred / "metrics.json").read_text())
            out[label] = (m["mean_accuracy"], m["optimizer_steps"])
    return out


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
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    import torch

    torch.set_num_threads(1)
    root = args.out or Path(tempfile.mkdtemp(prefix="hn-lora-"))
    root.mkdir(parents=True, exist_ok=True)
    data, base, base_accuracy = build_task(root, args)
    results = [run_seed(root, data, base, s, args) for s in seeds]
    print(f"new clients ({args.holdout} holdout of {args.clients}, digits Dirichlet({args.alpha}), base MLP pre-trained "
          f"on {args.public} public images, LoRA r 4; {args.rounds} rounds x {args.cohort} clients x "
          f"{args.local_steps} steps, lr {args.lr}; seeds {args.seeds})")
    print(f"the pre-trained base alone (its own classifier, no federated step) on the federated pool: "
          f"{base_accuracy:.1%}")
    print(f"{'protocol':<42} " + " ".join(f"{'seed ' + str(s):>8}" for s in seeds) + f" {'mean':>8} {'steps':>8}")
    means = {}
    for label in results[0]:
        accs = [r[label][0] for r in results]
        means[label] = sum(accs) / len(accs)
        steps = sum(r[label][1] for r in results) / len(results)
        print(f"{label:<42} " + " ".join(f"{a:>8.1%}" for a in accs) + f" {means[label]:>8.1%} {steps:>8.0f}")
    ok = True
    steps = max(r["pefll-lora"][1] for r in results)
    verdict = "ok" if steps == 0 else "MISS"
    ok &= steps == 0
    print(f"pefll-lora new-client optimizer steps: {steps} (target 0) {verdict}")
    hit = means["pefll-lora"] >= means["fedit"]
    ok &= hit
    print(f"pefll-lora mean accuracy {means['pefll-lora']:.1%} vs fedit's global adapter {means['fedit']:.1%} "
          f"(target >=) {'ok' if hit else 'MISS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
