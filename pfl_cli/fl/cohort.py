"""Local SGD for a whole cohort as one batched computation.

The c clients of a round share one architecture, so their parameters are stacked along a
leading cohort axis and every local step updates all of them at once. The gradients come
from one ``torch.func.vmap`` over ``functional_call`` (``cohort_exec=vmap``) or from one
forward and backward per client (``loop``), whichever the device and architecture run
faster (:func:`resolve_cohort_exec`). Semantics are those of ``torch.optim.SGD``
with momentum (buffer fresh each round) and ``clip_grad_norm_`` before each step, per
client (PeFLL, thesis Alg. 8 line 10); :func:`local_sgd_reference` runs the same thing
one client at a time with the real optimizer, and the tests hold the two equal.
"""

from __future__ import annotations

import functools
from typing import Mapping

from pfl_cli.fl.config import COHORT_EXECS


def scaled_gradient(delta, theta, *, lr: float, weight_decay: float = 0.0):
    """s * gradient from a one-step SGD delta, undoing its step size and weight decay (s > 0 an unknown
    clipping factor): what a server reads off one local step (``pflx attack``, ``Attackable.leaked_gradients``)."""
    return -delta / lr - weight_decay * theta


# Per-client parameters from which the client-major loop beats vmap on a CPU. Measured on the
# 2-core dev CPU (1 thread, 2026-11-24, FedAvg k = 20, batch 32, momentum and clip; CPU seconds
# per round, loop / vmap): MLP 64-32-10 (2,410 parameters) cohort 10: 5.75; 784-100-10 (78,510)
# cohort 20: 1.31; 3072-32-10 (98,666) cohort 20: 1.32; 3072-100-10 (308,310) cohort 8: 0.77,
# cohort 20: 0.68, cohort 50: 0.44. Above a few hundred thousand parameters one client's model,
# gradient and buffer stay in a 2 MB L2 for all of its steps, while vmap streams the whole
# cohort's stacks through memory every step; below it, per-call overhead dominates and the one
# batched call wins.
LOOP_MIN_PARAMETERS = 200_000


def resolve_cohort_exec(cohort_exec: str, model, device) -> str:
    """``vmap`` or ``loop`` for ``model`` on ``device``; ``auto`` picks from measured costs.

    On a CPU, vmap over a cohort's conv weights becomes a grouped convolution, which oneDNN
    runs slower than one ordinary convolution per client (``benchmarks/train_bench.py``:
    LeNet, cohort 25: vmap 0.6x the loop), and models of at least ``LOOP_MIN_PARAMETERS``
    parameters run faster client by client (see that constant's measurements); so do LSTMs, whose
    fused kernel runs only outside vmap (:func:`_is_recurrent`); small MLPs run
    faster as one batched call (digits MLP, cohort 10: 5x). On a GPU the batched path is the
    one that fills the device, so ``auto`` keeps vmap there. The choice depends only on the
    device and the architecture, never on a timing taken at run time, so the same seed gives
    the same numbers.
    """
    import torch

    if cohort_exec not in COHORT_EXECS:
        raise ValueError(f"cohort_exec must be one of {', '.join(COHORT_EXECS)}; got {cohort_exec!r}.")
    if cohort_exec != "auto":
        return cohort_exec
    if torch.device(device).type != "cpu":
        return "vmap"
    convolutional = _is_convolutional(model)
    large = sum(p.numel() for p in model.parameters()) >= LOOP_MIN_PARAMETERS
    return "loop" if convolutional or large or _is_recurrent(model) else "vmap"


def _is_convolutional(model) -> bool:
    import torch

    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())


def _is_recurrent(model) -> bool:
    """An LSTM (LEAF's Shakespeare net): on a CPU one client's fused LSTM kernel at a time beats vmap,
    which has no rule for that kernel and runs the recurrence step by step
    (``benchmarks/lstm_cohort_bench.py``, 2-core dev CPU, 1 thread, 2026-11-25, cohort 5, batch 10, momentum
    and clip; ms per cohort step, vmap / loop: LSTM 16 (5,840 parameters) 84 / 22, LSTM 64 (58,064) 222 / 44)."""
    import torch

    return any(isinstance(m, torch.nn.RNNBase) for m in model.modules())


