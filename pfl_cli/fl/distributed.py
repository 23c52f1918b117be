"""Scale-out on ``torch.distributed``: every rank holds its own clients' data and trains them.

Client ``i`` belongs to rank ``i mod N`` (:func:`held_clients`), and a rank's device holds only
those clients' samples (``build_store(held=...)``), so the data's memory per rank falls with N.
Every rank runs the same round loop with the same generators, so the cohort, the batches'
random draws and the server state agree everywhere; the per-client work is split by owner:
:func:`pfl_cli.fl.cohort.local_sgd`, :func:`pfl_cli.fl.evaluate.evaluate` and the algorithms'
own per-client computations (:func:`split_cohort`) run only the cohort rows whose data this
rank holds. The per-client results are then put back together on every rank by one
``all_reduce`` (sum) of tensors in which each rank filled its own rows and left the others
zero, which is exact; a gradient through per-client results (PeFLL's embedding network)
comes back through :func:`gather_rows`, whose backward hands each rank its rows and sums the
parameter gradients over ranks. The server step then runs on identical inputs on every rank
(replicated), so all ranks hold the same model; rank 0 alone writes files.

Started by ``torchrun`` (or ``pflx train --nproc N``), which sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``: gloo on CPU, NCCL on CUDA (one GPU per
local rank).
"""

from __future__ import annotations

import os

from pfl_cli.errors import InputError


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside a distributed run."""
    import sys

    if "torch" not in sys.modules:  # no process group joined yet: nor torch's ~3 CPU s for a refusal to import
        return 0, 1
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

    from pfl_cli.fl.config import planned_cohort

    why = cfg.algorithm_class.not_distributed
    if not why and getattr(cfg, "sam_rho", 0):  # fedavg's and fedprox's option (SAM steps in one process)
        why = f"its SAM local steps (sam_rho {cfg.sam_rho}) are not split across ranks (sam_rho=0's plain steps are)"
    if not why and getattr(cfg, "secagg", False):  # issue 48: the simulated secure sum is not split across ranks
        why = ("--secagg sums the cohort's rows in one process (the simulated protocol, pfl_cli.fl.secagg, is not "
               "split across ranks)")
    from pfl_cli.fl.conditions.settings import set_conditions

    if not why and set_conditions(cfg):
        why = f"federation conditions ({', '.join(set_conditions(cfg))}) run in one process"
    if size > 1 and why:
        raise InputError(f"--nproc / torchrun: --algorithm {cfg.algorithm} runs in one process only: {why}; "
                         "drop --nproc (or run without torchrun).")

    cohort = planned_cohort(cfg)  # None: every train client, which only the data tell
    if cfg.algorithm_class.federated and cohort is not None and size > cohort:  # local: no cohort
        raise InputError(f"--nproc / torchrun: {size} processes for a cohort of {cohort} clients "
                         f"would leave ranks idle; use at most --clients-per-round ({cohort}).")
    if device.type == "cuda" and size > torch.cuda.device_count():
        raise InputError(f"--nproc {size} with --device cuda: NCCL needs one GPU per process and this machine "
                         f"has {torch.cuda.device_count()}.")


def stop(*, finished: bool = False) -> None:
    """Leave the process group. ``finished``: every rank got to the end, so wait for the others first.

    Rank 0 still writes the artifact when the others are done; a rank that exits then closes
    its gloo connections under a rank still tearing down, which can abort it (SIGABRT from a
    background thread). After a failure there is no barrier: the others may never reach it.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        if finished:
            dist.barrier()
        dist.destroy_process_group()


def held_clients(num_clients: int):
    """The clients whose data this rank holds (bool, per client): client i on rank i mod N; None alone."""
    import numpy as np

    rank, size = world()
    return None if size == 1 else np.arange(num_clients) % size == rank


def own_rows(n: int) -> slice:
    """This rank's contiguous share of ``n`` rows (the first ranks take one more when uneven): the split of
    work that reads no client data (a cohort with zero local steps)."""
    rank, size = world()
    per, extra = divmod(n, size)
    lo = rank * per + min(rank, extra)
    return slice(lo, lo + per + (rank < extra))


def rows_here(store, index):
    """This rank's rows of a cohort whose sample ``index`` is (c, ...) (or lazy batches with their ``rows``):
    those whose data it holds."""
    index = getattr(index, "rows", index)
    rows = store.holds(index)
    return own_rows(index.shape[0]) if rows is None else rows


