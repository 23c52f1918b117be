"""The partitioners Flower users expect: each against a slow, obviously-correct reference, plus bad input."""

from __future__ import annotations

import numpy as np
import pytest

from pfl_cli.errors import ConfigError, InfeasibleError
from pfl_cli.partition import PartitionConfig, partition_labels, validate_config
from pfl_cli.partition._alloc import largest_remainder
from pfl_cli.partition.continuous import continuous_owners, feature_column
from pfl_cli.partition.dirichlet import class_proportions
from pfl_cli.partition.explicit import distribution_counts, distribution_owners, read_distribution, read_sizes, size_owners
from pfl_cli.partition.grouped import group_owners


def _validate(labels, **kw):
    cfg = PartitionConfig(**kw)
    return validate_config(cfg, num_samples=len(labels), num_classes=int(labels.max()) + 1, has_labels=True,
                           has_clients=False, has_test_pool=False)


# ------------------------------------------------------------------ --sizes (SizePartitioner)
def test_size_owners_match_a_per_client_reference():
    sizes = np.array([5, 0 + 1, 12, 7])
    owner = size_owners(40, sizes, np.random.default_rng(3))
    perm = np.random.default_rng(3).permutation(40)
    start = 0
    for j, s in enumerate(sizes):  # reference: client j takes the next s samples of the permutation
        assert sorted(np.flatnonzero(owner == j)) == sorted(perm[start:start + s])
        start += s
    assert np.count_nonzero(owner == -1) == 40 - sizes.sum()


def test_sizes_end_to_end_and_num_clients_from_the_list():
    labels = np.repeat(np.arange(4), 50)
    cfg = _validate(labels, sizes="30,50,20", test_fraction=0.0)
    assert cfg.scheme == "sizes" and cfg.num_clients == 3 and cfg.sizes == [30, 50, 20]
    part = partition_labels(labels, cfg, num_classes=4, rng=np.random.default_rng(0))
    assert part.train_sizes.tolist() == [30, 50, 20]
    assert len(np.unique(part.train_indices)) == 100  # disjoint


def test_sizes_from_a_file(tmp_path):
    (tmp_path / "s.txt").write_text("# one size per line\n4\n6\n")
    assert read_sizes(str(tmp_path / "s.txt")) == [4, 6]
    np.save(tmp_path / "s.npy", np.array([3, 2]))
    assert read_sizes(str(tmp_path / "s.npy")) == [3, 2]


@pytest.mark.parametrize("sizes, err, match", [
    ("100,150", InfeasibleError, "sizes sum to 250 samples, but the train pool has only 200"),
    ("10,0", ConfigError, "sizes must be whole numbers >= 1; got 0"),
    ("10,2.5", ConfigError, "got 2.5"),
    ("10,x", ConfigError, "sizes must hold numbers"),
    ("missing.txt", ConfigError, "no such file"),
])
def test_bad_sizes(sizes, err, match):
    with pytest.raises(err, match=match):
        _validate(np.repeat(np.arange(4), 50), sizes=sizes)


def test_sizes_with_dirichlet_draw_labels_at_those_sizes():
    labels = np.repeat(np.arange(10), 100)
    cfg = _validate(labels, sizes=[100, 300, 50], alpha=0.5, test_fraction=0.0)
    part = partition_labels(labels, cfg, num_classes=10, rng=np.random.default_rng(1))
    assert part.train_sizes.tolist() == [100, 300, 50]


def test_num_clients_disagreeing_with_sizes_is_refused():
    with pytest.raises(ConfigError, match="num-clients 4 disagrees with the 3 clients of sizes"):
        _validate(np.repeat(np.arange(4), 50), sizes="30,50,20", num_clients=4)


# ------------------------------------------------------------------ --distribution (DistributionPartitioner)
def test_distribution_rows_match_per_row_largest_remainder():
    rng = np.random.default_rng(0)
    q = rng.dirichlet(np.full(6, 0.3), size=40)
    sizes = rng.integers(1, 60, size=40)
    counts = distribution_counts(q, np.full(6, 10_000), sizes)
    reference = np.stack([largest_remainder(q[j], int(sizes[j])) for j in range(40)])  # one row at a time
    np.testing.assert_array_equal(counts, reference)


def test_distribution_owners_give_each_client_its_counts():
    labels = np.repeat(np.arange(3), [100, 60, 40])
    q = np.array([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]])
    owner, info = distribution_owners(labels, q, None, 3, np.random.default_rng(0))
    hist = np.stack([np.bincount(labels[owner == j], minlength=3) for j in range(3)])
    # Largest equal size: class 0 is asked 1.7 per unit of size and has 100 -> s = 58.
    assert hist.sum(axis=1).tolist() == [58, 58, 58]
    np.testing.assert_array_equal(hist, np.stack([largest_remainder(q[j], 58) for j in range(3)]))
    assert "largest feasible (58)" in info["client_sizes"]


