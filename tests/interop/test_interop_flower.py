"""pfl_cli.interop.flower.ArtifactPartitioner: every client of an artifact served to Flower, indices compared."""

from __future__ import annotations

import numpy as np
import pytest


def test_snippet_needs_no_flower_and_names_the_artifact(tmp_path):
    from pfl_cli.interop.flower_snippet import snippet

    text = snippet(tmp_path / "part", "hf:data/femnist?split=train&label=character")
    assert f"ArtifactPartitioner({str(tmp_path / 'part')!r}" in text and "load_from_disk('data/femnist')['train']" in text
    compile(text, "snippet", "exec")  # it is valid Python


@pytest.fixture(scope="module")
def hf_with_pools(tmp_path_factory):
    """A save_to_disk DatasetDict (train 90 rows, test 40) with a `row` column identifying every sample."""
    import datasets

    root = tmp_path_factory.mktemp("flower")
    rng = np.random.default_rng(0)

    def split(n):
        return datasets.Dataset.from_dict({"v": rng.normal(size=(n, 3)).tolist(), "label": (np.arange(n) % 5).tolist(),
                                           "row": list(range(n))})

    datasets.DatasetDict({"train": split(90), "test": split(40)}).save_to_disk(str(root / "dd"))
    return root


@pytest.mark.flower
def test_every_client_of_a_partition_is_served_with_its_indices(cli, hf_with_pools, tmp_path):
    import datasets

    from pfl_cli.artifacts import load_partition
    from pfl_cli.interop.flower import ArtifactPartitioner

    spec = f"hf:{hf_with_pools / 'dd'}?features=v"
    run = cli("partition", "--dataset", spec, "--dirichlet", "0.5", "-n", "6", "--holdout-clients", "2",
              "--out", tmp_path / "p", "--export", "flower", "--format", "json")
    assert run.code == 0, run.err
    part, _, _ = load_partition(tmp_path / "p")
    data = datasets.load_from_disk(str(hf_with_pools / "dd"))
    train = ArtifactPartitioner(tmp_path / "p")
    train.dataset = data["train"]
    test = ArtifactPartitioner(tmp_path / "p", part="test")
    test.dataset = data["test"]  # the official test pool: pflx's rows 90.. are the test split's rows 0..
    assert train.num_partitions == test.num_partitions == 6
    for k in range(6):
        assert train.load_partition(k)["row"] == part.train_of(k).tolist()
        assert test.load_partition(k)["row"] == (part.test_of(k) - 90).tolist()
        assert train.client_id(k) == part.client_id[k]
    holdout = ArtifactPartitioner(tmp_path / "p", clients="holdout")
    holdout.dataset = data["train"]
    assert [holdout.client_id(k) for k in range(2)] == part.client_id[part.role == 1].tolist()


@pytest.mark.flower
def test_a_simulated_artifact_is_served_too(cli, tmp_path):
    from pfl_cli.artifacts import load_partition
    from pfl_cli.data import load_dataset
    from pfl_cli.interop.flower import ArtifactPartitioner, hf_dataset

    assert cli("partition", "--dirichlet", "0.3", "-n", "10", "--out", tmp_path / "p", "--format", "quiet").code == 0
    assert cli("mdm-fit", "--partition", tmp_path / "p", "--components", "1", "--out", tmp_path / "m", "--format", "quiet").code == 0
    assert cli("simulate", "--model", tmp_path / "m", "--dataset", "builtin:digits", "--num-clients", "12",
               "--out", tmp_path / "s", "--format", "quiet").code == 0
    sim, _, _ = load_partition(tmp_path / "s")
    ds = load_dataset("builtin:digits")
    partitioner = ArtifactPartitioner(tmp_path / "s")
    partitioner.dataset = hf_dataset("builtin:digits")
    for k in range(partitioner.num_partitions):
        got = partitioner.load_partition(k)
        np.testing.assert_array_equal(np.asarray(got["x"]), ds.x[sim.train_of(k)].reshape(-1, 64))
        assert got["label"] == ds.y[sim.train_of(k)].tolist()


@pytest.mark.flower
def test_wrong_dataset_and_bad_arguments_are_refused(cli, tmp_path):
    import datasets

    from pfl_cli.interop.flower import ArtifactPartitioner

    assert cli("partition", "-n", "4", "--out", tmp_path / "p", "--format", "quiet").code == 0
    p = ArtifactPartitioner(tmp_path / "p")
    p.dataset = datasets.Dataset.from_dict({"x": [1, 2, 3]})
    with pytest.raises(ValueError, match="the assigned dataset has 3 rows; the artifact's dataset builtin:digits has 1797"):
        p.load_partition(0)
    with pytest.raises(ValueError, match=r"partition_id must be in \[0, 4\); got 4"):
        p.indices(4)
    with pytest.raises(ValueError, match="part must be one of train, test"):
        ArtifactPartitioner(tmp_path / "p", part="val")
    from pfl_cli.errors import ArtifactError

    with pytest.raises(ArtifactError, match="not a pflx artifact"):
        ArtifactPartitioner(tmp_path)


def test_export_flower_is_refused_for_another_tool(cli, tmp_path):
    run = cli("partition", "-n", "4", "--out", tmp_path / "p", "--export", "fedml")
    assert run.code == 2 and "export must be flower; got 'fedml'" in run.err and not (tmp_path / "p").exists()
