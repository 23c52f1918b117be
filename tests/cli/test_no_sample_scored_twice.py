"""No sample scored twice (DESIGN.md section 7): a stage that scores a model never takes a sample the model
trained on for unseen data, however the partition presents it (issue 39, item 4).

Generated over the scoring stages (``pfl_cli.overlap.SCORING_STAGES``: a new one is covered by adding it
there) and over both a model that lists its training samples (no DP) and one that cannot (``--dp``). The
reference is obviously correct: a Python set of each sample's bytes (features and label) that the model
trained on, against the bytes of the samples the stage would score.

Cases: (a) the model's partition re-created at the same path with another seed; (b) the same samples
permuted within each class (same labels, same labels hash, same indices, other content); (c) copies of
training samples at other indices; and the control: the model's own partition is scored.
"""

import json
import shutil

import numpy as np
import pytest

from pfl_cli.artifacts import load_partition
from pfl_cli.cli.app import main as _main
from pfl_cli.overlap import ALLOW_FLAG, CLIENT_ROLES, SCORING_STAGES
from pfl_cli.data import load_dataset

CLIENTS = "holdout"  # both stages take it; its clients' samples are never trained on in the model's own partition
PART = ["--classes-per-client", "2", "--class-shares", "equal", "--num-clients", "10", "--holdout-clients", "4",
        "--test-fraction", "0.3", "--format", "quiet"]
TRAIN = ["--algorithm", "fedavg", "--rounds", "2", "--eval-every", "2", "--local-steps", "2", "--set",
         "mlp_hidden=[8]", "--format", "quiet"]
DP = ["--dp", "eps=4,delta=1e-6,clip=0.5,population=1000,noise=seeded", "--set", "normalize=false"]
# smoke-sized runs of a stage (a --dp client uploads no raw gradient: attack its one-step delta)
CHEAP = {"attack": ["--images", "1", "--iterations", "1", "--attack", "dlg", "--local-steps", "1"]}
MODES = ("listed", "dp")  # the model lists its training samples (no DP) / cannot (--dp)


def main(argv):
    return _main([str(a) for a in argv])


def save(path, x, y):
    np.savez(path, x=x, y=y)
    return f"npz:{path}"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """data.npz (600 digits) and three variants of it; partitions and a model per mode over data.npz.

    - ``perm.npz``: the samples of each class in another order (labels, their hash and a partition's
      indices unchanged; the content at each index another sample's);
    - ``dup.npz``: some holdout clients' samples replaced by copies of training samples of their class.
    """
    root = tmp_path_factory.mktemp("unseen")
    digits = load_dataset("builtin:digits")
    x, y = digits.x[:600], digits.y[:600]
    spec = save(root / "data.npz", x, y)
    rng = np.random.default_rng(0)
    perm = np.arange(len(y))
    for c in np.unique(y):
        at = np.flatnonzero(y == c)
        perm[at] = rng.permutation(at)
    save(root / "perm.npz", x[perm], y)
    assert main(["partition", "--dataset", spec, *PART, "--out", root / "part"]) == 0
    part, _, _ = load_partition(root / "part")
    trained = trained_indices(part)
    holdout = np.flatnonzero(np.isin(part.role, CLIENT_ROLES[CLIENTS]))
    targets = np.concatenate([part.train_of(j) for j in holdout] + [part.test_of(j) for j in holdout])
    dup = x.copy()
    for i in targets[::3]:  # a third of the holdout clients' samples become copies of training samples
        same_class = trained[y[trained] == y[i]]
        if len(same_class):
            dup[i] = x[rng.choice(same_class)]
    save(root / "dup.npz", dup, y)
    for name in ("perm", "dup"):
        assert main(["partition", "--dataset", f"npz:{root / name}.npz", *PART, "--out", root / f"part-{name}"]) == 0
    for mode in MODES:
        assert main(["train", "--partition", root / "part", *TRAIN, *(DP if mode == "dp" else []),
                     "--out", root / mode]) == 0
    return root


