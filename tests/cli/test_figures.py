"""The figures `--plot` and `show --plot` draw, read back from the matplotlib figure before it is saved:
integer round ticks, the run named in the titles, the train/holdout boundary marked, the accuracy axis fitted
to the clients' accuracies (issue 34, item 14)."""

from __future__ import annotations

import csv
import json

import pytest

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed; make test installs it")

from pfl_cli.cli import figures  # noqa: E402


@pytest.fixture
def drawn(monkeypatch):
    """The figures passed to ``figures._save`` (still open), in order."""
    kept = []
    real = figures._save

    def save(fig, path):
        kept.append(fig)
        import io

        fig.savefig(io.BytesIO(), format="png")  # lay it out as saving does, then save for real
        real(fig, path)

    monkeypatch.setattr(figures, "_save", save)
    return kept


def _write_csv(path, header, rows):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def test_curves_have_integer_round_ticks_and_name_the_run(tmp_path, drawn):
    run = tmp_path / "pefll-s3"
    run.mkdir()
    rows = [[r, g, "mean_accuracy", 0.5 + r / 200] for r in (1, 2) for g in ("train", "holdout")]
    rows += [[r, "train", "loss", 1.0 / r] for r in (1, 2)]
    _write_csv(run / "metrics.csv", ["round", "group", "metric", "value"], rows)
    (run / "metrics.json").write_text(json.dumps({"algorithm": "pefll", "best_round": 2}))
    figures.training_curves(run / "metrics.csv", run / "metrics.json", tmp_path / "c.png")
    (fig,) = drawn
    for ax in fig.axes:
        lo, hi = ax.get_xlim()
        ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks  # not 32.5, 37.5
        assert "pefll-s3" in ax.get_title() and "pefll" in ax.get_title()


def test_a_run_drawn_in_its_writers_temporary_directory_is_named_as_its_out():
    assert figures.run_name(figures.Path("/x/runs/.pefll.tmp-ab_12c/metrics.csv")) == "pefll"
    assert figures.run_name(figures.Path("/x/runs/pefll/metrics.csv")) == "pefll"


def test_partition_heatmap_marks_where_holdout_clients_begin(tmp_path, drawn):
    rows = [[j, 1 if j >= 7 else 0, 10, 3, j, 10 - j] for j in range(10)]
    _write_csv(tmp_path / "stats.csv", ["client_id", "role", "n_train", "n_test", "class_0", "class_1"], rows)
    figures.partition_heatmap(tmp_path / "stats.csv", tmp_path / "stats.json", tmp_path / "p.png")
    ax = drawn[0].axes[0]
    marks = [line.get_ydata()[0] for line in ax.lines]
    assert 6.5 in marks  # 7 train clients (rows 0-6), then the holdout clients
    assert "holdout" in " ".join(t.get_text() for t in ax.texts) + ax.get_ylabel()


def test_client_histogram_fits_its_axis_to_the_accuracies(tmp_path, drawn):
    rows = [[j, 1, 20, 10, 0.8 + 0.02 * j, 0.85 + 0.01 * j] for j in range(10)]
    _write_csv(tmp_path / "clients.csv", ["client_id", "role", "n_train", "n_test", "accuracy", "accuracy_lm"], rows)
    (tmp_path / "metrics.json").write_text(json.dumps({"algorithm": "pefll", "clients": "holdout"}))
    figures.client_accuracy_histogram(tmp_path / "clients.csv", tmp_path / "metrics.json", tmp_path / "h.png")
    ax = drawn[0].axes[0]
    lo, hi = ax.get_xlim()
    assert 70 <= lo <= 80 and hi == 100  # the clients lie in 80-98 %: not squeezed into a fifth of 0-100
    heights = [p.get_height() for p in ax.patches if p.get_height() > 0]
    assert len(heights) >= 8  # bins fine enough to tell the clients apart