def test_distribution_beyond_a_class_supply_is_refused_naming_the_class():
    with pytest.raises(InfeasibleError, match="ask for 120 samples of class 1, but the train pool has only 60"):
        distribution_counts(np.array([[0.0, 1.0], [0.5, 0.5]]), np.array([500, 60]), np.array([80, 80]))


def test_distribution_equal_size_below_min_size_is_refused():
    with pytest.raises(InfeasibleError, match="allow clients of at most 50 samples each, below min-size 60"):
        distribution_counts(np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([100, 100]), None, min_size=60)


def test_unknown_group_mode_is_refused():
    with pytest.raises(ConfigError, match="group-mode must be one of allow-smaller, allow-bigger, drop-reminder, strict"):
        validate_config(PartitionConfig(natural_id=True, group_size=2, group_mode="bogus"), num_samples=10, num_classes=2,
                        has_labels=True, has_clients=True, has_test_pool=False)


@pytest.mark.parametrize("rows, match", [
    ("0.5,0.6\n0.5,0.5\n", "row 1 sums to 1.1"),
    ("-0.5,1.5\n0.5,0.5\n", "entries must be >= 0; got -0.5 in row 1, column 1"),
    ("0.5,0.5,0\n0.5,0.5,0\n", "one column per class \\(2\\); got 3 columns"),
    ("0.5,0.5\n1\n", "same number of entries"),
])
def test_bad_distribution_files(tmp_path, rows, match):
    (tmp_path / "q.csv").write_text(rows)
    with pytest.raises(ConfigError, match=match):
        read_distribution(str(tmp_path / "q.csv"), 2)


# ------------------------------------------------------------------ --natural-id --group-size (GroupedNaturalIdPartitioner)
NAMES = np.array(list("abcdefg"))


@pytest.mark.parametrize("mode, expect", [
    ("allow-smaller", ([0, 0, 0, 1, 1, 1, 2], ["a+b+c", "d+e+f", "g"])),
    ("allow-bigger", ([0, 0, 0, 1, 1, 1, 1], ["a+b+c", "d+e+f+g"])),
    ("drop-reminder", ([0, 0, 0, 1, 1, 1, -1], ["a+b+c", "d+e+f"])),
])
def test_grouped_ids_match_the_reference(mode, expect):
    owner = np.array([6, 0, 1, 2, 3, 4, 5, 6, 0])  # sample -> id position
    got_owner, got_names = group_owners(owner, NAMES, 3, mode)
    id_group, names = expect
    assert got_owner.tolist() == [id_group[i] for i in owner]  # reference: look each sample's id up
    assert got_names.tolist() == names


def test_grouped_strict_refuses_a_remainder():
    with pytest.raises(InfeasibleError, match="strict needs group-size 3 to divide the 7 natural ids; 1 are left over"):
        group_owners(np.arange(7), NAMES, 3, "strict")
    assert group_owners(np.arange(6), NAMES[:6], 3, "strict")[1].tolist() == ["a+b+c", "d+e+f"]


def test_grouped_natural_partition_keeps_every_sample_of_an_id_together():
    client = np.repeat(np.array(["u0", "u1", "u2", "u3", "u4"]), 10)
    labels = np.arange(50) % 3
    cfg = validate_config(PartitionConfig(natural_id=True, group_size=2, test_fraction=0.0), num_samples=50, num_classes=3,
                          has_labels=True, has_clients=True, has_test_pool=False)
    part = partition_labels(labels, cfg, num_classes=3, rng=np.random.default_rng(0), client=client)
    assert part.client_name.tolist() == ["u0+u1", "u2+u3", "u4"]
    assert part.train_sizes.tolist() == [20, 20, 10]
    for j in range(3):
        assert set(client[part.train_of(j)]) == set(part.client_name[j].split("+"))


def test_group_size_needs_natural_id():
    with pytest.raises(ConfigError, match="--group-size groups natural ids; it needs --natural-id"):
        _validate(np.zeros(10, dtype=int) + np.arange(10) % 2, group_size=2)


# ------------------------------------------------------------------ --continuous --strictness (ContinuousPartitioner)
def test_continuous_matches_a_per_sample_reference():
    values = np.random.default_rng(5).normal(3.0, 2.0, size=103)
    owner, _ = continuous_owners(values, num_clients=4, strictness=0.7, rng=np.random.default_rng(9))
    noise = np.random.default_rng(9).standard_normal(103)
    mean, std = sum(values) / 103, (sum((v - sum(values) / 103) ** 2 for v in values) / 103) ** 0.5
    score = [0.7 * (v - mean) / std + 0.3 * e for v, e in zip(values, noise)]
    ranked = sorted(range(103), key=lambda i: score[i])
    blocks = np.array_split(np.array(ranked), 4)  # Flower: np.array_split of the sorted indices
    for j, block in enumerate(blocks):
        assert sorted(np.flatnonzero(owner == j)) == sorted(block)


def test_strictness_one_sorts_clients_by_the_column():
    values = np.random.default_rng(0).random(100)
    owner, _ = continuous_owners(values, num_clients=5, strictness=1.0, rng=np.random.default_rng(0))
    for j in range(4):
        assert values[owner == j].max() < values[owner == j + 1].min()


