"""csv: loader on tiny files written in tmp_path."""

from __future__ import annotations

import numpy as np
import pytest

from pfl_cli.data import load_dataset
from pfl_cli.errors import DatasetError


def write(tmp_path, text, name="d.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_default_label_column_and_row_order(tmp_path):
    path = write(tmp_path, "a,label,b\n1.5,2,3\n4,0,5\n6,1,-7\n")
    ds = load_dataset(f"csv:{path}")
    assert ds.x.dtype == np.float64 and ds.x.shape == (3, 2)
    np.testing.assert_array_equal(ds.x, [[1.5, 3], [4, 5], [6, -7]])
    assert ds.y.dtype == np.int64 and ds.y.tolist() == [2, 0, 1]
    assert ds.num_classes == 3 and ds.client is None and ds.pool is None
    assert ds.extra["feature_names"] == ["a", "b"]


def test_y_column_is_the_fallback_label_and_integral_floats_pass(tmp_path):
    path = write(tmp_path, "f,y\n0.1,1.0\n0.2,3.0\n")
    ds = load_dataset(f"csv:{path}")
    assert ds.y.tolist() == [1, 3] and ds.num_classes == 4


def test_unlabelled_when_no_label_column(tmp_path):
    path = write(tmp_path, "f1,f2\n1,2\n3,4\n")
    ds = load_dataset(f"csv:{path}")
    assert ds.y is None and ds.x.shape == (2, 2)
    # label= with an empty value forces unlabelled even when a label column exists.
    path = write(tmp_path, "f1,label\n1,2\n3,4\n", "e.csv")
    ds = load_dataset(f"csv:{path}?label=")
    assert ds.y is None and ds.x.shape == (2, 2)


def test_named_label_and_client_columns(tmp_path):
    path = write(tmp_path, "user,f,cls\nu7,0.5,1\n007,0.25,0\nu7,1,1\n")
    ds = load_dataset(f"csv:{path}?label=cls&client=user&num_classes=5")
    assert ds.client.tolist() == ["u7", "007", "u7"]  # kept as str: leading zeros survive
    assert ds.y.tolist() == [1, 0, 1] and ds.num_classes == 5
    assert ds.x.shape == (3, 1)


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match="no such file .*nope.csv"):
        load_dataset(f"csv:{tmp_path / 'nope.csv'}")


def test_empty_file_and_header_only(tmp_path):
    with pytest.raises(DatasetError, match="empty; a header row"):
        load_dataset(f"csv:{write(tmp_path, '')}")
    header_only = write(tmp_path, "a,label\n", "h.csv")
    with pytest.raises(DatasetError, match="no data rows"):
        load_dataset(f"csv:{header_only}")


def test_non_numeric_feature_names_column_and_row(tmp_path):
    path = write(tmp_path, "a,b,label\n1,2,0\n3,oops,1\n")
    with pytest.raises(DatasetError, match=r"feature column 'b' must be numeric; got 'oops' in row 3"):
        load_dataset(f"csv:{path}")


def test_non_integer_label(tmp_path):
    path = write(tmp_path, "a,label\n1,0\n2,1.5\n")
    with pytest.raises(DatasetError, match="labels must be integers; got non-integer values such as 1.5"):
        load_dataset(f"csv:{path}")
    path = write(tmp_path, "a,label\n1,cat\n", "s.csv")
    with pytest.raises(DatasetError, match="label column 'label' must hold non-negative integers; got 'cat'"):
        load_dataset(f"csv:{path}")


def test_negative_label(tmp_path):
    path = write(tmp_path, "a,label\n1,0\n2,-2\n")
    with pytest.raises(DatasetError, match="labels must be non-negative integers, or -1 for an unknown label; got -2"):
        load_dataset(f"csv:{path}")


def test_unknown_labels_and_the_labeled_column(tmp_path):
    """-1 or an empty cell: unknown; labeled=0 with a label: a hidden label training never reads."""
    path = write(tmp_path, "a,label,labeled\n1,0,1\n2,,0\n3,2,0\n4,-1,1\n")
    ds = load_dataset(f"csv:{path}")
    assert ds.y.tolist() == [0, -1, 2, -1] and ds.num_classes == 3
    assert ds.labeled.tolist() == [True, False, False, True]
    assert ds.label_visible.tolist() == [True, False, False, False]
    assert ds.x.shape == (4, 1) and ds.info()["num_unlabeled_samples"] == 3
    renamed = write(tmp_path, "a,label,has\n1,0,true\n2,1,false\n", "renamed.csv")
    assert load_dataset(f"csv:{renamed}?labeled=has").labeled.tolist() == [True, False]
    bad = write(tmp_path, "a,label,labeled\n1,0,yes\n", "bad.csv")
    with pytest.raises(DatasetError, match="labeled column 'labeled' must hold 1 or 0 .*got 'yes' in row 2"):
        load_dataset(f"csv:{bad}")
    nolabel = write(tmp_path, "a,labeled\n1,1\n", "nolabel.csv")
    with pytest.raises(DatasetError, match="a labeled column .* needs a label column"):
        load_dataset(f"csv:{nolabel}")


def test_npz_minus_one_is_an_unknown_label(tmp_path):
    import numpy as np

    np.savez(tmp_path / "d.npz", x=np.arange(8.0).reshape(4, 2), y=np.array([1, -1, 0, -1]))
    ds = load_dataset(f"npz:{tmp_path / 'd.npz'}")
    assert ds.num_classes == 2 and ds.label_visible.tolist() == [True, False, True, False]
    full = load_dataset(f"npz:{tmp_path / 'd.npz'}")
    assert full.content_sha256 == ds.content_sha256


def test_label_outside_num_classes(tmp_path):
    path = write(tmp_path, "a,label\n1,0\n2,3\n")
    with pytest.raises(DatasetError, match=r"label 3 is outside \[0, 2\)"):
        load_dataset(f"csv:{path}?num_classes=2")
    with pytest.raises(DatasetError, match="num_classes must be a positive integer; got 'two'"):
        load_dataset(f"csv:{path}?num_classes=two")


def test_nan_features(tmp_path):
    path = write(tmp_path, "a,label\n1,0\nnan,1\n")
    with pytest.raises(DatasetError, match="NaN or infinite values in 1 samples"):
        load_dataset(f"csv:{path}")


def test_unknown_option_and_missing_columns(tmp_path):
    path = write(tmp_path, "a,label\n1,0\n")
    with pytest.raises(DatasetError, match=r"unknown option\(s\) \['lable'\]; it takes label, client, labeled, num_classes"):
        load_dataset(f"csv:{path}?lable=label")
    with pytest.raises(DatasetError, match=r"client column 'user' is not in the header; columns are \['a', 'label'\]"):
        load_dataset(f"csv:{path}?client=user")


def test_ragged_row_and_duplicate_columns(tmp_path):
    path = write(tmp_path, "a,b,label\n1,2,0\n3,1\n")
    with pytest.raises(DatasetError, match="every row must have 3 cells like the header; row 3 has 2"):
        load_dataset(f"csv:{path}")
    path = write(tmp_path, "a,a,label\n1,2,0\n", "dup.csv")
    with pytest.raises(DatasetError, match=r"column names must be unique; got duplicates \['a'\]"):
        load_dataset(f"csv:{path}")
