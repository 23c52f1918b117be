"""Benchmark: the cost of one asynchronous server step against a synchronous round of as many clients, on the CPU
(issue 47, item 2).

FedBuff's jobs of a server step all start from the step's model, so they train in one batched cohort call, as a
FedAvg round does; what the asynchronous simulation adds is the event loop over arrivals (the earliest in-flight
job, a replacement drawn from the idle clients, its duration), a copy of the model per dispatch and the staleness
-weighted buffer. Two ratios, each a median of interleaved steps measured in this run (the first dropped: FedBuff's
first step also trains its concurrency's initial jobs):

- fedbuff step / fedavg round: a whole FedBuff server step of K = ``--cohort`` buffered updates (``--cohort`` x 3
  in flight, at most the train clients, heavy-tailed speeds lognormal:1:1.5, 20 % dropouts) against a FedAvg
  round of ``--cohort`` clients (target <= 1.3x);
- fedasync round / fedavg round: a FedAsync round of ``--cohort`` arrivals (each mixed at once; jobs trained in
  batches of those waiting when an update is needed) against the same FedAvg round (context, no target: its jobs
  start from different models, in more and smaller calls).

    python benchmarks/async_bench.py [--cohort 16] [--local-steps 10] [--hidden 256] [--rounds 20]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import round_timing  # noqa: E402
from verdict import Verdicts  # noqa: E402

TARGET = 1.3


def main(argv=None) -> int:
    import torch

    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.fl.conditions.rounds import Conditions
    from pfl_cli.fl.store import ROLE_TRAIN
    from pfl_cli.registry import train_config

    ap = round_timing.parser(__doc__)
    args = ap.parse_args(argv)
    store = round_timing.digits_store()
    common = dict(local_steps=args.local_steps, lr=0.05, momentum=0.9, batch_size=32, mlp_hidden=(args.hidden,),
                  clients_per_round=args.cohort, rounds=args.rounds)
    latency = dict(compute_speed="lognormal:1:1.5", dropout=0.2, concurrency=3 * args.cohort)
    runs = {"fedavg": make_algorithm(train_config("fedavg", **common), store),
            "fedbuff": make_algorithm(train_config("fedbuff", **common, **latency), store),
            "fedasync": make_algorithm(train_config("fedasync", **common, **latency), store)}
    cond = {k: Conditions(runs[k], runs[k].cfg) for k in ("fedbuff", "fedasync")}
    train = torch.as_tensor(store.clients(ROLE_TRAIN))
    times: dict[str, list[float]] = {k: [] for k in runs}
    for t in range(args.rounds):
        for k, alg in runs.items():
            gen = torch.Generator().manual_seed(t)
            start = time.perf_counter()
            if k in cond:
                cond[k].run_round(alg, t, train, gen, args.rounds)
            else:
                cohort = alg.sample_cohort(train, alg.cohort_size(t, args.rounds, len(train)), gen)
                alg.run_round(t, cohort, gen)
                alg.traffic.close_round(len(cohort))
            times[k].append(time.perf_counter() - start)
    med = {k: statistics.median(ts[1:]) for k, ts in times.items()}
    print(f"K = cohort {args.cohort}, concurrency {min(3 * args.cohort, len(train))}, {args.local_steps} local "
          "steps, MLP "
          f"64-{args.hidden}-10, {torch.get_num_threads()} thread(s), CPU; median of {args.rounds - 1} interleaved "
          "steps (first dropped)")
    v = Verdicts()
    for k, s in med.items():
        v.note(k, f"{1e3 * s:.2f} ms/step")
    v.note("fedasync round / fedavg round", f"{med['fedasync'] / med['fedavg']:.2f}x")
    ratio = med["fedbuff"] / med["fedavg"]
    v.check("fedbuff server step / fedavg round", f"{ratio:.2f}x", f"<= {TARGET:.2f}x", ratio <= TARGET)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
