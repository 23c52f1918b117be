"""Benchmark: simulated secure aggregation and distributed-DP noise, per FedAvg round (issue 48, item 6).

On builtin:digits over 100 clients (the MLP 64-32-10, a cohort of 20, 10 local steps): a plain FedAvg round
and the same round under ``--secagg`` (each client's weighted row into a SecureSum, the server step on the
sums), alternated, best of several; target: the secure round costs at most 1.1x the plain one. Then the
distributed discrete Gaussian of a round under ``--secagg`` with noise from OS entropy (each client's
clip, scale, random rounding, discrete Gaussian share, modulo 2^20; the server's decoding): its time per
round beside the plain round's; target: at most 1.0x a plain round (the noise costs no more than the round's
local training, on the smallest net pflx trains; it grows with the parameters, training with the samples too).
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import torch
from verdict import Verdicts, best_of

from pfl_cli import registry
from pfl_cli.fl.secagg import secure_sum

COHORT, ROUNDS, REPEATS = 20, 3, 5


def store():
    from pfl_cli.data import load_dataset
    from pfl_cli.fl.store import build_store
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="dirichlet", alpha=0.5, num_clients=100, holdout_clients=0),
                            num_classes=10, rng=make_rng(0, "partition"))
    return build_store(ds.x / 16.0, ds.y, ds.num_classes, part, val_fraction=0.0, rng=None, device="cpu",
                       normalize=False)


def main() -> int:
    torch.set_num_threads(1)
    s = store()
    base = registry.train_config("fedavg", rounds=ROUNDS, clients_per_round=COHORT, local_steps=10, batch_size=16,
                                 lr=0.05, normalize=False, val_fraction=0.0)
    cohorts = [torch.as_tensor(np.random.default_rng(t).choice(100, COHORT, replace=False)) for t in range(ROUNDS)]

    def rounds(cfg):
        alg = cfg.algorithm_class(cfg, s)
        return lambda: [alg.run_round(t, c, torch.Generator().manual_seed(t)) for t, c in enumerate(cohorts)]

    plain_cfg, secure_cfg = base, dataclasses.replace(base, secagg=True)
    plain, secure = [], []
    for _ in range(REPEATS):  # alternated, so that both see the same machine load
        plain.append(best_of(rounds(plain_cfg), 1) / ROUNDS)
        secure.append(best_of(rounds(secure_cfg), 1) / ROUNDS)
    t_plain, t_secure = min(plain), min(secure)

    from pfl_cli.fl.api import plan_dp

    ddg_cfg = dataclasses.replace(secure_cfg, dp_epsilon=4.0, dp_clip=1.0, dp_mechanism="ddg", dp_noise="secure")
    mech = plan_dp(ddg_cfg, s)
    alg = ddg_cfg.algorithm_class(ddg_cfg, s)
    deltas = {k: 0.01 * torch.randn(COHORT, *v.shape) for k, v in alg.global_params.items()}

    def ddg_round():
        from pfl_cli.privacy.randomness import secure_torch_generator

        rows = mech.client_rows(deltas, secure_torch_generator())
        mech.release_sum(secure_sum(rows, modulus=mech.modulus))

    t_ddg = best_of(ddg_round, REPEATS)
    dim = sum(v.numel() for v in alg.global_params.values())
    print(f"secure aggregation on digits: FedAvg, MLP {dim} parameters, cohort {COHORT}, 10 local steps")
    v = Verdicts()
    v.note("plain round", f"{t_plain * 1e3:.1f} ms")
    v.note("--secagg round", f"{t_secure * 1e3:.1f} ms")
    v.check("--secagg / plain round", f"{t_secure / t_plain:.3f}x", "<= 1.1x", t_secure <= 1.1 * t_plain)
    v.note("ddg noise + encoding + decoding per round", f"{t_ddg * 1e3:.1f} ms")
    v.note("  client noise share std (integer units)", f"{mech.client_sigma:.4g}")
    v.note("  per coordinate of the cohort", f"{t_ddg / (dim * COHORT) * 1e6:.2f} us")
    v.check("ddg per round / plain round", f"{t_ddg / t_plain:.3f}x", "<= 1.0x", t_ddg <= 1.0 * t_plain)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