def cohort_forward(model, params: Mapping[str, "object"], x, how: str, shared: Mapping | None = None):
    """Each client's model on its own inputs: params {name: (c, *shape)}, x (c, b, ...) -> logits (c, b, C).

    ``how`` is ``vmap`` (one batched call: a LoRA net over a frozen base folds the cohort into the batch instead,
    :func:`_folded_forward`) or ``loop`` (one call per client); see :func:`resolve_cohort_exec`. ``shared`` {name: tensor}: parameters common to the whole
    cohort (no cohort axis).
    """
    import torch
    from torch.func import functional_call, vmap

    shared = dict(shared or {})
    if how == "vmap" and _folds(model, params):
        return _folded_forward(model, params, x, shared)
    if how == "vmap":
        # a net with random ops in training (LoRA's dropout) declares how vmap draws them: apart per client
        randomness = getattr(model, "vmap_randomness", "error")
        return vmap(lambda p, xb: functional_call(model, {**p, **shared}, (xb,)), randomness=randomness)(params, x)
    return torch.stack([functional_call(model, {**{k: v[i] for k, v in params.items()}, **shared}, (x[i],))
                        for i in range(x.shape[0])])


def _folds(model, params) -> bool:
    """Whether the cohort runs folded into one batch: the net declares which per-client tensors allow it
    (``cohort_fold``: :class:`pfl_cli.models.lora.LoRANet`'s adapters and linear classifier over a frozen base) and
    every per-client tensor is one of them, with each linear layer's weight and bias both per client or neither."""
    allowed = getattr(model, "cohort_fold", None)
    if not allowed or not set(params) <= allowed:
        return False
    layers = {k.rpartition(".")[0] for k in params}
    return all(f"{layer}.{leaf}" in params for layer in layers for leaf in ("weight", "bias")
               if f"{layer}.{leaf}" in allowed)


def _folded_forward(model, params, x, shared):
    """``cohort_forward`` with the cohort folded into the batch: the frozen base runs once on all c x b rows
    (one large matmul per layer, its bias fused, as in a client's own forward), and each per-client linear layer
    (c, out, in) runs as one grouped matmul of every client's rows with its own weights (:func:`_grouped_linear_mode`).
    Same numbers as vmap up to float rounding; on a CPU it skips vmap's batching rules (copies for attention heads,
    unfused bias adds): ``benchmarks/lora_bench.py``."""
    c, b = x.shape[:2]
    from torch.func import functional_call

    with _grouped_linear_mode()():
        out = functional_call(model, {**params, **shared}, (x.flatten(0, 1),))
    return out.view(c, b, *out.shape[1:])


def _grouped_linear(x, weight, bias=None):
    """``F.linear`` with a cohort of weights (c, out, in) over x (c * n..., in) whose rows are client-major."""
    import torch

    rows = x.reshape(weight.shape[0], -1, x.shape[-1])
    if bias is None:
        out = torch.bmm(rows, weight.transpose(1, 2))
    else:
        out = torch.baddbmm(bias.unsqueeze(-2) if bias.dim() == 2 else bias, rows, weight.transpose(1, 2))
    return out.reshape(*x.shape[:-1], weight.shape[1])


@functools.cache
def _grouped_linear_mode():
    """The torch function mode class (built on first use: this module imports torch lazily)."""
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class GroupedLinear(TorchFunctionMode):
        """``F.linear`` with a 3-D weight (a cohort's) becomes :func:`_grouped_linear`; everything else runs as
        is (torch disables the mode inside its own handler)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.linear:
                weight = args[1] if len(args) > 1 else kwargs["weight"]
                if weight.dim() == 3:
                    bias = args[2] if len(args) > 2 else kwargs.get("bias")
                    return _grouped_linear(args[0], weight, bias)
            return func(*args, **kwargs)

    return GroupedLinear


def _masked_mean_loss(logits, y, m):
    """Cross-entropy averaged over each row's real samples: (..., b, C), (..., b) -> (...)."""
    import torch.nn.functional as F

    m = m * (y >= 0)  # unlabeled samples (-1) add no loss
    ce = F.cross_entropy(logits.flatten(0, -2), y.clamp_min(0).flatten(), reduction="none").view(m.shape)
    return (ce * m).sum(-1) / m.sum(-1).clamp_min(1.0)


