"""Element-wise aggregation of a client's local model with the global one, weights learned on its data.

FedALA's Adaptive Local Aggregation (Zhang et al., AAAI 2023, §"Adaptive Local Aggregation")
initializes a client's model before local training as

    theta_hat = theta + (Theta - theta) * W     on the top ``p`` layers (element-wise W in [0, 1]),
    theta_hat = Theta                           on the layers below them,

with ``theta`` the client's previous local model and ``Theta`` the received global model.
W is learned on a random ``s`` share of the client's training data by gradient steps

    W <- clip_[0,1]( W - eta * grad_theta_hat L(theta_hat) * (Theta - theta) )

(the chain rule through theta_hat), one pass over the sample per round, and in the client's
first aggregation ("start phase") pass after pass until the losses of the last
``num_pre_loss`` passes have a standard deviation below ``threshold``. W starts at ones and
persists across rounds. :func:`adaptive_local_aggregation` does this for a whole cohort at
once (``vmap`` over clients); clients leave the start phase one by one as they converge.
"""

from __future__ import annotations

def top_layers(names: list[str], p: int) -> list[str]:
    """The parameter names of the top ``p`` layers of a net (layers: parameter-name prefixes, in order)."""
    layers: list[str] = []
    for k in names:
        layer = k.rsplit(".", 1)[0]
        if layer not in layers:
            layers.append(layer)
    top = set(layers[-p:]) if p > 0 else set()
    return [k for k in names if k.rsplit(".", 1)[0] in top]


def sample_share(padded, clients, share: float, gen):
    """Each client's random ``share`` of its samples (at least one), as a padded (c, width) table and lengths."""
    import torch

    from pfl_cli.fl.store import Padded

    rows, length = padded.rows(clients)
    c, width = rows.shape
    keys = torch.rand((c, width), generator=gen).to(rows.device)
    keys = keys.masked_fill(torch.arange(width, device=rows.device)[None, :] >= length[:, None], 2.0)
    perm = torch.argsort(keys, dim=1, stable=True)
    take = torch.clamp(torch.floor(length.to(torch.float64) * share).to(torch.int64), min=1)
    take = torch.minimum(take, length)
    return Padded(rows.gather(1, perm), take)


def adaptive_local_aggregation(model, local: dict, global_: dict, weights: dict, started, store, clients, gen, *,
                               top: list[str], share: float, batch_size: int, eta: float, threshold: float,
                               num_pre_loss: int, max_start_epochs: int):
    """theta_hat for every cohort client, and its learned W.

    ``local`` (c, ...) the clients' previous local models, ``global_`` the global model (one),
    ``weights`` (c, ...) W on the names ``top``, ``started`` BoolTensor (c,): the client has left
    its start phase (one pass this round) or not (passes until converged, at most
    ``max_start_epochs``). Returns ``(theta_hat, weights, passes)``, passes (c,) the number of
    passes each client took.
    """
    import torch
    from torch.func import functional_call, vmap

    from pfl_cli.fl.batches import CohortBatches
    from pfl_cli.fl.cohort import _masked_mean_loss
    from pfl_cli.fl.params import stack

    c = len(clients)
    device = clients.device
    glob = stack(global_, c)
    diff = {k: glob[k] - local[k] for k in top}
    w = {k: weights[k].detach().clone() for k in top}
    low = {k: v for k, v in glob.items() if k not in diff}  # the lower layers take the global model

    def aggregated():
        return {**low, **{k: local[k] + diff[k] * w[k] for k in top}}

    subset = sample_share(store.fit, clients, share, gen)
    forward = vmap(lambda p, x: functional_call(model, p, (x,)))
    going = torch.ones(c, dtype=torch.bool, device=device)
    passes = torch.zeros(c, dtype=torch.int64, device=device)
    history: list = []  # per pass: each client's loss on its last batch of the pass
    for epoch in range(max(int(max_start_epochs), 1)):
        batches = CohortBatches(subset, torch.arange(c, device=device), None, batch_size, gen, epochs=1)
        last = torch.zeros(c, device=device)
        for idx, m, go in batches:
            act = going if go is None else going & go
            hat = aggregated()
            leaves = {k: hat[k].detach().requires_grad_(True) for k in top}
            loss = _masked_mean_loss(forward({**hat, **leaves}, store.inputs(idx)), store.y[idx], m)
            grads = torch.autograd.grad(loss.sum(), [leaves[k] for k in top])
            with torch.no_grad():
                for k, g in zip(top, grads):
                    sel = act.view(-1, *([1] * (g.dim() - 1)))
                    w[k] = torch.where(sel, (w[k] - eta * g * diff[k]).clamp(0.0, 1.0), w[k])
                last = torch.where(act, loss.detach(), last)
        passes += going.to(torch.int64)
        history.append(last)
        # After one pass a client out of its start phase stops; one in it stops once its last
        # num_pre_loss pass losses vary by less than threshold (population std, as numpy's).
        done = started.clone()
        if len(history) > num_pre_loss:
            recent = torch.stack(history[-num_pre_loss:])
            done |= recent.std(0, unbiased=False) < threshold
        going &= ~done
        if not bool(going.any()):
            break
    return {k: v.detach() for k, v in aggregated().items()}, w, passes
