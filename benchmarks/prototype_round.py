"""Measurement: seconds per round of FedProto and FedNH beside FedAvg's (same cohort, model, epochs and batches).

Issue 40's speed target: a new algorithm's round within 1.2x FedAvg's round times the work its method adds.
Both train like FedAvg (``--epochs`` local epochs of batches of 32, the same MLP and cohort) and add one
prototype pass: a forward pass over every fit sample of each cohort client, summed by class
(:func:`pfl_cli.fl.prototypes.class_feature_sums`), which this script times on its own on the same cohorts. The
target is 1.2 x (FedAvg's round + that pass), printed beside each ratio; the alignment term (FedProto) and the
cosine classifier (FedNH) are the method's local steps and must fit inside the 1.2. Rounds are interleaved (a busy
machine slows every algorithm alike); the median round is printed.

    python benchmarks/prototype_round.py [--cohort 16] [--epochs 1] [--hidden 256] [--rounds 20]
"""

from __future__ import annotations

import round_timing  # benchmarks/ is the script's own folder, first on sys.path


class PrototypePass:
    """The pass alone, as a run_round: each cohort client's class sums of f(x) with FedProto's per-client models."""

    def __init__(self, alg) -> None:
        self.alg = alg

    def run_round(self, t, cohort, gen):
        return self.alg._class_sums(self.alg.private.gather(cohort), cohort)


def main(argv=None) -> int:
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.registry import train_config

    ap = round_timing.parser(__doc__)
    ap.add_argument("--epochs", type=int, default=1)
    args = ap.parse_args(argv)
    store = round_timing.digits_store()
    common = dict(local_epochs=args.epochs, lr=0.05, momentum=0.9, batch_size=32, mlp_hidden=(args.hidden,),
                  clients_per_round=args.cohort, client_clip=50.0, lambda_theta=0.0)
    algs = {k: make_algorithm(train_config(k, **common), store) for k in ("fedavg", "fedproto", "fednh")}
    algs["prototype pass"] = PrototypePass(make_algorithm(train_config("fedproto", **common), store))
    medians = round_timing.median_round_seconds(algs, store, args)
    print(f"local work: {args.epochs} epoch(s) of batches of 32 a client for all three (--local-steps does not apply)")
    base, extra = medians["fedavg"], medians["prototype pass"]
    target = 1.2 * (base + extra)
    print(f"fedavg    {1e3 * base:8.2f} ms/round; a prototype pass {1e3 * extra:6.2f} ms "
          f"({extra / base:4.2f}x fedavg's round); target 1.2 x (fedavg + pass) = {1e3 * target:.2f} ms")
    missed = False
    for k in ("fedproto", "fednh"):
        med = medians[k]
        ratio = med / (base + extra)
        print(f"{k:9s} {1e3 * med:8.2f} ms/round  {med / base:5.2f}x fedavg  {ratio:5.2f}x (fedavg + pass), "
              f"target 1.2  {'ok' if ratio <= 1.2 else 'OVER'}")
        missed |= ratio > 1.2
    return 1 if missed else 0  # a missed target is a failed benchmark


if __name__ == "__main__":
    raise SystemExit(main())
