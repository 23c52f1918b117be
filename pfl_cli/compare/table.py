"""One comparison table from client groups: per configuration and group, mean and t-interval over seeds,
fairness across clients averaged over seeds; as JSON-ready rows, CSV rows and Markdown.

One headline metric for every row: per-client test accuracy *without* label masking, averaged over
the clients of the group (clients without a scored test sample left out), then over seeds. The
label-masked accuracy is its own, labelled column, never the headline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from pfl_cli.compare.runs import ClientGroup
from pfl_cli.compare.stats import FAIRNESS_KEYS, client_fairness, mean_interval

GROUPS = ("train", "new")
GROUP_NAMES = {("train", "train"): "train", ("new", "predict"): "new", ("new", "train"): "new (train eval)"}
CSV_COLUMNS = ("algorithm", "label", "group", "source", "num_seeds", "seeds", "num_clients", "accuracy", "accuracy_ci",
               "accuracy_low", "accuracy_high", "accuracy_lm", "accuracy_lm_ci", *FAIRNESS_KEYS)
CLIENT_COLUMNS = ("label", "group", "seed", "client_id", "accuracy", "accuracy_lm")


@dataclass(frozen=True)
class Comparison:
    """The table: ``rows`` (one per configuration and client group) and the client groups they come from."""

    rows: tuple[dict, ...]
    groups: tuple[ClientGroup, ...]
    labels: dict            # group key -> row label
    level: float
    nonprivate: bool

    def document(self) -> dict[str, Any]:
        """``table.json``: what the table means, then its rows."""
        return {
            "headline_metric": "accuracy",
            "headline": "mean per-client test accuracy without label masking, averaged over seeds",
            "label_masked_metric": "accuracy_lm",
            "interval": f"two-sided Student-t, level {self.level:g}, over seeds (half-width; null with one seed)",
            "fairness": "over each run's clients, averaged over seeds: accuracy_std (standard deviation, ddof 0), "
                        "accuracy_worst10 (mean of the ceil(0.1 n) lowest), accuracy_min",
            "level": self.level,
            "nonprivate": self.nonprivate,
            "rows": [dict(r) for r in self.rows],
        }

    def csv_rows(self) -> list[list]:
        return [[_csv(r[c] if c != "seeds" else " ".join(str(s) for s in r["seeds"])) for c in CSV_COLUMNS]
                for r in self.rows]

    def client_rows(self) -> list[list]:
        """Per-client accuracies of every run (the figure's data): label, group, seed, client_id, accuracy, accuracy_lm."""
        out = []
        for g in self.groups:
            for cid, a, alm in zip(g.client_id, g.accuracy, g.accuracy_lm):
                out.append([self.labels[g.key], g.group, _csv(g.seed), int(cid), _csv(a), _csv(alm)])
        return out

    def markdown(self) -> str:
        pct = f"{100 * self.level:g} %"
        head = ["algorithm", "clients", "seeds", f"accuracy % (mean ± {pct} CI)", "std across clients",
                "worst 10 %", "min", f"label-masked accuracy % (mean ± {pct} CI)"]
        lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in self.rows:
            lines.append("| " + " | ".join([
                r["label"], GROUP_NAMES[(r["group"], r["source"])], str(r["num_seeds"]),
                format_interval(r["accuracy"], r["accuracy_ci"]), format_pct(r["accuracy_std"]), format_pct(r["accuracy_worst10"]),
                format_pct(r["accuracy_min"]), format_interval(r["accuracy_lm"], r["accuracy_lm_ci"])]) + " |")
        caption = (f"Mean per-client test accuracy (%, no label masking) over seeds, ± the half-width of the {pct} "
                   "Student-t interval (n/a with one seed); fairness columns over each run's clients (standard "
                   "deviation in points, mean of the worst 10 % of clients, minimum), averaged over seeds. "
                   "train: the training clients; new: clients never trained on (predict --clients holdout; "
                   "'train eval': the train run's own holdout evaluation).")
        if self.nonprivate:
            caption += (" NONPRIVATE: some runs are --dp runs whose accuracies come from their nonprivate files, "
                        "not covered by the DP guarantee.")
        return "\n".join(lines) + "\n\n" + caption + "\n"


def _csv(value) -> Any:
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        return "" if not np.isfinite(value) else float(value)
    return value


def format_pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


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


def _run_summary(g: ClientGroup) -> dict[str, Any]:
    acc, acc_lm = g.accuracy[np.isfinite(g.accuracy)], g.accuracy_lm[np.isfinite(g.accuracy_lm)]
    return {"seed": g.seed, "path": g.path, "num_clients": int(acc.size),
            "accuracy": float(acc.mean()) if acc.size else None,
            "accuracy_lm": float(acc_lm.mean()) if acc_lm.size else None, **client_fairness(g.accuracy)}


def compare(groups: Sequence[ClientGroup], *, level: float = 0.95) -> Comparison:
    """The comparison table of ``groups`` (from :func:`pfl_cli.compare.read_runs`).

    Rows: one per configuration (algorithm and config without the seed, in the order first given)
    and client group (train, then new). New clients come from predict artifacts where the
    configuration has any, else from the train runs' own holdout evaluation (``source``).
    """
    if not 0.0 < level < 1.0:
        from pfl_cli.errors import ConfigError

        raise ConfigError(f"--level must be in (0, 1); got {level!r}.")
    with_predict = {g.key for g in groups if g.source == "predict"}
    used = tuple(g for g in groups if not (g.group == "new" and g.source == "train" and g.key in with_predict))
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
                "config": dict(members[0].config),
                **({"predict_config": dict(members[0].predict_config or {})} if members[0].source == "predict" else {}),
                "runs": runs,
            })
    return Comparison(rows=tuple(rows), groups=used, labels=labels, level=level,
                      nonprivate=any(g.nonprivate for g in used))
