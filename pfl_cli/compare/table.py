"""One comparison table from client groups: per configuration and group, mean and t-interval over seeds,
fairness across clients averaged over seeds; as JSON-ready rows, CSV rows and Markdown.

One headline metric for every row, picked by ``metric`` (:data:`METRICS`); by default per-client test
accuracy *without* label masking, averaged over the clients of the group (clients without a scored
test sample left out), then over seeds. ``balanced_accuracy`` and ``macro_f1`` are averaged the same
way (each client's own, scikit-learn's definitions, :mod:`pfl_cli.fl.evaluate`); ``global_accuracy``
is each run's global model scored on the union of the group's test splits (the "global test set"
of the optimization papers), averaged over seeds. Every metric has its columns whichever is the
headline. The label-masked accuracy is its own, labelled column, never the headline. The fairness
columns are over per-client accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from pfl_cli.compare.paired import TESTS, paired_comparisons
from pfl_cli.compare.runs import ClientGroup
from pfl_cli.compare.stats import FAIRNESS_KEYS, client_fairness, mean_interval

GROUPS = ("train", "new")
GROUP_NAMES = {("train", "train"): "train", ("new", "predict"): "new", ("new", "train"): "new (train eval)"}
# The headline metrics --metric picks: name -> what one run contributes (averaged over seeds).
METRICS = {
    "accuracy": "mean per-client test accuracy without label masking",
    "balanced_accuracy": "mean per-client balanced accuracy (mean recall over the classes of its test labels)",
    "macro_f1": "mean per-client macro-F1 (over the classes of its test labels or predictions)",
    "global_accuracy": "the global model's accuracy on the union of the group's test splits (pooled)",
}
EXTRA_METRICS = ("balanced_accuracy", "macro_f1", "global_accuracy")
CSV_COLUMNS = ("algorithm", "label", "group", "source", "num_seeds", "seeds", "num_clients", "accuracy", "accuracy_ci",
               "accuracy_low", "accuracy_high", "accuracy_lm", "accuracy_lm_ci", *FAIRNESS_KEYS,
               *(c for m in EXTRA_METRICS for c in (m, f"{m}_ci")))
CLIENT_COLUMNS = ("label", "group", "seed", "client_id", "accuracy", "accuracy_lm", "balanced_accuracy", "macro_f1",
                  "global_accuracy")
TITLES = {"accuracy": "accuracy", "balanced_accuracy": "balanced accuracy", "macro_f1": "macro-F1",
          "global_accuracy": "global-model accuracy"}


@dataclass(frozen=True)
class Comparison:
    """The table: ``rows`` (one per configuration and client group) and the client groups they come from."""

    rows: tuple[dict, ...]
    groups: tuple[ClientGroup, ...]
    labels: dict            # group key -> row label
    level: float
    nonprivate: bool
    metric: str = "accuracy"  # the headline (METRICS)
    paired: tuple = ()        # each row against its group's first row (pfl_cli.compare.paired)

    def document(self) -> dict[str, Any]:
        """``table.json``: what the table means, then its rows."""
        return {
            "headline_metric": self.metric,
            "headline": f"{METRICS[self.metric]}, averaged over seeds",
            "metrics": dict(METRICS),
            "label_masked_metric": "accuracy_lm",
            "interval": f"two-sided Student-t, level {self.level:g}, over seeds (half-width; null with one seed)",
            "fairness": "over each run's clients, averaged over seeds: accuracy_std (standard deviation, ddof 0), "
                        "accuracy_worst10 (mean of the ceil(0.1 n) lowest), accuracy_min",
            "level": self.level,
            "nonprivate": self.nonprivate,
            "rows": [dict(r) for r in self.rows],
            "paired_tests": dict(TESTS),
            "paired": [dict(p) for p in self.paired],
        }

    def csv_rows(self) -> list[list]:
        return [[_csv(r[c] if c != "seeds" else " ".join(str(s) for s in r["seeds"])) for c in CSV_COLUMNS]
                for r in self.rows]

    def client_rows(self) -> list[list]:
        """Per-client accuracies of every run (the figure's data): label, group, seed, client_id, accuracy, accuracy_lm."""
        out = []
        for g in self.groups:
            more = [_optional(g, m) for m in ("balanced_accuracy", "macro_f1", "client_global_accuracy")]
            for cid, a, alm, *extra in zip(g.client_id, g.accuracy, g.accuracy_lm, *more):
                out.append([self.labels[g.key], g.group, _csv(g.seed), int(cid), _csv(a), _csv(alm),
                            *(_csv(v) for v in extra)])
        return out

    def markdown(self) -> str:
        pct = f"{100 * self.level:g} %"
        m = self.metric
        head = ["algorithm", "clients", "seeds", f"{TITLES[m]} % (mean ± {pct} CI)",
                *([f"accuracy % (mean ± {pct} CI)"] if m != "accuracy" else []), "std across clients",
                "worst 10 %", "min", f"label-masked accuracy % (mean ± {pct} CI)"]
        lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
        for r in self.rows:
            lines.append("| " + " | ".join([
                r["label"], GROUP_NAMES[(r["group"], r["source"])], str(r["num_seeds"]),
                format_interval(r[m], r[f"{m}_ci"]),
                *([format_interval(r["accuracy"], r["accuracy_ci"])] if m != "accuracy" else []),
                format_pct(r["accuracy_std"]), format_pct(r["accuracy_worst10"]),
                format_pct(r["accuracy_min"]), format_interval(r["accuracy_lm"], r["accuracy_lm_ci"])]) + " |")
        return "\n".join(lines) + "\n\n" + self.caption() + "\n" + self.paired_markdown()

    def caption(self) -> str:
        """What the main table's numbers are."""
        pct = f"{100 * self.level:g} %"
        m = self.metric
        what = (METRICS[m][0].upper() + METRICS[m][1:]) if m != "accuracy" else \
            "Mean per-client test accuracy (no label masking)"
        caption = (f"{what} (%) over seeds, ± the half-width of the {pct} "
                   "Student-t interval (n/a with one seed); fairness columns over each run's clients' accuracy "
                   "(standard deviation in points, mean of the worst 10 % of clients, minimum), averaged over seeds. "
                   "train: the training clients; new: clients never trained on (predict --clients holdout; "
                   "'train eval': the train run's own holdout evaluation).")
        if self.nonprivate:
            caption += (" NONPRIVATE: some runs are --dp runs whose accuracies come from their nonprivate files, "
                        "not covered by the DP guarantee.")
        return caption

    def paired_markdown(self) -> str:
        """The paired comparisons as a second table ("" when there is nothing to pair)."""
        if not self.paired:
            return ""
        lines = ["", "| algorithm | vs | clients | over | pairs | difference (points) | paired t p | Wilcoxon p |",
                 "|---|---|---|---|---:|---:|---:|---:|"]
        for p in self.paired:
            for c in (p["by_seed"], p["by_client"]):
                lines.append("| " + " | ".join([
                    p["label"], p["reference"], p["group"], f"{c['over']} ({TITLES[c.get('metric', p['metric'])]})",
                    str(c["pairs"]), format_points(c["mean_difference"]), format_p(c["p_values"]["paired_t"]),
                    format_p(c["p_values"]["wilcoxon"])]) + " |")
        return "\n".join(lines) + ("\n\nPaired comparisons against the first configuration: over the seeds both "
                                   "ran (one headline number a seed) and over the clients both scored (each client's "
                                   "accuracy averaged over those seeds); two-sided p-values of the paired t-test and "
                                   "the Wilcoxon signed-rank test (- : fewer than two pairs, or no difference).\n")


def _csv(value) -> Any:
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        return "" if not np.isfinite(value) else float(value)
    return value


def format_pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def format_points(value) -> str:
    return "-" if value is None else f"{100 * value:+.1f}"


def format_p(value) -> str:
    return "-" if value is None else (f"{value:.3f}" if value >= 0.001 else f"{value:.1e}")


def format_interval(mean, half) -> str:
    if mean is None:
        return "-"
    return f"{100 * mean:.1f} ± {100 * half:.1f}" if half is not None else f"{100 * mean:.1f} ± n/a"


def _labels(groups: Sequence[ClientGroup]) -> dict[str, str]:
    """A row label per configuration: the algorithm's name, plus the keys that tell its configurations apart."""
    configs: dict[str, dict[str, dict]] = {}
    for g in groups:
        configs.setdefault(g.algorithm, {}).setdefault(g.key, dict(g.config))
    labels = {}
    for algorithm, by_key in configs.items():
        if len(by_key) == 1:
            labels.update({k: algorithm for k in by_key})
            continue
        every = sorted({k for c in by_key.values() for k in c})
        differ = [k for k in every if len({repr(c.get(k)) for c in by_key.values()}) > 1]
        for key, config in by_key.items():
            labels[key] = f"{algorithm} ({', '.join(f'{k}={_short(config.get(k))}' for k in differ)})"
    return labels


def _short(value) -> str:
    return "null" if value is None else (f"{value:g}" if isinstance(value, float) else str(value).replace(" ", ""))


def _mean_finite(values) -> float | None:
    a = np.asarray([np.nan if v is None else v for v in values], dtype=np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else None


def _optional(g: ClientGroup, name: str) -> np.ndarray:
    value = getattr(g, name)
    return value if value is not None else np.full(len(g.client_id), np.nan)


def _mean_of(values: np.ndarray) -> float | None:
    a = values[np.isfinite(values)]
    return float(a.mean()) if a.size else None


def _run_summary(g: ClientGroup) -> dict[str, Any]:
    acc = g.accuracy[np.isfinite(g.accuracy)]
    return {"seed": g.seed, "path": g.path, "num_clients": int(acc.size),
            "accuracy": _mean_of(g.accuracy), "accuracy_lm": _mean_of(g.accuracy_lm),
            "balanced_accuracy": _mean_of(_optional(g, "balanced_accuracy")),
            "macro_f1": _mean_of(_optional(g, "macro_f1")), "global_accuracy": g.global_accuracy,
            **client_fairness(g.accuracy)}


def check_metric(metric: str) -> None:
    """Refuse an unknown headline metric (ConfigError, exit 2), naming the known ones."""
    if metric not in METRICS:
        import difflib

        from pfl_cli.errors import ConfigError

        near = difflib.get_close_matches(str(metric), list(METRICS), n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        raise ConfigError(f"--metric must be one of {', '.join(METRICS)}; got {metric!r}. {hint}Pick one, e.g. "
                          "--metric balanced_accuracy.")


def _check_global(groups: Sequence[ClientGroup]) -> None:
    """--metric global_accuracy: every run of the table has its global model's accuracy."""
    from pfl_cli.errors import InputError

    for g in groups:
        if g.global_accuracy is not None:
            continue
        if g.global_model is False:
            raise InputError(f"--metric global_accuracy: RUN {g.path} ({g.algorithm}) has no global model (its "
                             "clients' models are per-client only: no one model serves them all); compare it with "
                             "--metric accuracy, or leave it out of a global-accuracy table.")
        if g.global_model is True:
            raise InputError(f"--metric global_accuracy: RUN {g.path} ({g.algorithm}) scored no test sample of its "
                             f"{'new' if g.group == 'new' else 'train'} clients with its global model (no labeled "
                             "test sample); compare it with another --metric.")
        raise InputError(f"--metric global_accuracy: RUN {g.path} ({g.algorithm}) holds no global_accuracy (written "
                         "before pflx scored global models); train (and predict) it again with this pflx, or pick "
                         "another --metric.")


def compare(groups: Sequence[ClientGroup], *, level: float = 0.95, metric: str = "accuracy") -> Comparison:
    """The comparison table of ``groups`` (from :func:`pfl_cli.compare.read_runs`).

    Rows: one per configuration (algorithm and config without the seed, in the order first given)
    and client group (train, then new). New clients come from predict artifacts where the
    configuration has any, else from the train runs' own holdout evaluation (``source``).
    """
    if not 0.0 < level < 1.0:
        from pfl_cli.errors import ConfigError

        raise ConfigError(f"--level must be in (0, 1); got {level!r}.")
    check_metric(metric)
    with_predict = {g.key for g in groups if g.source == "predict"}
    used = tuple(g for g in groups if not (g.group == "new" and g.source == "train" and g.key in with_predict))
    if metric == "global_accuracy":
        _check_global(used)
    labels = _labels(used)
    order = list(dict.fromkeys(g.key for g in used))
    rows = []
    for key in order:
        for group in GROUPS:
            members = sorted((g for g in used if g.key == key and g.group == group),
                             key=lambda g: (g.seed is None, g.seed if g.seed is not None else 0))
            if not members:
                continue
            runs = [_run_summary(g) for g in members]
            mean, half = mean_interval([np.nan if r["accuracy"] is None else r["accuracy"] for r in runs], level)
            mean_lm, half_lm = mean_interval([np.nan if r["accuracy_lm"] is None else r["accuracy_lm"] for r in runs],
                                             level)
            rows.append({
                "algorithm": members[0].algorithm, "label": labels[key], "group": group, "source": members[0].source,
                "num_seeds": len(members), "seeds": [g.seed for g in members],
                "num_clients": max(r["num_clients"] for r in runs),
                "accuracy": mean, "accuracy_ci": half,
                "accuracy_low": None if half is None else mean - half,
                "accuracy_high": None if half is None else mean + half,
                "accuracy_lm": mean_lm, "accuracy_lm_ci": half_lm,
                **{k: _mean_finite(r[k] for r in runs) for k in FAIRNESS_KEYS},
                **{k: v for m in EXTRA_METRICS for k, v in zip((m, f"{m}_ci"), mean_interval(
                    [np.nan if r[m] is None else r[m] for r in runs], level))},
                "config": dict(members[0].config),
                **({"predict_config": dict(members[0].predict_config or {})} if members[0].source == "predict" else {}),
                "runs": runs,
            })
    return Comparison(rows=tuple(rows), groups=used, labels=labels, level=level,
                      nonprivate=any(g.nonprivate for g in used), metric=metric,
                      paired=tuple(paired_comparisons(rows, used, labels, metric)))
