"""No sample scored twice: a stage that scores a model never takes a sample it trained on for unseen data.

The rule lives in the core, below the commands: ``predict`` and ``attack`` call
:func:`check_unseen_samples`, and a Python user scoring a train artifact on a partition calls
:func:`check_unseen` (the same refusals, as :class:`~pfl_cli.errors.ArtifactError`).

DESIGN.md section 5 ("a test sample that a model trained on is never scored as a test sample") and
section 7 (the suite ``tests/cli/test_no_sample_scored_twice.py``, generated from
:data:`SCORING_STAGES`). Samples are compared by content (:mod:`pfl_cli.data.digest`: features
and label), never by index: another partition of the same dataset, a copy of it in another order,
or a dataset holding one sample twice names the same sample by different indices.

What a model trained on comes from:

- a train artifact without DP: its ``train_samples.npz`` (``sample`` and ``digest``);
- a ``--dp`` train artifact records neither (which records trained is what DP protects), and
  withholds its partition's sha256; its manifest's partition input carries the partition's
  *fingerprint* instead (:func:`pfl_cli.manifest.partition_fingerprint`: a keyed digest of the
  partition's content under a secret key that only the partition artifact holds, so it publishes
  nothing about the data). A partition with that fingerprint is the model's own, its dataset
  checked against the digest the partition recorded, and its train clients' train samples are what
  the model trained on. Any other partition is checked against the model's own partition where it
  is still found at the path the manifest names; where it is not (moved, deleted, re-created,
  even by the same command over a re-exported file: a new partition draws a new key), the
  overlap cannot be checked, and the stage refuses unless ``--allow-unchecked-overlap`` says that
  is acceptable; its report then says ``overlap_unchecked: true``. The recipe (public options and
  seed) is recorded too, but names options, not data: it recognises nothing on its own (issue 49).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pfl_cli.errors import ArtifactError

ALLOW_FLAG = "--allow-unchecked-overlap"
ALLOW_HELP = ("Score a partition whose overlap with the model's training samples cannot be checked (a --dp model "
              "lists none, and its own partition is not at the path its manifest names); the report says "
              "overlap_unchecked. Samples the model is known to have trained on are refused all the same.")
CLIENT_ROLES = {"train": (0,), "holdout": (1,), "all": (0, 1)}


@dataclass(frozen=True)
class Scoring:
    """What a scoring stage takes for unseen data: which split of its ``--clients`` clients."""

    split: str  # "test" or "train": the partition's split whose samples the stage scores
    what: str  # how its message names them
    own_train_clients: bool  # the model's own partition's --clients train are scored on purpose


# The stages that score a model; the suite of tests/cli/test_no_sample_scored_twice.py runs over this table.
SCORING_STAGES = {
    "predict": Scoring("test", "test samples", own_train_clients=False),
    # attack --clients train on the model's own partition attacks the uploads the model trained on, by design
    "attack": Scoring("train", "train samples (the attack's targets)", own_train_clients=True),
}


def check_unseen(model: str | Path, partition: str | Path, *, stage: str = "predict", clients: str = "holdout",
                 allow_unchecked: bool = False) -> bool:
    """Refuse (ArtifactError) to score the train artifact ``model`` on ``clients`` of the partition artifact
    ``partition`` where ``stage`` would take a sample the model trained on for unseen data.

    The check ``pflx predict`` and ``pflx attack`` run (see the module's docstring), for library users. Returns
    True when the overlap could not be checked (a ``--dp`` model whose own partition is gone) and
    ``allow_unchecked`` accepted that, False when it was checked.

    >>> check_unseen("runs/fedavg", "runs/part")  # doctest: +SKIP
    False
    """
    from pfl_cli.data.location import load_partition_dataset
    from pfl_cli.readers import read_artifact

    if stage not in SCORING_STAGES:
        raise ValueError(f"stage must be one of {', '.join(SCORING_STAGES)}; got {stage!r}.")
    if clients not in CLIENT_ROLES:
        raise ValueError(f"clients must be one of {', '.join(CLIENT_ROLES)}; got {clients!r}.")
    model_art = read_artifact(model, "train", flag="--model")
    part, info, part_art, ds = load_partition_dataset(partition)
    return check_unseen_samples(stage, clients, model=Path(model), model_art=model_art, partition=Path(partition),
                                part=part, part_art=part_art, info=info, ds=ds, allow_unchecked=allow_unchecked)


def partition_recipe(art) -> str:
    """sha256 of what made a partition artifact: stage, pflx version, config and seed.

    All public inputs (the user's options), so a ``--dp`` train artifact may keep it where it
    withholds the partition's content hash; the same recipe over the same dataset makes the
    same partition (DESIGN.md section 5: same seed and inputs, byte-identical artifacts).
    """
    from pfl_cli.formats import canonical_json, sha256_bytes

    m = art.manifest
    return sha256_bytes(canonical_json({"stage": m.get("stage"), "version": m.get("version"),
                                        "config": m.get("config", {}), "seed": m.get("seed")}).encode())


def partition_input(part_art) -> dict:
    """A train artifact's reference to its partition: path, stage, sha256 (withheld under --dp), recipe,
    fingerprint (:func:`fingerprint_of`; kept under --dp) and ``absolute_path`` (where it was; found from any
    working directory by a model copied away alone)."""
    return {**part_art.input_ref(), "recipe": partition_recipe(part_art), "fingerprint": fingerprint_of(part_art),
            "absolute_path": str(Path(part_art.path).resolve())}


def fingerprint_of(part_art) -> str | None:
    """The keyed fingerprint of a partition artifact (None: written without a key)."""
    from pfl_cli.manifest import partition_fingerprint

    return partition_fingerprint(part_art.manifest, part_art.content_hash)


def is_models_partition(ref: dict, part_art) -> bool:
    """True when ``part_art`` is the very partition a train artifact's partition input ``ref`` names: its
    sha256 where recorded (no DP), else its keyed fingerprint (a --dp model); never the recipe alone."""
    if ref.get("sha256") is not None:
        return part_art.content_hash == ref["sha256"]
    return ref.get("fingerprint") is not None and fingerprint_of(part_art) == ref["fingerprint"]


def model_partition_location(model_art, ref: dict) -> Path:
    """Where the partition a train artifact names is now: beside the model in a moved tree, as typed, or at
    the absolute path it had (a model copied away from its tree, used from another directory)."""
    from pfl_cli.readers import input_location

    where = input_location(model_art, ref)
    if not (where / "manifest.json").is_file() and ref.get("absolute_path"):
        there = Path(ref["absolute_path"])
        if (there / "manifest.json").is_file():
            return there
    return where


def unrotated_x(ds, part, spec: str) -> np.ndarray:
    """The dataset's features as stored: a sample is the same sample whatever angle a client shows it at."""
    if part.rotation is None:
        return ds.x
    from pfl_cli.data.location import load_located

    return load_located(spec).x  # where the stage found the data (a moved dataset: not at the recorded path)


def trained_samples(part) -> np.ndarray:
    """Sorted dataset indices of the train clients' train samples: what a model trained on ``part`` read."""
    from pfl_cli.fl.store import ROLE_TRAIN

    return np.unique(np.asarray(part.train_indices, np.int64)[np.asarray(part.role)[part.train_owner()] == ROLE_TRAIN])


def training_record(part, ds, spec: str) -> tuple[np.ndarray, np.ndarray]:
    """``(sample, digest)`` of ``train_samples.npz``: the indices :func:`trained_samples` and their content digests."""
    from pfl_cli.data.digest import sample_digests

    sample = trained_samples(part)
    return sample, sample_digests(unrotated_x(ds, part, spec), ds.y, sample)


def check_unseen_samples(stage: str, clients: str, *, model: Path, model_art, partition: Path, part, part_art,
                         info: dict, ds, allow_unchecked: bool = False) -> bool:
    """Refuse (exit 2) samples the model trained on where ``stage`` takes them for unseen ones.

    Returns True when the overlap could not be checked and ``allow_unchecked`` accepted that (the
    stage's report says ``overlap_unchecked``), False when it was checked (or nothing is scored
    that could overlap).
    """
    from pfl_cli.data.digest import digest_keys, sample_digests

    scoring = SCORING_STAGES[stage]
    ref = next((i for i in model_art.manifest.get("inputs", []) if i.get("stage") == "partition"), None)
    if ref is None:  # a train artifact always names its partition; nothing to compare with otherwise
        return False
    own = is_models_partition(ref, part_art)
    if own and scoring.own_train_clients and clients == "train":
        return False
    indices, owner = ((part.test_indices, part.test_owner()) if scoring.split == "test"
                      else (part.train_indices, part.train_owner()))
    chosen = np.asarray(indices, np.int64)[np.isin(np.asarray(part.role)[owner], CLIENT_ROLES[clients])]
    if not len(chosen):  # nothing scored, nothing that could overlap
        return False
    trained = _model_training_digests(model_art, ref, own, part, info, ds)
    if trained is None:
        if allow_unchecked:
            return True
        where = model_partition_location(model_art, ref)
        raise ArtifactError(
            f"--partition {partition}: cannot check its {scoring.what} against the samples --model {model} trained "
            f"on: the model records none (a --dp model does not), this partition is not the one it trained on (its "
            f"options, seed or pflx version differ), and that one "
            f"{'was replaced at' if where.exists() else 'is gone from'} {where}. Pass the model's own partition, "
            f"restore it at {where}, "
            f"or pass {ALLOW_FLAG} to score this one anyway (recorded as overlap_unchecked).")
    if not len(trained):
        return False
    scored = digest_keys(sample_digests(unrotated_x(ds, part, info["spec"]), ds.y, chosen))
    hits = int(np.count_nonzero(np.isin(scored, digest_keys(trained))))
    if hits and own:  # the partition hands one sample out twice: to a train client, and as unseen data
        raise ArtifactError(
            f"--partition {partition}: {hits} of the {len(chosen)} {scoring.what} of its {clients} clients are "
            f"samples the model trained on (same features and label; --model {model}): the partition is the "
            "model's own and holds them twice, once in a train client's train split (pflx simulate --replacement "
            f"over a dataset without a test pool draws both from one pool; or the dataset holds duplicates); "
            f"{stage} takes them for unseen data. Re-create it without reuse (pflx simulate --no-replacement) or "
            "deduplicate the dataset, and train again.")
    if hits:
        raise ArtifactError(
            f"--partition {partition}: {hits} of the {len(chosen)} {scoring.what} of its {clients} clients are "
            f"samples the model trained on (same features and label; --model {model}, trained on the partition "
            f"{model_partition_location(model_art, ref)}); {stage} takes them for unseen data. Pass the model's own "
            "partition, or one whose "
            "clients hold none of its training samples.")
    return False


def _model_training_digests(model_art, ref: dict, own: bool, part, info: dict, ds) -> np.ndarray | None:
    """Content digests of the samples the model trained on; None where they cannot be known (a --dp model)."""
    from pfl_cli.readers import load_partition
    from pfl_cli.data.digest import sample_digests
    from pfl_cli.data.location import locate_dataset
    from pfl_cli.readers import read_train_samples

    if model_art.has("train_samples.npz"):
        sample, digest = read_train_samples(model_art, "--model", num_samples=int(info["num_samples"]))
        if digest is None:  # recorded before digests were: indices into the dataset the manifest names
            digest = _digests_of_recorded(model_art, sample, part, info, ds)
        return digest
    if own:  # the model's own partition, recognised by its fingerprint: its train clients' train samples
        return training_record(part, ds, info["spec"])[1]
    path = model_partition_location(model_art, ref)  # beside the model in a moved tree, from any directory
    if ref.get("fingerprint") is None or not (path / "manifest.json").is_file():
        return None
    try:
        theirs, their_info, their_art = load_partition(path, flag="--model's partition")
    except ArtifactError:
        return None
    if not is_models_partition(ref, their_art):  # re-created there (another key), or changed
        return None
    their_ds = locate_dataset(their_info, their_art.path, flag="--model's partition")
    if their_ds.num_samples != int(their_info["num_samples"]) or (
            their_info.get("labels_sha256") and their_ds.labels_sha256 != their_info["labels_sha256"]):
        return None  # its dataset changed since: what the model trained on is no longer there
    return sample_digests(their_ds.x, their_ds.y, trained_samples(theirs))


def _digests_of_recorded(model_art, sample: np.ndarray, part, info: dict, ds) -> np.ndarray:
    """Digests of a pre-digest record's indices, read from the dataset the model's manifest names (found by
    its spec and content sha256); from this partition's dataset where that one is not found (same labels)."""
    from dataclasses import replace

    from pfl_cli.data import load_dataset
    from pfl_cli.data.digest import sample_digests
    from pfl_cli.errors import PflxError

    ref = next((i for i in model_art.manifest.get("inputs", []) if i.get("stage") == "dataset"), {})
    here = replace(ds, x=unrotated_x(ds, part, info["spec"]))
    candidates = [here]
    if ref.get("path") not in (None, info["spec"]):
        try:
            candidates.insert(0, load_dataset(ref["path"]))
        except (PflxError, OSError):
            pass
    for there in candidates:
        if len(sample) and there.num_samples > sample[-1] and there.content_sha256 == ref.get("sha256"):
            return sample_digests(there.x, there.y, sample)
    return sample_digests(here.x, here.y, sample)
