"""`pflx tune --jobs N`: N processes run trials of one study, its storage coordinating them (a trial is asked
by one process only; a trial of a process that died is reaped and run again: :func:`pfl_cli.tune.loop.optimize`).

Each worker is a fresh interpreter (``spawn``: no forked torch thread pools) with one torch thread. It loads
the partition and carves the same validation data again from the plan, and draws with its own sampler seed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from pfl_cli.errors import RunError
from pfl_cli.tune.plan import Plan, TuneOptions, plan_data


def run_workers(plan: Plan, o: TuneOptions, *, url: str, name: str, identity: str, partition: Path,
                poll: Callable[[], None]) -> None:
    """``o.jobs`` processes run trials of the study ``name`` in ``url``; ``poll()`` every half second while they
    run (the caller's progress), and once after."""
    import multiprocessing
    import signal

    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
    procs = [ctx.Process(target=_worker, args=(plan, o, url, name, identity, str(partition), rank), daemon=True)
             for rank in range(o.jobs)]
    # a worker ignores Ctrl-C until its own handler is in place (the first line of _worker): a fresh interpreter
    # still importing (spawn's bootstrap) would print a traceback; the parent, which has the one line to say,
    # ends a worker that did not stop by itself
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for p in procs:
            p.start()
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        while any(p.is_alive() for p in procs):
            time.sleep(0.5)
            poll()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    poll()
    failed = [p.exitcode for p in procs if p.exitcode not in (0, None)]
    if failed:
        raise RunError(f"--jobs: {len(failed)} of {o.jobs} worker processes failed (exit codes {failed}); the study "
                       "so far is kept: run the same command again to continue it (PFLX_DEBUG=1 shows the "
                       "workers' tracebacks).")


def _worker(plan: Plan, o: TuneOptions, url: str, name: str, identity: str, partition: str, rank: int) -> None:
    import signal
    import sys

    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # started with Ctrl-C ignored (run_workers)
        import torch

        from pfl_cli.data.location import load_partition_dataset
        from pfl_cli.tune.loop import Proposals, optimize
        from pfl_cli.tune.study import make_pruner, make_sampler, open_storage, open_study
        from pfl_cli.tune.trial import Objective

        torch.set_num_threads(1)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # (its own level is reset when optuna configures it)
        part, _info, _art, ds = load_partition_dataset(Path(partition))
        data = plan_data(plan, o, ds, part)
        seed = plan.cfg.seed * 1000 + rank + 1  # each worker its own draws
        study = open_study(open_storage(url), name, sampler=make_sampler(plan.sampler, plan.params, seed=seed),
                           pruner=make_pruner(plan.pruner, rounds=plan.cfg.rounds), meta={})
        objective = Objective(data, plan.trial_cfg, plan.params, group=plan.objective["group"],
                              metric=plan.objective["metric"], identity=identity)
        optimize(study, objective, o.trials, proposals=Proposals(plan.sampler, plan.params, seed))
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the group: the parent says the one line
        raise SystemExit(130) from None
    except Exception as err:  # noqa: BLE001 - one line per worker, the parent says what to do
        if os.environ.get("PFLX_DEBUG", "") not in ("", "0"):
            raise
        sys.stderr.write(f"pflx: tune worker {rank}: {type(err).__name__}: {err}\n")
        raise SystemExit(1)
