"""mnist: / fashion-mnist: loaders on tiny IDX files with struct headers, plain and gzip'd."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from pfl_cli.data import load_dataset
from pfl_cli.errors import DatasetError

IMAGES, LABELS = 0x00000803, 0x00000801


def idx_bytes(array, magic):
    return struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()


def write_idx(path, array, magic, gz=True):
    raw = idx_bytes(array, magic)
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as fh:
            fh.write(raw)
    else:
        path.write_bytes(raw)
    return path


def fake_images(n, start):
    return ((np.arange(n * 784).reshape(n, 28, 28) + start) % 256).astype(np.uint8)


def make_mnist(root, n_train=3, n_test=2, gz=True):
    root.mkdir(parents=True, exist_ok=True)
    write_idx(root / "train-images-idx3-ubyte", fake_images(n_train, 0), IMAGES, gz)
    write_idx(root / "train-labels-idx1-ubyte", np.arange(n_train) % 10, LABELS, gz)
    write_idx(root / "t10k-images-idx3-ubyte", fake_images(n_test, 50), IMAGES, gz)
    write_idx(root / "t10k-labels-idx1-ubyte", np.arange(9, 9 - n_test, -1), LABELS, gz)
    return root


@pytest.mark.parametrize("gz", [True, False])
def test_mnist_shapes_order_and_pools(tmp_path, gz):
    root = make_mnist(tmp_path / "mnist", gz=gz)
    ds = load_dataset(f"mnist:{root}")
    assert ds.x.dtype == np.uint8 and ds.x.shape == (5, 1, 28, 28)
    np.testing.assert_array_equal(ds.x[:3, 0], fake_images(3, 0))
    np.testing.assert_array_equal(ds.x[3:, 0], fake_images(2, 50))
    assert ds.y.dtype == np.int64 and ds.y.tolist() == [0, 1, 2, 9, 8]
    assert ds.pool.tolist() == [0, 0, 0, 1, 1]
    assert ds.num_classes == 10 and ds.class_names == tuple("0123456789")


def test_fashion_mnist_class_names(tmp_path):
    ds = load_dataset(f"fashion-mnist:{make_mnist(tmp_path)}")
    assert ds.class_names[0] == "T-shirt/top" and ds.class_names[9] == "Ankle boot"
    assert ds.x.shape == (5, 1, 28, 28) and ds.has_test_pool


def test_missing_directory_and_file(tmp_path):
    with pytest.raises(DatasetError, match="no such directory .*nowhere; point to the directory holding the IDX"):
        load_dataset(f"mnist:{tmp_path / 'nowhere'}")
    root = make_mnist(tmp_path / "m")
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DatasetError, match=r"missing t10k-labels-idx1-ubyte \(or t10k-labels-idx1-ubyte.gz\)"):
        load_dataset(f"mnist:{root}")


def test_truncated_and_corrupt_gz(tmp_path):
    root = make_mnist(tmp_path)
    path = root / "train-images-idx3-ubyte.gz"
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte.gz: cannot read it .*EOFError.*re-download"):
        load_dataset(f"mnist:{root}")
    path.write_bytes(b"this is not gzip data at all")
    with pytest.raises(DatasetError, match="train-images-idx3-ubyte.gz: cannot read it .*BadGzipFile"):
        load_dataset(f"mnist:{root}")


def test_wrong_magic(tmp_path):
    root = make_mnist(tmp_path)
    # A labels file where the images file should be: the classic mix-up.
    write_idx(root / "train-images-idx3-ubyte", np.arange(3), LABELS, gz=False)
    with pytest.raises(DatasetError, match="IDX magic number must be 0x00000803; got 0x00000801"):
        load_dataset(f"mnist:{root}")


def test_data_size_disagrees_with_header(tmp_path):
    root = make_mnist(tmp_path, gz=False)
    path = root / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DatasetError, match=r"header promises 2x28x28 = 1568 bytes of data; got 1558"):
        load_dataset(f"mnist:{root}")
    path.write_bytes(struct.pack(">II", IMAGES, 2))
    with pytest.raises(DatasetError, match=r"truncated IDX header \(8 bytes, need 16\)"):
        load_dataset(f"mnist:{root}")


def test_image_label_count_mismatch(tmp_path):
    root = make_mnist(tmp_path)
    write_idx(root / "train-labels-idx1-ubyte", np.arange(4), LABELS)
    with pytest.raises(DatasetError, match="train images and labels must have the same count; got 3 images and 4 labels"):
        load_dataset(f"mnist:{root}")


def test_label_out_of_range_and_unknown_option(tmp_path):
    root = make_mnist(tmp_path)
    write_idx(root / "train-labels-idx1-ubyte", np.array([0, 1, 12]), LABELS)
    with pytest.raises(DatasetError, match=r"label 12 is outside \[0, 10\)"):
        load_dataset(f"mnist:{root}")
    with pytest.raises(DatasetError, match=r"unknown option\(s\) \['split'\]; it takes no options"):
        load_dataset(f"fashion-mnist:{root}?split=train")
