"""The explicit round loop: sample a cohort, run the algorithm's round, evaluate, select, checkpoint.

Every round's randomness (cohort, batches) comes from a generator seeded by (seed, round),
and evaluation's from (seed, evaluation round), so a run resumed from a checkpoint draws
exactly what the uninterrupted run would have drawn and ends with the same metrics. Under
``--dp`` the rounds draw from OS entropy instead (:mod:`pfl_cli.privacy.randomness`) unless
``noise=seeded``: a resumed secure run continues with fresh entropy from the round after the
checkpoint, and never re-runs a released round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from pfl_cli.errors import RunError
from pfl_cli.fl.dp import private_snapshot, released_state_finite, restore_private
from pfl_cli.fl.evaluate import NEW_CLIENT_STREAM, GroupEval, personalize_and_evaluate
from pfl_cli.fl.params import cpu_tree
from pfl_cli.fl.store import ROLE_HOLDOUT, ROLE_TRAIN
from pfl_cli.privacy.randomness import train_randomness
from pfl_cli.readers.model import restore, weights_mismatch
from pfl_cli.rng import torch_generator

GROUPS = ("train", "holdout", "val")


class TrainingDiverged(RunError):
    """The training loss stopped being finite."""

    def __init__(self, round_: int, loss: float | None, last_checkpoint: int | None) -> None:
        # loss None: under --dp, where the released model (not the private loss) stopped being finite.
        self.round, self.loss, self.last_checkpoint = round_, loss, last_checkpoint
        what = "the released model stopped being finite" if loss is None else f"the loss became {loss}"
        super().__init__(f"training diverged: {what} at round {round_}.")


@dataclass
class Evaluation:
    round: int
    groups: dict[str, GroupEval]

    def summaries(self) -> dict[str, dict]:
        return {g: ev.summary() for g, ev in self.groups.items()}


@dataclass
class TrainOutcome:
    """What a training run hands to the writer of the ``train`` artifact."""

    weights: dict[str, Any]       # the selected model's weights (CPU tensors)
    history: list[list]           # [round, group, metric, value] rows
    best: Evaluation              # the evaluation of the selected model
    last_round: int
    selection: str                # "val" or "last"
    extra: dict = field(default_factory=dict)


def evaluate_groups(alg, round_: int, *, seed: int, with_val: bool) -> Evaluation:
    """Personalize and evaluate train clients (test, val) and holdout clients (test)."""
    store = alg.store
    groups: dict[str, GroupEval] = {}
    for name, role in (("train", ROLE_TRAIN), ("holdout", ROLE_HOLDOUT)):
        clients = store.clients(role)
        if len(clients) == 0:
            continue
        splits = ("test", "val") if name == "train" and with_val else ("test",)
        # Holdout clients get predict's protocol with predict's draws (a fresh NEW_CLIENT_STREAM), not
        # draws left over from the train group: metrics.json's holdout numbers equal predict's.
        gen = torch_generator(seed, f"evaluate-{round_}" if name == "train" else NEW_CLIENT_STREAM)
        evals, _, _ = personalize_and_evaluate(alg, clients, splits, gen)
        groups[name] = evals["test"]
        if "val" in evals:
            groups["val"] = evals["val"]
    return Evaluation(round_, groups)


def evaluation_rows(ev: Evaluation) -> list[list]:
    rows = []
    for group, summary in ev.summaries().items():
        for metric in ("mean_accuracy", "pooled_accuracy", "mean_accuracy_lm", "pooled_accuracy_lm", "loss"):
            rows.append([ev.round, group, metric, summary[metric]])
    return rows


def run_rounds(alg, cfg, *, resume: dict | None = None, on_checkpoint: Callable[[dict], None] | None = None,
               on_progress: Callable[[int, int, dict], None] | None = None) -> TrainOutcome:
    """Train ``alg`` for ``cfg.rounds`` rounds (none for non-federated algorithms).

    Parameters
    ----------
    alg : pfl_cli.algorithms.Algorithm
    cfg : TrainConfig
    resume : dict, optional
        A checkpoint previously passed to ``on_checkpoint``; training continues after it.
    on_checkpoint : callable(dict), optional
        Receives a checkpoint (plain dicts, lists and tensors) every ``checkpoint_every``
        rounds; the caller stores it.
    on_progress : callable(done, total, status), optional
    """
    import torch

    store = alg.store
    train_clients = torch.as_tensor(store.clients(ROLE_TRAIN), device=store.device)
    if len(train_clients) == 0:
        raise RunError("training needs train clients (role 0); the partition has none.")
    total = cfg.rounds if alg.federated else 0
    # Under DP, choosing a round by accuracy on private clients would be an unaccounted release:
    # the model is the last round's.
    with_val = cfg.val_fraction > 0 and int(store.val.length.sum()) > 0 and alg.dp is None
    every_ckpt = cfg.checkpoint_every or cfg.eval_every
    start, history, best, loss_acc, last_ckpt = 0, [], None, [0.0, 0], None
    private = alg.dp is not None
    if private:  # no round is released twice: a resumed run continues after the last released round
        every_ckpt = 1
    conditions = _conditions(alg, cfg)  # federation conditions (pfl_cli.fl.conditions), None when none is set
    if resume is not None and resume.get("private_run"):
        restore(lambda state: restore_private(alg, state), resume, "--resume: the checkpoint's state",
                fix="Delete the checkpoint folder and run without --resume to start over.")
        start = last_ckpt = int(resume["round"])
    elif resume is not None:
        restore(lambda state: _load_resume(alg, state, conditions), resume, "--resume: the checkpoint's state",
                fix="Delete the checkpoint folder and run without --resume to start over.")
        start, history, loss_acc = int(resume["round"]), list(resume["history"]), list(resume["loss_acc"])
        best = resume["best"]
        last_ckpt = start
    if total:
        alg.check_trainable(train_clients)
    latest: dict[str, float] = {}
    randomness = train_randomness(cfg)  # under --dp: OS entropy unless noise=seeded (issue 21)
    for t in range(start, total):
        gen = randomness.torch(f"round-{t}")
        if conditions is None:
            cohort = alg.sample_cohort(train_clients, alg.cohort_size(t, total, len(train_clients)), gen)
            loss = alg.run_round(t, cohort, gen)
            alg.traffic.close_round(len(cohort))
        else:  # who is online, who answers, how much work they finish, and the simulated clock
            cohort, loss, rows = conditions.run_round(alg, t, train_clients, gen, total)
            history.extend(rows)
        mean_loss = float(loss.mean()) if len(loss) else float("nan")  # a Poisson cohort may be empty
        if private and not released_state_finite(alg):  # judged on the released model, never on the private loss
            raise TrainingDiverged(t + 1, None, last_ckpt)
        if not private and len(loss) and not np.isfinite(mean_loss):
            raise TrainingDiverged(t + 1, mean_loss, last_ckpt)
        if len(loss):
            loss_acc = [loss_acc[0] + mean_loss, loss_acc[1] + 1]
        done = t + 1
        if done % cfg.eval_every == 0 or done == total:
            history.append([done, "train", "train_loss", loss_acc[0] / max(loss_acc[1], 1)])
            loss_acc = [0.0, 0]
            ev = evaluate_groups(alg, done, seed=cfg.seed, with_val=with_val)
            history.extend(evaluation_rows(ev))
            if conditions is not None:
                history.extend(conditions.evaluation_rows(done))
            if alg.byzantine is not None:  # honest clients' accuracy, the backdoor's success (pfl_cli.fl.byzantine)
                history.extend(alg.byzantine.evaluation_rows(alg, ev, done))
            history.extend([done, g, name, value] for g, d in alg.diagnostics().items() for name, value in d.items())
            best = _select(best, ev, alg, with_val)
            latest = {g: s["mean_accuracy_lm" if cfg.label_mask else "mean_accuracy"]
                      for g, s in ev.summaries().items()}
        if on_checkpoint is not None and (done % every_ckpt == 0 or done == total):
            on_checkpoint(private_snapshot(alg, done, cfg.dp_noise) if private else
                          {"round": done, "algorithm_name": alg.name, "algorithm": alg.state(),
                           "history": [list(r) for r in history],
                           "loss_acc": list(loss_acc), "best": best, "traffic": alg.traffic.state(),
                           **({} if conditions is None else {"conditions": conditions.state()})})
            last_ckpt = done
        if on_progress is not None:
            on_progress(done, total, {"loss": mean_loss, **latest})
    if total == 0 or (private and best is None):  # (a --dp resume of a finished run keeps no evaluation)
        ev = evaluate_groups(alg, total, seed=cfg.seed, with_val=with_val)
        history.extend(evaluation_rows(ev))
        if alg.byzantine is not None:
            history.extend(alg.byzantine.evaluation_rows(alg, ev, total))
        best = _select(None, ev, alg, with_val)
    if best is None:  # rounds fewer than one evaluation period never happens (last round evaluates)
        raise RunError("no evaluation ran; set --eval-every to at most --rounds.")
    ev = _evaluation_from(best["evaluation"])
    return TrainOutcome(weights=best["weights"], history=history, best=ev, last_round=total,
                        selection="val" if with_val else "last",
                        extra={} if conditions is None else {"conditions": conditions.summary()})


def _conditions(alg, cfg):
    """The run's federation conditions, or None when every condition key is at its default."""
    from pfl_cli.fl.conditions.settings import conditions_active

    if not (conditions_active(cfg) or getattr(alg, "asynchronous", False)) or not alg.federated:
        return None  # (an asynchronous server always runs on the simulated clock of the conditions)
    from pfl_cli.fl.conditions.rounds import Conditions

    return Conditions(alg, cfg)