def trained_indices(part):
    """The train clients' train samples: what a model trained on ``part`` read (the partition's own record)."""
    return np.unique(np.concatenate([part.train_of(j) for j in np.flatnonzero(part.role == 0)]))


def sample_bytes(ds, i):
    return ds.x[i].tobytes() + int(ds.y[i]).to_bytes(8, "little", signed=True)


def scored_training_samples(stage, model_part, part):
    """The reference: how many samples ``stage`` scores on ``part`` hold the bytes of one the model trained on."""
    trained_ds, ds = load_dataset(model_part[1]["spec"]), load_dataset(part[1]["spec"])
    trained = {sample_bytes(trained_ds, i) for i in trained_indices(model_part[0])}
    p = part[0]
    split = p.test_of if SCORING_STAGES[stage].split == "test" else p.train_of
    chosen = [i for j in np.flatnonzero(np.isin(p.role, CLIENT_ROLES[CLIENTS])) for i in split(j)]
    return sum(sample_bytes(ds, i) in trained for i in chosen), len(chosen)


def score(stage, model, partition, out, *extra, clients=CLIENTS):
    return main([stage, "--model", model, "--partition", partition, "--clients", clients, "--out", out,
                 "--format", "json", *CHEAP.get(stage, []), *extra])


def refused(capsys, code, out):
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert not out.exists()
    return err


@pytest.fixture(scope="module")
def walked(root):
    """(a): a model per mode on ``walk``; then ``walk`` re-created at its path with another seed."""
    walk = root / "walk"
    assert main(["partition", "--dataset", f"npz:{root / 'data.npz'}", *PART, "--out", walk]) == 0
    own = load_partition(walk)
    for mode in MODES:
        assert main(["train", "--partition", walk, *TRAIN, *(DP if mode == "dp" else []),
                     "--out", root / f"walk-{mode}"]) == 0
    assert main(["partition", "--dataset", f"npz:{root / 'data.npz'}", *PART, "--seed", "1", "--force",
                 "--out", walk]) == 0
    return walk, own


@pytest.mark.parametrize("clients", ["holdout", "train"])
@pytest.mark.parametrize("stage", sorted(SCORING_STAGES))
@pytest.mark.parametrize("mode", MODES)
def test_own_partition_is_scored(root, tmp_path, capsys, stage, mode, clients):
    # holdout clients and test splits are unseen; attack --clients train attacks the trained uploads on purpose
    out = tmp_path / "out"
    assert score(stage, root / mode, root / "part", out, clients=clients) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["overlap_unchecked"] is False


@pytest.mark.parametrize("stage", sorted(SCORING_STAGES))
@pytest.mark.parametrize("mode", MODES)
def test_own_partition_holding_a_training_sample_twice_is_refused(root, tmp_path, capsys, stage, mode):
    # (c) on the model's own partition: a dataset with copies of training samples where unseen ones should be
    # (as pflx simulate --replacement over one pool deals them out)
    model = root / f"dup-{mode}"
    if not model.exists():
        assert main(["train", "--partition", root / "part-dup", *TRAIN, *(DP if mode == "dp" else []),
                     "--out", model]) == 0
    own = load_partition(root / "part-dup")
    hits, total = scored_training_samples(stage, own, own)
    assert hits > 0
    out = tmp_path / "out"
    err = refused(capsys, score(stage, model, root / "part-dup", out), out)
    assert f"{hits} of the {total} " in err and "the model's own and holds them twice" in err