def _cohort_grads(model, theta: dict, x, y, m, how: str, fixed: dict, shared: dict):
    """Every client's loss (c,) and gradients {name: (c, *shape)} at ``theta`` on its batch.

    ``fixed`` {name: (c, *shape)}: per-client parameters the forward reads but nobody trains.

    ``vmap``: one vmapped forward and one ordinary backward; clients' losses are independent,
    so the gradient of their sum with respect to the stacked parameters is every client's own
    gradient at once (~2x cheaper than vmap(grad) here). ``loop``: one forward and backward
    per client on views of its slice of the stack.
    """
    import torch
    from torch.func import functional_call

    names = list(theta)
    if how == "vmap":
        leaves = {k: v.detach().requires_grad_(True) for k, v in theta.items()}
        logits = cohort_forward(model, {**leaves, **fixed}, x, "vmap", shared)
        loss = _masked_mean_loss(logits, y, m)
        grads = torch.autograd.grad(loss.sum(), [leaves[k] for k in names])
        return loss.detach(), dict(zip(names, grads))
    losses, per_client = [], []
    for i in range(x.shape[0]):
        leaves = {k: v[i].detach().requires_grad_(True) for k, v in theta.items()}
        frozen = {k: v[i] for k, v in fixed.items()}
        loss = _masked_mean_loss(functional_call(model, {**leaves, **frozen, **shared}, (x[i],)), y[i], m[i])
        per_client.append(torch.autograd.grad(loss, [leaves[k] for k in names]))
        losses.append(loss.detach())
    if len(per_client) == 1:  # one client (the client-major loop): a view, not a copy
        return losses[0].unsqueeze(0), {k: g.unsqueeze(0) for k, g in zip(names, per_client[0])}
    return torch.stack(losses), {k: torch.stack([g[j] for g in per_client]) for j, k in enumerate(names)}


def _steps(index, mask, active):
    """``(index, mask, active)`` per step from a lazy :class:`CohortBatches` or (c, steps, b) tables."""
    from pfl_cli.fl.batches import CohortBatches, LocalSteps

    if isinstance(index, (CohortBatches, LocalSteps)):
        if mask is not None or active is not None:
            raise ValueError("local_sgd: lazy batches carry their own masks and active steps; "
                             "pass mask=None and active=None with them.")
        if getattr(index, "per_step", 1) != 1:
            raise ValueError(f"local_sgd: one batch per step; got LocalSteps with per_step={index.per_step}.")
        return index.num_clients, iter(index)
    return index.shape[0], ((index[:, s], mask[:, s], None if active is None else active[:, s])
                            for s in range(index.shape[1]))


