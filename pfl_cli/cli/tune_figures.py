"""The figures of `pflx tune --plot`: the study's history and a parallel-coordinates view of its trials."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

STATE_COLORS = {"complete": "tab:blue", "pruned": "tab:orange", "fail": "tab:red"}


def tune_figures(header: Sequence[str], rows: Sequence[Sequence], params: Sequence, history: Path,
                 parallel: Path, *, title: str) -> None:
    """history.png: each trial's final validation score (pruned: its last reported value) and the best
    so far; parallel.png: one axis per searched key (log axes where searched on a log scale), a line per
    finished trial coloured by its score."""
    from pfl_cli.cli.figures import _save, pyplot

    plt = pyplot()
    col = {name: i for i, name in enumerate(header)}
    points = []
    for r in rows:
        value = r[col["value"]]
        if value is None and r[col["curve"]]:  # a pruned trial: where its curve stopped
            value = float(str(r[col["curve"]]).split(";")[-1].split(":")[1])
        points.append((int(r[col["number"]]), r[col["state"]], value))
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for state, color in STATE_COLORS.items():
        xs = [n for n, s, v in points if s == state and v is not None]
        ys = [100 * v for n, s, v in points if s == state and v is not None]
        if xs:
            ax.scatter(xs, ys, color=color, label=state, s=28, zorder=3)
    best, line = -math.inf, []
    for n, s, v in sorted(points):
        if s == "complete" and v is not None:
            best = max(best, v)
        line.append((n, 100 * best if math.isfinite(best) else None))
    xs = [n for n, b in line if b is not None]
    if xs:
        ax.step(xs, [b for _, b in line if b is not None], where="post", color="black", lw=1.2, label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    _save(fig, history)

    done = sorted((r for r in rows if r[col["state"]] == "complete" and r[col["value"]] is not None),
                  key=lambda r: float(r[col["value"]]))  # the best drawn last, on top
    values = [float(r[col["value"]]) for r in done]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    fig, ax = plt.subplots(figsize=(2.2 * (len(params) + 1) + 1.5, 4.4))
    cmap = plt.get_cmap("viridis")
    axes_pos = list(range(len(params) + 1))
    scaled = [[_position(p, r[col[p.key]]) for p in params] + [(v - lo) / (hi - lo) if hi > lo else 0.5]
              for r, v in zip(done, values)]
    for ys, v in zip(scaled, values):
        ax.plot(axes_pos, ys, color=cmap((v - lo) / (hi - lo) if hi > lo else 0.5), lw=1.4, alpha=0.85)
    for x, p in enumerate(params):  # each axis labelled with its own range, bottom and top
        low, high = (p.labels[0], p.labels[-1]) if p.kind == "choice" else (f"{p.low:g}", f"{p.high:g}")
        ax.text(x, -0.06, low, ha="center", va="top", fontsize=8)
        ax.text(x, 1.06, high, ha="center", va="bottom", fontsize=8)
    ax.text(len(params), -0.06, f"{100 * lo:.1f}%", ha="center", va="top", fontsize=8)
    ax.text(len(params), 1.06, f"{100 * hi:.1f}%", ha="center", va="bottom", fontsize=8)
    for x in axes_pos:
        ax.axvline(x, color="grey", lw=0.8)
    ax.set_xticks(axes_pos, [f"{p.key}\n({p.kind})" for p in params] + ["validation\naccuracy"], fontsize=9)
    ax.set_yticks([])
    ax.set_ylim(-0.15, 1.15)
    ax.set_xlim(-0.3, len(params) + 0.3)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.set_title(f"{title}\n{len(done)} complete trials, colour = validation accuracy", fontsize=10)
    _save(fig, parallel)


def _position(p, value) -> float:
    """``value`` of searched key ``p`` on its axis, 0 (low) to 1 (high); log keys on a log scale."""
    if p.kind == "choice":
        labels = list(p.labels)
        return labels.index(str(value)) / max(len(labels) - 1, 1) if str(value) in labels else 0.5
    v = float(value)
    if p.kind == "log":
        return (math.log(v) - math.log(p.low)) / (math.log(p.high) - math.log(p.low))
    return (v - p.low) / (p.high - p.low)
