"""Measurement: seconds per round of FedOpt (adam / yogi / adagrad) and FedExP beside FedAvg's, same cohort and model.

Issue 40's speed target: a new algorithm's round within 1.2x FedAvg's round times the work its method
adds. FedOpt and FedExP add only O(|theta|) server arithmetic to FedAvg's round (the moments; the
clients' delta norms), so the target is 1.2x FedAvg. Each algorithm runs ``--rounds`` rounds of
``--cohort`` clients (``--local-steps`` SGD steps, batch 32) on the digits clients with a ``--hidden``
MLP; the median round of the interleaved repetitions is printed with its ratio to FedAvg's.

    python benchmarks/server_optim_round.py [--cohort 16] [--local-steps 10] [--hidden 256] [--rounds 20]
"""

from __future__ import annotations

import round_timing  # benchmarks/ is the script's own folder, first on sys.path


def main(argv=None) -> int:
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.registry import train_config

    ap = round_timing.parser(__doc__)
    args = ap.parse_args(argv)
    store = round_timing.digits_store()
    common = dict(local_steps=args.local_steps, local_epochs=None, lr=0.05, momentum=0.0, batch_size=32,
                  mlp_hidden=(args.hidden,), clients_per_round=args.cohort)
    runs = {"fedavg": ("fedavg", {}), "fedadam": ("fedopt", {"server_optimizer": "adam"}),
            "fedyogi": ("fedopt", {"server_optimizer": "yogi"}), "fedadagrad": ("fedopt", {"server_optimizer": "adagrad"}),
            "fedexp": ("fedexp", {})}
    algs = {k: make_algorithm(train_config(name, **common, **extra), store) for k, (name, extra) in runs.items()}
    medians = round_timing.median_round_seconds(algs, store, args)
    base = medians["fedavg"]
    missed = False
    for k, med in medians.items():
        ratio = med / base
        print(f"{k:11s} {1e3 * med:8.2f} ms/round  {ratio:5.2f}x fedavg  {'ok' if ratio <= 1.2 else 'OVER'}")
        missed |= ratio > 1.2
    return 1 if missed else 0  # a missed target is a failed benchmark


if __name__ == "__main__":
    raise SystemExit(main())
