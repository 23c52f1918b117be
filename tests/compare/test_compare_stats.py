"""The statistics of `pflx compare` against slow, obvious references: the t-interval by its textbook formula
with tabulated quantiles, fairness by sorting, and the table built from hand-made client groups."""

import math

import numpy as np
import pytest

from pfl_cli.compare import ClientGroup, client_fairness, compare, mean_interval, worst_count

# Two-sided 95 % Student-t quantiles t_{0.975, df}, from a printed table.
T975 = {1: 12.7062047, 2: 4.3026527, 3: 3.1824463, 4: 2.7764451, 9: 2.2621572}


def reference_interval(values):
    n = len(values)
    mean = sum(values) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, T975[n - 1] * s / math.sqrt(n)


@pytest.mark.parametrize("values", [[0.5, 0.7], [0.61, 0.64, 0.59], [0.1, 0.9, 0.5, 0.3, 0.7],
                                    [0.8, 0.81, 0.79, 0.8, 0.82, 0.78, 0.8, 0.83, 0.77, 0.8]])
def test_t_interval_is_the_textbook_formula(values):
    mean, half = mean_interval(values)
    ref_mean, ref_half = reference_interval(values)
    assert mean == pytest.approx(ref_mean, abs=1e-12)
    assert half == pytest.approx(ref_half, rel=1e-6)


def test_one_seed_has_no_interval_not_a_zero_one():
    assert mean_interval([0.42]) == (0.42, None)
    assert mean_interval([0.42, float("nan")]) == (0.42, None)  # a run without a score does not count
    assert mean_interval([]) == (None, None)
    mean, half = mean_interval([0.3, 0.3])
    assert mean == 0.3 and half == 0.0  # two equal seeds: an interval of width 0, defined


def test_other_levels_and_a_bad_level():
    values = [0.1, 0.4, 0.35]
    _, h95 = mean_interval(values)
    _, h99 = mean_interval(values, level=0.99)
    assert h99 > h95  # t_{0.995, 2} = 9.9248
    assert h99 == pytest.approx(9.9248432 * np.std(values, ddof=1) / math.sqrt(3), rel=1e-6)
    with pytest.raises(ValueError, match="level must be in"):
        mean_interval(values, level=1.0)


@pytest.mark.parametrize("n,k", [(1, 1), (5, 1), (10, 1), (11, 2), (20, 2), (21, 3), (30, 3), (100, 10), (0, 0)])
def test_worst_decile_is_ceil_of_a_tenth(n, k):
    assert worst_count(n) == k


def reference_fairness(acc):
    a = sorted(v for v in acc if v == v)
    n = len(a)
    mean = sum(a) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in a) / n)
    k = math.ceil(n / 10)
    return {"accuracy_std": std, "accuracy_worst10": sum(a[:k]) / k, "accuracy_min": a[0]}


@pytest.mark.parametrize("seed", range(5))
def test_fairness_against_sorting(seed):
    rng = np.random.default_rng(seed)
    acc = rng.uniform(size=int(rng.integers(1, 60)))
    acc[rng.uniform(size=acc.size) < 0.1] = np.nan  # clients without test samples
    if np.isnan(acc).all():
        acc[0] = 0.5
    got, ref = client_fairness(acc), reference_fairness(acc.tolist())
    assert got.keys() == ref.keys()
    for key in ref:
        assert got[key] == pytest.approx(ref[key], abs=1e-12)
    assert set(client_fairness(acc, suffix="_lm")) == {f"{k}_lm" for k in ref}


def test_fairness_of_no_client_is_null():
    assert client_fairness([float("nan")]) == {"accuracy_std": None, "accuracy_worst10": None, "accuracy_min": None}


def group(algorithm, seed, acc, *, group="train", source="train", lr=0.1, predict_config=None):
    acc = np.asarray(acc, dtype=float)
    return ClientGroup(path=f"{algorithm}-{lr}-{seed}-{group}-{source}", stage="train" if source == "train" else
                       "predict", group=group, source=source, algorithm=algorithm, config={"algorithm": algorithm,
                                                                                           "lr": lr},
                       seed=seed, client_id=np.arange(acc.size), accuracy=acc, accuracy_lm=np.minimum(acc + 0.1, 1),
                       predict_config=predict_config, input_ref={"sha256": f"{algorithm}{lr}{seed}{group}{source}"})


def test_table_rows_from_client_groups():
    runs = [
        group("fedavg", 0, [0.2, 0.4, 0.6]), group("fedavg", 1, [0.3, 0.5, float("nan")]),
        group("fedavg", 0, [0.1, 0.2], group="new", source="train"),  # superseded: fedavg has predict runs
        group("fedavg", 0, [0.5, 0.7], group="new", source="predict", predict_config={}),
        group("fedavg", 1, [0.4, 0.6], group="new", source="predict", predict_config={}),
        group("fedavg", 0, [0.9, 0.9], lr=0.01),
        group("local", 3, [1.0, 0.0], group="new", source="train"),
    ]
    table = compare(runs)
    got = [(r["label"], r["group"], r["source"], r["seeds"]) for r in table.rows]
    assert got == [("fedavg (lr=0.1)", "train", "train", [0, 1]), ("fedavg (lr=0.1)", "new", "predict", [0, 1]),
                   ("fedavg (lr=0.01)", "train", "train", [0]), ("local", "new", "train", [3])]
    train = table.rows[0]
    per_seed = [0.4, 0.4]  # client means, the NaN client left out
    assert train["accuracy"] == pytest.approx(0.4) and train["accuracy_ci"] == pytest.approx(0.0, abs=1e-12)
    assert train["accuracy_std"] == pytest.approx((np.std([0.2, 0.4, 0.6]) + np.std([0.3, 0.5])) / 2)
    assert train["accuracy_worst10"] == pytest.approx((0.2 + 0.3) / 2) and train["accuracy_min"] == pytest.approx(0.25)
    assert [r["accuracy"] for r in train["runs"]] == pytest.approx(per_seed)
    new = table.rows[1]
    mean, half = reference_interval([0.6, 0.5])
    assert new["accuracy"] == pytest.approx(mean) and new["accuracy_ci"] == pytest.approx(half, rel=1e-6)
    assert new["accuracy_low"] == pytest.approx(mean - half) and new["accuracy_high"] == pytest.approx(mean + half)
    assert table.rows[2]["accuracy_ci"] is None and table.rows[2]["accuracy_low"] is None
    md = table.markdown()
    assert "| fedavg (lr=0.01) | train | 1 | 90.0 ± n/a |" in md
    assert f"| fedavg (lr=0.1) | new | 2 | {100 * mean:.1f} ± {100 * half:.1f} |" in md
    assert "| local | new (train eval) | 1 | 50.0 ± n/a | 50.0 | 0.0 | 0.0 |" in md
    csv_rows = table.csv_rows()
    assert csv_rows[2][8] == "" and csv_rows[0][5] == "0 1"  # undefined interval: empty, not 0
    assert len(table.client_rows()) == 3 + 3 + 2 + 2 + 2 + 2  # the superseded group is not part of the table