def test_feature_column_by_name_and_index_and_bad_ones():
    x = np.arange(12.0).reshape(4, 3)
    assert feature_column(x, "b", ["a", "b", "c"], "csv:f").tolist() == [1, 4, 7, 10]
    assert feature_column(x, "2", None, "npz:f").tolist() == [2, 5, 8, 11]
    with pytest.raises(ConfigError, match="continuous column 'z' is not a feature of csv:f; give one of"):
        feature_column(x, "z", ["a", "b", "c"], "csv:f")
    with pytest.raises(ConfigError, match=r"index must be in \[0, 3\)"):
        feature_column(x, 3, None, "npz:f")
    with pytest.raises(ConfigError, match="constant"):
        continuous_owners(np.ones(10), num_clients=2, strictness=1.0, rng=np.random.default_rng(0))


@pytest.mark.parametrize("kw, match", [
    ({"continuous": "0"}, "--continuous needs --strictness"),
    ({"continuous": "0", "strictness": 1.5}, r"strictness must be a number in \[0, 1\]"),
    ({"strictness": 0.5}, "--strictness belongs to --continuous"),
])
def test_bad_continuous_options(kw, match):
    with pytest.raises(ConfigError, match=match):
        _validate(np.arange(20) % 2, **kw)


# ------------------------------------------------------------------ per-client alpha (Flower) vs per-class alpha (pflx)
def test_client_alpha_rows_follow_the_dirichlet_moments():
    alpha = np.array([0.5, 1.0, 2.0, 4.5])
    p = class_proportions(np.broadcast_to(alpha, (40_000, 4)), 4, np.random.default_rng(0))
    a0 = alpha.sum()
    np.testing.assert_allclose(p.mean(axis=0), alpha / a0, atol=0.005)
    np.testing.assert_allclose(p.var(axis=0), alpha * (a0 - alpha) / (a0**2 * (a0 + 1)), rtol=0.05)


def test_client_alpha_partition_gives_the_big_alpha_client_most_data():
    labels = np.repeat(np.arange(20), 200)
    cfg = _validate(labels, client_alpha="0.2,0.2,50", test_fraction=0.0)
    assert cfg.scheme == "dirichlet" and cfg.num_clients == 3 and cfg.client_alpha == [0.2, 0.2, 50.0]
    part = partition_labels(labels, cfg, num_classes=20, rng=np.random.default_rng(0))
    assert part.train_sizes[2] > 0.9 * len(labels)


@pytest.mark.parametrize("kw, match", [
    ({"client_alpha": "0.5,0.5", "alpha": 0.1}, "per class\\) and --client-alpha \\(per client"),
    ({"client_alpha": "0.5,-1"}, "client-alpha must list one alpha > 0 per client"),
    ({"client_alpha": "0.5,0.5", "num_clients": 3}, "disagrees with the 2 clients of client-alpha"),
    ({"client_alpha": "1,1", "sizes": "5,5"}, "does not combine with --quantity or --sizes"),
])
def test_bad_client_alpha(kw, match):
    with pytest.raises(ConfigError, match=match):
        _validate(np.arange(40) % 4, **kw)


# ------------------------------------------------------------------ end to end through the CLI
def test_cli_flower_schemes_end_to_end(cli, tmp_path):
    (tmp_path / "q.csv").write_text("\n".join([",".join(["0.1"] * 10)] * 4))
    runs = {
        "sizes": ["--sizes", "100,200,300"],
        "dist": ["--distribution", tmp_path / "q.csv", "--sizes", "50,50,60,40"],
        "alpha": ["--client-alpha", "1,1,1,1,1"],
        "cont": ["--continuous", "20", "--strictness", "0.9", "-n", "4"],
    }
    for name, args in runs.items():
        run = cli("partition", *args, "--test-fraction", "0", "--out", tmp_path / name, "--format", "json")
        assert run.code == 0, run.err
    import json

    assert json.loads((tmp_path / "dist" / "manifest.json").read_text())["config"]["distribution"][0] == [0.1] * 10
    sizes = np.diff(np.load(tmp_path / "dist" / "clients.npz")["train_offsets"])
    assert sizes.tolist() == [50, 50, 60, 40]


def test_cli_bad_sizes_is_one_line_exit_2_and_no_artifact(cli, tmp_path):
    run = cli("partition", "--sizes", "1000,1000", "--out", tmp_path / "p")
    assert run.code == 2 and run.err.count("\n") == 1 and "sizes sum to 2000" in run.err
    assert not (tmp_path / "p").exists()


def test_a_long_inline_list_is_read_as_numbers_not_as_a_file_name():
    # 800 inline numbers are longer than a file name may be: is_file() raised ENAMETOOLONG (an internal error).
    from pfl_cli.partition.explicit import read_sizes

    assert read_sizes(",".join(["1"] * 800)) == [1] * 800
