"""cifar10: / cifar100: loaders on tiny batches pickled like the published python version."""

from __future__ import annotations

import io
import os
import pickle
import struct

import numpy as np
import pytest

from pfl_cli.data import load_dataset
from pfl_cli.errors import DatasetError

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def dump(path, obj):
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)


def images(n, start):
    """n images whose bytes count up from ``start``, so order and layout are checkable."""
    return ((np.arange(n * 3072).reshape(n, 3072) + start) % 251).astype(np.uint8)


def make_cifar10(root, per_batch=2, meta=True):
    """Five train batches of ``per_batch`` images and a test batch of 3, with bytes keys."""
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    for i in range(1, 6):
        labels = [(i + j) % 10 for j in range(per_batch)]
        dump(d / f"data_batch_{i}", {b"batch_label": b"training batch", b"labels": labels,
                                     b"data": images(per_batch, 100 * i), b"filenames": [b"f.png"] * per_batch})
    dump(d / "test_batch", {b"batch_label": b"testing batch", b"labels": [9, 8, 7],
                            b"data": images(3, 7), b"filenames": [b"t.png"] * 3})
    if meta:
        dump(d / "batches.meta", {b"label_names": [n.encode() for n in CIFAR10_NAMES],
                                  b"num_cases_per_batch": per_batch, b"num_vis": 3072})
    return d


def make_cifar100(root):
    d = root / "cifar-100-python"
    d.mkdir(parents=True)
    dump(d / "train", {b"data": images(4, 1), b"fine_labels": [99, 0, 5, 42], b"coarse_labels": [19, 0, 1, 3],
                       b"filenames": [b"a"] * 4, b"batch_label": b"training batch 1 of 1"})
    dump(d / "test", {b"data": images(2, 2), b"fine_labels": [1, 2], b"coarse_labels": [4, 5],
                      b"filenames": [b"b"] * 2, b"batch_label": b"testing batch 1 of 1"})
    dump(d / "meta", {b"fine_label_names": [f"fine{i}".encode() for i in range(100)],
                      b"coarse_label_names": [f"coarse{i}".encode() for i in range(20)]})
    return d


def test_cifar10_shapes_order_pools_and_names(tmp_path):
    d = make_cifar10(tmp_path)
    ds = load_dataset(f"cifar10:{d}")
    assert ds.x.dtype == np.uint8 and ds.x.shape == (13, 3, 32, 32)
    assert ds.y.dtype == np.int64
    assert ds.y.tolist() == [1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 9, 8, 7]  # batches 1..5, then test
    assert ds.pool.tolist() == [0] * 10 + [1] * 3
    assert ds.num_classes == 10 and ds.class_names == tuple(CIFAR10_NAMES)
    # Row layout: 1024 red, 1024 green, 1024 blue bytes -> channel first.
    np.testing.assert_array_equal(ds.x[2].reshape(-1), images(2, 200)[0])
    np.testing.assert_array_equal(ds.x[10, 1, 0, :3], images(3, 7)[0, 1024:1027])


def test_cifar10_accepts_parent_directory_and_missing_meta(tmp_path):
    make_cifar10(tmp_path, meta=False)
    ds = load_dataset(f"cifar10:{tmp_path}")
    assert ds.num_samples == 13 and ds.class_names is None


def test_cifar100_fine_and_coarse(tmp_path):
    make_cifar100(tmp_path)
    fine = load_dataset(f"cifar100:{tmp_path}")
    assert fine.x.shape == (6, 3, 32, 32) and fine.num_classes == 100
    assert fine.y.tolist() == [99, 0, 5, 42, 1, 2] and fine.pool.tolist() == [0, 0, 0, 0, 1, 1]
    assert fine.class_names[99] == "fine99"
    coarse = load_dataset(f"cifar100:{tmp_path / 'cifar-100-python'}?labels=coarse")
    assert coarse.num_classes == 20 and coarse.y.tolist() == [19, 0, 1, 3, 4, 5]
    assert coarse.class_names[:2] == ("coarse0", "coarse1")
    with pytest.raises(DatasetError, match="option labels must be fine or coarse; got 'medium'"):
        load_dataset(f"cifar100:{tmp_path}?labels=medium")