@pytest.mark.parametrize("stage", sorted(SCORING_STAGES))
@pytest.mark.parametrize("mode", MODES)
def test_partition_recreated_with_another_seed_at_the_models_path(walked, root, tmp_path, capsys, stage, mode):
    walk, own = walked
    hits, total = scored_training_samples(stage, own, load_partition(walk))
    assert hits > 0  # the re-created partition hands out samples the model trained on
    out = tmp_path / "out"
    err = refused(capsys, score(stage, root / f"walk-{mode}", walk, out), out)
    if mode == "listed":  # the model lists its samples: the overlap is counted, and no flag lets it through
        assert f"{hits} of the {total} " in err and "the model trained on" in err
        err = refused(capsys, score(stage, root / f"walk-{mode}", walk, out, ALLOW_FLAG), out)
        assert f"{hits} of the {total} " in err
        return
    # --dp: the model lists none and its own partition is gone: refused unless the user accepts it unchecked
    assert "cannot check" in err and ALLOW_FLAG in err
    assert score(stage, root / f"walk-{mode}", walk, out, ALLOW_FLAG) == 0
    captured = capsys.readouterr()
    assert json.loads((out / "metrics.json").read_text())["overlap_unchecked"] is True
    assert json.loads(captured.out)["overlap_unchecked"] is True
    assert f"{ALLOW_FLAG}: {stage} scores" in captured.err and "overlap_unchecked: true" in captured.err


@pytest.mark.parametrize("variant", ["perm", "dup"])
@pytest.mark.parametrize("stage", sorted(SCORING_STAGES))
@pytest.mark.parametrize("mode", MODES)
def test_training_samples_at_other_indices_are_refused(root, tmp_path, capsys, stage, mode, variant):
    # (b) perm: same labels hash and the same indices as the model's partition, other content at each index;
    # (c) dup: copies of training samples where the model's partition has unseen ones.
    own, other = load_partition(root / "part"), load_partition(root / f"part-{variant}")
    np.testing.assert_array_equal(own[0].test_indices, other[0].test_indices)
    assert own[1]["labels_sha256"] == other[1]["labels_sha256"]
    hits, total = scored_training_samples(stage, own, other)
    assert hits > 0
    out = tmp_path / "out"
    err = refused(capsys, score(stage, root / mode, root / f"part-{variant}", out), out)
    assert f"{hits} of the {total} " in err and "the model trained on" in err
    # a --dp model's own partition is still at its path, so the overlap is known: no flag lets it through
    err = refused(capsys, score(stage, root / mode, root / f"part-{variant}", out, ALLOW_FLAG), out)
    assert f"{hits} of the {total} " in err


def test_a_dp_model_copied_away_alone_still_finds_its_partition(root, tmp_path, capsys, monkeypatch):
    # Trained with --partition typed relative to the working directory, then the model alone copied to another
    # depth and used from there: its manifest's typed and relative paths both miss the partition, which has not
    # moved. Before (review), the overlap was 'unverifiable' ('is gone from part'); now it is checked.
    monkeypatch.chdir(root)
    assert main(["train", "--partition", "part", *TRAIN, *DP, "--out", tmp_path / "made" / "dp"]) == 0
    shutil.copytree(tmp_path / "made" / "dp", tmp_path / "a" / "b" / "dp")
    monkeypatch.chdir(tmp_path / "a" / "b")
    hits, total = scored_training_samples("predict", load_partition(root / "part"), load_partition(root / "part-dup"))
    assert hits > 0
    out = tmp_path / "out"
    err = refused(capsys, score("predict", "dp", root / "part-dup", out, ALLOW_FLAG), out)
    assert f"{hits} of the {total} " in err


def test_training_record_is_content_digests(root):
    # Non-DP: 16 bytes of digest a training sample, one per index the partition trained; none under --dp.
    from pfl_cli.data.digest import sample_digests

    part, info, _ = load_partition(root / "part")
    record = np.load(root / "listed" / "train_samples.npz")
    ds = load_dataset(info["spec"])
    np.testing.assert_array_equal(record["sample"], trained_indices(part))
    assert record["digest"].dtype == np.uint8 and record["digest"].shape == (len(record["sample"]), 16)
    np.testing.assert_array_equal(record["digest"], sample_digests(ds.x, ds.y, record["sample"]))
    assert not (root / "dp" / "train_samples.npz").exists()
    ref = next(i for i in json.loads((root / "dp" / "manifest.json").read_text())["inputs"]
               if i["stage"] == "partition")
    assert ref["sha256"] is None and len(ref["recipe"]) == 64  # the release contract: no private fingerprint


