"""Measurement: seconds per round of FedLC and FedAMP beside FedAvg's and FedProx's (same cohort, model and steps),
and FedAMP's attention alone at a cohort of 100.

Issue 40's speed target: a new algorithm's round within 1.2x FedAvg's round times the work its method adds.
FedLC's calibrated loss adds one (c, C) subtraction per forward pass to FedAvg's round: target 1.2x FedAvg.
FedAMP's local objective is FedProx's (the proximal term, around a per-client anchor), plus the attention over
the cohort (O(c^2 |theta|)) and the gather and scatter of the personalized models (O(c |theta|)): target 1.2x
FedProx's round, printed beside it. All run plain SGD at one lr. Each runs ``--rounds`` rounds of
``--cohort`` clients on the digits clients with a ``--hidden`` MLP, interleaved (benchmarks/round_timing.py);
the median round is printed with its ratio. Then FedAMP's cloud models over ``--attention-cohort`` random
models of the benchmark's MLP: the vectorized form (the Gram matmul and xi @ W; :mod:`pfl_cli.fl.attention`)
beside a double loop over client pairs, median of ``--repeats``.

    python benchmarks/label_skew_round.py [--cohort 16] [--local-steps 10] [--hidden 256] [--rounds 20]
                                          [--attention-cohort 100] [--repeats 5]
"""

from __future__ import annotations

import statistics
import time

import round_timing  # benchmarks/ is the script's own folder, first on sys.path


def pairwise_loop(flat, alpha_k: float, sigma: float):
    """The cloud models by a double loop over client pairs (what the vectorized form replaces)."""
    import math

    import torch

    c = flat.shape[0]
    u = torch.empty_like(flat)
    for i in range(c):
        acc, self_weight = torch.zeros_like(flat[i]), 1.0
        for j in range(c):
            if j != i:
                xi = alpha_k * math.exp(-float((flat[i] - flat[j]).pow(2).sum()) / sigma) / sigma
                acc += xi * flat[j]
                self_weight -= xi
        u[i] = acc + self_weight * flat[i]
    return u


def time_attention(cohort: int, hidden: int, repeats: int) -> tuple[int, float, float]:
    """(floats a model, median seconds vectorized, median seconds of the double loop) at ``cohort`` models."""
    import torch

    from pfl_cli.fl.attention import cloud_models, flatten
    from pfl_cli.models import build, client_spec

    net = build(client_spec("mlp", (64,), 10, (hidden,)))
    g = torch.Generator().manual_seed(0)
    models = {k: v.detach().unsqueeze(0) + 0.05 * torch.randn(cohort, *v.shape, generator=g)
              for k, v in net.named_parameters()}
    cloud_models(models, 1.0, 1.0)  # warm-up: the first call loads its kernels
    fast, slow = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        u, _ = cloud_models(models, 1.0, 1.0)
        fast.append(time.perf_counter() - start)
        start = time.perf_counter()
        ref = pairwise_loop(flatten(models), 1.0, 1.0)
        slow.append(time.perf_counter() - start)
    torch.testing.assert_close(flatten(u), ref, atol=1e-4, rtol=1e-4)  # the same cloud models
    return int(flatten(models).shape[1]), statistics.median(fast), statistics.median(slow)


def main(argv=None) -> int:
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.registry import train_config

    ap = round_timing.parser(__doc__)
    ap.add_argument("--attention-cohort", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    store = round_timing.digits_store()
    common = dict(local_steps=args.local_steps, local_epochs=None, lr=0.05, batch_size=32, momentum=0.0,
                  mlp_hidden=(args.hidden,), clients_per_round=args.cohort)
    runs = {"fedavg": {}, "fedprox": {}, "fedlc": {}, "fedamp": {}}
    algs = {k: make_algorithm(train_config(k, **common, **extra), store) for k, extra in runs.items()}
    medians = round_timing.median_round_seconds(algs, store, args)
    base, prox = medians["fedavg"], medians["fedprox"]
    missed = False
    for k, med in medians.items():
        if k in ("fedavg", "fedprox"):
            print(f"{k:8s} {1e3 * med:8.2f} ms/round  {med / base:5.2f}x fedavg  (reference)")
            continue
        ratio, against = (med / prox, "fedprox") if k == "fedamp" else (med / base, "fedavg")
        print(f"{k:8s} {1e3 * med:8.2f} ms/round  {med / base:5.2f}x fedavg  {ratio:5.2f}x {against} (its target)  "
              f"{'ok' if ratio <= 1.2 else 'OVER'}")
        missed |= ratio > 1.2
    d, fast, slow = time_attention(args.attention_cohort, args.hidden, args.repeats)
    print(f"fedamp attention, cohort {args.attention_cohort}, MLP 64-{args.hidden}-10 ({d:,} floats a model): "
          f"{1e3 * fast:.2f} ms vectorized (two matmuls), {1e3 * slow:.1f} ms double loop ({slow / fast:.0f}x)")
    return 1 if missed else 0  # a missed target is a failed benchmark


if __name__ == "__main__":
    raise SystemExit(main())
