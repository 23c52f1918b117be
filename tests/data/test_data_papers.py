"""The papers' datasets from their published layouts: EMNIST, rotated Fashion-MNIST, CINIC-10, Omniglot,
US census and StackOverflow (csv). Each fixture is written by the test in the release's layout."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from PIL import Image

from pfl_cli.data import load_dataset
from pfl_cli.errors import DatasetError
from tests.data.test_data_mnist import IMAGES, LABELS, make_mnist, write_idx

CINIC_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


# ---------------------------------------------------------------- fixtures in the published layouts
def upright_images(n, seed):
    """Images that are not symmetric under transposition, so orientation mistakes show."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)


def make_emnist(root, split="byclass", labels_train=(0, 61, 10, 36, 5, 7), labels_test=(1, 60, 2), mapping=True):
    gz = root / "gzip"
    gz.mkdir(parents=True)
    up_train, up_test = upright_images(len(labels_train), 0), upright_images(len(labels_test), 1)
    # The release stores each image transposed (column-major): write it that way.
    write_idx(gz / f"emnist-{split}-train-images-idx3-ubyte", up_train.transpose(0, 2, 1), IMAGES)
    write_idx(gz / f"emnist-{split}-train-labels-idx1-ubyte", np.asarray(labels_train), LABELS)
    write_idx(gz / f"emnist-{split}-test-images-idx3-ubyte", up_test.transpose(0, 2, 1), IMAGES, gz=False)
    write_idx(gz / f"emnist-{split}-test-labels-idx1-ubyte", np.asarray(labels_test), LABELS, gz=False)
    if mapping and split == "byclass":
        codes = [*range(48, 58), *range(65, 91), *range(97, 123)]
        (gz / "emnist-byclass-mapping.txt").write_text("".join(f"{i} {c}\n" for i, c in enumerate(codes)))
    return root, up_train, up_test


def write_png(path, array, mode):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode=mode).save(path)


def make_cinic(root, per_class=(2, 1, 1), gray=("train", "cat")):
    """train/valid/test/<class>/*.png; pixel (0, 0) red channel = class, (0, 1) = split, (0, 2) = index."""
    for s, (split, n) in enumerate(zip(("train", "valid", "test"), per_class)):
        for c, name in enumerate(CINIC_CLASSES):
            for i in range(n):
                img = np.full((32, 32, 3), 7, dtype=np.uint8)
                img[0, 0, 0], img[0, 1, 0], img[0, 2, 0] = c, s, i
                path = root / split / name / f"cifar10-{split}-{i}.png"
                if (split, name) == gray and i == 0:  # an ImageNet grayscale image, as CINIC-10 has a few
                    write_png(path, np.full((32, 32), 90, dtype=np.uint8), "L")
                else:
                    write_png(path, img, "RGB")
    return root


OMNIGLOT = {"background": {"Greek": 2, "Latin": 1}, "evaluation": {"Tengwar": 2}}  # alphabet -> characters


def make_omniglot(root, drawings=3):
    for half, alphabets in OMNIGLOT.items():
        for alphabet, n_chars in alphabets.items():
            for ch in range(1, n_chars + 1):
                for d in range(drawings):
                    img = np.full((105, 105), 255, dtype=np.uint8)
                    img[10 + d, 5:50] = 0  # a stroke whose row tells the drawing apart
                    write_png(root / f"images_{half}" / alphabet / f"character{ch:02d}" / f"0{ch:03d}_{d + 1:02d}.png",
                              img, "L")
    return root


CENSUS_FEATURES = ("AGEP_17", "AGEP_40", "SEX_1", "SEX_2", "COW_5")


def make_census_csv(path, n=60):
    """The csv the census recipe reads: state ``ST`` as client, one-hot features."""
    rng = np.random.default_rng(0)
    states = rng.choice(["01", "06", "36"], size=n)
    rows = ["ST," + ",".join(CENSUS_FEATURES)]
    rows += [f"{st}," + ",".join(str(v) for v in rng.integers(0, 2, size=len(CENSUS_FEATURES))) for st in states]
    path.write_text("\n".join(rows) + "\n")
    return path


