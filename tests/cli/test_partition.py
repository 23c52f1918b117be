"""`pflx partition` end to end on real directories, read back as DESIGN.md section 3 describes."""

import csv
import json

import numpy as np
import pytest


def read_partition_as_documented(path):
    """A reader that knows only DESIGN.md section 3."""
    manifest = json.loads((path / "manifest.json").read_text())
    dataset = json.loads((path / "dataset.json").read_text())
    with np.load(path / "clients.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    with open(path / "stats.csv") as fh:
        rows = list(csv.DictReader(fh))
    stats = json.loads((path / "stats.json").read_text())
    n = len(arrays["client_id"])
    for split in ("train", "test"):
        off, idx = arrays[f"{split}_offsets"], arrays[f"{split}_indices"]
        assert off.dtype == np.int64 and idx.dtype == np.int64 and off.shape == (n + 1,)
        assert off[0] == 0 and off[-1] == len(idx) and (np.diff(off) >= 0).all()
        assert len(idx) == 0 or (0 <= idx.min() and idx.max() < dataset["num_samples"])
    assert arrays["role"].dtype == np.uint8 and set(np.unique(arrays["role"])) <= {0, 1}
    assert [r["client_id"] for r in rows] == [str(c) for c in arrays["client_id"]]
    assert list(rows[0])[:4] == ["client_id", "role", "n_train", "n_test"]
    assert len(rows[0]) == 4 + dataset["num_classes"]
    for r, a, b in zip(rows, np.diff(arrays["train_offsets"]), np.diff(arrays["test_offsets"])):
        assert int(r["n_train"]) == a and int(r["n_test"]) == b
        assert sum(int(r[f"class_{c}"]) for c in range(dataset["num_classes"])) == a
    assert manifest["stage"] == "partition" and manifest["schema"] == 1
    return manifest, dataset, arrays, rows, stats


@pytest.fixture
def digits_npz(tmp_path):
    from sklearn.datasets import load_digits

    d = load_digits()
    path = tmp_path / "digits.npz"
    pool = (np.arange(len(d.target)) >= 1500).astype(np.uint8)
    np.savez(path, x=d.data.astype(np.float32), y=d.target, pool=pool)
    return path


@pytest.mark.parametrize(
    "flags",
    [
        ["--dirichlet", "0.1"],
        ["--scheme", "dirichlet", "--alpha", "0.5", "--self-balancing", "--min-size", "10"],
        ["--iid"],
        ["--classes-per-client", "2", "--assign", "deterministic"],
        ["--shards-per-client", "2"],
        ["--quantity", "lognormal:0.5"],
        ["--quantity", "dirichlet:1.0", "--dirichlet", "0.3"],
        ["--dirichlet", "0.1", "--holdout-clients", "0.2", "--test-fraction", "0.3"],
    ],
    ids=lambda f: " ".join(f),
)
def test_every_scheme_writes_a_valid_artifact(cli, tmp_path, flags):
    out = tmp_path / "part"
    res = cli("partition", "--dataset", "builtin:digits", "--num-clients", 50, "--out", out, *flags, "--format", "json")
    assert res.code == 0, res.err
    summary = json.loads(res.out)
    manifest, dataset, arrays, rows, stats = read_partition_as_documented(out)
    assert dataset["num_samples"] == 1797 and dataset["num_classes"] == 10
    assert len(arrays["client_id"]) == 50 == summary["num_clients"]
    every = np.concatenate([arrays["train_indices"], arrays["test_indices"]])
    assert len(every) == len(np.unique(every))
    assert stats["num_clients"] == 50 and "heterogeneity" in stats
    assert manifest["config"]["num_clients"] == 50


def test_documented_command_and_holdout(cli, tmp_path):
    out = tmp_path / "x"
    res = cli("partition", "--dataset", "builtin:digits", "--dirichlet", "0.1", "--num-clients", 50,
              "--holdout-clients", 10, "--out", out)
    assert res.code == 0 and "dirichlet" in res.out
    _, _, arrays, _, stats = read_partition_as_documented(out)
    assert arrays["role"].sum() == 10 and stats["num_holdout_clients"] == 10


def test_same_seed_byte_identical_other_seed_differs(cli, tmp_path):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert cli("partition", "--dirichlet", "0.3", "-n", 20, "--seed", seed, "--out", tmp_path / name, "--plot").code == 0
    a, b, c = ((tmp_path / n / "clients.npz").read_bytes() for n in "abc")
    assert a == b and a != c
    assert (tmp_path / "a" / "stats.csv").read_bytes() == (tmp_path / "b" / "stats.csv").read_bytes()
    assert (tmp_path / "a" / "partition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rerun_is_noop_and_change_needs_force(cli, tmp_path):
    out = tmp_path / "p"
    assert cli("partition", "--dirichlet", "0.3", "--out", out).code == 0
    stamp = (out / "manifest.json").read_text()
    res = cli("partition", "--dirichlet", "0.3", "--out", out, "--format", "json")
    assert res.code == 0 and json.loads(res.out)["up_to_date"] is True
    assert (out / "manifest.json").read_text() == stamp
    res = cli("partition", "--dirichlet", "0.5", "--out", out)
    assert res.code == 2 and "Pass --force" in res.err
    assert cli("partition", "--dirichlet", "0.5", "--out", out, "--force").code == 0
    assert json.loads((out / "manifest.json").read_text())["config"]["alpha"] == 0.5


def test_config_file_and_set_precedence(cli, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("partition:\n  num-clients: 7\n  alpha: 0.2\nseed: 3\n")
    out = tmp_path / "p"
    assert cli("partition", "--config", cfg, "--num-clients", 9, "--set", "seed=4", "--out", out).code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["config"]["num_clients"], manifest["config"]["alpha"], manifest["seed"]) == (9, 0.2, 4)


def test_official_test_pool_is_matched(cli, tmp_path, digits_npz):
    out = tmp_path / "p"
    assert cli("partition", "--dataset", f"npz:{digits_npz}", "--classes-per-client", 2, "-n", 10, "--out", out).code == 0
    _, dataset, arrays, _, stats = read_partition_as_documented(out)
    assert dataset["has_test_pool"] is True
    assert (arrays["train_indices"] < 1500).all() and (arrays["test_indices"] >= 1500).all()
    assert "official test pool" in stats["scheme_info"]["test_split"]


def _bad_npz(tmp_path, **arrays):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    return f"npz:{path}"


@pytest.mark.parametrize(
    "make_args, match",
    [
        (lambda t: ["--scheme", "bogus"], "scheme must be one of"),
        (lambda t: ["--dirichlet", "0"], "--dirichlet / --alpha: alpha must be > 0"),  # the flag named (issue 34)
        (lambda t: ["--dirichlet", "-0.5"], "alpha must be > 0"),
        (lambda t: ["--num-clients", 5000], "more than the 1797 samples"),
        (lambda t: ["--dirichlet", "0.1", "--min-size", 500], "no partition can meet it"),
        (lambda t: ["--dataset", f"npz:{t / 'missing.npz'}"], "no such file"),
        (lambda t: ["--dataset", "nosuch:thing"], "unknown dataset scheme 'nosuch'"),
        (lambda t: ["--dataset", _corrupt(t)], "not a readable .npz"),
        (lambda t: ["--dataset", _bad_npz(t, x=np.ones((4, 2)), y=np.array([0.5, 1, 2, 3]))], "labels must be integers"),
        (lambda t: ["--dataset", _bad_npz(t, x=np.ones((4, 2)), y=np.array([0, -2, 2, 3]))], "non-negative integers, or -1 for an unknown label"),
        (lambda t: ["--dataset", _bad_npz(t, x=np.array([[np.nan, 1], [1, 1], [1, 1], [1, 1]]), y=np.arange(4))], "NaN"),
        (lambda t: ["--iid", "--dirichlet", "0.1"], "conflicts with the options of scheme 'dirichlet'"),
    ],
)
def test_bad_input_one_line_exit_2_and_no_output(cli, tmp_path, make_args, match):
    out = tmp_path / "out"
    res = cli("partition", "--out", out, "-n", 4, *make_args(tmp_path)) if "--num-clients" not in make_args(tmp_path) \
        else cli("partition", "--out", out, *make_args(tmp_path))
    assert res.code == 2, res.err
    assert match in res.err and res.err.count("\n") == 1 and res.out == ""
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def _corrupt(tmp_path):
    path = tmp_path / "corrupt.npz"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    return f"npz:{path}"


def test_out_that_is_a_file(cli, tmp_path):
    target = tmp_path / "f"
    target.write_text("keep")
    res = cli("partition", "--out", target)
    assert res.code == 2 and "is a file" in res.err and target.read_text() == "keep"


def test_repair_is_recorded_and_warned(cli, tmp_path):
    out = tmp_path / "p"
    res = cli("partition", "--dirichlet", "0.05", "-n", 60, "--min-size", 20, "--out", out)
    assert res.code == 0 and "pflx: warning:" in res.err and "moved" in res.err
    stats = json.loads((out / "stats.json").read_text())
    assert stats["scheme_info"]["repaired"] is True and stats["train_size"]["min"] >= 20 * 0.8 - 1


@pytest.fixture
def natural_npz(tmp_path):
    """Digits' first 300 samples over 6 natural clients (a client column)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    path = tmp_path / "natural.npz"
    np.savez(path, x=d.data[:300].astype(np.float32), y=d.target[:300], client=np.arange(300) % 6)
    return path


@pytest.mark.parametrize("flags, clients", [(["--scheme", "natural"], 6), (["--natural-id"], 6),
                                            (["--natural-id", "--group-size", "4"], 2)])
def test_natural_scheme_records_the_datas_client_count(cli, tmp_path, natural_npz, flags, clients):
    """``--scheme natural`` without --num-clients recorded the default 10 clients, and train refused the partition."""
    from pfl_cli.readers.artifact import load_partition

    out = tmp_path / "part"
    res = cli("partition", "--dataset", f"npz:{natural_npz}", "--out", out, *flags, "--format", "quiet")
    assert res.code == 0, res.err
    manifest, _, arrays, _, _ = read_partition_as_documented(out)
    assert manifest["config"]["num_clients"] == clients == len(arrays["client_id"])
    load_partition(out)  # what train reads: accepted


def test_natural_scheme_refuses_a_different_num_clients(cli, tmp_path, natural_npz):
    out = tmp_path / "part"
    res = cli("partition", "--dataset", f"npz:{natural_npz}", "--scheme", "natural", "--num-clients", 4, "--out", out)
    assert res.code == 2 and res.err.count("\n") == 1 and not out.exists()
    assert "num-clients 4 disagrees with the 6 natural clients" in res.err
