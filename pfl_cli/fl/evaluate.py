"""Accuracy of global or personalized models on groups of clients, with and without label masking.

Label masking (PeFLL thesis App. B.1.3 "Integrating known client label sets", Table B.4): a client overwrites the scores of classes absent
from its train data so they are never predicted. pflx sets their logits to -inf before the
argmax (the authors' code multiplies logits by a 0/1 mask, which lets an absent class win
when every present logit is negative). Both accuracies come from the same logits, so every
evaluation reports both.

Beside accuracy, the metrics papers print on imbalanced clients: balanced accuracy and macro-F1, per
client and pooled, from per-client class counts (true positives, true labels, predictions: the
diagonal and both margins of each client's confusion matrix, all clients of a chunk in one
weighted ``bincount``). The definitions are scikit-learn's (``balanced_accuracy_score``, ``f1_score(average=
"macro")``): balanced accuracy is the mean recall over the classes with a scored test sample; macro-F1
the mean of ``2 tp / (support + predicted)`` over the classes in the labels *or* the predictions.
Per client these run over that client's scored test samples; pooled ones over the summed counts
(the pooled confusion matrix, never a mean of per-client values). Both score the plain argmax, the
prediction the headline accuracy scores.

The global model (:meth:`pfl_cli.algorithms.base.Algorithm.global_model`): where a method holds one
model for every client, it is also scored on the clients' test splits, and ``global_accuracy`` is its
accuracy on their union -- the "global test set" the optimization papers report (McMahan et al.,
AISTATS 2017, section 3; Karimireddy et al., ICML 2020, section 7; Reddi et al., ICLR 2021, section 5).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np


@dataclass(frozen=True)
class GroupEval:
    """Per-client counts on one split of one group of clients."""

    clients: np.ndarray     # client positions in the store
    n: np.ndarray           # evaluated samples per client
    correct: np.ndarray     # argmax over all classes
    correct_lm: np.ndarray  # argmax over the client's own classes (label masking)
    loss: np.ndarray        # summed cross-entropy per client
    # Per-client class counts of the plain argmax, (k, C) int64: true positives, scored labels, predictions.
    # None where an evaluation did not count them (a Flower node's reply, an older checkpoint).
    tp: np.ndarray | None = None
    support: np.ndarray | None = None
    predicted: np.ndarray | None = None
    # The same counts for the method's global model on the same samples; None where it has none.
    global_tp: np.ndarray | None = None
    global_predicted: np.ndarray | None = None

    def summary(self) -> dict:
        """Mean of per-client accuracies (clients with data), pooled accuracy, mean loss, and fairness across
        clients: ``accuracy_std``, ``accuracy_worst10``, ``accuracy_min`` (and ``_lm``: label-masked)."""
        has = self.n > 0
        total = int(self.n.sum())

        def mean_acc(correct):
            return float(np.mean(correct[has] / self.n[has])) if has.any() else float("nan")

        from pfl_cli.compare.stats import client_fairness

        return {
            "mean_accuracy": mean_acc(self.correct),
            "pooled_accuracy": float(self.correct.sum() / total) if total else float("nan"),
            "mean_accuracy_lm": mean_acc(self.correct_lm),
            "pooled_accuracy_lm": float(self.correct_lm.sum() / total) if total else float("nan"),
            "loss": float(self.loss.sum() / total) if total else float("nan"),
            "num_clients": int(len(self.clients)),
            "num_samples": total,
            # Fairness across the clients with data (spread, worst decile, minimum): one function for
            # train, predict and compare (pfl_cli.compare.stats); None where no client has data.
            **client_fairness(self.accuracy(False)),
            **client_fairness(self.accuracy(True), suffix="_lm"),
            **self.class_summary(),
        }

    def class_summary(self) -> dict:
        """Balanced accuracy and macro-F1, mean over clients (with scored samples) and pooled; the global
        model's pooled accuracy, balanced accuracy and macro-F1. None where not counted / no global model."""
        out = dict.fromkeys(CLASS_METRICS)
        if self.tp is not None:
            has = self.n > 0

            def mean(values):
                return float(np.mean(values[has])) if has.any() else None

            out["mean_balanced_accuracy"] = mean(balanced_accuracy(self.tp, self.support))
            out["mean_macro_f1"] = mean(macro_f1(self.tp, self.support, self.predicted))
            tp, support, predicted = self.tp.sum(0), self.support.sum(0), self.predicted.sum(0)
            out["pooled_balanced_accuracy"] = _none(balanced_accuracy(tp, support))
            out["pooled_macro_f1"] = _none(macro_f1(tp, support, predicted))
            if self.global_tp is not None:
                gtp, gpred = self.global_tp.sum(0), self.global_predicted.sum(0)
                total = int(support.sum())
                out["global_accuracy"] = float(gtp.sum() / total) if total else None
                out["global_balanced_accuracy"] = _none(balanced_accuracy(gtp, support))
                out["global_macro_f1"] = _none(macro_f1(gtp, support, gpred))
        return out

    def client_metrics(self) -> dict[str, np.ndarray]:
        """Per-client ``balanced_accuracy``, ``macro_f1`` and ``global_accuracy`` (NaN: no scored sample, not
        counted, or no global model)."""
        nan = np.full(len(self.clients), np.nan)
        if self.tp is None:
            return {"balanced_accuracy": nan, "macro_f1": nan, "global_accuracy": nan}
        with np.errstate(invalid="ignore", divide="ignore"):
            glob = (np.where(self.n > 0, self.global_tp.sum(1) / np.maximum(self.n, 1), np.nan)
                    if self.global_tp is not None else nan)
        return {"balanced_accuracy": balanced_accuracy(self.tp, self.support),
                "macro_f1": macro_f1(self.tp, self.support, self.predicted), "global_accuracy": glob}

    def accuracy(self, label_mask: bool) -> np.ndarray:
        correct = self.correct_lm if label_mask else self.correct
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.n > 0, correct / np.maximum(self.n, 1), np.nan)