def test_digests_compare_content_not_dtype_or_index():
    from pfl_cli.data.digest import sample_digests

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (50, 3, 4, 4), dtype=np.uint8)
    y = rng.integers(0, 3, 50)
    d = sample_digests(images, y)
    for dtype in (np.float32, np.float64, np.int64):  # one image digests alike however it is stored
        np.testing.assert_array_equal(sample_digests(images.astype(dtype), y), d)
    order = rng.permutation(50)
    np.testing.assert_array_equal(sample_digests(images[order], y[order]), d[order])
    # against the obvious reference: equal digests exactly where the (features, label) bytes are equal
    x = np.concatenate([images, images[:5]]).astype(np.float32) / 7
    labels = np.concatenate([y, y[:4], (y[4:5] + 1) % 3])
    keys = [x[i].tobytes() + bytes([labels[i]]) for i in range(len(x))]
    dig = [bytes(r) for r in sample_digests(x, labels)]
    assert all((keys[i] == keys[j]) == (dig[i] == dig[j]) for i in range(len(x)) for j in range(len(x)))
    assert (sample_digests(np.array([[0.0, 1.5]])) == sample_digests(np.array([[-0.0, 1.5]]))).all()


def test_moved_model_partition_under_dp_is_still_its_own(root, tmp_path, capsys):
    # --dp withholds the partition's sha256; its recipe (public options and seed) recognises it after a move.
    shutil.copytree(root / "part", tmp_path / "moved")
    out = tmp_path / "out"
    assert score("predict", root / "dp", tmp_path / "moved", out) == 0
    assert json.loads((out / "metrics.json").read_text())["overlap_unchecked"] is False


@pytest.fixture(scope="module")
def replaced(root):
    """A --dp model on a copy of data.npz; then that file overwritten by perm.npz (same labels, the samples of each
    class in another order) and partitioned again with the model's options: the recipe of the model's own."""
    d = root / "replaced"
    d.mkdir()
    shutil.copy(root / "data.npz", d / "data.npz")
    spec = f"npz:{d / 'data.npz'}"
    assert main(["partition", "--dataset", spec, *PART, "--out", d / "part"]) == 0
    assert main(["train", "--partition", d / "part", *TRAIN, *DP, "--out", d / "dp"]) == 0
    shutil.copy(root / "perm.npz", d / "data.npz")
    assert main(["partition", "--dataset", spec, *PART, "--out", d / "again"]) == 0
    return d


@pytest.mark.parametrize("stage", sorted(SCORING_STAGES))
def test_same_options_over_a_dataset_replaced_in_place_is_not_the_dp_models_own(root, replaced, tmp_path, capsys,
                                                                                stage):
    # A recipe names options, not data (review of issue 39, item 4): before, the partition above passed for the
    # --dp model's own, and predict scored 75 of its 180 test samples that the model trained on.
    model_part = load_partition(replaced / "part")
    model_part = (model_part[0], {**model_part[1], "spec": f"npz:{root / 'data.npz'}"})  # the data it trained on
    hits, scored = scored_training_samples(stage, model_part, load_partition(replaced / "again"))
    assert hits > 0.1 * scored  # the reference: the samples the stage would score include trained ones
    out = tmp_path / "out"
    err = refused(capsys, score(stage, replaced / "dp", replaced / "again", out), out)
    assert "is not the data the partition was made from" in err


@pytest.mark.parametrize("record, needle", [
    ("indices", "are samples the model trained on"),  # pflx before digests: the indices, read in the model's data
    ("bad", "train_samples.npz: digest must be a uint8 array of shape"),
])
def test_a_record_without_digests_is_read_in_the_models_dataset(root, tmp_path, capsys, record, needle):
    # (b) with an artifact written before digests: the indices name samples of the dataset the model trained on
    # (found by its manifest's spec and content hash), not of the partition's permuted copy.
    from fuzz.damaged import rehash

    model = tmp_path / "old"
    shutil.copytree(root / "listed", model)
    sample = np.load(model / "train_samples.npz")["sample"]
    arrays = {"sample": sample} if record == "indices" else {"sample": sample, "digest": np.zeros((3, 16), np.uint8)}
    np.savez(model / "train_samples.npz", **arrays)
    rehash(model, "train_samples.npz")
    out = tmp_path / "out"
    err = refused(capsys, score("predict", model, root / "part-perm", out), out)
    assert needle in err
    if record == "indices":
        hits, total = scored_training_samples("predict", load_partition(root / "part"), load_partition(root / "part-perm"))
        assert f"{hits} of the {total} " in err


