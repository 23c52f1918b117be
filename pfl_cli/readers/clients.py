"""Reader of ``clients.npz``: which samples each client holds (DESIGN.md section 3, CSR layout)."""

from __future__ import annotations

import numpy as np

from pfl_cli.formats import load_npz
from pfl_cli.manifest import Artifact
from pfl_cli.errors import ArtifactError
from pfl_cli.readers._rules import listed, refuse

REQUIRED = ("client_id", "role", "train_offsets", "train_indices", "test_offsets", "test_indices")
OPTIONAL = ("client_name", "labeled", "rotation")


def _integer_vector(art: Artifact, flag: str, name: str, arrays: dict, key: str) -> None:
    a = arrays[key]
    # A float or string array would be cast silently (1.7 -> 1): an index is an integer or nothing.
    if a.dtype.kind not in "iub" or a.ndim != 1:
        raise refuse(art, flag, name, f"{key} must be a 1-D integer array",
                     f"{a.dtype} array of shape {a.shape}")


def read_clients(art: Artifact, flag: str, *, num_samples: int) -> dict[str, np.ndarray]:
    """The arrays of ``clients.npz``, checked.

    Rules: the six CSR arrays are present, 1-D and of an integer dtype (``client_id`` unique,
    ``role`` 0 or 1); offsets start at 0, never decrease and end at their index array's length;
    indices lie in ``[0, num_samples)``; optional ``client_name`` is a string array and
    ``labeled`` / ``rotation`` integer arrays, one entry per client; the number of clients is
    the manifest config's ``num_clients`` when it fixes one (not natural clients).
    """
    from pfl_cli.partition.base import Partition

    name = "clients.npz"
    arrays = _plain_npz(art, flag, name)
    missing = sorted(set(REQUIRED) - set(arrays))
    if missing:
        raise refuse(art, flag, name, f"lacks the arrays {missing}")
    for key in (*REQUIRED, "labeled", "rotation"):
        if key in arrays:
            _integer_vector(art, flag, name, arrays, key)
    if "client_name" in arrays and (arrays["client_name"].dtype.kind != "U" or arrays["client_name"].ndim != 1):
        raise refuse(art, flag, name, "client_name must be a 1-D string array", str(arrays["client_name"].dtype))
    ids = arrays["client_id"]
    ordered = np.sort(ids)  # not np.unique: it imports numpy.ma (~25 ms of `pflx show`'s start-up)
    if (ordered[1:] == ordered[:-1]).any():
        raise refuse(art, flag, name, "client_id must be unique")
    part = Partition.from_arrays(arrays)
    try:
        part.check(num_samples)
    except ValueError as err:
        raise refuse(art, flag, name, str(err).rstrip("."), fix="The artifact's files disagree; re-create the "
                     "partition.") from None
    config = art.config
    said = config.get("num_clients")
    if isinstance(said, int) and not isinstance(said, bool) and not config.get("natural_id") and said != len(ids):
        raise refuse(art, flag, name, f"must hold the {said} clients of the manifest's config (num_clients)",
                     f"{len(ids)} clients", fix="The manifest or the file was edited; re-create the partition.")
    return arrays


def read_partition_files(art: Artifact, flag: str) -> tuple[dict, dict[str, np.ndarray], dict]:
    """``(dataset.json, clients.npz arrays, stats.json)`` of a partition artifact, each checked and all consistent."""
    from pfl_cli.readers.documents import read_dataset_info, read_stats

    info = read_dataset_info(art, flag)
    arrays = read_clients(art, flag, num_samples=info["num_samples"])
    stats = read_stats(art, flag, num_clients=len(arrays["client_id"]), roles=arrays["role"])
    if stats.get("num_classes", info["num_classes"]) != info["num_classes"]:
        raise refuse(art, flag, "stats.json", f"num_classes must be dataset.json's {info['num_classes']}",
                     stats["num_classes"])
    return info, arrays, stats


def read_train_samples(art: Artifact, flag: str, *, num_samples: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``train_samples.npz`` of a train artifact: ``(sample, digest)``, the dataset indices the model
    trained on and their content digests (:mod:`pfl_cli.data.digest`; None in an artifact written
    before pflx recorded them), checked.

    Rules: it holds ``sample``, a 1-D integer array, strictly increasing, in ``[0, num_samples)``;
    ``digest``, when present, is a uint8 array of shape ``(len(sample), 16)``.
    """
    name = "train_samples.npz"
    arrays = _plain_npz(art, flag, name)
    if "sample" not in arrays:
        raise refuse(art, flag, name, "lacks the array 'sample'")
    _integer_vector(art, flag, name, arrays, "sample")
    sample = arrays["sample"].astype(np.int64)
    if len(sample) and (sample[0] < 0 or sample[-1] >= num_samples or (np.diff(sample) <= 0).any()):
        raise refuse(art, flag, name, f"sample must be strictly increasing dataset indices in [0, {num_samples})")
    digest = arrays.get("digest")
    if digest is not None and (digest.dtype != np.uint8 or digest.shape != (len(sample), 16)):
        raise refuse(art, flag, name, f"digest must be a uint8 array of shape ({len(sample)}, 16), one row per sample",
                     f"{digest.dtype} array of shape {digest.shape}")
    return sample, digest


def _plain_npz(art: Artifact, flag: str, name: str) -> dict:
    """The arrays of the artifact's listed ``name``, or the refusal that names the file and why."""
    listed(art, flag, name)
    try:
        return load_npz(art.file(name))
    except ArtifactError as err:
        reason = str(err).split("(", 1)[-1].rstrip(".").removesuffix(")")
        raise refuse(art, flag, name, f"must be a readable .npz of plain arrays ({reason})") from None
