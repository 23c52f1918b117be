"""Measurement: seconds per round of MOON and FedSAM beside FedAvg's (same cohort, model, steps and lr).

Issue 40's speed target: a new algorithm's round within 1.2x FedAvg's round times the work its method adds.
FedSAM takes a second gradient every local step (the gradient at w + rho g / ||g||, Qu et al. 2022 Alg. 1):
target 1.2 x 2 x FedAvg's round. MOON's step runs three forward passes (the trained model, the global model
and the client's previous model, Li et al. 2021 Alg. 1) and one backward: target 1.2 x 3 x FedAvg's round.
Each runs ``--rounds`` rounds of ``--cohort`` clients on the digits clients with a ``--hidden`` MLP, rounds
interleaved (benchmarks/round_timing.py); the median round is printed beside its target. Exits 1 on a miss.
Also printed: the memory of MOON's per-client state (each client's previous local model, one
:class:`~pfl_cli.fl.client_state.ClientState` row a client) at ``--clients`` clients, measured from the real tensors.

    python benchmarks/local_terms_round.py [--cohort 16] [--local-steps 10] [--hidden 256] [--rounds 20]
                                           [--clients 10000]
"""

from __future__ import annotations

import drift_round  # benchmarks/ is the script's own folder, first on sys.path
import round_timing

WORK = {"fedavg": 1.0, "fedsam": 2.0, "moon": 3.0}  # FedAvg's round times the work each method adds


def main(argv=None) -> int:
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.registry import train_config

    ap = round_timing.parser(__doc__)
    ap.add_argument("--clients", type=int, default=10000)
    args = ap.parse_args(argv)
    store = round_timing.digits_store()
    common = dict(local_steps=args.local_steps, local_epochs=None, lr=0.05, batch_size=32,
                  mlp_hidden=(args.hidden,), clients_per_round=args.cohort)
    algs = {k: make_algorithm(train_config(k, **common), store) for k in WORK}
    medians = round_timing.median_round_seconds(algs, store, args)
    base = medians["fedavg"]
    missed = False
    for k, med in medians.items():
        target = 1.2 * WORK[k]
        ratio = med / base
        print(f"{k:7s} {1e3 * med:8.2f} ms/round  {ratio:5.2f}x fedavg  target <= {target:.1f}x "
              f"(1.2 x {WORK[k]:.0f})  {'ok' if ratio <= target else 'OVER'}")
        missed |= ratio > target
    for label, hidden in (("digits MLP 64-32-10 (the default mlp_hidden)", (32,)), (f"MLP 64-{args.hidden}-10",
                                                                                     (args.hidden,))):
        params, nbytes = drift_round.drift_bytes((64,), hidden, args.clients)
        print(f"MOON's previous models, {label}: {params:,} floats a client x {args.clients:,} clients = "
              f"{nbytes / 2 ** 20:,.1f} MiB (one ClientState)")
    return 1 if missed else 0  # a missed target is a failed benchmark


if __name__ == "__main__":
    raise SystemExit(main())