def make_stackoverflow_csv(path, n=50, dim=6):
    """A user's question embeddings: ``client_id`` then e0..e{dim-1} (the thesis uses d = 384)."""
    rng = np.random.default_rng(1)
    users = rng.choice(["u1", "u2", "u3", "u4"], size=n)
    rows = ["client_id," + ",".join(f"e{j}" for j in range(dim))]
    rows += [f"{u}," + ",".join(f"{v:.6f}" for v in rng.normal(size=dim)) for u in users]
    path.write_text("\n".join(rows) + "\n")
    return path


# ---------------------------------------------------------------- EMNIST
def test_emnist_byclass_is_upright_with_the_official_split_and_mapping(tmp_path):
    root, up_train, up_test = make_emnist(tmp_path / "emnist")
    for where in (root, root / "gzip"):  # the gzip folder itself or its parent
        ds = load_dataset(f"emnist:{where}")
        assert ds.x.shape == (9, 1, 28, 28) and ds.x.dtype == np.uint8
        np.testing.assert_array_equal(ds.x[:6, 0], up_train)  # transposed back to upright
        np.testing.assert_array_equal(ds.x[6:, 0], up_test)
        assert ds.y.tolist() == [0, 61, 10, 36, 5, 7, 1, 60, 2] and ds.pool.tolist() == [0] * 6 + [1] * 3
        assert ds.num_classes == 62 and ds.class_names[:11] == (*"0123456789", "A") and ds.class_names[61] == "z"


@pytest.mark.parametrize("split,classes,labels", [("balanced", 47, (0, 46)), ("bymerge", 47, (3, 46)),
                                                  ("digits", 10, (0, 9)), ("mnist", 10, (9, 0)),
                                                  ("letters", 26, (1, 26))])
def test_emnist_splits_and_their_label_ranges(tmp_path, split, classes, labels):
    make_emnist(tmp_path, split, labels_train=labels, labels_test=labels[:1])
    ds = load_dataset(f"emnist:{tmp_path}?split={split}")
    shift = 1 if split == "letters" else 0  # letters number their classes 1..26 in the files
    assert ds.num_classes == classes and ds.y.tolist() == [v - shift for v in (*labels, labels[0])]
    assert ds.extra["emnist_split"] == split and ds.class_names is None


def test_emnist_refusals_name_the_first_missing_or_malformed_thing(tmp_path):
    with pytest.raises(DatasetError, match="no such directory .*EMNIST release's gzip directory"):
        load_dataset(f"emnist:{tmp_path / 'nowhere'}")
    root, _, _ = make_emnist(tmp_path / "e")
    with pytest.raises(DatasetError, match="option split must be one of byclass, bymerge, balanced, letters"):
        load_dataset(f"emnist:{root}?split=byfield")
    with pytest.raises(DatasetError, match=r"missing emnist-letters-train-images-idx3-ubyte \(or .*\.gz\) in"):
        load_dataset(f"emnist:{root}?split=letters")
    (root / "gzip" / "emnist-byclass-test-labels-idx1-ubyte").unlink()
    with pytest.raises(DatasetError, match=r"missing emnist-byclass-test-labels-idx1-ubyte \(or"):
        load_dataset(f"emnist:{root}")


def test_emnist_refuses_labels_outside_the_split_and_a_bad_mapping(tmp_path):
    make_emnist(tmp_path / "a", "digits", labels_train=(0, 12), labels_test=(1,))
    with pytest.raises(DatasetError, match=r"labels must lie in \[0, 10\) for split digits; got 12 at index 1"):
        load_dataset(f"emnist:{tmp_path / 'a'}?split=digits")
    make_emnist(tmp_path / "b", "letters", labels_train=(0, 3), labels_test=(1,))
    with pytest.raises(DatasetError, match=r"\[1, 27\) for split letters; got 0 at index 0"):
        load_dataset(f"emnist:{tmp_path / 'b'}?split=letters")
    root, _, _ = make_emnist(tmp_path / "c")
    (root / "gzip" / "emnist-byclass-mapping.txt").write_text("0 48\n1 forty-nine\n")
    with pytest.raises(DatasetError, match="mapping.txt: line 2 must be 'label ascii-code"):
        load_dataset(f"emnist:{root}")
    (root / "gzip" / "emnist-byclass-mapping.txt").write_text("0 48\n")
    with pytest.raises(DatasetError, match="must name all 62 classes; it names 1"):
        load_dataset(f"emnist:{root}")