def count(rows) -> int:
    """How many rows a slice or a bool mask selects."""
    return rows.stop - rows.start if isinstance(rows, slice) else int(rows.sum())


def _take(value, rows, placeholder: bool = False):
    """``rows`` of a per-client argument; ``placeholder``: indices of samples held elsewhere point at this
    rank's first sample instead (a stand-in client that only gives the results their shapes)."""
    import torch

    from pfl_cli.fl.batches import LocalSteps
    from pfl_cli.fl.store import NOT_HERE

    if value is None:
        return None
    if isinstance(value, dict):
        return {k: _take(v, rows, placeholder) for k, v in value.items()}
    if isinstance(value, LocalSteps):  # lazy batches: sliced step by step
        return value.take(rows, placeholder=placeholder)
    value = value[rows]
    if placeholder and value.dtype == torch.long:
        value = value.masked_fill(value == NOT_HERE, 0)
    return value


def split_cohort(fn, store, index, per_client: dict, /, **common):
    """``fn(**per_client, **common)`` on the cohort rows whose data this rank holds; whole results everywhere.

    ``per_client`` holds the arguments with a leading cohort axis (tensors, dicts of tensors
    or None), ``index`` the cohort's sample indices (c, ...) that say which rows are here;
    ``fn`` must treat the clients independently and return a tensor, or a dict, tuple or list
    of tensors, each with the cohort axis first (non-tensors pass through unchanged). One
    process: ``fn`` runs on everything.
    """
    rank, size = world()
    if size == 1:
        return fn(**per_client, **common)
    rows = rows_here(store, index)
    n = getattr(index, "rows", index).shape[0]
    if count(rows) == 0:
        # vmap cannot run every function on an empty cohort: run one placeholder client on this
        # rank's first sample and keep none of it (the shapes of the rows the others fill in).
        out = fn(**{k: _take(v, slice(0, 1), placeholder=True) for k, v in per_client.items()}, **common)
        out = _map_tensors(out, lambda t: t[:0])
    else:
        out = fn(**{k: _take(v, rows) for k, v in per_client.items()}, **common)
    return assemble_tree(out, rows, n)


def _map_tensors(node, fn):
    import torch

    if isinstance(node, torch.Tensor):
        return fn(node)
    if isinstance(node, dict):
        return {k: _map_tensors(v, fn) for k, v in node.items()}
    if isinstance(node, (tuple, list)):
        return type(node)(_map_tensors(v, fn) for v in node)
    return node


def assemble_tree(out, rows, n: int):
    """:func:`assemble` of every tensor in a nest of dicts, tuples and lists (one all_reduce per dtype)."""
    leaves: list = []
    _map_tensors(out, leaves.append)
    whole = assemble(dict(enumerate(leaves)), rows, n) if leaves else {}
    position = iter(range(len(leaves)))  # _map_tensors visits the leaves in the same order again
    return _map_tensors(out, lambda _: whole[next(position)])


def gather_rows(part, rows, n: int):
    """The whole (n, ...) tensor from each rank's ``rows``, differentiably.

    Backward: each rank takes its rows of the (identical, replicated) incoming gradient, so
    the parameters behind ``part`` get this rank's clients' share; :func:`sum_grads` adds the
    shares up.
    """
    import torch

    class _Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return assemble({"x": x}, rows, n)["x"]

        @staticmethod
        def backward(ctx, grad):
            return grad[rows]

    if world()[1] == 1:
        return part
    return _Gather.apply(part)


def sum_grads(grads, params):
    """Each rank's share of a sum of per-client gradients of ``params`` -> the whole sum on every rank.

    A None gradient (no path from this rank's clients) counts as zero, so every rank reduces
    the same tensors."""
    import torch
    import torch.distributed as dist

    if world()[1] == 1:
        return grads
    grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, params)]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat)
    return list(flat.split([g.numel() for g in grads])[i].view(g.shape) for i, g in enumerate(grads))


def assemble(parts: dict, rows, n: int) -> dict:
    """Whole (n, ...) tensors on every rank from each rank's ``rows`` (a slice or a bool mask) of them.

    One all_reduce per dtype; the other ranks' rows are zero here, so the sum is exact."""
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