def local_sgd(model, params: Mapping[str, "object"], store, index, mask=None, *, lr: float, momentum: float = 0.0,
              weight_decay: float = 0.0, clip: float = 0.0, active=None, cohort_exec: str = "auto",
              fixed: Mapping[str, "object"] | None = None, prox_mu: float = 0.0,
              prox_anchor: Mapping[str, "object"] | None = None, shared: Mapping[str, "object"] | None = None,
              momentum_state: dict | None = None, clip_groups: list | None = None,
              correction: Mapping[str, "object"] | None = None):
    """Run every cohort client's local steps at once.

    Parameters
    ----------
    model : torch.nn.Module
        The client architecture (its own weights are not used).
    params : dict name -> Tensor (c, *shape)
        Each client's starting parameters.
    store : pfl_cli.fl.store.ClientStore
    index : CohortBatches, or Tensor (c, steps, b)
        Lazy batches from :func:`pfl_cli.fl.batches.draw_batches` (memory per step), or the
        tables of :func:`pfl_cli.fl.batches.sample_batches` with their ``mask``.
    mask : Tensor (c, steps, b), optional
        With table ``index`` only.
    lr : float, or dict name -> float
        Step size (one per parameter when a dict: HyperFL's eta_h and eta_v).
    momentum, weight_decay : float
        ``torch.optim.SGD`` semantics; ``weight_decay = 2 * lambda_theta`` adds the
        gradient of ``lambda_theta * ||theta||^2``.
    clip : float
        Clip each client's gradient to this global norm before the step (0 = off).
    active : BoolTensor (c, steps), optional
        With table ``index`` only: steps a client takes; inactive steps leave its parameters
        and momentum alone (clients with fewer epochs' worth of batches).
    cohort_exec : {"auto", "vmap", "loop"}
        How the cohort's gradients are computed (:func:`resolve_cohort_exec`); every path
        gives the same numbers up to float rounding.
    fixed : dict name -> Tensor (c, *shape), optional
        Per-client parameters the forward pass reads but the clients do not train (FedRep's
        body while its head trains, and the other way round; HyperFL step 1's generated feature
        extractor, step 2's classifier).
    prox_mu, prox_anchor : float, dict name -> Tensor (c, *shape)
        Proximal term ``prox_mu / 2 * ||theta - anchor||^2`` (FedProx Eq. 2, Ditto Eq. 2):
        its gradient ``prox_mu * (theta - anchor)`` joins the step like weight decay (after
        clipping). Anchors of ``fixed`` parameters are ignored.
    correction : dict name -> Tensor (c, *shape), optional
        A constant each client adds to its gradient at every step, after clipping, beside the
        proximal term (SCAFFOLD's ``c - c_i``, Karimireddy et al. 2020 Alg. 1 line 10; FedDyn's
        ``-grad L_k(theta_k^{t-1})``, Acar et al. 2021 Alg. 1; :mod:`pfl_cli.fl.control_variates`).
    shared : dict name -> Tensor, optional
        Untrained parameters common to the whole cohort (no cohort axis: a frozen hypernetwork).
    momentum_state : dict name -> Tensor (c, *shape), optional
        Starting momentum buffers of those parameters (the others start at zero, a fresh
        optimizer); updated in place to the final buffers, so a client's private optimizer
        persists across rounds (pFedHN-PC's heads).
    clip_groups : list of lists of names, optional
        Clip each group's gradient norm separately (HyperFL clips the hypernetwork and the
        embedding apart); default: one group of all parameters.

    Returns
    -------
    params : dict name -> Tensor (c, *shape)
        The clients' parameters after local training (detached).
    loss : Tensor (c,)
        Each client's mean training loss over its active steps.
    """
    import torch

    from pfl_cli.fl.distributed import assemble, count, rows_here, world

    c, stream = _steps(index, mask, active)
    how = resolve_cohort_exec(cohort_exec, model, next(iter(params.values())).device)
    fixed = dict(fixed or {})
    anchor = {k: prox_anchor[k] for k in params} if prox_mu else {}
    corr = {k: correction[k] for k in params} if correction is not None else {}
    if momentum or momentum_state is not None or not _steps_in_place(lr, clip_groups, params):
        buf = {k: (momentum_state[k].clone() if momentum_state is not None and k in momentum_state
                   else torch.zeros_like(v)) for k, v in params.items()}  # a private optimizer persists (pFedHN-PC)
    else:  # plain SGD stepped in place reads no buffer: no cohort-sized zeros, no copy per step
        buf = {}
    opts = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, clip=clip, prox_mu=prox_mu,
                clip_groups=clip_groups, shared=dict(shared or {}))
    if world()[1] == 1:
        theta, loss = _train(model, params, store, stream, c, how, fixed=fixed, anchor=anchor, buf=buf,
                             correction=corr, **opts)
    else:
        # Distributed: this rank trains the clients whose data it holds; every rank gets all of them back.
        rows = rows_here(store, index)
        mine, fixed, anchor, buf, corr = ({k: v[rows] for k, v in d.items()}
                                          for d in (params, fixed, anchor, buf, corr))
        share = ((idx[rows], m[rows], None if go is None else go[rows]) for idx, m, go in stream)
        theta, loss = _train(model, mine, store, share, count(rows), how, fixed=fixed, anchor=anchor,
                             buf=buf, correction=corr, **opts)
        whole = assemble({**theta, **{_BUF + k: v for k, v in buf.items()}, _LOSS: loss}, rows, c)
        loss = whole.pop(_LOSS)
        buf = {k: whole.pop(_BUF + k) for k in list(buf)}
        theta = whole
    if momentum_state is not None:
        for k in momentum_state:
            momentum_state[k] = buf[k].detach()
    return theta, loss


def local_sgd_held(model, params: Mapping[str, "object"], store, batches, *, lr: float, momentum: float = 0.0,
                   weight_decay: float = 0.0, clip: float = 0.0, cohort_exec: str = "auto", prox_mu: float = 0.0,
                   prox_anchor: Mapping[str, "object"] | None = None):
    """:func:`local_sgd` of only the cohort rows whose data ``store`` holds, in one process (a Flower node).

    ``batches`` are drawn for the whole cohort (lazy :class:`~pfl_cli.fl.batches.CohortBatches`), so
    the rows trained here take exactly the batches they take in the simulation; the other rows'
    indices are :data:`~pfl_cli.fl.store.NOT_HERE` and are never read. Returns ``(rows, theta,
    loss)``: the bool mask (c,) of the rows held here, their parameters after training and losses.
    """
    import torch

    from pfl_cli.fl.distributed import count, rows_here

    c, stream = _steps(batches, None, None)
    rows = rows_here(store, batches)
    how = resolve_cohort_exec(cohort_exec, model, next(iter(params.values())).device)
    mine = {k: v[rows] for k, v in params.items()}
    anchor = {k: prox_anchor[k][rows] for k in params} if prox_mu else {}
    buf = {k: torch.zeros_like(v) for k, v in mine.items()}
    share = ((idx[rows], m[rows], None if go is None else go[rows]) for idx, m, go in stream)
    theta, loss = _train(model, mine, store, share, count(rows), how, fixed={}, anchor=anchor, buf=buf, shared={},
                         lr=lr, momentum=momentum, weight_decay=weight_decay, clip=clip, prox_mu=prox_mu,
                         clip_groups=None)
    return rows, theta, loss


