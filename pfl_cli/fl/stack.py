"""The run axis: K runs of one algorithm trained in one process, their local SGD as one batched call per step.

Runs that share every shape-determining key (model, cohort size, local steps, batch size, rounds,
evaluation period, ...) and differ only in float settings (lr, momentum, weight decay, mu) and the
seed train in lockstep: each run is the ordinary round loop (:func:`pfl_cli.fl.loop.run_rounds`) on
its own algorithm, store and generators, in a worker thread of its own, and every local-SGD call of a
round (``Algorithm.cohort_sgd``) meets the other runs' calls at a rendezvous; the last to arrive runs
all of them as one computation over the stacked (run, client) rows -- one vmapped forward and
backward per step over K x C rows, with per-row lr, momentum, weight decay, clip, proximal weight and
SAM radius (:func:`stacked_local_sgd`) -- and hands each run its rows back. Everything else a run does (cohort
sampling, batches, server aggregation, DP noise, evaluation, selection, checkpoints, progress) is the
separate run's own code on its own state, so each stacked run equals the run ``train_federated``
trains with the same config and seed, up to the float rounding of batched reductions over more rows
(``tests/fl/test_stack.py`` measures it). A run that ends early (a pruned trial) leaves the stack
and the others continue. What a round does outside ``cohort_sgd`` stays per run: for PeFLL that is the
descriptors, the hypernetwork's forward and backward and the server's Adam step (its generated models'
local SGD, Alg. 8 step 10, is the batched call).

Which algorithms stack is declared, never inherited: an algorithm class sets ``stackable = True``
and names in ``stack_keys`` the keys its runs may differ in (:func:`is_stackable`); every other key
is shape-determining or changes control flow, and runs that differ in one train in separate stacks
(:func:`stack_groups`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, fields
from typing import Any, Callable, Sequence

import numpy as np

from pfl_cli.errors import ConfigError


def is_stackable(cls) -> bool:
    """Whether algorithm class ``cls`` declares (itself, not through a parent) that its runs stack."""
    return bool(cls.__dict__.get("stackable", False))


def stack_keys(cls) -> tuple[str, ...]:
    """The keys runs of ``cls`` may differ in within one stack (the seed and float settings)."""
    return tuple(cls.__dict__.get("stack_keys", ()))


def stackable_names(registry: dict) -> list[str]:
    """The names in ``{name: algorithm class}`` whose runs stack."""
    return sorted(name for name, cls in registry.items() if is_stackable(cls))


def loaded_stackable_names() -> list[str]:
    """The names of the algorithms loaded in this process whose runs stack: the algorithm of every config class
    (``TrainConfig`` subclasses, each set by the algorithm that declares it), which after ``pfl_cli.registry``
    has loaded its entries are the registry's algorithms. The engine reads no registry (it sits below the
    algorithms); the caller that holds one has :func:`stackable_names`."""
    from pfl_cli.fl.config import TrainConfig

    found, todo = set(), list(TrainConfig.__subclasses__())
    while todo:
        sub = todo.pop()
        todo.extend(sub.__subclasses__())
        cls = sub.__dict__.get("algorithm_class")
        if cls is not None and is_stackable(cls) and getattr(cls, "name", ""):
            found.add(cls.name)
    return sorted(found)


def config_stacks(cfg) -> bool:
    """Whether runs of ``cfg`` may train stacked: its algorithm stacks and no federation condition is set (each run
    under conditions answers its rounds differently: :func:`check_stackable` refuses them)."""
    from pfl_cli.fl.conditions.settings import set_conditions

    return is_stackable(cfg.algorithm_class) and not set_conditions(cfg)


# How a refusal of check_stackable says to train one run at a time (on the command line; a spec says it its way).
UNSTACK_HINT = "drop --seeds / --stack"


def check_stackable(cfg, known: Callable[[], Sequence[str]] | None = None) -> None:
    """Refuse (one line, exit 2) a stack of an algorithm that does not declare ``stackable``, or of runs under
    federation conditions; ``known``: what says the names of those that do, asked only to refuse (the caller's
    registry, which loads every algorithm for it; default the loaded ones)."""
    cls = cfg.algorithm_class
    if cls is None or not is_stackable(cls):
        names = (known or loaded_stackable_names)()
        raise ConfigError(f"stacking: algorithm {cfg.algorithm!r} cannot train runs stacked on a run axis (only "
                          "algorithms whose local training is one batched SGD call per round stack: "
                          f"{', '.join(names)}); got {cfg.algorithm!r}. Train its runs one at a time "
                          f"({UNSTACK_HINT}).")
    from pfl_cli.fl.conditions.settings import set_conditions

    if set_conditions(cfg):  # each run's rounds answer differently (who is online, who is late, its codec memory)
        raise ConfigError(f"stacking: federation conditions ({', '.join(set_conditions(cfg))}) train one run per "
                          f"process; train each seed with --seed S ({UNSTACK_HINT}).")


def shape_key(cfg) -> tuple:
    """The values of every key that is not one of the algorithm's stack keys: runs stack iff these are equal."""
    free = set(stack_keys(cfg.algorithm_class))
    return tuple((f.name, repr(getattr(cfg, f.name))) for f in fields(cfg) if f.name not in free)