def test_emnist_images_and_labels_counts_must_agree(tmp_path):
    root, _, _ = make_emnist(tmp_path)
    write_idx(root / "gzip" / "emnist-byclass-test-labels-idx1-ubyte", np.zeros(5), LABELS, gz=False)
    with pytest.raises(DatasetError, match="emnist-byclass-test images and labels must have the same count; got 3 images and 5"):
        load_dataset(f"emnist:{root}")


# ---------------------------------------------------------------- rotated Fashion-MNIST (thesis §5.5)
def test_rotated_fashion_mnist_rotates_each_clients_train_and_test_images(tmp_path, cli):
    """Thesis Table 5.2: IID clients, each draws one angle from {0, 90, 180, 270} and rotates all its images."""
    from pfl_cli.cli.common import load_partition_dataset

    root = make_mnist(tmp_path / "fmnist", n_train=40, n_test=10)
    run = cli("partition", "--dataset", f"fashion-mnist:{root}", "--iid", "--num-clients", "8",
              "--rotations", "0,90,180,270", "--out", tmp_path / "p")
    assert run.code == 0, run.err
    part, _, _, ds = load_partition_dataset(tmp_path / "p")
    raw = load_dataset(f"fashion-mnist:{root}")
    assert set(np.asarray(part.rotation).tolist()) <= {0, 90, 180, 270} and part.rotation.shape == (8,)
    assert len(set(part.rotation.tolist())) > 1  # 8 draws from 4 angles (seed 0)
    for c in range(8):
        k = int(part.rotation[c]) // 90
        for idx in (part.train_of(c), part.test_of(c)):
            for i in idx:  # slow reference: one np.rot90 per sample
                np.testing.assert_array_equal(ds.x[i, 0], np.rot90(raw.x[i, 0], k))
    assert np.asarray(part.test_indices).size and (raw.pool[np.asarray(part.test_indices)] == 1).all()


# ---------------------------------------------------------------- CINIC-10
def test_cinic10_published_layout_pools_and_classes(tmp_path):
    root = make_cinic(tmp_path / "cinic")
    ds = load_dataset(f"cinic10:{root}")
    assert ds.x.shape == (40, 3, 32, 32) and ds.x.dtype == np.uint8 and ds.class_names == CINIC_CLASSES
    assert ds.pool.tolist() == [0] * 30 + [1] * 10  # train (20) and valid (10), then test (10)
    rgb = ds.x[:, :, 0, :3]
    keep = rgb[:, 1, 0] == 7  # every image but the grayscale one carries its tags in the red channel
    np.testing.assert_array_equal(rgb[keep, 0, 0], ds.y[keep])
    assert rgb[keep, 0, 1].tolist() == [0] * 19 + [1] * 10 + [2] * 10  # split order: train, valid, test
    gray = np.flatnonzero(~keep)
    assert gray.size == 1 and ds.y[gray[0]] == 3 and (ds.x[gray[0]] == 90).all()  # L -> RGB, 3 equal channels
    dropped = load_dataset(f"cinic10:{root}?valid=drop")
    assert dropped.num_samples == 30 and dropped.pool.tolist() == [0] * 20 + [1] * 10