_LOSS = "\0loss"  # not a parameter name
_BUF = "\0buf."


def _train(model, params, store, stream, c: int, how: str, *, fixed, anchor, buf, shared, lr, momentum,
           weight_decay, clip, prox_mu, clip_groups, correction=None):
    """:func:`local_sgd` on ``c`` clients whose steps come from ``stream``."""
    import torch

    from pfl_cli.fl.batches import ActiveMean

    device = next(iter(params.values())).device
    theta = {k: v.detach().clone() for k, v in params.items()}
    if c == 0:  # a rank with no clients of this cohort
        return theta, torch.zeros(0, device=device)
    step = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, clip=clip, clip_groups=clip_groups)
    if correction:
        step["correction"] = correction
    if how == "loop":
        return theta, _train_client_major(model, theta, store, list(stream), c, fixed=fixed, anchor=anchor,
                                          buf=buf, shared=shared, prox_mu=prox_mu, **step)
    mean_loss = ActiveMean(c, device)
    for idx, m, go in stream:
        loss, grads = _cohort_grads(model, theta, store.inputs(idx), store.y[idx], m, how, fixed, shared)
        sgd_update_(theta, grads, buf, active=go, prox_mu=prox_mu, prox_anchor=anchor, **step)
        mean_loss.add(loss, go)
    return theta, mean_loss.mean()


def _train_client_major(model, theta, store, steps: list, c: int, *, fixed, anchor, buf, shared, prox_mu,
                        correction=None, **step):
    """The ``loop`` path: each client's steps back to back, on views of its rows of the stacks (in place).

    Clients are independent, so client-major order gives the numbers of the step-major loop;
    on a CPU it keeps one client's parameters, gradients and buffers in cache for all of its
    steps instead of streaming the whole cohort's through memory every step (MLP 3072-100-10,
    cohort 50: 61 MB per stack; issue 26's profile). A step a client does not take
    (``active`` False) is skipped, which leaves its parameters and buffer alone as the
    vectorized step does. Returns each client's mean loss over its steps (c,).

    Per-step overhead, cut because it was 10% of the step of that MLP (issue 26): a client's
    parameters are bound once for all its steps (the in-place step writes through them);
    a batch whose real samples are a prefix (an epoch's last batch) is cut to them, which
    saves padding's forward and backward and changes nothing, because padding adds nothing
    to the masked loss or its gradient and every pflx net treats samples independently
    (``resnet`` freezes its BatchNorm statistics); and a batch of only real, labeled samples
    takes the plain mean cross-entropy, whose gradient is the masked mean's to the bit.
    """
    import torch

    names = list(theta)
    inputs = _batch_reader(model, store)
    plan = [(idx, m, None if go is None else go.tolist(), *_exact_batches(m, store.y[idx])) for idx, m, go in steps]
    total = torch.zeros(c, device=next(iter(theta.values())).device)
    taken = torch.zeros_like(total)
    forward, leaves = _client_binder(model, names, fixed, shared)
    for i in range(c):
        row = slice(i, i + 1)
        mine = {k: v[row] for k, v in theta.items()}
        net = forward(i, mine, {k: v[i] for k, v in fixed.items()})
        own_buf, own_anchor = {k: b[row] for k, b in buf.items()}, {k: a[row] for k, a in anchor.items()}
        own = {"correction": {k: d[row] for k, d in correction.items()}} if correction else {}
        loss_sum, count = total[i], 0
        for idx, m, go, real, exact in plan:
            if go is not None and not go[i]:
                continue
            if real[i] is None:
                loss = _masked_mean_loss(net(inputs(idx[i])), store.y[idx[i]], m[i])
            else:
                batch = idx[i, :real[i]]
                logits, labels = net(inputs(batch)), store.y[batch]
                loss = (torch.nn.functional.cross_entropy(logits, labels) if exact[i]
                        else _masked_mean_loss(logits, labels, m[i, :real[i]]))
            grads = torch.autograd.grad(loss, leaves(mine))
            sgd_update_(mine, {k: g.unsqueeze(0) for k, g in zip(names, grads)}, own_buf, active=None,
                        prox_mu=prox_mu, prox_anchor=own_anchor, **own, **step)
            loss_sum = loss_sum + loss.detach()
            count += 1
        total[i], taken[i] = loss_sum, count
    return total / taken.clamp_min(1.0)


