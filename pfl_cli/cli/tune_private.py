"""`pflx tune --dp`: private selection (``pfl_cli.tune.private``) and its artifact.

Released: the best trial's config (``best.yaml``) and its noisy validation score (``metrics.json``),
covered by ``privacy.json`` (one ``RepeatAndSelectDpEvent`` around a trial's training events and its
score release). Nothing else about the trials leaves the run: not their number (it is part of the
guarantee's randomness), not their scores or curves; progress lines name no trial.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from pfl_cli.cli.output import Reporter
from pfl_cli.errors import RunError


def run_private_study(plan, o, data, *, writer, out: Path, report: Reporter, prior=None) -> None:
    """``prior``: the ledger of the private study whose best.yaml is ``--config`` (on the same partition). This
    study's release is a function of that one's too, so its privacy.json lists that study's events first."""
    import yaml

    from pfl_cli.artifacts import MECHANISM, NONPRIVATE, POST_PROCESSING
    from pfl_cli.config import config_to_dict
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
    report.note(f"private study: a secret number of trials (mean {o.trials}) runs; only the best config is released.")
    for i in range(k):
        values = _draw(plan.params, rng)
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
    best_cfg = dataclasses.replace(cfg, **best[1])
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
    with writer:
        head = ("# pflx tune --dp: the released best config of a private study (Papernot & Steinke 2022); "
                "privacy.json covers the whole study.\n")
        writer.save_text("best.yaml", head + yaml.safe_dump(config_to_dict(best_cfg), sort_keys=False),
                         release=MECHANISM)
        writer.save_json("privacy.json", {**doc, **statement(cfg.dp_noise)}, release=POST_PROCESSING)
        writer.save_json("metrics.json", metrics, release=MECHANISM)
        if cfg.write_nonprivate:
            writer.save_csv("nonprivate-trials.csv", ["trial", "state", "noisy_score", *(p.key for p in plan.params)],
                            rows, release=NONPRIVATE)
    _print(report, out, metrics)
    if se > SELECTION_NOTE_SE:
        report.note(f"the released score's standard error is about {100 * se:.1f} points (score noise "
                    f"{o.dp_score_noise:g} over the scored clients): trials closer than about {200 * se:.0f} points "
                    "were told apart by noise, not by the data.")


SELECTION_NOTE_SE = 0.05  # above this standard error the output says that the selection was mostly noise


def _draw(params, rng) -> dict:
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


WITH_PRIOR = " with the one that chose --config"


def _print(report: Reporter, out: Path, m: dict) -> None:
    from rich.table import Table

    dp = m["dp"]
    table = Table(title=f"tune --dp -> {out}: {m['algorithm']}, released best of a private study", title_justify="left",
                  caption=f"whole study{WITH_PRIOR if dp.get('composes_config_study') else ''}: "
                          f"epsilon {dp['epsilon']:.4g} at delta {dp['delta']:g} ({dp['unit']}-level; "
                          f"each trial {dp['trial_epsilon']:g}); the score is a noisy release, standard error "
                          f"about {100 * dp['score_standard_error']:.1f} points", caption_justify="left")
    table.add_column("noisy validation score", justify="right")
    for key in m["best"]["params"]:
        table.add_column(key, justify="right")
    table.add_row(f"{100 * m['best']['noisy_score']:.1f}%",
                  *(f"{v:.4g}" if isinstance(v, float) else str(v) for v in m["best"]["params"].values()))
    report.result({"out": str(out), "up_to_date": False, **m}, table)