def stack_groups(cfgs: Sequence, *, group: bool = True) -> list[list[int]]:
    """Indices of ``cfgs`` split into stacks of equal :func:`shape_key`, in first-seen order.

    With ``group=False`` runs that differ in a shape-determining key are refused, naming the key.
    """
    for cfg in cfgs:
        check_stackable(cfg)
    groups: dict[tuple, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        groups.setdefault(shape_key(cfg), []).append(i)
    if not group and len(groups) > 1:
        first, other = (dict(k) for k in list(groups)[:2])
        name = next(k for k in first if first[k] != other.get(k))
        raise ConfigError(f"stacking: runs of one stack must share every shape-determining key; {name} differs "
                          f"({first[name]} and {other[name]}). Give the runs the same {name}, or train them "
                          "as separate stacks.")
    return list(groups.values())


@dataclass
class _Call:
    """One run's ``cohort_sgd`` call, waiting at the rendezvous."""

    alg: Any
    start: dict
    clients: Any
    gen: Any
    steps: int | None
    epochs: int | None
    prox_mu: float
    prox_anchor: dict | None
    sam_rho: float = 0.0


class _Rendezvous:
    """Collects one pending local-SGD call from every active run and runs them as one batched call."""

    def __init__(self, members: int) -> None:
        self.cv = threading.Condition()
        self.active = members
        self.pending: dict[int, _Call] = {}
        self.results: dict[int, Any] = {}
        self.batches = 0  # batched calls run (what the tests watch: the runs really met)

    def submit(self, i: int, call: _Call):
        with self.cv:
            self.pending[i] = call
            self._maybe_run()
            while i not in self.results:
                self.cv.wait()
            out = self.results.pop(i)
        if isinstance(out, BaseException):
            raise out
        return out

    def leave(self) -> None:
        with self.cv:
            self.active -= 1
            self._maybe_run()

    def _maybe_run(self) -> None:
        if not self.pending or len(self.pending) < self.active:
            return
        order = sorted(self.pending)  # by run index: the same rows in the same places whatever thread came last
        calls = [self.pending.pop(i) for i in order]
        try:
            outs = stacked_local_sgd(calls)
        except BaseException as err:  # every waiting run raises it
            outs = [err] * len(calls)
        self.batches += 1
        self.results.update(zip(order, outs))
        self.cv.notify_all()


def stacked_local_sgd(calls: list[_Call]) -> list[tuple]:
    """Every call's local SGD as one batched computation over their stacked rows.

    Each call is ``Algorithm.cohort_sgd``'s arguments for one run; each gets back what that method
    returns (parameters, each client's mean loss, steps taken), computed by
    :func:`pfl_cli.fl.cohort.local_sgd`'s semantics (``torch.optim.SGD`` with momentum after
    ``clip_grad_norm_``, per client) with the run's own settings on its own rows; a run with ``sam_rho > 0``
    takes its rows' gradients at ``w + rho g / ||g||`` (:func:`pfl_cli.fl.sam.sam_perturbation`, the second
    batched gradient of the step; rows with rho 0 keep their plain gradient). Batches come from
    each run's own generator; batches narrower than the widest are padded with masked slots, which
    add nothing to the masked mean loss or its gradient.
    """
    import torch

    from pfl_cli.fl.batches import ActiveMean
    from pfl_cli.fl.cohort import expand_as_params, resolve_cohort_exec
    from pfl_cli.fl.sam import sam_perturbation

    first = calls[0].alg
    how = resolve_cohort_exec(first.cfg.cohort_exec, first.net, first.device)
    if how != "vmap" or len(calls) == 1:  # nothing to batch: each run's own call (the loop path is per client anyway)
        return [_one_call(c) for c in calls]
    batches = [c.alg.local_batches(c.clients, c.gen, steps=c.steps, epochs=c.epochs) for c in calls]
    sizes = [len(c.clients) for c in calls]
    rows = sum(sizes)
    device = first.device
    theta = {k: torch.cat([c.start[k].detach() for c in calls]).clone() for k in calls[0].start}

    def per_row(values) -> torch.Tensor:
        return torch.cat([torch.full((n,), float(v), device=device) for n, v in zip(sizes, values)])

    opts = [c.alg.sgd_update_options() for c in calls]
    lr, mom = per_row(o["lr"] for o in opts), per_row(o["momentum"] for o in opts)
    wd, clip = per_row(o["weight_decay"] for o in opts), per_row(o["clip"] for o in opts)
    mu = per_row(c.prox_mu for c in calls)
    rho = per_row(c.sam_rho for c in calls)
    sharp_rows = rho > 0 if bool(rho.any()) else None
    anchor = ({k: torch.cat([c.prox_anchor[k].expand(n, *c.prox_anchor[k].shape) for c, n in zip(calls, sizes)])
               for k in theta} if bool(mu.any()) else {})
    buf = {k: torch.zeros_like(v) for k, v in theta.items()} if bool(mom.any()) else {}
    streams = [iter(b) for b in batches]
    mean_loss = ActiveMean(rows, device)
    for _ in range(max(len(b) for b in batches)):
        steps = [next(s, None) for s in streams]
        width = max(s[0].shape[1] for s in steps if s is not None)
        xs, ys, ms, go = [], [], [], []
        for c, n, s in zip(calls, sizes, steps):
            store = c.alg.store
            if s is None:  # this run's clients have taken all their steps: padding rows that sit the step out
                idx, m = torch.zeros((n, width), dtype=torch.long, device=device), None
                active = torch.zeros(n, dtype=torch.bool, device=device)
            else:
                idx, m, active = s
            xs.append(store.inputs(idx))
            ys.append(store.y[idx])
            ms.append(torch.zeros(idx.shape, device=device) if m is None else m)
            go.append(torch.ones(n, dtype=torch.bool, device=device) if active is None else active)
        go_all = torch.cat(go)
        everyone = bool(go_all.all())
        loss, grads = _grads_by_width(first.net, theta, sizes, xs, ys, ms)
        if sharp_rows is not None:  # SAM (Foret et al. 2021, Eq. 2-3): the same batch's gradient at w + eps
            eps = sam_perturbation(grads, rho)
            _, sharp = _grads_by_width(first.net, {k: v + eps[k] for k, v in theta.items()}, sizes, xs, ys, ms)
            grads = {k: torch.where(expand_as_params(sharp_rows, g), sharp[k], g) for k, g in grads.items()}
        _rows_sgd_(theta, grads, buf, lr=lr, momentum=mom, weight_decay=wd, clip=clip, prox_mu=mu, anchor=anchor,
                   active=None if everyone else go_all)
        mean_loss.add(loss, None if everyone else go_all)
    losses = mean_loss.mean().split(sizes)
    out, lo = [], 0
    for c, n, b, loss in zip(calls, sizes, batches, losses):
        out.append(({k: v[lo:lo + n] for k, v in theta.items()}, loss, b.active_steps()))
        lo += n
    return out


def _grads_by_width(model, theta: dict, sizes, xs, ys, ms):
    """Every row's loss and gradients at ``theta``, the runs whose batches have one width in one batched call.

    A run's separate process reduces over its own batch width; padding it to a wider run's width changes the
    order of the batch sum inside the matrix products (the last bits of a gradient, issue 49), so runs of
    different widths (local epochs, batches wider than a cohort's clients) are computed apart.
    """
    import torch

    widths = [x.shape[1] for x in xs]
    starts = np.cumsum([0, *sizes])
    groups: dict[int, list[int]] = {}
    for i, w in enumerate(widths):
        groups.setdefault(w, []).append(i)
    if len(groups) == 1:
        return _stacked_grads(model, theta, torch.cat(xs), torch.cat(ys), torch.cat(ms))
    rows = int(starts[-1])
    loss, grads = None, None
    for members in groups.values():
        at = torch.as_tensor(np.concatenate([np.arange(starts[i], starts[i + 1]) for i in members]),
                             dtype=torch.long, device=xs[0].device)
        part_loss, part = _stacked_grads(model, {k: v[at] for k, v in theta.items()},
                                         torch.cat([xs[i] for i in members]), torch.cat([ys[i] for i in members]),
                                         torch.cat([ms[i] for i in members]))
        if loss is None:
            loss = part_loss.new_zeros(rows)
            grads = {k: g.new_zeros((rows, *g.shape[1:])) for k, g in part.items()}
        loss[at] = part_loss
        for k, g in part.items():
            grads[k][at] = g
    return loss, grads


def _stacked_grads(model, theta: dict, x, y, m):
    """Every row's loss (rows,) and gradients at ``theta`` on its batch: :func:`pfl_cli.fl.cohort._cohort_grads`'s
    numbers, for pflx's MLP through one batched matrix product per layer.

    The MLP's layers written as ``baddbmm`` over the rows and differentiated by one backward: on the 2-core dev
    CPU (one thread, 2026-11-27, digits MLP 64-32-10, batch 32) 2.7 ms a step for 80 rows (8 runs x cohort 10)
    against 5.5 ms through ``vmap(functional_call)`` (0.8 against 1.8 ms for 10 rows): vmap's per-call dispatch
    is most of a small net's step. Every other net goes through vmap.
    """
    import torch

    from pfl_cli.fl.cohort import _cohort_grads, _masked_mean_loss
    from pfl_cli.models.client import MLP

    if type(model) is not MLP:
        return _cohort_grads(model, theta, x, y, m, "vmap", {}, {})
    names = list(theta)
    leaves = {k: v.detach().requires_grad_(True) for k, v in theta.items()}
    h = x.flatten(2)
    for i in range(1, model.num_layers + 1):
        w, b = leaves[f"fc{i}.weight"], leaves[f"fc{i}.bias"]
        h = torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
        if i < model.num_layers:
            h = torch.relu(h)
    loss = _masked_mean_loss(h, y, m)
    grads = torch.autograd.grad(loss.sum(), [leaves[k] for k in names])
    return loss.detach(), dict(zip(names, grads))


def _one_call(c: _Call):
    # the algorithm's own class method, past the rendezvous the run's instance attribute installs (the engine
    # imports no algorithm module: pfl_cli.fl stays below pfl_cli.algorithms)
    sam = {"sam_rho": c.sam_rho} if c.sam_rho else {}  # only FedAvg's cohort_sgd (and its heirs') takes it
    return type(c.alg).cohort_sgd(c.alg, c.start, c.clients, c.gen, steps=c.steps, epochs=c.epochs,
                                  prox_mu=c.prox_mu, prox_anchor=c.prox_anchor, **sam)


def _rows_sgd_(theta: dict, grads: dict, buf: dict, *, lr, momentum, weight_decay, clip, prox_mu, anchor,
               active) -> None:
    """One ``torch.optim.SGD`` step per row after ``clip_grad_norm_``, in place, each row with its own settings.

    The arithmetic of :func:`pfl_cli.fl.cohort._sgd_inplace_` with a (rows,) vector where that step
    has a number: a row whose setting is 0 gets exactly the step without it (x + 0 * y = x), and an
    inactive row (``active`` False) keeps its parameters and buffer.
    """
    import torch

    from pfl_cli.fl.cohort import expand_as_params

    with torch.no_grad():
        if bool((clip > 0).any()):
            norm = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads.values()))
            # clip * (1 / n), as the separate step's ``clip / (norm + 1e-6)`` computes with a Python float clip
            # (Tensor.__rtruediv__ is reciprocal-then-multiply); a per-row division differs in the last bit
            scale = torch.where(clip > 0, (torch.reciprocal(norm + 1e-6) * clip).clamp(max=1.0), torch.ones_like(clip))
            for g in grads.values():
                g.mul_(expand_as_params(scale, g))
        decay, prox, heavy = bool(weight_decay.any()), bool(prox_mu.any()), bool(momentum.any())
        sel_row = None if active is None else active.to(lr.dtype)
        # the momentum itself on an active row, 1 on an inactive one (selected, not 1 + (m - 1) * sel, which rounds
        # m - 1 and differs from m in the last bit): a step with every row active equals the step without ``active``
        keep = momentum if sel_row is None else torch.where(sel_row > 0, momentum, torch.ones_like(momentum))
        for k, g in grads.items():
            p = theta[k]
            if decay:
                g.addcmul_(expand_as_params(weight_decay, g), p)
            if prox:
                g.addcmul_(expand_as_params(prox_mu, g), p - anchor[k])
            sel = None if sel_row is None else expand_as_params(sel_row, g)
            if sel is not None:
                g.mul_(sel)
            step = expand_as_params(-lr, g)
            if heavy:
                b = buf[k]
                b.mul_(expand_as_params(keep, g)).add_(g)
                p.addcmul_(step, b if sel is None else b * sel)
            else:
                p.addcmul_(step, g)