CLASS_METRICS = ("mean_balanced_accuracy", "pooled_balanced_accuracy", "mean_macro_f1", "pooled_macro_f1",
                 "global_accuracy", "global_balanced_accuracy", "global_macro_f1")


def _none(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


def balanced_accuracy(tp: np.ndarray, support: np.ndarray) -> np.ndarray:
    """Mean recall ``tp / support`` over the classes with ``support > 0`` along the last axis; NaN without any.

    scikit-learn's ``balanced_accuracy_score`` (``adjusted=False``)
    on the predictions these counts come from.
    """
    present = support > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = np.where(present, tp / np.maximum(support, 1), 0.0).sum(-1)
        return np.where(present.any(-1), recall / present.sum(-1), np.nan)


def macro_f1(tp: np.ndarray, support: np.ndarray, predicted: np.ndarray) -> np.ndarray:
    """Mean F1 ``2 tp / (support + predicted)`` over the classes in the labels or the predictions (last axis).

    scikit-learn's ``f1_score(average="macro")`` (whose labels default to those of ``y_true`` and ``y_pred``);
    NaN where there is no sample at all.
    """
    either = support + predicted
    present = either > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(present, 2.0 * tp / np.maximum(either, 1), 0.0).sum(-1)
        return np.where(present.any(-1), f1 / present.sum(-1), np.nan)


def _class_counts(pred, y, scored, num_classes: int):
    """``(tp, support, predicted)``: (k, C) counts of a chunk's scored samples, for all k clients at once.

    One weighted bincount (``scatter_add_``) over ``row * C + class`` in three blocks: the labels, the
    predictions, and the labels of the correct predictions; an unscored sample adds 0 (no boolean masking:
    a third faster than three masked bincounts on a 50-client chunk).
    """
    import torch

    k, c = y.shape[0], num_classes
    base = (torch.arange(k, device=y.device) * c)[:, None]
    true = (base + y.clamp_min(0)).flatten()
    index = torch.cat([true, (base + pred).flatten() + k * c, true + 2 * k * c])
    weight = scored.flatten().long()
    weight = torch.cat([weight, weight, weight * (pred == y).flatten().long()])
    counts = torch.zeros(3 * k * c, dtype=torch.int64, device=y.device).scatter_add_(0, index, weight)
    support, predicted, tp = counts.view(3, k, c).cpu().numpy()
    return tp, support, predicted


def _count(logits, y, allowed):
    """Correct (plain, masked) and summed loss per row of (k, m, C) logits; unlabeled samples (-1) count 0."""
    import torch.nn.functional as F

    target = y.clamp_min(0)
    ce = F.cross_entropy(logits.flatten(0, -2), target.flatten(), reduction="none").view(y.shape)
    plain = logits.argmax(-1) == y
    # A client without train labels has nothing to mask with: it keeps all classes.
    allowed = allowed | ~allowed.any(-1, keepdim=True)
    masked = logits.masked_fill(~allowed.unsqueeze(-2), float("-inf")).argmax(-1) == y
    return plain, masked, ce


def forward_chunks(model, params, store, clients: np.ndarray, split: str, *, personalized: bool,
                   max_samples: int = 8192, how: str = "vmap"):
    """Logits of ``clients``' ``split`` samples, a chunk of clients at a time.

    Yields
    ------
    rows : slice
        The chunk's positions in ``clients``.
    index : LongTensor (k, width)
        Sample indices, padded.
    valid : BoolTensor (k, width)
        Real (not padding) entries.
    logits : Tensor (k, width, C)
    """
    import torch
    from torch.func import functional_call

    from pfl_cli.fl.cohort import cohort_forward

    k = len(clients)
    if k == 0:
        return
    sel = torch.as_tensor(clients, device=store.device)
    index, length = getattr(store, split).rows(sel)
    width = index.shape[1]
    per_chunk = max(1, max_samples // width)
    with torch.no_grad():
        for start in range(0, k, per_chunk):
            rows = slice(start, min(k, start + per_chunk))
            idx, n = index[rows], length[rows]
            valid = torch.arange(width, device=idx.device) < n[:, None]
            x = store.inputs(idx)
            if personalized:
                logits = cohort_forward(model, {name: p[rows] for name, p in params.items()}, x, how)
            else:
                logits = functional_call(model, params, (x.flatten(0, 1),)).view(*idx.shape, -1)
            yield rows, idx, valid, logits


def evaluate(model, params, store, clients: np.ndarray, split: str = "test", *, personalized: bool,
             max_samples: int = 8192, cohort_exec: str = "auto") -> GroupEval:
    """Evaluate ``clients`` on their ``split`` samples that have an evaluation label (``store.y_eval``).

    Parameters
    ----------
    model : torch.nn.Module
        The client architecture.
    params : dict name -> Tensor
        One global model (``personalized=False``), or one model per entry of ``clients``
        stacked on a leading axis (``personalized=True``).
    store : ClientStore
    clients : ndarray of int
        Client positions in the store.
    split : {"test", "val", "fit"}
    max_samples : int
        Samples per forward pass (bounds memory).
    cohort_exec : {"auto", "vmap", "loop"}
        How personalized models run (:func:`pfl_cli.fl.cohort.resolve_cohort_exec`; on CPU
        a LeNet cohort's forward is ~3x faster as a loop than as vmap's grouped convolution).
    """
    import torch

    from pfl_cli.fl.cohort import resolve_cohort_exec
    from pfl_cli.fl.distributed import assemble, world

    clients = np.asarray(clients, dtype=np.int64)
    how = resolve_cohort_exec(cohort_exec, model, store.device)
    if world()[1] == 1:
        return _evaluate(model, params, store, clients, split, personalized, max_samples, how)
    # Distributed: this rank evaluates the clients whose data it holds; the counts come back whole.
    k = len(clients)
    held = store.held[clients]
    rows = torch.as_tensor(held)
    mine = {name: p[rows.to(p.device)] for name, p in params.items()} if personalized else params
    part = _evaluate(model, mine, store, clients[held], split, personalized, max_samples, how)
    counted = [f.name for f in fields(GroupEval)[1:] if getattr(part, f.name) is not None]
    whole = assemble({f: torch.as_tensor(getattr(part, f)) for f in counted}, rows, k)
    return GroupEval(clients, **{f: whole[f].numpy() for f in counted})


def _evaluate(model, params, store, clients: np.ndarray, split: str, personalized: bool, max_samples: int,
              how: str) -> GroupEval:
    k = len(clients)
    out = {name: np.zeros(k, dtype=np.int64) for name in ("n", "correct", "correct_lm")}
    loss = np.zeros(k)
    c = store.num_classes
    counts = {name: np.zeros((k, c), dtype=np.int64) for name in ("tp", "support", "predicted")}
    for rows, idx, valid, logits in forward_chunks(model, params, store, clients, split, personalized=personalized,
                                                   max_samples=max_samples, how=how):
        # Model selection (val) reads only labels training may read, never an oracle's hidden ones.
        y = (store.y if split == "val" else store.y_eval)[idx]
        scored = valid & (y >= 0)  # samples without an evaluation label are not scored
        allowed = store.classes[clients[rows]]
        plain, masked, ce = _count(logits, y, allowed)
        out["n"][rows] = scored.sum(1).cpu().numpy()
        out["correct"][rows] = (plain & scored).sum(1).cpu().numpy()
        out["correct_lm"][rows] = (masked & scored).sum(1).cpu().numpy()
        loss[rows] = (ce * scored).sum(1).double().cpu().numpy()
        for name, value in zip(counts, _class_counts(logits.argmax(-1), y, scored, c)):
            counts[name][rows] = value
    return GroupEval(clients, out["n"], out["correct"], out["correct_lm"], loss, **counts)


def predict_samples(model, params, store, clients: np.ndarray, split: str, *, personalized: bool,
                    max_samples: int = 8192) -> dict[str, np.ndarray]:
    """Every ``split`` sample's predicted class and class probabilities under its client's model.

    Returns
    -------
    dict with ``client`` (positions in the store), ``sample`` (dataset sample index),
    ``predicted`` (argmax over all classes), ``probabilities`` float32 (n, C), flat over clients.
    """
    import torch

    from pfl_cli.fl.cohort import resolve_cohort_exec

    clients = np.asarray(clients, dtype=np.int64)
    how = resolve_cohort_exec("auto", model, store.device)
    parts: dict[str, list] = {"client": [], "sample": [], "predicted": [], "probabilities": []}
    for rows, idx, valid, logits in forward_chunks(model, params, store, clients, split, personalized=personalized,
                                                   max_samples=max_samples, how=how):
        owner = torch.as_tensor(clients[rows], device=idx.device)[:, None].expand_as(idx)
        probs = torch.softmax(logits, -1)
        parts["client"].append(owner[valid].cpu().numpy())
        parts["sample"].append(idx[valid].cpu().numpy())
        parts["predicted"].append(logits.argmax(-1)[valid].cpu().numpy())
        parts["probabilities"].append(probs[valid].to(torch.float32).cpu().numpy())
    c = store.num_classes
    empty = {"client": np.zeros(0, np.int64), "sample": np.zeros(0, np.int64), "predicted": np.zeros(0, np.int64),
             "probabilities": np.zeros((0, c), np.float32)}
    return {k: np.concatenate(v) if v else empty[k] for k, v in parts.items()}


def _concat(parts: list[GroupEval]) -> GroupEval:
    names = [f.name for f in fields(GroupEval)]
    return GroupEval(**{f: None if any(getattr(p, f) is None for p in parts) else
                        np.concatenate([getattr(p, f) for p in parts]) for f in names})


def _take(ev: GroupEval, order) -> GroupEval:
    return GroupEval(**{f.name: None if getattr(ev, f.name) is None else getattr(ev, f.name)[order]
                        for f in fields(GroupEval)})


def with_global(alg, evals: dict[str, GroupEval], clients: np.ndarray, personalized: bool, *,
                max_samples: int = 8192) -> dict[str, GroupEval]:
    """``evals["test"]`` with its global model's class counts (``global_tp``, ``global_predicted``).

    A method that serves every client one model (``personalized`` False) is its own global model: the
    counts are the evaluation's. A personalized one is scored again with :meth:`global_model` (one
    more forward pass over the test samples), or left without them when it holds none.
    """
    ev = evals.get("test")
    if ev is None or ev.tp is None:
        return evals
    if not personalized:
        return {**evals, "test": replace(ev, global_tp=ev.tp, global_predicted=ev.predicted)}
    glob = global_model_of(alg)
    if glob is None:
        return evals
    net, params = glob
    g = evaluate(net, params, alg.store, ev.clients, "test", personalized=False, max_samples=max_samples)
    return {**evals, "test": replace(ev, global_tp=g.tp, global_predicted=g.predicted)}


def global_model_of(alg):
    """``alg.global_model()``, or None for an algorithm (a plugin) that does not define it."""
    method = getattr(alg, "global_model", None)
    return method() if callable(method) else None


# The named random stream of the new-client protocol (pFedHN's embedding fit, HyperFL's new
# embedding and classifier, fine-tuning batches, ...). ``predict`` and train's evaluation of the
# holdout clients both draw from it, fresh, so that metrics.json's holdout numbers are exactly what
# ``pflx predict --clients holdout`` reports for the same model and seed.
NEW_CLIENT_STREAM = "predict"


def personalize_and_evaluate(alg, clients: np.ndarray, splits: tuple[str, ...], gen, *, chunk: int = 256,
                             keep_params: bool = False, max_samples: int = 8192, each_chunk=None,
                             with_global_model: bool = True):
    """Each client's model from ``alg.personalize``, evaluated on ``splits``, ``chunk`` clients at a time.

    Chunking bounds memory by the chunk, not the population: 3,597 FEMNIST writers' LeNets
    would be 1.8 GB at once.

    Returns
    -------
    evals : dict split -> GroupEval
    params : dict name -> Tensor (n_clients, ...) on the CPU, or one global model, or None
        The models, when ``keep_params``.
    personalized : bool

    ``each_chunk(clients, params, personalized, net)``, when given, sees every chunk's models
    (``predict`` writes the chunk's predictions with them). ``with_global_model``: the test split's
    evaluation also holds the global model's counts (:func:`with_global`).
    """
    import torch

    from pfl_cli.errors import InputError

    clients = np.asarray(clients, dtype=np.int64)
    how = alg.cfg.cohort_exec
    groups = alg.model_groups(clients)  # clients sharing one architecture (pFedHN's mixed sizes: one per size)
    if keep_params and len(groups) > 1:
        raise InputError("save_models: the clients have models of different sizes (client_sizes), which one "
                         "models.pt tensor per parameter cannot hold; predict without --save-models.")
    parts: dict[str, list[GroupEval]] = {split: [] for split in splits}
    kept: list[dict] = []
    personalized = True
    for members, net in groups:
        personalized = _personalize_group(alg, net, members, splits, gen, chunk, keep_params, max_samples, parts,
                                          kept, how, each_chunk)
    out = None
    if keep_params:
        out = kept[0] if not personalized else {k: torch.cat([p[k] for p in kept]) for k in kept[0]}
    evals = {split: _concat(p) for split, p in parts.items()}
    if len(groups) > 1:  # back to the order of ``clients``
        where = {int(c): i for i, c in enumerate(clients)}
        for split, ev in evals.items():
            perm = np.argsort([where[int(c)] for c in ev.clients], kind="stable")
            evals[split] = _take(ev, perm)
    if with_global_model and len(groups) == 1:
        evals = with_global(alg, evals, clients, personalized, max_samples=max_samples)
    return evals, out, personalized


def _personalize_group(alg, net, clients, splits, gen, chunk, keep_params, max_samples, parts, kept, how,
                       each_chunk) -> bool:
    personalized = True
    for lo in range(0, max(len(clients), 1), chunk):
        sel = clients[lo:lo + chunk]
        params, personalized = alg.personalize(sel, gen)
        for split in splits:
            parts[split].append(evaluate(net, params, alg.store, sel, split, personalized=personalized,
                                         max_samples=max_samples, cohort_exec=how))
        if each_chunk is not None:
            each_chunk(sel if personalized else clients[lo:], params, personalized, net)
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