def _batch_reader(model, store):
    """``index -> inputs`` of one client's batch for the client-major loop.

    A convolutional net on a CPU gets its images channels-last (NHWC): oneDNN's NHWC convolutions
    and max-pooling are much faster than the NCHW ones (LeNet, batch 64, one thread: a step 23 ms ->
    18 ms; NCHW max_pool2d_with_indices alone was a third of the step; issue 26). The layout changes
    the order of float sums only; every layer after the convolutions reads the same logical tensor.
    Only this path converts: inside ``vmap`` a memory format cannot be asked for.
    """
    import torch

    if not _is_convolutional(model) or store.x.dim() != 4 or torch.device(store.device).type != "cpu":
        return store.inputs
    return lambda index: store.inputs(index).contiguous(memory_format=torch.channels_last)


def _client_binder(model, names: list, fixed: dict, shared: dict):
    """``(bind, leaves)`` for the client-major loop: ``bind(i, mine, frozen)`` gives client i's forward
    ``x -> logits`` over its trained rows ``mine`` {name: (1, *shape)}, and ``leaves(mine)`` the
    tensors to differentiate.

    When every parameter the net reads is trained, a private copy of the net has its parameters
    pointed at the client's rows (no ``functional_call`` per step); otherwise each step goes
    through ``functional_call`` with the frozen and shared tensors.
    """
    import copy

    from torch.func import functional_call

    if fixed or shared or set(names) != {k for k, _ in model.named_parameters()}:
        bound = {}

        def bind(i, mine, frozen):
            bound["leaves"] = [v[0].detach().requires_grad_(True) for v in mine.values()]
            params = {**frozen, **shared, **dict(zip(names, bound["leaves"]))}
            return lambda x: functional_call(model, params, (x,))

        return bind, lambda mine: bound["leaves"]
    net = copy.deepcopy(model)
    own = dict(net.named_parameters())
    params = [own[k].requires_grad_(True) for k in names]

    def bind(i, mine, frozen):
        for p, v in zip(params, mine.values()):
            p.data = v[0]  # the parameter reads and is stepped through the client's row of the stack
        return net

    return bind, lambda mine: params


def _exact_batches(m, y) -> tuple[list, list]:
    """Per client of a step's mask ``m`` (c, b) and labels ``y`` (c, b): how many leading slots hold
    its real samples when those are exactly a non-empty prefix (the batches of
    :class:`~pfl_cli.fl.batches.CohortBatches`), else None; and whether those are all labeled."""
    import torch

    count = m.sum(1)
    prefix = (m == (torch.arange(m.shape[1], device=m.device) < count[:, None]).to(m.dtype)).all(1)
    labeled = ((y >= 0) | (m == 0)).all(1)
    real = [int(n) if ok and n > 0 else None for n, ok in zip(count.tolist(), prefix.tolist())]
    return real, [r is not None and known for r, known in zip(real, labeled.tolist())]


def expand_as_params(v, like):
    """A per-client vector (c,) viewed to broadcast against a stacked parameter (c, *shape)."""
    return v.view(-1, *([1] * (like.dim() - 1)))


def batch_loss_and_grads(forward, theta: Mapping, names, store, idx, m, *, create_graph: bool = False):
    """Every client's masked mean cross-entropy on its batch ``idx`` (c, b) and its gradients.

    ``forward`` is the vmapped ``functional_call`` of the client net; gradients are taken
    with respect to ``theta[k]`` for ``k`` in ``names`` (leaves or graph nodes).
    """
    import torch

    loss = batch_loss(forward, theta, store, idx, m)
    grads = torch.autograd.grad(loss.sum(), [theta[k] for k in names], create_graph=create_graph)
    return loss, dict(zip(names, grads))


def batch_loss(forward, params: Mapping, store, idx, m):
    """Every client's masked mean cross-entropy (c,) of its model ``params`` on its batch ``idx`` (c, b)."""
    return _masked_mean_loss(forward(dict(params), store.inputs(idx)), store.y[idx], m)


def clip_per_client(grads: dict, clip: float) -> dict:
    """Scale each client's gradient to global norm at most ``clip`` (``clip_grad_norm_``'s coefficient)."""
    import torch

    if clip <= 0 or not grads:
        return grads
    norm = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads.values()))
    scale = (clip / (norm + 1e-6)).clamp(max=1.0)
    return {k: g * expand_as_params(scale, g) for k, g in grads.items()}


