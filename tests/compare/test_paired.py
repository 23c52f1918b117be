"""Paired comparisons in `pflx compare` (issue 49, item 5): against scipy called by hand on the same pairs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pfl_cli.compare.runs import ClientGroup
from pfl_cli.compare.table import compare

SEEDS = (0, 1, 2)


def _group(lr: float, seed: int, accuracy: np.ndarray, client_id=None) -> ClientGroup:
    ids = np.arange(accuracy.size, dtype=np.int64) if client_id is None else np.asarray(client_id, dtype=np.int64)
    return ClientGroup(path=f"runs/lr{lr}-s{seed}", stage="train", group="train", source="train", algorithm="fedavg",
                       config={"lr": lr}, seed=seed, client_id=ids, accuracy=accuracy, accuracy_lm=accuracy)


def test_paired_tests_over_seeds_and_clients_are_scipys_on_the_shared_pairs():
    rng = np.random.default_rng(0)
    base = {s: rng.uniform(0.4, 0.8, 12) for s in SEEDS}
    better = {s: np.clip(base[s] + rng.normal(0.05, 0.03, 12), 0, 1) for s in SEEDS}
    # the second configuration also ran seed 3 (no pair) and scored one client fewer in seed 0 (NaN)
    better[0][5] = np.nan
    groups = [_group(0.1, s, base[s]) for s in SEEDS] + [_group(0.2, s, better[s]) for s in SEEDS]
    groups.append(_group(0.2, 3, rng.uniform(size=12)))
    table = compare(groups)
    (paired,) = table.paired
    assert paired["seeds"] == list(SEEDS) and paired["reference"].startswith("fedavg (lr=0.1")
    a = np.array([np.nanmean(base[s]) for s in SEEDS])
    b = np.array([np.nanmean(better[s]) for s in SEEDS])
    seeds = paired["by_seed"]
    assert seeds["pairs"] == 3 and seeds["mean_difference"] == pytest.approx(np.mean(b - a))
    assert seeds["p_values"]["paired_t"] == pytest.approx(stats.ttest_rel(b, a).pvalue)
    assert seeds["p_values"]["wilcoxon"] == pytest.approx(stats.wilcoxon(b, a).pvalue)
    ca = np.mean([base[s] for s in SEEDS], axis=0)
    cb = np.nanmean([better[s] for s in SEEDS], axis=0)  # client 5: the mean of the seeds it was scored in
    clients = paired["by_client"]
    assert clients["pairs"] == 12 and clients["mean_difference"] == pytest.approx(np.mean(cb - ca))
    assert clients["p_values"]["paired_t"] == pytest.approx(stats.ttest_rel(cb, ca).pvalue)
    assert clients["p_values"]["wilcoxon"] == pytest.approx(stats.wilcoxon(cb, ca).pvalue)
    doc = table.document()
    assert doc["paired"][0]["by_client"]["pairs"] == 12 and set(doc["paired_tests"]) == {"paired_t", "wilcoxon"}
    md = table.markdown()
    assert "| paired t p | Wilcoxon p |" in md and "Wilcoxon signed-rank" in md


def test_no_difference_and_one_pair_give_no_p_value():
    acc = np.linspace(0.2, 0.9, 6)
    table = compare([_group(0.1, 0, acc), _group(0.2, 0, acc.copy())])
    (paired,) = table.paired
    assert paired["by_seed"]["pairs"] == 1 and paired["by_seed"]["p_values"] == {"paired_t": None, "wilcoxon": None}
    assert paired["by_client"]["mean_difference"] == 0 and paired["by_client"]["p_values"]["wilcoxon"] is None


def test_two_seeds_warn_that_the_interval_says_little():
    from pfl_cli.compare.paired import few_seeds_warnings

    table = compare([_group(0.1, s, np.full(4, 0.3 + 0.4 * s)) for s in (0, 1)])
    (line,) = few_seeds_warnings(table.rows, "accuracy", 0.95)
    assert "2 seeds give a 95 % interval of ±254.1 points from a t multiplier of 12.7 (1 degree of freedom)" in line
    many = compare([_group(0.1, s, np.full(4, 0.5 + 0.01 * s)) for s in range(5)])
    assert few_seeds_warnings(many.rows, "accuracy", 0.95) == []
