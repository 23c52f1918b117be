"""Measurement: seconds per round of FedNova beside FedAvg's (same cohort, model, local epochs and momentum).

Issue 40's speed target: a new algorithm's round within 1.2x FedAvg's round times the work its method adds.
FedNova's clients run FedAvg's local epochs unchanged; the server divides each client's move by a scalar
``||a_i||_1`` and scales the sum by tau_eff (O(c |theta|), as FedAvg's weighted mean), so its target is 1.2x
FedAvg's round. Both run ``--local-epochs`` epochs (step counts differ by client: the setting FedNova is for)
with momentum 0.9, ``--rounds`` interleaved rounds of ``--cohort`` digits clients with a ``--hidden`` MLP;
the median round is printed with its ratio to FedAvg's. Exit 1 on a missed target.

    python benchmarks/nova_round.py [--cohort 16] [--local-epochs 2] [--hidden 256] [--rounds 20]
"""

from __future__ import annotations

import round_timing  # benchmarks/ is the script's own folder, first on sys.path


def main(argv=None) -> int:
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.registry import train_config

    ap = round_timing.parser(__doc__)
    ap.add_argument("--local-epochs", type=int, default=2)
    args = ap.parse_args(argv)
    store = round_timing.digits_store()
    common = dict(local_epochs=args.local_epochs, lr=0.02, momentum=0.9, batch_size=32, mlp_hidden=(args.hidden,),
                  clients_per_round=args.cohort)
    algs = {k: make_algorithm(train_config(k, **common), store) for k in ("fedavg", "fednova")}
    medians = round_timing.median_round_seconds(algs, store, args)
    base = medians["fedavg"]
    missed = False
    for k, med in medians.items():
        ratio = med / base
        print(f"{k:9s} {1e3 * med:8.2f} ms/round  {ratio:5.2f}x fedavg (target 1.20x)  {'ok' if ratio <= 1.2 else 'OVER'}")
        missed |= ratio > 1.2
    print(f"(local epochs {args.local_epochs}: the local-steps line above does not apply; each client takes "
          f"{args.local_epochs} x ceil(n_i / 32) steps)")
    return 1 if missed else 0  # a missed target is a failed benchmark


if __name__ == "__main__":
    raise SystemExit(main())
