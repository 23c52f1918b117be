"""Scale-out on ``torch.distributed``: cohort clients and evaluation clients split across ranks.

Every rank runs the same round loop on the same data with the same generators, so the
cohort, the batches and the server state agree everywhere. The per-client work is split:
:func:`pfl_cli.fl.cohort.local_sgd` trains only this rank's contiguous share of the cohort
and :func:`pfl_cli.fl.evaluate.evaluate` evaluates only its share of the clients; the
per-client results are then put back together on every rank by one ``all_reduce`` (sum) of
tensors in which each rank filled its own rows and left the others zero, which is exact.
The server step then runs on identical inputs on every rank (replicated, not reduced by
averaging), so all ranks hold the same model; rank 0 alone writes files.

Started by ``torchrun`` (or ``pflx train --nproc N``), which sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``: gloo on CPU, NCCL on CUDA (one GPU per
local rank).
"""

from __future__ import annotations

import os

from pfl_cli.errors import InputError


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside a distributed run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def launched_size() -> int:
    """The world size a launcher (torchrun, ``--nproc``) asked for through the environment."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def start(device):
    """Join the process group a launcher described in the environment; return this rank's device.

    Outside a launcher (no ``WORLD_SIZE`` > 1) nothing happens and ``device`` comes back.
    """
    import torch
    import torch.distributed as dist

    if launched_size() <= 1 or dist.is_initialized():
        return device
    if device.type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise InputError(f"--nproc / torchrun: local rank {local} needs a GPU of its own; this machine has "
                             f"{torch.cuda.device_count()} (use at most that many processes per node).")
        device = torch.device(f"cuda:{local}")
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def check_world_size(cfg, size: int, device) -> None:
    """Refuse an algorithm that cannot be split, more ranks than clients per round (ranks would idle), or
    more ranks than GPUs on a CUDA run."""
    import torch

    from pfl_cli.algorithms import REGISTRY
    from pfl_cli.fl.config import planned_cohort

    why = REGISTRY[cfg.algorithm].not_distributed
    if size > 1 and why:
        raise InputError(f"--nproc / torchrun: --algorithm {cfg.algorithm} runs in one process only: {why}; "
                         "drop --nproc (or run without torchrun).")

    cohort = planned_cohort(cfg)  # None: every train client, which only the data tell
    if REGISTRY[cfg.algorithm].federated and cohort is not None and size > cohort:  # local: no cohort
        raise InputError(f"--nproc / torchrun: {size} processes for a cohort of {cohort} clients "
                         f"would leave ranks idle; use at most --clients-per-round ({cohort}).")
    if device.type == "cuda" and size > torch.cuda.device_count():
        raise InputError(f"--nproc {size} with --device cuda: NCCL needs one GPU per process and this machine "
                         f"has {torch.cuda.device_count()}.")


def stop() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def own_rows(n: int) -> slice:
    """This rank's contiguous share of ``n`` rows (the first ranks take one more when uneven)."""
    rank, size = world()
    per, extra = divmod(n, size)
    lo = rank * per + min(rank, extra)
    return slice(lo, lo + per + (rank < extra))


def assemble(parts: dict, rows: slice, n: int) -> dict:
    """Whole (n, ...) tensors on every rank from each rank's ``rows`` of them (one all_reduce per dtype)."""
    import torch
    import torch.distributed as dist

    out = {}
    for dtype in dict.fromkeys(v.dtype for v in parts.values()):
        names = [k for k, v in parts.items() if v.dtype == dtype]
        fulls = []
        for k in names:
            full = parts[k].new_zeros((n, *parts[k].shape[1:]))
            full[rows] = parts[k]
            fulls.append(full)
        flat = torch.cat([f.flatten() for f in fulls])
        dist.all_reduce(flat)  # other ranks' rows are zero here: the sum is exact
        offset = 0
        for k, f in zip(names, fulls):
            out[k] = flat[offset:offset + f.numel()].view(f.shape)
            offset += f.numel()
    return out