def sgd_step(theta: dict, grads: dict, buf: dict, *, lr, momentum: float = 0.0, weight_decay: float = 0.0,
             clip: float = 0.0, active=None, prox_mu: float = 0.0, prox_anchor: Mapping | None = None,
             clip_groups: list | None = None, correction: Mapping | None = None) -> tuple[dict, dict]:
    """One ``torch.optim.SGD`` step per client after ``clip_grad_norm_``; new ``(theta, buf)`` dicts.

    ``theta``, ``grads`` and ``buf`` (momentum buffers) map names to (c, *shape) tensors; the
    clip is over each client's whole gradient (``clip_groups``, lists of names: each group's
    norm apart, as HyperFL clips the hypernetwork and the embedding); ``active`` (c,) bool
    leaves inactive clients alone; ``prox_mu * (theta - prox_anchor)`` (FedProx Eq. 2, Ditto
    Eq. 2) joins after clipping; ``lr`` may be one step per name (a dict). Out of place, so
    the same step serves :func:`local_sgd` (under ``no_grad``) and :func:`unrolled_sgd`
    (differentiable, for the attacks of ``pfl_cli.attack``).
    """
    import torch

    if clip_groups is None:
        grads = clip_per_client(grads, clip)
    else:
        grads = {**grads, **{k: g for group in clip_groups
                             for k, g in clip_per_client({n: grads[n] for n in group}, clip).items()}}
    new_theta, new_buf = dict(theta), dict(buf)  # parameters without a gradient stay as they are
    for k, g in grads.items():
        p = theta[k]
        step = lr[k] if isinstance(lr, dict) else lr
        if weight_decay:
            g = g + weight_decay * p
        if prox_mu:
            g = g + prox_mu * (p - prox_anchor[k])
        if correction:
            g = g + correction[k]
        nb = momentum * buf[k] + g if momentum else g
        if active is None:
            new_buf[k], new_theta[k] = nb, p - step * nb
        else:
            sel = expand_as_params(active, g)
            new_buf[k], new_theta[k] = torch.where(sel, nb, buf[k]), p - step * nb * sel
    return new_theta, new_buf


def sgd_update_(theta: dict, grads: dict, buf: dict, **options) -> None:
    """:func:`sgd_step` in place, into the tensors of ``theta`` and ``buf`` (leaves keep ``requires_grad``)."""
    import torch

    with torch.no_grad():
        if _steps_in_place(options["lr"], options.get("clip_groups"), grads):
            _sgd_inplace_(theta, grads, buf, **{k: v for k, v in options.items() if k != "clip_groups"})
            return
        new_theta, new_buf = sgd_step(theta, grads, buf, **options)
        for k in grads:
            theta[k].copy_(new_theta[k])
            buf[k].copy_(new_buf[k])


def _steps_in_place(lr, clip_groups, names) -> bool:
    """Whether :func:`sgd_update_` takes the in-place step: one clip group and a number for every step size."""
    return clip_groups is None and all(isinstance(lr[k] if isinstance(lr, dict) else lr, (int, float)) for k in names)


def _sgd_inplace_(theta: dict, grads: dict, buf: dict, *, lr, momentum: float = 0.0, weight_decay: float = 0.0,
                  clip: float = 0.0, active=None, prox_mu: float = 0.0, prox_anchor: Mapping | None = None,
                  correction: Mapping | None = None) -> None:
    """:func:`sgd_step`'s numbers written in place, consuming ``grads`` as scratch space.

    The out-of-place step allocates four or five cohort-sized temporaries per step (clipped
    gradient, decayed gradient, new buffer, scaled step, new parameters); for an MLP
    3072-100-10 and a cohort of 50 each is 61 MB, above glibc's mmap threshold, so every one
    is a fresh mmap and ~15,000 page faults: the profile of the 50-client FedAvg round showed
    as much system time as user time (issue 26). Inactive clients (``active`` False) get a zero
    gradient and a momentum factor of 1, which leaves their buffer and parameters exactly as
    they were, as :func:`sgd_step`'s ``where`` does.
    """
    import torch

    if clip > 0:
        norm = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads.values()))
        scale = (clip / (norm + 1e-6)).clamp(max=1.0)
        for g in grads.values():
            g.mul_(expand_as_params(scale, g))
    for k, g in grads.items():
        p, b = theta[k], buf.get(k)
        step = lr[k] if isinstance(lr, dict) else lr
        if weight_decay:
            g.add_(p, alpha=weight_decay)
        if prox_mu:
            g.add_(p - prox_anchor[k], alpha=prox_mu)
        if correction:
            g.add_(correction[k])
        sel = None if active is None else expand_as_params(active, g).to(g.dtype)
        if sel is not None:
            g.mul_(sel)
        if momentum:  # m on an active client, 1 on an inactive one: selected, not 1 + (m - 1) * sel (m - 1 rounds,
            # and an all-active step would differ in the last bit from the step without ``active``: issue 49)
            b.mul_(momentum if sel is None else torch.where(sel > 0, momentum, 1.0)).add_(g)
            p.add_(b if sel is None else b * sel, alpha=-step)
        else:
            if k in buf:  # a buffer someone reads afterwards (momentum_state): torch.optim.SGD's, the gradient
                b.copy_(g) if sel is None else b.mul_(1.0 - sel).add_(g)
            p.add_(g, alpha=-step)


