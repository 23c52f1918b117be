"""Benchmark: a FedAvg round under federation conditions (30 % dropouts, top-k at 1 % with error feedback) against a
plain round, and FedProx with stragglers' partial work against plain FedProx, on the CPU (issue 47, item 6).

Conditions keep the cohort's one batched call: the round's plan (who is online, who leaves, each client's step
budget) is a few numpy draws, dropouts shrink the cohort the call trains, a straggler's partial work is a mask over
its steps (:func:`pfl_cli.fl.conditions.rounds.cap_steps`), and top-k compresses the cohort's deltas in one
``topk`` over a (c, d) matrix. Three ratios, each a median of interleaved rounds measured in this run:

- conditions / plain: FedAvg's whole round (sampling, planning, local SGD, compression, aggregation) with 30 %
  dropouts and top-k, against the plain round of the same selected cohort size (target <= 1.2x);
- conditions / plain on the answering clients: the same conditioned round against a plain round of exactly the
  clients that answered it (the overhead of planning and compressing alone; target <= 1.2x);
- partial work / plain: FedProx with a deadline that makes about half the cohort stragglers (their late steps
  masked) against plain FedProx on the same cohort (target <= 1.2x).

    python benchmarks/conditions_bench.py [--cohort 16] [--local-steps 10] [--hidden 256] [--rounds 20]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # round_timing, verdict: also when run by runpy
import round_timing  # noqa: E402
from verdict import Verdicts  # noqa: E402


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
    conditions = dict(dropout=0.3, compression="topk", compression_density=0.01)
    # a deadline that half of uniform:1:3 step-a-second clients miss on local_steps steps
    partial = dict(compute_speed="uniform:1:3", round_deadline=args.local_steps / 2.0)
    runs = {
        "fedavg": make_algorithm(train_config("fedavg", **common), store),
        "fedavg+conditions": make_algorithm(train_config("fedavg", **common, **conditions), store),
        "fedavg on the answering": make_algorithm(train_config("fedavg", **common), store),
        "fedprox": make_algorithm(train_config("fedprox", **common), store),
        "fedprox+partial work": make_algorithm(train_config("fedprox", **common, **partial), store),
    }
    cond = {k: Conditions(runs[k], runs[k].cfg) for k in ("fedavg+conditions", "fedprox+partial work")}
    train = torch.as_tensor(store.clients(ROLE_TRAIN))
    times: dict[str, list[float]] = {k: [] for k in runs}
    answered, partial_clients = [], []
    for t in range(args.rounds):
        for k, alg in runs.items():
            gen = torch.Generator().manual_seed(t)
            if k in cond:
                start = time.perf_counter()
                cohort, _, _ = cond[k].run_round(alg, t, train, gen, args.rounds)
                times[k].append(time.perf_counter() - start)
                if k == "fedavg+conditions":
                    answered.append(len(cohort))
                continue
            if k == "fedavg on the answering":  # exactly the clients the conditioned round aggregated
                plan = cond["fedavg+conditions"].plan_round(runs["fedavg+conditions"], t, train,
                                                            torch.Generator().manual_seed(t), args.rounds)
                cohort = plan.cohort[torch.as_tensor(plan.kept)]
            else:
                cohort = alg.sample_cohort(train, alg.cohort_size(t, args.rounds, len(train)), gen)
            start = time.perf_counter()
            alg.run_round(t, cohort, gen)
            alg.traffic.close_round(len(cohort))
            times[k].append(time.perf_counter() - start)
    plan_stats = cond["fedprox+partial work"].totals
    med = {k: statistics.median(ts[1:]) for k, ts in times.items()}
    print(f"cohort {args.cohort}, {args.local_steps} local steps, MLP 64-{args.hidden}-10, {torch.get_num_threads()} "
          f"thread(s), CPU; median of {args.rounds - 1} interleaved rounds (first dropped)")
    v = Verdicts()
    for k, ms in med.items():
        v.note(k, f"{1e3 * ms:.2f} ms/round")
    v.note("clients answering under 30 % dropouts", f"{statistics.mean(answered):.1f} of {args.cohort}")
    v.note("fedprox stragglers keeping partial work", f"{plan_stats['partial']} of {plan_stats['selected']}")
    for label, a, b in (("conditions / plain (same selection)", "fedavg+conditions", "fedavg"),
                        ("conditions / plain (the answering clients)", "fedavg+conditions", "fedavg on the answering"),
                        ("partial work / plain (fedprox)", "fedprox+partial work", "fedprox")):
        ratio = med[a] / med[b]
        v.check(label, f"{ratio:.2f}x", "<= 1.20x", ratio <= 1.2)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
