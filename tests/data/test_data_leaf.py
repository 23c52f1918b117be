"""leaf: loader on tiny FEMNIST and Shakespeare files in LEAF's published JSON layout."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pfl_cli.data import load_dataset
from pfl_cli.data.leaf import SHAKESPEARE_LETTERS
from pfl_cli.errors import DatasetError


def leaf_doc(users):
    """``users`` maps uid -> (xs, ys), in order."""
    return {
        "users": list(users),
        "num_samples": [len(ys) for _, ys in users.values()],
        "hierarchies": ["h"] * len(users),
        "user_data": {uid: {"x": xs, "y": ys} for uid, (xs, ys) in users.items()},
    }


def write_json(path, doc):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def pixels(value):
    return [value] * 784


def make_femnist(root):
    """data/train and data/test with two files each; users keep their ids across pools."""
    write_json(root / "train" / "b_train.json", leaf_doc({"f0003": ([pixels(0.5)], [61])}))
    write_json(root / "train" / "a_train.json", leaf_doc({
        "f0002": ([pixels(1.0), pixels(0.0)], [3, 7]),
        "f0001": ([pixels(0.25)], [0]),
    }))
    write_json(root / "test" / "a_test.json", leaf_doc({"f0002": ([pixels(0.75)], [9])}))
    write_json(root / "test" / "b_test.json", leaf_doc({"f0003": ([pixels(0.125)], [1])}))
    return root


def test_femnist_train_test_pools_clients_and_order(tmp_path):
    ds = load_dataset(f"leaf:{make_femnist(tmp_path / 'data')}")
    assert ds.x.dtype == np.float32 and ds.x.shape == (6, 1, 28, 28)
    assert ds.num_classes == 62 and ds.class_names is None
    # Files sorted by name, users in file order, samples in order; train pool first.
    assert ds.y.tolist() == [3, 7, 0, 61, 9, 1]
    assert ds.client.tolist() == ["f0002", "f0002", "f0001", "f0003", "f0002", "f0003"]
    assert ds.pool.tolist() == [0, 0, 0, 0, 1, 1]
    assert ds.x[:, 0, 0, 0].tolist() == [1.0, 0.0, 0.25, 0.5, 0.75, 0.125]
    assert ds.extra["leaf_task"] == "femnist"


def test_directory_of_json_and_single_file_are_one_pool(tmp_path):
    root = make_femnist(tmp_path / "data")
    ds = load_dataset(f"leaf:{root / 'train'}?task=femnist")
    assert ds.pool is None and ds.num_samples == 4
    ds = load_dataset(f"leaf:{root / 'test' / 'b_test.json'}")
    assert ds.pool is None and ds.client.tolist() == ["f0003"] and ds.y.tolist() == [1]


def test_shakespeare_codes_and_auto_detection(tmp_path):
    line = ("To be, or not to be: that is the question:\nWhether 'tis nobler in the mind to suf")[:80]
    assert len(line) == 80
    path = write_json(tmp_path / "all_data.json", leaf_doc({
        "THE_TRAGEDY_OF_HAMLET_HAMLET": ([line, line[1:] + "f"], ["f", "e"]),
        "KING_LEAR_EDGAR": ([line[::-1]], ["}"]),
    }))
    ds = load_dataset(f"leaf:{path}")
    assert ds.extra["leaf_task"] == "shakespeare"
    assert ds.x.dtype == np.int64 and ds.x.shape == (3, 80)
    assert ds.num_classes == 80 and len(ds.class_names) == 80 and ds.class_names[0] == "\n"
    assert "".join(ds.class_names[c] for c in ds.x[0]) == line
    assert ds.y.tolist() == [SHAKESPEARE_LETTERS.index(c) for c in "fe}"]
    assert ds.client.tolist() == ["THE_TRAGEDY_OF_HAMLET_HAMLET"] * 2 + ["KING_LEAR_EDGAR"]


def test_shakespeare_letter_outside_alphabet(tmp_path):
    path = write_json(tmp_path / "s.json", leaf_doc({"u": (["ab%d"], ["e"])}))
    with pytest.raises(DatasetError, match=r"character '%' is not in LEAF's 80-letter Shakespeare alphabet"):
        load_dataset(f"leaf:{path}")
    path = write_json(tmp_path / "s.json", leaf_doc({"u": (["abé"], ["e"])}))
    with pytest.raises(DatasetError, match=r"character 'é' is not in LEAF's 80-letter"):
        load_dataset(f"leaf:{path}")


def test_num_samples_inconsistent_with_data(tmp_path):
    doc = leaf_doc({"u1": ([pixels(0.0), pixels(1.0)], [1, 2])})
    doc["num_samples"] = [3]
    path = write_json(tmp_path / "bad.json", doc)
    with pytest.raises(DatasetError, match=r"bad.json: user 'u1' must have num_samples = 3 samples in x and y; got \(2, 2\)"):
        load_dataset(f"leaf:{path}")
    doc["num_samples"] = [2, 5]
    write_json(path, doc)
    with pytest.raises(DatasetError, match="users and num_samples must be lists of the same length"):
        load_dataset(f"leaf:{path}")


def test_user_missing_from_user_data(tmp_path):
    doc = leaf_doc({"u1": ([pixels(0.0)], [1])})
    doc["users"].append("ghost")
    doc["num_samples"].append(1)
    path = write_json(tmp_path / "bad.json", doc)
    with pytest.raises(DatasetError, match="user 'ghost' is listed in users but has no x and y in user_data"):
        load_dataset(f"leaf:{path}")


def test_missing_path_empty_directory_and_bad_json(tmp_path):
    with pytest.raises(DatasetError, match="no such file or directory .*missing"):
        load_dataset(f"leaf:{tmp_path / 'missing'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match=r"no \*.json files in .*empty"):
        load_dataset(f"leaf:{tmp_path / 'empty'}")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(DatasetError, match="x.json: not readable JSON"):
        load_dataset(f"leaf:{tmp_path / 'x.json'}")
    write_json(tmp_path / "y.json", {"users": []})
    with pytest.raises(DatasetError, match="a LEAF file is an object with users, num_samples and user_data"):
        load_dataset(f"leaf:{tmp_path / 'y.json'}")


def test_femnist_bad_samples_and_options(tmp_path):
    path = write_json(tmp_path / "f.json", leaf_doc({"u": ([[0.0] * 783], [1])}))
    with pytest.raises(DatasetError, match="FEMNIST samples must be 784 pixel values; sample 0 has 783"):
        load_dataset(f"leaf:{path}")
    path = write_json(tmp_path / "f.json", leaf_doc({"u": ([pixels(0.0)], [62])}))
    with pytest.raises(DatasetError, match=r"label 62 is outside \[0, 62\)"):
        load_dataset(f"leaf:{path}")
    with pytest.raises(DatasetError, match="option task must be one of femnist, shakespeare; got 'celeba'"):
        load_dataset(f"leaf:{path}?task=celeba")
    with pytest.raises(DatasetError, match="Shakespeare x must be strings and y single characters"):
        load_dataset(f"leaf:{path}?task=shakespeare")
    with pytest.raises(DatasetError, match=r"unknown option\(s\) \['users'\]; it takes task"):
        load_dataset(f"leaf:{path}?users=10")


def test_user_twice_in_one_pool_is_refused(tmp_path):
    doc = leaf_doc({"u1": ([pixels(0.0)], [1])})
    write_json(tmp_path / "d" / "all_data_0.json", doc)
    write_json(tmp_path / "d" / "all_data_0_copy.json", doc)
    with pytest.raises(DatasetError, match="user 'u1' appears in both all_data_0.json and all_data_0_copy.json of the same pool"):
        load_dataset(f"leaf:{tmp_path / 'd'}")
