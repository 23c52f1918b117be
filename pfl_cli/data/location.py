"""Where a partition's dataset lives: recorded resolved at partition time, found again when it moves.

A dataset spec given as ``npz:gmm10.npz`` means the file ``gmm10.npz`` of the directory the
command ran in. ``partition`` and ``simulate`` therefore record in ``dataset.json`` the spec with
the path made absolute, the path relative to the artifact directory (so a tree of artifacts and
data copied elsewhere keeps working) and the dataset's digest. A stage that reads the partition
looks for the data, in order, at:

1. the recorded absolute path;
2. the recorded path relative to the partition artifact's directory;
3. each directory of the ``PFLX_DATA`` environment variable (``os.pathsep``-separated), under the
   dataset's file or folder name (``PFLX_DATA=/mnt/data`` finds ``/mnt/data/gmm10.npz``).

The digest decides which copy is the dataset: a copy whose digest differs is never used.
What is digested (cheap, and stable across a copy, a move or a re-download):

- a single file (``npz:``, ``csv:``, a LEAF json): the sha256 of its bytes; a file whose bytes
  differ is still accepted when its arrays hash the same (``np.savez`` stamps the time into the
  zip, so re-saving the same arrays changes the bytes);
- a directory layout (CIFAR batches, IDX files, image folders, LEAF, Hugging Face folders): the
  digest of the arrays it loads to (:attr:`Dataset.content_sha256`: features, labels, natural
  clients, pools), the digest the manifests' dataset inputs already record. Listing order,
  timestamps and stray files (``.DS_Store``) do not change it, and it costs one pass over the
  arrays a stage loads anyway.

Generator schemes (``builtin:``, ``gmm:``, ``ring:``) name no file and need none of this.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from pfl_cli.data.base import Dataset
from pfl_cli.data.registry import load_dataset, parse_spec
from pfl_cli.errors import DatasetError
from pfl_cli.formats import sha256_file

ENV = "PFLX_DATA"
# The schemes that name a generator, not a file or directory.
GENERATED = frozenset({"builtin", "gmm", "ring"})


def spec_path(spec: str) -> str | None:
    """The file or directory ``spec`` reads (None for a generator such as ``builtin:digits``)."""
    scheme, arg, _ = parse_spec(spec)
    return None if scheme in GENERATED or not arg else arg


def with_path(spec: str, path: str | Path) -> str:
    """``spec`` reading ``path`` instead, its scheme and ``?options`` kept as written."""
    scheme, rest = spec.split(":", 1)
    _, mark, query = rest.partition("?")
    return f"{scheme}:{path}{mark}{query}"


def _absolute(arg: str) -> str:
    """The absolute path of the file or directory ``arg`` opens.

    ``os.path.abspath`` folds ``..`` by the letters (``data/link/../g.npz`` -> ``data/g.npz``), the
    kernel through the link (``link``'s target's parent): where the two name different files the
    link-resolved path is the one read. Otherwise the path as spelled is kept, so a link inside a
    tree of artifacts and data travels with the tree.
    """
    path = os.path.abspath(arg)
    try:
        if os.path.samefile(path, arg):
            return path
    except OSError:
        pass
    return os.path.realpath(arg)


def resolved_spec(spec: str) -> str:
    """``spec`` with its path made absolute (against the working directory); generators unchanged."""
    arg = spec_path(spec)
    return spec if arg is None else with_path(spec, _absolute(arg))


def source_record(ds: Dataset, artifact_dir: str | Path) -> dict[str, Any]:
    """The ``dataset.json`` fields that let a stage find ``ds`` again from anywhere.

    Returns ``{}`` for a generator. Otherwise ``spec`` (the path absolute), ``spec_given``
    (as typed, when it differs) and ``source`` {``path`` (absolute), ``relative_path`` (from
    the artifact directory), ``kind`` (file or directory), ``sha256`` (a file's bytes),
    ``content_sha256`` (the loaded arrays)}.
    """
    arg = spec_path(ds.spec)
    if arg is None:
        return {}
    path = _absolute(arg)
    source: dict[str, Any] = {
        "path": path,
        "relative_path": os.path.relpath(path, os.path.abspath(artifact_dir)),
        "kind": "file" if os.path.isfile(path) else "directory",
    }
    if source["kind"] == "file":
        source["sha256"] = sha256_file(path)
    source["content_sha256"] = ds.content_sha256
    record: dict[str, Any] = {"spec": resolved_spec(ds.spec), "source": source}
    if record["spec"] != ds.spec:
        record["spec_given"] = ds.spec
    return record


# recorded spec -> the spec :func:`locate_dataset` found it under in this process (for :func:`load_located`)
_FOUND: dict[str, str] = {}


def load_located(spec: str) -> Dataset:
    """Load the recorded ``spec`` again from where :func:`locate_dataset` last found it in this process
    (the recorded path when it has not looked): a stage that needs the raw arrays a second time (a
    rotated partition's unrotated features) reads the copy the first load checked."""
    return _as_recorded(load_dataset(_FOUND.get(spec, spec)), spec)


def _candidates(source: Mapping[str, Any], artifact_dir: Path, env: Mapping[str, str]) -> list[tuple[Path, str]]:
    """(path, where it came from), in the order they are tried."""
    stored = Path(str(source["path"]))
    found = [(stored, "recorded path")]
    if source.get("relative_path"):
        # folded by the letters, as it was recorded (os.path.relpath): through a linked directory
        # (``runs -> /scratch/runs``) ``runs/part/../../data`` is the tree's ``data``, not /scratch's
        rel = str(source["relative_path"])
        found.append((Path(os.path.normpath(os.path.join(os.path.abspath(artifact_dir), rel))),
                      "relative to the partition"))
        if ".." in Path(rel).parts:  # then as the kernel reads it
            found.append((artifact_dir / rel, "relative to the partition"))
    for root in (r for r in env.get(ENV, "").split(os.pathsep) if r.strip()):
        found.append((Path(root) / stored.name, ENV))
    return found


def _exists(path: Path, kind: str) -> bool:
    return {"file": path.is_file, "directory": path.is_dir}.get(kind, path.exists)()


def locate_dataset(info: Mapping[str, Any], artifact_dir: str | Path, *, flag: str = "--partition",
                   env: Mapping[str, str] | None = None) -> Dataset:
    """Load the dataset a partition's ``dataset.json`` (``info``) names, wherever it now is.

    The returned dataset carries the recorded ``spec`` (so artifacts made before and after a
    move name the same dataset). Raises :class:`DatasetError` (exit 2, one line) when no
    candidate exists, or none has the recorded digest.
    """
    env = os.environ if env is None else env
    artifact_dir = Path(artifact_dir)
    spec = str(info["spec"])
    source = info.get("source")
    where = f"{flag} {artifact_dir}"
    if not isinstance(source, Mapping):  # a generator, or a partition written before sources were recorded
        arg = spec_path(spec)
        if arg is None:
            return load_dataset(spec)
        source = {"path": arg, "kind": "any"}
    kind = str(source.get("kind", "any"))
    tried, wrong = [], []
    for path, origin in _candidates(source, artifact_dir, env):
        if not _exists(path, kind):
            tried.append(str(path))
            continue
        ds = load_dataset(with_path(spec, path))
        same_bytes = kind == "file" and bool(source.get("sha256")) and sha256_file(path) == source["sha256"]
        recorded = source.get("content_sha256")
        if not same_bytes and recorded and ds.content_sha256 != recorded:
            wrong.append(f"{path} ({origin}: sha256 {ds.content_sha256[:12]}, recorded {str(recorded)[:12]})")
            continue
        _FOUND[spec] = with_path(spec, os.path.abspath(path))
        return _as_recorded(ds, spec)
    name = Path(str(source["path"])).name
    if wrong:
        raise DatasetError(f"{where}: its dataset {spec} is not the data the partition was made from at "
                           f"{'; '.join(wrong)}. Restore the original {name}, or set {ENV} to a directory holding an "
                           "unchanged copy (its digest is checked).")
    raise DatasetError(f"{where}: its dataset {spec} is not found (tried {', '.join(tried)}). Set {ENV} to the "
                       f"directory that now holds {name} (e.g. {ENV}=/path/to/data), or move it back.")


def _as_recorded(ds: Dataset, spec: str) -> Dataset:
    import dataclasses

    return ds if ds.spec == spec else dataclasses.replace(ds, spec=spec)


def load_partition_dataset(partition: str | Path, *, flag: str = "--partition"):
    """A partition artifact and its dataset: ``(partition, dataset.json, artifact, dataset)``, refused when the
    dataset no longer matches dataset.json.

    The dataset is looked for where dataset.json recorded it, then relative to the artifact, then under
    ``PFLX_DATA`` (:func:`locate_dataset`), its digest checked. A rotated partition's clients are rotated here.
    """
    from pfl_cli.errors import ArtifactError
    from pfl_cli.readers import load_partition

    part, info, artifact = load_partition(partition, flag=flag)
    ds = locate_dataset(info, artifact.path, flag=flag)
    if ds.num_samples != int(info["num_samples"]) or (
        info.get("labels_sha256") and ds.labels_sha256 != info["labels_sha256"]
    ):
        raise ArtifactError(f"{flag} {partition}: dataset {info['spec']} no longer matches the partition "
                            "(size or labels changed). Re-create the partition.")
    if part.rotation is not None:  # rotated clients (partition --rotations): rotate when the data load
        import dataclasses

        from pfl_cli.partition.rotation import rotate_clients

        ds = dataclasses.replace(ds, x=rotate_clients(ds.x, part))
    return part, info, artifact, ds
