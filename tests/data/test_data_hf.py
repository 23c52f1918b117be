"""`hf:` datasets: save_to_disk folders and parquet folders built with `datasets` in a temp dir.

The tests marked `hf` need the hf extra (`make test` and CI install it); the others check what
happens without it and the pieces that need only Pillow.
"""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

from pfl_cli.data import load_dataset
from pfl_cli.errors import DatasetError


def _png(array: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


# ------------------------------------------------------------------ without the extra
def test_save_to_disk_folder_without_datasets_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "dataset_dict.json").write_text('{"splits": ["train"]}')
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DatasetError, match=r"needs the hf extra: pip install 'pflx\[hf\]'"):
        load_dataset(f"hf:{tmp_path}")


def test_parquet_folder_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "train-00000-of-00001.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DatasetError, match=r"reading parquet files needs the hf extra"):
        load_dataset(f"hf:{tmp_path}")


def test_a_folder_that_is_not_a_saved_dataset_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DatasetError, match="is not a saved dataset .* and holds no .parquet files"):
        load_dataset(f"hf:{tmp_path}")
    with pytest.raises(DatasetError, match="no such directory"):
        load_dataset(f"hf:{tmp_path / 'nope'}")
    with pytest.raises(DatasetError, match=r"unknown option\(s\) \['lable'\]"):
        load_dataset(f"hf:{tmp_path}?lable=y")


def test_images_decode_to_channels_first_and_mixed_sizes_are_refused():
    from pfl_cli.data.hf import _images

    rng = np.random.default_rng(0)
    gray = [rng.integers(0, 256, (5, 7), dtype=np.uint8) for _ in range(3)]
    rgb = [rng.integers(0, 256, (5, 7, 3), dtype=np.uint8) for _ in range(2)]
    x = _images([{"bytes": _png(a), "path": None} for a in gray], "img", "hf:t")
    assert x.shape == (3, 1, 5, 7) and x.dtype == np.uint8
    np.testing.assert_array_equal(x[:, 0], np.stack(gray))
    x = _images([{"bytes": _png(a), "path": None} for a in rgb], "img", "hf:t")
    assert x.shape == (2, 3, 5, 7)
    np.testing.assert_array_equal(x[1, 2], rgb[1][:, :, 2])  # channel c of the image is plane c
    cells = [{"bytes": _png(gray[0]), "path": None}, {"bytes": _png(np.zeros((6, 7), np.uint8)), "path": None}]
    with pytest.raises(DatasetError, match="has mixed sizes: row 0 is 1x5x7 .*, row 1 is 1x6x7"):
        _images(cells, "img", "hf:t")


# ------------------------------------------------------------------ with the extra
def _image_dataset(n: int, seed: int, sizes=None):
    import datasets

    rng = np.random.default_rng(seed)
    arrays = [rng.integers(0, 256, sizes[i] if sizes else (6, 6), dtype=np.uint8) for i in range(n)]
    features = datasets.Features({
        "img": datasets.Image(), "character": datasets.ClassLabel(names=["a", "b", "c", "d"]),
        "writer": datasets.Value("string"), "row": datasets.Value("int64"),
    })
    data = {"img": [{"bytes": _png(a), "path": None} for a in arrays], "character": (np.arange(n) % 4).tolist(),
            "writer": [f"w{i % 7}" for i in range(n)], "row": list(range(n))}
    return datasets.Dataset.from_dict(data, features=features), arrays


@pytest.fixture(scope="module")
def femnist_like(tmp_path_factory):
    """A DatasetDict with train/test splits: images, a ClassLabel, a writer column (natural clients)."""
    import datasets

    root = tmp_path_factory.mktemp("hf")
    train, train_arrays = _image_dataset(84, 0)
    test, test_arrays = _image_dataset(28, 1)
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(root / "dd"))
    train.to_parquet(str(root / "pq" / "train-00000-of-00001.parquet"))
    test.to_parquet(str(root / "pq" / "test-00000-of-00001.parquet"))
    return root, train_arrays, test_arrays


