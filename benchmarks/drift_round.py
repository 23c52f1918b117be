"""Measurement: seconds per round of SCAFFOLD and FedDyn beside FedAvg's (same cohort, model and steps), and the
memory of their per-client drift state at 10,000 clients.

Issue 40's speed target: a new algorithm's round within 1.2x FedAvg's round times the work its method adds.
SCAFFOLD's correction adds one |theta|-sized addition per local step and O(c |theta|) for the control
variates (target ~1x, so 1.2x FedAvg); FedDyn's local objective is FedProx's plus the same linear term, so
its target is 1.2x FedProx's round, printed beside it. All run plain SGD at one lr (SCAFFOLD's steps are
plain SGD). Each runs ``--rounds`` rounds of ``--cohort``
clients on the digits clients with a ``--hidden`` MLP, interleaved; the median round is printed with its
ratio to FedAvg's. The memory is the bytes of the real :class:`~pfl_cli.fl.client_state.ClientState` tensors
(one model-shaped row per client, plus its ``has`` flags) for the default digits MLP (64-32-10) and the
benchmark's, at ``--clients`` clients: 4 bytes per float, so an MLP 3072-100-10 (307,310 floats) would hold
11.4 GiB at 10,000 clients (not allocated here: more than the dev machine's memory).

    python benchmarks/drift_round.py [--cohort 16] [--local-steps 10] [--hidden 256] [--rounds 20] [--clients 10000]
"""

from __future__ import annotations

import round_timing  # benchmarks/ is the script's own folder, first on sys.path


def drift_bytes(input_shape, hidden, clients: int) -> tuple[int, int]:
    """(parameters of the client net, bytes of a ClientState of zeros like it over ``clients`` rows)."""
    import torch

    from pfl_cli.fl.client_state import ClientState
    from pfl_cli.models import build, client_spec

    net = build(client_spec("mlp", input_shape, 10, hidden))
    zeros = {k: torch.zeros_like(v) for k, v in net.named_parameters()}
    state = ClientState(zeros, clients, b"\0" * 32)
    params = sum(v.numel() for v in zeros.values())
    return params, sum(v.numel() * v.element_size() for v in state.values.values()) + state.has.numel()


def main(argv=None) -> int:
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.registry import train_config

    ap = round_timing.parser(__doc__)
    ap.add_argument("--clients", type=int, default=10000)
    args = ap.parse_args(argv)
    store = round_timing.digits_store()
    common = dict(local_steps=args.local_steps, local_epochs=None, lr=0.05, batch_size=32,
                  mlp_hidden=(args.hidden,), clients_per_round=args.cohort)
    runs = {"fedavg": dict(momentum=0.0), "fedprox": dict(momentum=0.0), "scaffold": {}, "feddyn": dict(momentum=0.0)}
    algs = {k: make_algorithm(train_config(k, **common, **extra), store) for k, extra in runs.items()}
    medians = round_timing.median_round_seconds(algs, store, args)
    base = medians["fedavg"]
    prox = medians["fedprox"]
    missed = False
    for k, med in medians.items():
        ratio, against = (med / prox, "fedprox") if k == "feddyn" else (med / base, "fedavg")
        print(f"{k:9s} {1e3 * med:8.2f} ms/round  {med / base:5.2f}x fedavg  {ratio:5.2f}x {against} (its target)  "
              f"{'ok' if ratio <= 1.2 else 'OVER'}")
        missed |= ratio > 1.2
    for label, shape, hidden in (("digits MLP 64-32-10 (the default mlp_hidden)", (64,), (32,)),
                                 (f"MLP 64-{args.hidden}-10", (64,), (args.hidden,))):
        params, nbytes = drift_bytes(shape, hidden, args.clients)
        print(f"drift state, {label}: {params:,} floats a client x {args.clients:,} clients = "
              f"{nbytes / 2 ** 20:,.1f} MiB (one ClientState; SCAFFOLD and FedDyn each keep one)")
    return 1 if missed else 0  # a missed target is a failed benchmark


if __name__ == "__main__":
    raise SystemExit(main())