def batch_gradients(model, params: Mapping[str, "object"], x, y, fixed: Mapping[str, "object"] | None = None) -> dict:
    """Each client's gradient of its mean cross-entropy on its batch, differentiable (``create_graph``).

    params (c, *shape) per name, x (c, b, *input_shape), y (c, b). Parameters that are
    constants to the caller are made leaves so that they can be differentiated. ``fixed``
    (c, *shape) per name: parameters the forward pass reads without a gradient of their own
    (HyperFL's classifier in step 2); still differentiable through when they require grad.
    """
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, vmap

    names = list(params)
    theta = [params[k] if params[k].requires_grad else params[k].detach().requires_grad_(True) for k in names]
    fixed = dict(fixed or {})
    logits = vmap(lambda p, f, xb: functional_call(model, {**p, **f}, (xb,)))(dict(zip(names, theta)), fixed, x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)
    return dict(zip(names, torch.autograd.grad(loss.sum(), theta, create_graph=True)))


def unrolled_sgd(model, params: Mapping[str, "object"], x, y, steps: int, *, lr, momentum: float = 0.0,
                 weight_decay: float = 0.0, clip: float = 0.0, fixed: Mapping[str, "object"] | None = None,
                 clip_groups: list | None = None) -> dict:
    """``steps`` full-batch local SGD steps per client, differentiable in ``x`` and ``params``.

    The client update of :func:`local_sgd` (the same :func:`sgd_step`) on one fixed batch per
    client, x (c, b, *input_shape) and y (c, b), kept on the autograd graph so that a
    gradient-inversion attack can differentiate the uploaded delta with respect to dummy data.
    ``lr`` (one per name when a dict), ``fixed`` and ``clip_groups`` as in :func:`local_sgd`.
    """
    import torch

    theta = {k: v if v.requires_grad else v.detach().requires_grad_(True) for k, v in params.items()}
    buf = {k: torch.zeros_like(v) for k, v in params.items()}
    for _ in range(steps):
        grads = batch_gradients(model, theta, x, y, fixed)
        theta, buf = sgd_step(theta, grads, buf, lr=lr, momentum=momentum, weight_decay=weight_decay, clip=clip,
                              clip_groups=clip_groups)
    return theta


def local_sgd_reference(model, params, store, index, mask=None, *, lr, momentum=0.0, weight_decay=0.0, clip=0.0,
                        active=None, cohort_exec: str = "loop", fixed=None, prox_mu=0.0, prox_anchor=None):
    """:func:`local_sgd` one client at a time with ``torch.optim.SGD`` (tests and benchmarks).

    Takes the same arguments; ``cohort_exec`` is accepted so both share one options dict
    (the reference is always a loop over real optimizers).
    """
    import copy

    import torch

    if hasattr(index, "materialize"):  # lazy batches (CohortBatches, LocalSteps)
        index, mask, active = index.materialize()
    c, steps = index.shape[:2]
    out = {k: [] for k in params}
    losses = []
    everything = {**params, **(fixed or {})}
    for i in range(c):
        net = copy.deepcopy(model)
        with torch.no_grad():
            for k, p in net.named_parameters():
                p.copy_(everything[k][i])
        moving = [p for k, p in net.named_parameters() if k in params]
        for k, p in net.named_parameters():
            p.requires_grad_(k in params)
        opt = torch.optim.SGD(moving, lr=lr, momentum=momentum, weight_decay=weight_decay)
        total, count = 0.0, 0
        for s in range(steps):
            if active is not None and not bool(active[i, s]):
                continue
            idx = index[i, s]
            logits = net(store.inputs(idx))
            y = store.y[idx]
            m = mask[i, s] * (y >= 0)
            ce = torch.nn.functional.cross_entropy(logits, y.clamp_min(0), reduction="none")
            loss = (ce * m).sum() / m.sum().clamp_min(1.0)
            opt.zero_grad()
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(moving, clip)
            if prox_mu:
                with torch.no_grad():
                    for k, p in net.named_parameters():
                        if p.requires_grad:
                            p.grad += prox_mu * (p - prox_anchor[k][i])
            opt.step()
            total, count = total + float(loss.detach()), count + 1
        for k, p in net.named_parameters():
            if k in out:
                out[k].append(p.detach().clone())
        losses.append(total / max(count, 1))
    return {k: torch.stack(v) for k, v in out.items()}, torch.tensor(losses)