@pytest.mark.hf
def test_save_to_disk_dataset_dict_with_images_pools_and_clients(femnist_like):
    root, train_arrays, test_arrays = femnist_like
    ds = load_dataset(f"hf:{root / 'dd'}?label=character&client=writer")
    assert ds.x.shape == (112, 1, 6, 6) and ds.x.dtype == np.uint8
    np.testing.assert_array_equal(ds.x[:84, 0], np.stack(train_arrays))
    np.testing.assert_array_equal(ds.x[84:, 0], np.stack(test_arrays))
    assert ds.y.tolist() == (np.arange(84) % 4).tolist() + (np.arange(28) % 4).tolist()
    assert ds.num_classes == 4 and ds.class_names == ("a", "b", "c", "d")
    assert ds.has_test_pool and int((ds.pool == 0).sum()) == 84
    assert ds.client[:8].tolist() == ["w0", "w1", "w2", "w3", "w4", "w5", "w6", "w0"]


@pytest.mark.hf
def test_parquet_folder_reads_like_the_saved_dataset(femnist_like):
    root, *_ = femnist_like
    a = load_dataset(f"hf:{root / 'dd'}?label=character&client=writer")
    b = load_dataset(f"hf:{root / 'pq'}?label=character&client=writer")
    assert a.content_sha256 == b.content_sha256 and b.class_names == a.class_names
    one = load_dataset(f"hf:{root / 'pq'}?split=test&label=character")
    assert one.num_samples == 28 and not one.has_test_pool


@pytest.mark.hf
@pytest.mark.parametrize("query, match", [
    ("label=letter", r"label column 'letter' is not in the dataset; columns are \['img', 'character', 'writer', 'row'\]"),
    ("label=character&client=author", "client column 'author' is not in the dataset"),
    ("split=validation", r"no split 'validation'; the splits are \['test', 'train'\]"),
    ("label=character&image=writer", "image column 'writer' does not hold images"),
])
def test_bad_columns_and_splits(femnist_like, query, match):
    root, *_ = femnist_like
    with pytest.raises(DatasetError, match=match):
        load_dataset(f"hf:{root / 'dd'}?{query}")


@pytest.mark.hf
def test_mixed_image_sizes_are_refused(tmp_path):
    ds, _ = _image_dataset(3, 0, sizes=[(6, 6), (6, 6), (8, 6)])
    ds.save_to_disk(str(tmp_path / "mixed"))
    with pytest.raises(DatasetError, match="image column 'img' has mixed sizes: row 0 is 1x6x6 .*, row 2 is 1x8x6"):
        load_dataset(f"hf:{tmp_path / 'mixed'}?label=character")


@pytest.mark.hf
def test_tabular_dataset_numeric_and_list_features(tmp_path):
    import datasets

    ds = datasets.Dataset.from_dict({"a": [1.0, 2.0, 3.0], "v": [[1, 2], [3, 4], [5, 6]], "label": [0, 1, 1],
                                     "name": ["x", "y", "z"]})
    ds.save_to_disk(str(tmp_path / "tab"))
    with pytest.raises(DatasetError, match="feature column 'name' must be numeric"):
        load_dataset(f"hf:{tmp_path / 'tab'}")
    got = load_dataset(f"hf:{tmp_path / 'tab'}?features=a,v")
    np.testing.assert_array_equal(got.x, [[1, 1, 2], [2, 3, 4], [3, 5, 6]])
    assert got.extra["feature_names"] == ["a", "v"] and got.num_classes == 2


@pytest.mark.hf
def test_partition_natural_clients_of_an_hf_dataset_end_to_end(cli, femnist_like, tmp_path):
    root, *_ = femnist_like
    spec = f"hf:{root / 'dd'}?label=character&client=writer"
    run = cli("partition", "--dataset", spec, "--natural-id", "--out", tmp_path / "p", "--format", "json")
    assert run.code == 0, run.err
    from pfl_cli.artifacts import load_partition

    part, info, _ = load_partition(tmp_path / "p")
    assert part.num_clients == 7 and info["class_names"] == ["a", "b", "c", "d"]
    ds = load_dataset(spec)
    for j in range(7):  # every sample of writer j, train from the train split, test from the test split
        assert set(ds.client[part.train_of(j)]) == {part.client_name[j]}
        assert (part.train_of(j) < 84).all() and (part.test_of(j) >= 84).all()
