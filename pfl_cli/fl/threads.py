"""How many torch threads a CPU run uses: chosen from the model and the cores, unless the user chose.

pflx's models are small (the digits MLP has about 10,000 parameters, LeNet about 60,000): one
local step is a few matrix products of a few hundred rows, too little work to split between
threads. torch's default of one thread a core then makes each op wait on the others' spin-waits,
and on a 2-core machine a ``train`` took 16.2 s with the default and 5.4 s with one thread (78 s
when the machine was busy): users had to know to ``export OMP_NUM_THREADS=1``. ``auto`` takes one
thread below :data:`THREADED_MIN_PARAMETERS` parameters and every core (at most
:data:`MAX_THREADS`) above, where a step's products are large enough to split
(``benchmarks/threads_bench.py`` measures both on this machine's workloads and checks the choice).

The user's choice wins: ``PFLX_THREADS=N`` (a positive integer) sets N; an exported
``OMP_NUM_THREADS`` (read by torch at start-up) is left as it is. A run on a GPU is left alone.
"""

from __future__ import annotations

import os

from pfl_cli.errors import InputError

# Below this many parameters one thread was fastest for every model measured (benchmarks/threads_bench.py, 2 cores:
# the digits MLP, LeNet and a 4.2M-parameter MLP ran 1.9x, 4.1x and 2.5x slower with two threads beside one other job).
THREADED_MIN_PARAMETERS = 10_000_000
MAX_THREADS = 8


def choose_threads(n_parameters: int, cores: int) -> int:
    """``auto``'s choice for a model of ``n_parameters`` parameters on ``cores`` cores."""
    if n_parameters < THREADED_MIN_PARAMETERS:
        return 1
    return max(1, min(cores, MAX_THREADS))


def requested_threads() -> int | None:
    """``PFLX_THREADS`` as a positive integer, None when unset or ``auto``; refused in one line otherwise."""
    text = os.environ.get("PFLX_THREADS", "").strip().lower()
    if text in ("", "auto"):
        return None
    if not text.isdigit() or int(text) < 1:
        raise InputError(f"PFLX_THREADS must be a positive integer or auto; got {text!r} "
                         "(unset it to let pflx choose from the model's size).")
    return int(text)


def configure_threads(modules, device) -> int:
    """Set torch's CPU threads for a run of ``modules`` (torch modules) on ``device``; the number in use."""
    import torch

    if torch.device(device).type != "cpu":
        return torch.get_num_threads()
    wanted = requested_threads()
    if wanted is None:
        if os.environ.get("OMP_NUM_THREADS", "").strip():
            return torch.get_num_threads()  # the user's own choice, already applied by torch
        n = sum(p.numel() for m in modules for p in m.parameters())
        wanted = choose_threads(n, os.cpu_count() or 1)
    if torch.get_num_threads() != wanted:
        torch.set_num_threads(wanted)
    return wanted