def test_cinic10_refusals(tmp_path):
    root = make_cinic(tmp_path / "c", per_class=(1, 1, 1), gray=None)
    with pytest.raises(DatasetError, match="option valid must be train or drop; got 'test'"):
        load_dataset(f"cinic10:{root}?valid=test")
    with pytest.raises(DatasetError, match="no such directory .*unpacked CINIC-10 directory"):
        load_dataset(f"cinic10:{tmp_path / 'none'}")
    (root / "test" / "truck" / "cifar10-test-0.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DatasetError, match=r"test/truck/cifar10-test-0.png: not a readable PNG"):
        load_dataset(f"cinic10:{root}")
    (root / "test" / "truck" / "cifar10-test-0.png").unlink()
    with pytest.raises(DatasetError, match=r"no \*.png files in .*test/truck"):
        load_dataset(f"cinic10:{root}")
    import shutil

    shutil.rmtree(root / "valid" / "bird")
    with pytest.raises(DatasetError, match="missing folder valid/bird in .*train/valid/test/<class>/"):
        load_dataset(f"cinic10:{root}")
    write_png(root / "test" / "truck" / "cifar10-test-0.png", np.zeros((32, 32, 3), dtype=np.uint8), "RGB")
    assert load_dataset(f"cinic10:{root}?valid=drop").num_samples == 20  # valid/ is not read then


def test_cinic10_image_size_is_checked(tmp_path):
    root = make_cinic(tmp_path / "c", per_class=(1, 1, 1), gray=None)
    write_png(root / "train" / "airplane" / "cifar10-train-0.png", np.zeros((64, 64, 3), dtype=np.uint8), "RGB")
    with pytest.raises(DatasetError, match="airplane/cifar10-train-0.png: every image must be 32x32 like the published 32x32; got 64x64"):
        load_dataset(f"cinic10:{root}")
    root = make_omniglot(tmp_path / "o")
    write_png(root / "images_background" / "Latin" / "character01" / "0001_02.png", np.zeros((30, 30), dtype=np.uint8), "L")
    with pytest.raises(DatasetError, match="Latin/character01/0001_02.png: every image must be 105x105 like 0001_01.png; got 30x30"):
        load_dataset(f"omniglot:{root}")


def test_png_loaders_refuse_in_one_line_without_pillow(tmp_path, monkeypatch, cli):
    root = make_cinic(tmp_path / "c", per_class=(1, 1, 1), gray=None)
    make_omniglot(tmp_path / "o")
    monkeypatch.setitem(sys.modules, "PIL", None)  # import PIL now raises ImportError
    for spec in (f"cinic10:{root}", f"omniglot:{tmp_path / 'o'}"):
        with pytest.raises(DatasetError, match=r"reading PNG images needs Pillow, which is not installed: pip install 'pflx\[hf\]'"):
            load_dataset(spec)
    run = cli("partition", "--dataset", f"cinic10:{root}", "--iid", "--out", tmp_path / "p")
    assert run.code == 2 and len(run.err.strip().splitlines()) == 1 and "pflx[hf]" in run.err
    assert not (tmp_path / "p").exists()


# ---------------------------------------------------------------- Omniglot
def test_omniglot_alphabets_are_clients_and_characters_classes(tmp_path):
    root = make_omniglot(tmp_path / "omniglot")
    ds = load_dataset(f"omniglot:{root}")
    assert ds.x.shape == (15, 1, 105, 105) and ds.pool is None and ds.num_classes == 5
    assert ds.class_names == ("Greek/character01", "Greek/character02", "Latin/character01",
                              "Tengwar/character01", "Tengwar/character02")
    assert ds.client.tolist() == ["Greek"] * 6 + ["Latin"] * 3 + ["Tengwar"] * 6
    assert ds.y.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    stroke_row = [int(np.flatnonzero((ds.x[i, 0] == 0).any(axis=1))[0]) for i in range(3)]
    assert stroke_row == [10, 11, 12] and ds.x[0, 0, 0, 0] == 255  # drawings in file order, pixels as published
    half = load_dataset(f"omniglot:{root}?set=evaluation&size=28")
    assert half.x.shape == (6, 1, 28, 28) and half.client.tolist() == ["Tengwar"] * 6 and half.num_classes == 2


def test_omniglot_refusals(tmp_path):
    root = make_omniglot(tmp_path / "o")
    with pytest.raises(DatasetError, match="option set must be one of all, background, evaluation; got 'test'"):
        load_dataset(f"omniglot:{root}?set=test")
    with pytest.raises(DatasetError, match=r"option size must be an integer in \[1, 1024\] \(pixels\); got 'big'"):
        load_dataset(f"omniglot:{root}?size=big")
    with pytest.raises(DatasetError, match="missing folder images_background in .*images_background.zip"):
        load_dataset(f"omniglot:{tmp_path}")
    (root / "images_evaluation" / "Tengwar" / "character02").joinpath("0002_01.png").write_text("no image")
    with pytest.raises(DatasetError, match="character02/0002_01.png: not a readable PNG"):
        load_dataset(f"omniglot:{root}")


# ---------------------------------------------------------------- census and StackOverflow (thesis §6.5, csv)
def test_census_and_stackoverflow_csv_with_the_recipes_columns(tmp_path):
    census = load_dataset(f"csv:{make_census_csv(tmp_path / 'census.csv')}?client=ST&label=")
    assert census.y is None and census.x.shape == (60, 5) and set(census.client) == {"01", "06", "36"}
    assert census.extra["feature_names"] == list(CENSUS_FEATURES)
    so = load_dataset(f"csv:{make_stackoverflow_csv(tmp_path / 'so.csv')}?client=client_id&label=")
    assert so.x.shape == (50, 6) and so.y is None and set(so.client) == {"u1", "u2", "u3", "u4"}


# ---------------------------------------------------------------- every family under every partition scheme
def _families(tmp_path):
    return {
        "emnist": f"emnist:{make_emnist(tmp_path / 'emnist', labels_train=tuple(range(62)) * 3, labels_test=(0, 3, 6))[0]}",
        "fashion-mnist": f"fashion-mnist:{make_mnist(tmp_path / 'fmnist', n_train=40, n_test=10)}",
        "cinic10": f"cinic10:{make_cinic(tmp_path / 'cinic', per_class=(4, 1, 1), gray=None)}",
        "omniglot": f"omniglot:{make_omniglot(tmp_path / 'omniglot', drawings=8)}?size=8",
        "census": f"csv:{make_census_csv(tmp_path / 'census.csv')}?client=ST&label=",
        "stackoverflow": f"csv:{make_stackoverflow_csv(tmp_path / 'so.csv')}?client=client_id&label=",
    }


SCHEME_FLAGS = {
    "iid": ["--iid"],
    "dirichlet": ["--dirichlet", "0.5"],
    "pathological": ["--classes-per-client", "2"],
    "shards": ["--shards-per-client", "2"],
    "quantity": ["--quantity", "lognormal:0.5"],
    "natural": ["--natural-id"],
    "sizes": ["--sizes", "5,6,7"],
    "distribution": None,  # one uniform row per client, built from the number of classes
    "continuous": ["--continuous", "0", "--strictness", "0.5"],
    "dominant": ["--dominant-classes", "1"],
}
NEEDS_LABELS = {"dirichlet", "pathological", "shards", "dominant", "distribution"}


@pytest.mark.parametrize("family", ["emnist", "fashion-mnist", "cinic10", "omniglot", "census", "stackoverflow"])
def test_every_family_partitions_with_every_scheme(tmp_path, cli, family):
    from pfl_cli.artifacts import load_partition
    from pfl_cli.partition.api import SCHEMES

    assert set(SCHEME_FLAGS) == set(SCHEMES)
    spec = _families(tmp_path)[family]
    ds = load_dataset(spec)
    for scheme in SCHEMES:
        if SCHEME_FLAGS[scheme] is None and ds.y is not None:  # three clients, each one class of the train pool
            present = np.unique(ds.y if ds.pool is None else ds.y[ds.pool == 0])[:3]
            (tmp_path / "q.csv").write_text("\n".join(",".join("1" if c == k else "0" for c in range(ds.num_classes))
                                                      for k in present))
        flags = SCHEME_FLAGS[scheme] or ["--distribution", tmp_path / "q.csv"]
        clients = [] if scheme in ("natural", "sizes", "distribution") else ["--num-clients", "3"]
        out = tmp_path / f"p-{scheme}"
        run = cli("partition", "--dataset", spec, *flags, *clients, "--min-size", "1", "--out", out)
        refused = (scheme in NEEDS_LABELS and ds.y is None) or (scheme == "natural" and ds.client is None)
        if refused:  # a scheme the data cannot support is refused in one line, nothing written
            assert run.code == 2 and len(run.err.strip().splitlines()) == 1 and not out.exists(), (scheme, run.err)
            continue
        assert run.code == 0, (family, scheme, run.err)
        part, info, _ = load_partition(out)
        part.check(ds.num_samples)
        train = np.asarray(part.train_indices)
        assert train.size and len(np.unique(train)) == train.size and info["spec"] == spec
        if ds.pool is not None:  # the official split: train indices from the train pool only
            assert (ds.pool[train] == 0).all(), (family, scheme)
        if scheme == "natural":
            assert part.num_clients == len(set(ds.client)), family