@dataclass
class StackedRun:
    """One run of a stack: its :class:`~pfl_cli.fl.api.TrainRun`, or the exception that ended it."""

    run: Any = None
    error: BaseException | None = None


def train_stacked(x: np.ndarray, y: np.ndarray, num_classes: int, partition, cfgs: Sequence, *, device: Any = None,
                  labeled: np.ndarray | None = None, vocab_size: int | None = None,
                  resumes: Sequence[dict | None] | None = None,
                  on_checkpoint: Sequence[Callable[[dict], None] | None] | None = None,
                  on_progress: Callable[[int, int, int, dict], None] | None = None,
                  group: bool = True) -> list[StackedRun]:
    """Train the runs ``cfgs`` of one algorithm in this process, stacked on a run axis; one result per run.

    Each run is what :func:`pfl_cli.fl.api.train_federated` trains with its config (same cohorts,
    batches, aggregation, evaluation, selection and checkpoints, from its own seed), with the local
    SGD of all runs of a stack as one batched call per step. Runs that differ in a
    shape-determining key train in separate stacks, one stack after another (``group=False``:
    refused). ``resumes`` / ``on_checkpoint``: per run, as in :func:`~pfl_cli.fl.loop.run_rounds`;
    ``on_progress(run, done, total, status)`` for every run's rounds (an exception it raises ends
    that run alone: a pruned trial leaves the stack). A run that fails gets its exception in its
    :class:`StackedRun`; the others are unaffected.
    """
    cfgs = list(cfgs)
    results: list[StackedRun] = [StackedRun() for _ in cfgs]
    for members in stack_groups(cfgs, group=group):
        _train_group(x, y, num_classes, partition, cfgs, members, results, device=device, labeled=labeled,
                     vocab_size=vocab_size, resumes=resumes, on_checkpoint=on_checkpoint, on_progress=on_progress)
    return results


