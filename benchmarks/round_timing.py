"""Shared by the per-round speed benchmarks of new algorithms (``drift_round.py``, ``server_optim_round.py``):
the same digits clients, cohort, MLP and interleaved rounds, so every ratio is measured like for like in one run."""

from __future__ import annotations

import argparse
import statistics
import time


def parser(doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--cohort", type=int, default=16)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20)
    return ap


def digits_store():
    """Digits over 40 train clients (Dirichlet 0.3), every sample fit (no validation carve)."""
    from pfl_cli.data import load_dataset
    from pfl_cli.fl.store import build_store
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="dirichlet", alpha=0.3, num_clients=40, holdout_clients=0,
                                                  seed=0), num_classes=ds.num_classes, rng=make_rng(0, "partition"),
                            pool=ds.pool)
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(0, "validation-split"),
                       device="cpu")


def median_round_seconds(algs: dict, store, args) -> dict[str, float]:
    """Each algorithm's median round over ``args.rounds`` (the first dropped: warm-up), rounds interleaved so that a
    busy machine slows every algorithm alike; every algorithm gets the same cohort and generator each round."""
    import torch

    from pfl_cli.fl.store import ROLE_TRAIN

    clients = store.clients(ROLE_TRAIN)
    times: dict[str, list[float]] = {k: [] for k in algs}
    for t in range(args.rounds):
        cohort = torch.as_tensor(clients[torch.randperm(len(clients), generator=torch.Generator().manual_seed(t))
                                         [:args.cohort].numpy()])
        for k, alg in algs.items():
            start = time.perf_counter()
            alg.run_round(t, cohort, torch.Generator().manual_seed(t))
            times[k].append(time.perf_counter() - start)
    print(f"cohort {args.cohort}, {args.local_steps} local steps, MLP 64-{args.hidden}-10, "
          f"{torch.get_num_threads()} thread(s); median of {args.rounds - 1} rounds (first dropped); target 1.2x")
    return {k: statistics.median(ts[1:]) for k, ts in times.items()}