def _load_resume(alg, state: dict, conditions=None) -> None:
    """Restore the algorithm, its traffic and its conditions from a checkpoint; its best model must fit the
    algorithm too."""
    fresh = alg.weights()
    alg.load_state(state["algorithm"])
    alg.traffic.load_state(state["traffic"])
    if conditions is not None:
        conditions.load_state(state["conditions"], alg.device)
    for what, tree in (("its algorithm state", alg.weights()), ("its best model", (state["best"] or {}).get("weights"))):
        mismatch = weights_mismatch(tree, fresh) if tree is not None else None
        if mismatch:
            raise ValueError(f"{what}: {mismatch}")
    if state["best"] is not None:
        _evaluation_from(state["best"]["evaluation"])
        float(state["best"]["score"])


def _evaluation_to(ev: Evaluation) -> dict:
    import torch

    from dataclasses import fields

    # every counted field (the class counts too: a resumed run reports what the uninterrupted one does)
    return {"round": ev.round, "groups": {g: {f.name: torch.as_tensor(getattr(e, f.name)) for f in fields(GroupEval)
                                              if getattr(e, f.name) is not None}
                                          for g, e in ev.groups.items()}}


def _evaluation_from(doc: dict) -> Evaluation:
    groups = {g: GroupEval(**{k: v.numpy() for k, v in d.items()}) for g, d in doc["groups"].items()}
    return Evaluation(int(doc["round"]), groups)


def _select(best: dict | None, ev: Evaluation, alg, with_val: bool) -> dict:
    """Keep the model with the best validation accuracy (the papers' selection), else the latest.

    Ties go to the later round: small validation sets saturate early, and among equally
    accurate models the one trained longer is the better guess.
    """
    key = "pooled_accuracy_lm" if alg.cfg.label_mask else "pooled_accuracy"
    score = ev.summaries()["val"][key] if with_val else float(ev.round)
    if best is None or score >= best["score"]:
        return {"score": score, "round": ev.round, "weights": cpu_tree(alg.weights(), clone=True),
                "evaluation": _evaluation_to(ev)}
    return best