def _train_group(x, y, num_classes, partition, cfgs, members, results, *, device, labeled, vocab_size, resumes,
                 on_checkpoint, on_progress) -> None:
    """One stack: the algorithms are built here, one after another (their initializations fork torch's global
    generator), then each run's round loop runs in a thread of its own, meeting the others at the rendezvous."""
    from pfl_cli.fl.api import TrainRun, make_algorithm, model_payload, plan_dp, validate_train_config
    from pfl_cli.fl.device import resolve_device
    from pfl_cli.fl.byzantine.threat import prepare_threat
    from pfl_cli.fl.distributed import held_clients
    from pfl_cli.fl.loop import run_rounds
    from pfl_cli.fl.store import build_store
    from pfl_cli.privacy.randomness import train_randomness

    algs = {}
    for i in members:
        cfg = cfgs[i]
        try:
            validate_train_config(cfg)
            dev = device if device is not None else resolve_device(cfg.device)
            store = build_store(x, y, num_classes, partition, val_fraction=cfg.val_fraction,
                                rng=train_randomness(cfg).numpy("validation-split"),
                                stable_carve=cfg.dp_epsilon is not None, device=dev, normalize=cfg.normalize,
                                labeled=labeled, hidden_labels=cfg.evaluate_hidden_labels,
                                held=held_clients(partition.num_clients), vocab_size=vocab_size)
            threat = prepare_threat(cfg, store)  # Byzantine clients, as train_federated prepares them
            alg = make_algorithm(cfg, store)
            alg.byzantine = threat
            if cfg.dp_epsilon is not None:
                alg.dp = plan_dp(cfg, store)
            algs[i] = alg
        except Exception as err:  # noqa: BLE001 - this run's own failure, reported with it
            results[i].error = err
    meet = _Rendezvous(len(algs))

    def work(i: int, alg) -> None:
        def cohort_sgd(start, clients, gen, *, steps=None, epochs=None, trainable=None, prox_mu=0.0,
                       prox_anchor=None, sgd=None, sam_rho=0.0):
            if trainable is not None or sgd is not None:  # not one plain SGD call: not stackable
                raise ConfigError(f"stacking: {alg.name} trains a parameter subset or its own SGD settings in a "
                                  "round; it cannot stack. Train its runs one at a time.")
            return meet.submit(i, _Call(alg, start, clients, gen, steps, epochs, prox_mu, prox_anchor, sam_rho))

        def progress(done, total, status):
            if on_progress is not None:
                on_progress(i, done, total, status)

        try:
            alg.cohort_sgd = cohort_sgd  # every local-SGD call of this run meets the stack (fine-tuning's too)
            outcome = run_rounds(alg, cfgs[i], resume=None if resumes is None else resumes[i],
                                 on_checkpoint=None if on_checkpoint is None else on_checkpoint[i],
                                 on_progress=progress)
            results[i].run = TrainRun(model=model_payload(alg, outcome.weights), outcome=outcome, store=alg.store,
                                      algorithm=alg, dp=alg.dp)
        except BaseException as err:  # noqa: BLE001 - ends this run only
            results[i].error = err
        finally:
            meet.leave()

    threads = [threading.Thread(target=work, args=(i, alg), name=f"pflx-stack-{i}", daemon=True)
               for i, alg in algs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
