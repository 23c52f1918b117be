"""Accuracy of global or personalized models on groups of clients, with and without label masking.

Label masking (``specs/pefll.md`` §2.5): a client overwrites the scores of classes absent
from its train data so they are never predicted. pflx sets their logits to -inf before the
argmax (the authors' code multiplies logits by a 0/1 mask, which lets an absent class win
when every present logit is negative). Both accuracies come from the same logits, so every
evaluation reports both.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GroupEval:
    """Per-client counts on one split of one group of clients."""

    clients: np.ndarray     # client positions in the store
    n: np.ndarray           # evaluated samples per client
    correct: np.ndarray     # argmax over all classes
    correct_lm: np.ndarray  # argmax over the client's own classes (label masking)
    loss: np.ndarray        # summed cross-entropy per client

    def summary(self) -> dict:
        """Mean of per-client accuracies (clients with data), pooled accuracy, mean loss."""
        has = self.n > 0
        total = int(self.n.sum())

        def mean_acc(correct):
            return float(np.mean(correct[has] / self.n[has])) if has.any() else float("nan")

        return {
            "mean_accuracy": mean_acc(self.correct),
            "pooled_accuracy": float(self.correct.sum() / total) if total else float("nan"),
            "mean_accuracy_lm": mean_acc(self.correct_lm),
            "pooled_accuracy_lm": float(self.correct_lm.sum() / total) if total else float("nan"),
            "loss": float(self.loss.sum() / total) if total else float("nan"),
            "num_clients": int(len(self.clients)),
            "num_samples": total,
        }

    def accuracy(self, label_mask: bool) -> np.ndarray:
        correct = self.correct_lm if label_mask else self.correct
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.n > 0, correct / np.maximum(self.n, 1), np.nan)


def _count(logits, y, allowed):
    """Correct (plain, masked) and summed loss per row of (k, m, C) logits."""
    import torch
    import torch.nn.functional as F

    ce = F.cross_entropy(logits.flatten(0, -2), y.flatten(), reduction="none").view(y.shape)
    plain = logits.argmax(-1) == y
    # A client without train labels has nothing to mask with: it keeps all classes.
    allowed = allowed | ~allowed.any(-1, keepdim=True)
    masked = logits.masked_fill(~allowed.unsqueeze(-2), float("-inf")).argmax(-1) == y
    return plain, masked, ce


def evaluate(model, params, store, clients: np.ndarray, split: str = "test", *, personalized: bool,
             max_samples: int = 8192) -> GroupEval:
    """Evaluate ``clients`` on their ``split`` samples.

    Parameters
    ----------
    model : torch.nn.Module
        The client architecture.
    params : dict name -> Tensor
        One global model (``personalized=False``), or one model per entry of ``clients``
        stacked on a leading axis (``personalized=True``), evaluated with ``vmap``.
    store : ClientStore
    clients : ndarray of int
        Client positions in the store.
    split : {"test", "val", "fit"}
    max_samples : int
        Samples per forward pass (bounds memory).
    """
    import torch
    from torch.func import functional_call, vmap

    clients = np.asarray(clients, dtype=np.int64)
    k = len(clients)
    out = {name: np.zeros(k, dtype=np.int64) for name in ("n", "correct", "correct_lm")}
    loss = np.zeros(k)
    padded = getattr(store, split)
    sel = torch.as_tensor(clients, device=store.device)
    if k == 0:
        return GroupEval(clients, out["n"], out["correct"], out["correct_lm"], loss)
    index, length = padded.rows(sel)
    width = index.shape[1]
    per_chunk = max(1, max_samples // width)
    forward = vmap(lambda p, x: functional_call(model, p, (x,)))
    with torch.no_grad():
        for start in range(0, k, per_chunk):
            rows = slice(start, min(k, start + per_chunk))
            idx, n = index[rows], length[rows]
            valid = torch.arange(width, device=idx.device) < n[:, None]
            x = store.inputs(idx)
            if personalized:
                logits = forward({name: p[rows] for name, p in params.items()}, x)
            else:
                logits = functional_call(model, params, (x.flatten(0, 1),)).view(*idx.shape, -1)
            plain, masked, ce = _count(logits, store.y[idx], store.classes[sel[rows]])
            out["n"][rows] = n.cpu().numpy()
            out["correct"][rows] = (plain & valid).sum(1).cpu().numpy()
            out["correct_lm"][rows] = (masked & valid).sum(1).cpu().numpy()
            loss[rows] = (ce * valid).sum(1).double().cpu().numpy()
    return GroupEval(clients, out["n"], out["correct"], out["correct_lm"], loss)


def _concat(parts: list[GroupEval]) -> GroupEval:
    return GroupEval(*(np.concatenate([getattr(p, f) for p in parts])
                       for f in ("clients", "n", "correct", "correct_lm", "loss")))


def personalize_and_evaluate(alg, clients: np.ndarray, splits: tuple[str, ...], gen, *, chunk: int = 256,
                             keep_params: bool = False, max_samples: int = 8192):
    """Each client's model from ``alg.personalize``, evaluated on ``splits``, ``chunk`` clients at a time.

    Chunking bounds memory by the chunk, not the population: 3,597 FEMNIST writers' LeNets
    would be 1.8 GB at once.

    Returns
    -------
    evals : dict split -> GroupEval
    params : dict name -> Tensor (n_clients, ...) on the CPU, or one global model, or None
        The models, when ``keep_params``.
    personalized : bool
    """
    import torch

    from pfl_cli.errors import InputError

    clients = np.asarray(clients, dtype=np.int64)
    groups = alg.model_groups(clients)  # clients sharing one architecture (pFedHN's mixed sizes: one per size)
    if keep_params and len(groups) > 1:
        raise InputError("save_models: the clients have models of different sizes (client_sizes), which one "
                         "models.pt tensor per parameter cannot hold; predict without --save-models.")
    parts: dict[str, list[GroupEval]] = {split: [] for split in splits}
    kept: list[dict] = []
    personalized = True
    for members, net in groups:
        personalized = _personalize_group(alg, net, members, splits, gen, chunk, keep_params, max_samples, parts,
                                          kept)
    out = None
    if keep_params:
        out = kept[0] if not personalized else {k: torch.cat([p[k] for p in kept]) for k in kept[0]}
    evals = {split: _concat(p) for split, p in parts.items()}
    if len(groups) > 1:  # back to the order of ``clients``
        where = {int(c): i for i, c in enumerate(clients)}
        for split, ev in evals.items():
            perm = np.argsort([where[int(c)] for c in ev.clients], kind="stable")
            evals[split] = GroupEval(*(getattr(ev, f)[perm] for f in ("clients", "n", "correct", "correct_lm", "loss")))
    return evals, out, personalized


def _personalize_group(alg, net, clients, splits, gen, chunk, keep_params, max_samples, parts, kept) -> bool:
    personalized = True
    for lo in range(0, max(len(clients), 1), chunk):
        sel = clients[lo:lo + chunk]
        params, personalized = alg.personalize(sel, gen)
        for split in splits:
            parts[split].append(evaluate(net, params, alg.store, sel, split, personalized=personalized,
                                         max_samples=max_samples))
        if keep_params:
            kept.append({k: v.detach().cpu() for k, v in params.items()})
        if not personalized:  # one global model serves every client: evaluate the rest in one go
            rest = clients[lo + chunk:]
            if len(rest):
                for split in splits:
                    parts[split].append(evaluate(net, params, alg.store, rest, split, personalized=False,
                                                 max_samples=max_samples))
            break
    return personalized