def test_missing_directory_and_batch(tmp_path):
    with pytest.raises(DatasetError, match="no data_batch_1 in .*point to the unpacked cifar-10-batches-py"):
        load_dataset(f"cifar10:{tmp_path / 'none'}")
    d = make_cifar10(tmp_path)
    (d / "data_batch_4").unlink()
    with pytest.raises(DatasetError, match="data_batch_4: file is missing"):
        load_dataset(f"cifar10:{d}")


def test_unknown_option(tmp_path):
    d = make_cifar10(tmp_path)
    with pytest.raises(DatasetError, match=r"unknown option\(s\) \['labels'\]; it takes no options"):
        load_dataset(f"cifar10:{d}?labels=fine")


class CallsOsSystem:
    """Unpickling this runs ``os.system(command)`` under a plain ``pickle.load``."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class CallsEval:
    def __reduce__(self):
        return (eval, ("1 + 1",))


def test_pickle_calling_os_system_is_refused_without_running(tmp_path):
    d = make_cifar10(tmp_path)
    marker = tmp_path / "pwned"
    dump(d / "data_batch_3", {b"data": images(2, 0), b"labels": CallsOsSystem(f"touch {marker}")})
    with pytest.raises(DatasetError, match=r"data_batch_3: not a plain CIFAR batch; it references (posix|nt|os)\.system"):
        load_dataset(f"cifar10:{d}")
    assert not marker.exists()


def test_pickle_referencing_any_other_global_is_refused(tmp_path):
    d = make_cifar10(tmp_path / "a")
    dump(d / "test_batch", {b"data": images(3, 0), b"labels": CallsEval()})
    # Protocol 2 writes builtins as __builtin__ for Python 2 readers.
    with pytest.raises(DatasetError, match=r"test_batch: not a plain CIFAR batch; it references (__builtin__|builtins)\.eval"):
        load_dataset(f"cifar10:{d}")
    d = make_cifar10(tmp_path / "b")
    dump(d / "batches.meta", {b"label_names": np.float64})  # a numpy class, but not one an array needs
    with pytest.raises(DatasetError, match=r"batches.meta: not a plain CIFAR batch; it references numpy\.float64"):
        load_dataset(f"cifar10:{d}")


def test_corrupt_and_wrong_shaped_batches(tmp_path):
    d = make_cifar10(tmp_path)
    (d / "data_batch_2").write_bytes(b"\x80\x02}q\x00(")  # cut off mid-pickle
    with pytest.raises(DatasetError, match="data_batch_2: not a readable CIFAR pickle"):
        load_dataset(f"cifar10:{d}")
    dump(d / "data_batch_2", {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]})
    with pytest.raises(DatasetError, match=r"'data' must be a uint8 array of shape \(N, 3072\); got \(2, 100\)"):
        load_dataset(f"cifar10:{d}")
    dump(d / "data_batch_2", {b"data": images(2, 0), b"labels": [0]})
    with pytest.raises(DatasetError, match=r"'labels' must be 2 integer labels; got shape \(1,\)"):
        load_dataset(f"cifar10:{d}")
    dump(d / "data_batch_2", [1, 2])
    with pytest.raises(DatasetError, match="a CIFAR batch must be a dict; got list"):
        load_dataset(f"cifar10:{d}")


class Py2Pickler(pickle._Pickler):
    """Writes bytes and str with Python 2's str opcodes, as the published CIFAR files have them."""

    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2_str(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else obj
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(raw)) + raw)
        self.memoize(obj)

    dispatch[bytes] = save_py2_str
    dispatch[str] = save_py2_str


def test_batches_pickled_by_python2_and_old_numpy_load(tmp_path):
    """The published files hold Python 2 str opcodes and name numpy.core.multiarray (numpy 1.x)."""
    d = make_cifar10(tmp_path)
    buf = io.BytesIO()
    Py2Pickler(buf, protocol=2).dump({b"data": images(3, 7), b"labels": [9, 8, 7], b"batch_label": "testing batch"})
    old = buf.getvalue().replace(b"numpy._core.multiarray\n", b"numpy.core.multiarray\n")
    assert b"numpy.core.multiarray\n_reconstruct" in old and b"_codecs" not in old
    (d / "test_batch").write_bytes(old)
    ds = load_dataset(f"cifar10:{d}")
    assert ds.y[-3:].tolist() == [9, 8, 7]
    np.testing.assert_array_equal(ds.x[-3:].reshape(3, -1), images(3, 7))