@pytest.mark.parametrize("stage", sorted(SCORING_STAGES))
def test_a_training_sample_shown_at_another_angle_is_the_same_sample(root, tmp_path, capsys, stage):
    # Rotated clients (partition --rotations) see their images turned when the data load: the sample is the
    # stored image, so another partition that deals it out at another angle still hands back a training sample.
    rotated = root / "rot"
    if not (rotated / "model").exists():
        for seed in (0, 1):
            assert main(["partition", "--dataset", f"npz:{root / 'data.npz'}", *PART, "--rotations", "0,90,180,270",
                         "--seed", seed, "--out", rotated / f"part{seed}"]) == 0
        assert main(["train", "--partition", rotated / "part0", *TRAIN, "--out", rotated / "model"]) == 0
    hits, total = scored_training_samples(stage, load_partition(rotated / "part0"), load_partition(rotated / "part1"))
    assert hits > 0
    out = tmp_path / "out"
    err = refused(capsys, score(stage, rotated / "model", rotated / "part1", out), out)
    assert f"{hits} of the {total} " in err


@pytest.mark.parametrize("stage", [pytest.param(s, marks=() if s == "predict" else pytest.mark.slow)
                                   for s in sorted(SCORING_STAGES)])
def test_dataset_reexported_and_partition_recreated_at_the_models_path(root, tmp_path, capsys, stage):
    # Issue 49, finding 1: the data file re-exported (rows permuted within each class) and the partition re-created
    # by the same command at the same path. The recipe (options and seed) matched, and a --dp model withholds every
    # digest of its data, so predict took it for the model's own and scored 239 of 360 training samples as test
    # samples (exit 0, overlap_unchecked: false). A partition carries a secret key; the --dp model records a keyed
    # digest of its partition under it, and the re-created partition (another key) cannot pass for it.
    d = tmp_path / "re"
    d.mkdir()
    shutil.copy(root / "data.npz", d / "data.npz")
    spec = f"npz:{d / 'data.npz'}"
    assert main(["partition", "--dataset", spec, *PART, "--out", d / "part"]) == 0
    assert main(["train", "--partition", d / "part", *TRAIN, *DP, "--out", d / "dp"]) == 0
    model_part = load_partition(d / "part")
    model_part = (model_part[0], {**model_part[1], "spec": f"npz:{root / 'data.npz'}"})  # the data it trained on
    shutil.copy(root / "perm.npz", d / "data.npz")
    shutil.rmtree(d / "part")
    assert main(["partition", "--dataset", spec, *PART, "--out", d / "part"]) == 0
    hits, scored = scored_training_samples(stage, model_part, load_partition(d / "part"))
    assert hits > 0.1 * scored
    out = tmp_path / "out"
    err = refused(capsys, score(stage, d / "dp", d / "part", out), out)
    assert "cannot check" in err and ALLOW_FLAG in err


def test_the_python_api_refuses_what_the_cli_refuses(walked, root):
    # The rule is core (pfl_cli.overlap): a library user scoring a --dp model on its re-created partition is
    # refused as predict is, and accepted unchecked only when asking for it.
    from pfl_cli.errors import ArtifactError
    from pfl_cli.overlap import check_unseen

    walk, _own = walked
    with pytest.raises(ArtifactError, match="cannot check"):
        check_unseen(root / "walk-dp", walk)
    assert check_unseen(root / "walk-dp", walk, allow_unchecked=True) is True
    with pytest.raises(ArtifactError, match="samples the model trained on"):
        check_unseen(root / "walk-listed", walk)
    assert check_unseen(root / "listed", root / "part") is False
