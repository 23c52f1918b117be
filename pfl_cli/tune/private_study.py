"""`pflx tune --dp`: the private study (Papernot & Steinke, "Hyperparameter tuning with Rényi differential
privacy", ICLR 2022; the mechanism and its accounting: :mod:`pfl_cli.tune.private`).

A secret number of trials K ~ TNB(shape, mean) runs, each a DP training run of a config drawn independently of
every other trial (random search) followed by the Gaussian release of its validation score; only the best
trial's config and noisy score are released (:class:`PrivateStudy`), covered by one ``RepeatAndSelectDpEvent``
(Theorem 2). Nothing else about the trials leaves: not their number (part of the guarantee's randomness), not
their scores or curves (``rows`` only for ``write_nonprivate``, released as non-private).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pfl_cli.errors import RunError
from pfl_cli.tune.plan import Plan, TuneOptions

SELECTION_NOTE_SE = 0.05  # above this standard error the output says that the selection was mostly noise


@dataclass(frozen=True)
class PrivateStudy:
    """What a private study releases: the best config, privacy.json's document, metrics.json; ``rows``: every
    trial's (number, state, noisy score, drawn values), written only on request (``write_nonprivate``)."""

    best_cfg: Any
    privacy: dict
    metrics: dict
    rows: list
    score_standard_error: float


def run_private_study(plan: Plan, o: TuneOptions, data, *, prior=None,
                      note: Callable[[str], None] = lambda _m: None) -> PrivateStudy:
    """Run the private study of ``plan`` on ``data`` (:func:`pfl_cli.tune.plan.tuning_data`, carved under the
    study's noise mode). ``prior``: the ledger of the private study whose best.yaml is ``--config`` (on the same
    partition): this study's release is a function of that one's too, so its privacy.json lists that study's
    events first. ``note(line)``: the one status line (no progress: a count of finished trials would tell K)."""
    from pfl_cli.fl.api import train_federated, validate_train_config
    from pfl_cli.fl.loop import TrainingDiverged
    from pfl_cli.privacy.events import event_key
    from pfl_cli.privacy.ledger import PrivacyLedger
    from pfl_cli.privacy.randomness import SecureNumpyGenerator, statement
    from pfl_cli.tune.private import (draw_trial_count, release_score, repeat_and_select, score_events,
                                      score_standard_error)

    cfg = plan.cfg
    seeded = cfg.dp_noise == "seeded"
    # K, the candidates and the score noise: OS entropy (an adversary holding the artifact holds the seed).
    rng = np.random.default_rng([cfg.seed, 0x7E5E]) if seeded else SecureNumpyGenerator()
    k = draw_trial_count(float(o.trials), o.dp_shape, rng)
    group, metric = plan.objective["group"], plan.objective["metric"]
    best, reference, trial_events, rows = None, None, None, []
    # No progress lines: a count of finished trials, or a line per trial, would tell K.
    note(f"private study: a secret number of trials (mean {o.trials}) runs; only the best config is released.")
    for i in range(k):
        values = draw(plan.params, rng)
        tcfg = dataclasses.replace(plan.trial_cfg, **values)
        validate_train_config(tcfg)
        try:
            run = train_federated(data.x, data.y, data.num_classes, data.partition, tcfg, labeled=data.labeled,
                                  vocab_size=data.vocab_size)
        except TrainingDiverged:
            # The released model stopped being finite: this run outputs "no score" (data-independent bottom).
            rows.append([i, "fail", None, *values.values()])
            continue
        events = run.dp.ledger().events
        key = event_key(repeat_and_select(events, 2.0, 1.0))
        if reference is None:
            reference, trial_events = key, tuple(events)
        elif key != reference:  # the searched keys are checked up front; this guards the rule itself
            raise RunError("tune --dp: two trials ran different DP mechanisms; nothing was written.")
        ev = run.outcome.best.groups.get(group)
        acc = np.zeros(0) if ev is None else ev.accuracy(metric.endswith("_lm"))
        score = release_score(acc, o.dp_score_noise, rng)
        rows.append([i, "complete", score["score"], *values.values()])
        if best is None or score["score"] > best[0]:
            best = (score["score"], values, score)
    if best is None or trial_events is None:
        raise RunError("tune --dp: no trial produced a finite model; nothing was written. Lower --lr or raise "
                       "the clip bound, and run again (a run that releases nothing costs no privacy).")
    ledger = PrivacyLedger(cfg.algorithm_class.dp_unit, cfg.dp_delta,
                           (repeat_and_select(list(trial_events) + score_events(o.dp_score_noise),
                                              float(o.trials), o.dp_shape),),
                           notes=(f"pflx tune --dp: truncated negative binomial number of trials (mean {o.trials}, "
                                  f"shape {o.dp_shape}), each a DP training run plus a Gaussian release (noise "
                                  f"multiplier {o.dp_score_noise}) of its validation score; the best is released "
                                  "(Papernot & Steinke 2022)",), accountant="rdp")
    if prior is not None:
        ledger = prior.compose(ledger)
    doc = ledger.to_dict(accountant="rdp")
    # Post-processing of the released noisy score and count: how far apart two trials must be to be told apart.
    se = score_standard_error(o.dp_score_noise, best[2]["noisy_count"], min(max(best[2]["score"], 0.0), 1.0))
    metrics = {"algorithm": cfg.algorithm, "objective": plan.objective,
               "best": {"params": best[1], "noisy_score": best[2]["score"],
                        "noisy_sum": best[2]["noisy_sum"], "noisy_count": best[2]["noisy_count"]},
               "space": {p.key: p.spec() for p in plan.params}, "sampler": plan.sampler, "pruner": plan.pruner,
               "dp": {"unit": doc["unit"], "epsilon": doc["epsilon"], "delta": doc["delta"],
                      "trial_epsilon": cfg.dp_epsilon, "mean_trials": o.trials, "shape": o.dp_shape,
                      "score_noise_multiplier": o.dp_score_noise, "score_standard_error": se,
                      "noise": cfg.dp_noise, "composes_config_study": prior is not None}}
    return PrivateStudy(best_cfg=dataclasses.replace(cfg, **best[1]), privacy={**doc, **statement(cfg.dp_noise)},
                        metrics=metrics, rows=rows, score_standard_error=se)


def draw(params, rng) -> dict:
    """One candidate, drawn independently of every other trial (random search over the space)."""
    out = {}
    for p in params:
        if p.kind == "log":
            out[p.key] = float(np.exp(rng.uniform(np.log(p.low), np.log(p.high))))
        elif p.kind == "float":
            out[p.key] = float(rng.uniform(p.low, p.high))
        elif p.kind == "int":
            out[p.key] = int(rng.integers(int(p.low), int(p.high) + 1))
        else:
            out[p.key] = p.choices[int(rng.integers(len(p.choices)))]
    return out
