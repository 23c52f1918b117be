"""Benchmark: pFedLA's hypernetwork step size and direction on the conformance task, pflx's against FL-bench's.

pflx's pFedLA steps each client's hypernetwork by ``psi <- psi - hn_lr J^T (theta_bar - theta')``
(theta_bar the aggregated model the client received, theta' after local training): descent on the
surrogate 1/2 ||theta' - theta_bar(psi)||^2, the justification pFedHN gives for its update (Shamsian et
al., ICML 2021, §3: "the gradient of an approximation to the surrogate loss"), which moves theta_bar
towards the trained model. FL-bench (``src/server/pfedla.py``) takes ``grad_outputs = -(old - new)``
with ``torch.optim.SGD``: ``psi <- psi - hn_lr J^T (theta' - theta_bar)``, the literal sign of pFedHN's
Alg. 1, which moves theta_bar away from it; its ``hn_lr`` default is 5e-3. FL-bench's direction at a
step ``lr`` is pflx's at ``-lr``, so this script runs pflx's pFedLA with the hypernetwork's vector-Jacobian
product negated for the ``flbench`` runs (:func:`flbench_direction`), on the
conformance task of ``benchmarks/conformance.py`` (the ring, 20 clients, two classes a client, MLP
64-100-10, SGD lr 0.05, batch 10, one local epoch, every client every round), for each of
``--variants`` (``LR:SIGN``, SIGN ``pflx`` or ``flbench``) and ``--seeds``, and prints the pooled test
accuracy of the 20 clients with FedAvg's and Local's beside it.

    python benchmarks/pfedla_hn_lr.py [--rounds 50] [--seeds 0,1,2] [--jobs 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import conformance  # noqa: E402  (the same export and matched settings)

DEFAULT_VARIANTS = "100:pflx,0.005:pflx,0.005:flbench,100:flbench"


def flbench_direction() -> None:
    """pflx's pFedLA, its hypernetwork stepped in FL-bench's direction: the one ``torch.autograd.grad`` call of
    ``run_round`` that has ``grad_outputs`` (theta_bar - theta') gets them negated (theta' - theta_bar, FL-bench's
    ``-diff``); local training's gradients (no ``grad_outputs``) are untouched."""
    import torch

    from pfl_cli.algorithms import pfedla

    original = pfedla.PFedLA.run_round

    def run_round(self, t, cohort, gen):
        grad = torch.autograd.grad

        def flipped(outputs, inputs, grad_outputs=None, **kw):
            if grad_outputs is not None:
                grad_outputs = [-g for g in grad_outputs]
            return grad(outputs, inputs, grad_outputs=grad_outputs, **kw)

        torch.autograd.grad = flipped
        try:
            return original(self, t, cohort, gen)
        finally:
            torch.autograd.grad = grad

    pfedla.PFedLA.run_round = run_round


def signed_config(rounds: int, seed: int, hn_lr: float):
    """pflx's pFedLA config at the conformance settings with hypernetwork step ``hn_lr``."""
    from pfl_cli.registry import train_config

    base = conformance._pflx_config("fedavg", rounds, seed)
    keys = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)
            if f.name in ("rounds", "clients_per_round", "local_epochs", "batch_size", "lr", "momentum",
                          "client_clip", "model_arch", "mlp_hidden", "eval_every", "val_fraction", "normalize",
                          "seed", "device")}
    return train_config("pfedla", **keys, pfedla_hn_lr=hn_lr)


def _child(args) -> None:
    from pfl_cli.fl.api import train_federated

    x, y, part = conformance.load_export(args.work)
    if args.algorithm == "pfedla":
        lr, sign = args.variant.split(":")
        cfg = signed_config(args.rounds, args.seed, float(lr))
        if sign == "flbench":
            flbench_direction()
    else:
        cfg = conformance._pflx_config(args.algorithm, args.rounds, args.seed)
    run = train_federated(x, y, 10, part, cfg)
    print(json.dumps({"accuracy": run.outcome.best.summaries()["train"]["pooled_accuracy"]}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help="LR:SIGN,... (SIGN pflx or flbench)")
    ap.add_argument("--references", default="fedavg,local", help="conformance algorithms run beside (or empty)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--algorithm", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
        variants = [v for v in args.variants.split(",") if v]
        for v in variants:
            lr, sign = v.split(":")
            if not float(lr) > 0 or sign not in ("pflx", "flbench"):
                raise ValueError(v)
    except ValueError:
        print(f"pfedla_hn_lr.py: --variants must be LR:SIGN items (LR > 0, SIGN pflx or flbench) and --seeds "
              f"integers; got {args.variants!r}, {args.seeds!r}", file=sys.stderr)
        return 2
    refs = [a for a in args.references.split(",") if a]
    with tempfile.TemporaryDirectory(prefix="pflx-pfedla-") as tmp:
        work = pathlib.Path(tmp)
        conformance._export(work, conformance.DEFAULT_DATASET, 20, 0)
        jobs = [("pfedla", v, s) for v in variants for s in seeds] + [(a, "", s) for a in refs for s in seeds]

        def run(job):
            alg, variant, seed = job
            env = {**__import__("os").environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                   "PYTHONPATH": str(conformance.ROOT)}
            out = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--child", "--algorithm",
                                  alg, "--variant", variant, "--seed", str(seed), "--rounds", str(args.rounds),
                                  "--work", str(work)], capture_output=True, text=True, env=env)
            if out.returncode:
                raise RuntimeError(f"{job}: {out.stderr.strip().splitlines()[-3:]}")
            acc = 100 * json.loads(out.stdout.strip().splitlines()[-1])["accuracy"]
            print(f"  {alg} {variant} seed {seed}: {acc:.2f} %", file=sys.stderr, flush=True)
            return acc

        with ThreadPoolExecutor(args.jobs) as pool:
            acc = dict(zip(jobs, pool.map(run, jobs)))
    print(f"pFedLA on the conformance task, {args.rounds} rounds, every client every round, seeds {args.seeds}")
    print(f"{'run':<28} {'mean %':>7}  per seed")
    for v in variants:
        vals = [acc[("pfedla", v, s)] for s in seeds]
        lr, sign = v.split(":")
        print(f"{'pfedla hn_lr ' + lr + ' ' + sign + ' sign':<28} {statistics.mean(vals):>7.2f}  "
              + ", ".join(f"{a:.2f}" for a in vals))
    for a in refs:
        vals = [acc[(a, "", s)] for s in seeds]
        print(f"{a:<28} {statistics.mean(vals):>7.2f}  " + ", ".join(f"{v:.2f}" for v in vals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
