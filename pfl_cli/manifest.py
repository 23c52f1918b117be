"""The artifact contract (DESIGN.md section 3, schema 1): names, the manifest's rules, the DP release classes.

Compatibility contract. An artifact directory holds payload files and ``manifest.json``,
written last::

    {"tool": "pflx", "version": "0.1.0", "schema": 1, "stage": "partition",
     "created_utc": "...", "argv": [...], "config": {...}, "seed": 0,
     "inputs": [{"path": ..., "stage": ..., "sha256": ...}],
     "outputs": [{"path": "clients.npz", "sha256": ..., "bytes": 123}]}

Readers check ``tool``, ``schema`` and ``stage`` and verify the payload hashes
(:func:`pfl_cli.readers.read_artifact`); :func:`check_manifest` checks the manifest's fields.
The writer is :class:`pfl_cli.artifacts.ArtifactWriter`.

DP release contract. An artifact written under ``--dp`` (``ArtifactWriter(..., dp=True)``)
carries ``"dp": true`` in its manifest, and every output entry a ``"release"`` class:

- ``"mechanism"`` -- the output of a DP mechanism whose events are in ``privacy.json``;
- ``"post-processing"`` -- a function of mechanism outputs and public inputs only (the
  config, public data such as the server's dataset, user-given bounds); ``privacy.json``
  itself is post-processing of the public config;
- ``"nonprivate"`` -- a diagnostic computed on the private data. Written only when the user
  asks (``--write-nonprivate``), to a file whose name starts with ``nonprivate``.

The writer refuses to finish a DP artifact holding an unclassified file or a
``nonprivate`` file under another name. Under ``--dp`` the manifest withholds the sha256
of private inputs (a hash tells two neighbouring datasets apart with certainty); inputs
marked with :func:`public_input` keep theirs. :func:`check_release_contract` checks a
finished artifact directory file by file.

Layers: this module imports only :mod:`pfl_cli.formats` and :mod:`pfl_cli.errors`; the
readers (:mod:`pfl_cli.readers`) import it, the writer (:mod:`pfl_cli.artifacts`) imports
both, the engine (:mod:`pfl_cli.fl`) imports the readers and never the writer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from pfl_cli.errors import ArtifactError
from pfl_cli.formats import canonical_json, load_json, sha256_bytes

SCHEMA = 1
MANIFEST = "manifest.json"
# The payload format of a train artifact's model.pt (written by pfl_cli.fl.api, read by pfl_cli.readers.model).
MODEL_FORMAT = "pflx-model-1"
# A partition's manifest holds a secret drawn from OS entropy when it is written (64 hex digits). A train artifact
# records its partition's fingerprint under that key (:func:`partition_fingerprint`); under --dp, where the
# partition's sha256 is withheld, the fingerprint alone recognises the very partition the model trained on.
PARTITION_KEY = "partition_key"

# Which command writes each stage, for error messages that say how to fix things.
PRODUCER = {
    "partition": "pflx partition (or pflx simulate)",
    "mdm-fit": "pflx mdm-fit",
    "train": "pflx train",
    "predict": "pflx predict",
    "cluster": "pflx cluster",
    "attack": "pflx attack",
    "compare": "pflx compare",
    "tune": "pflx tune",
}



def lock_file(out: str | Path) -> Path:
    """The sibling lock file of ``out``: ``.NAME.lock`` beside it (held by its writer, probed by its readers)."""
    out = Path(out)
    return out.parent / f".{out.name}.lock"


# ---------------------------------------------------------------------------- DP release contract
MECHANISM = "mechanism"
POST_PROCESSING = "post-processing"
NONPRIVATE = "nonprivate"
RELEASE_CLASSES = (MECHANISM, POST_PROCESSING, NONPRIVATE)
NONPRIVATE_PREFIX = "nonprivate"
PRIVACY_FILE = "privacy.json"
# Keys that hold exact counts or exact statistics of the private data; a released (not
# nonprivate) JSON document or CSV header under --dp must not contain them.
EXACT_COUNT_KEYS = frozenset({
    "num_clients", "num_points", "num_samples_seen", "cohort_size", "cohort_sizes", "clients", "clipped_fraction",
    "skipped_empty_clients", "server_points_kept_exact", "kmeans_cost", "normalized_cost", "log_likelihood",
    "mean_log_likelihood", "max_samples_seen", "holdout_normalized_cost", "centralized_normalized_cost",
})


def public_input(ref: Mapping[str, str]) -> dict[str, Any]:
    """Mark an input reference as public data: a DP manifest keeps its sha256."""
    return {**ref, "public": True}


def is_nonprivate_name(name: str) -> bool:
    return Path(name).name.startswith(NONPRIVATE_PREFIX)


def check_release_class(name: str, release: str | None) -> None:
    if release not in RELEASE_CLASSES:
        raise ValueError(f"release class of {name} must be one of {', '.join(RELEASE_CLASSES)}; got {release!r}.")
    if (release == NONPRIVATE) != is_nonprivate_name(name):
        raise ValueError(f"{name}: a file is release class {NONPRIVATE!r} exactly when its name starts with "
                         f"{NONPRIVATE_PREFIX!r}; got class {release!r}.")


def _json_keys(obj: Any) -> Iterable[str]:
    """Keys of every nested object whose value is set (a ``null`` releases nothing)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if value is not None:
                yield str(key)
            yield from _json_keys(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _json_keys(value)


def _numbers_in_text(text: str) -> set[float]:
    import re

    found = set()
    for token in re.findall(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text):
        try:
            found.add(float(token))
        except ValueError:
            pass
    return found


def release_contract_violations(path: str | Path, *, private_values: Iterable[float] = ()) -> list[str]:
    """Every way the DP artifact at ``path`` breaks the release contract (empty: none).

    Walks every file of the directory. Checks that the manifest says ``"dp": true``, that
    each file is listed with a valid release class, that ``nonprivate`` files (and only
    they) are named ``nonprivate*``, that ``privacy.json`` holds events and is not
    nonprivate, that private inputs' hashes are withheld, that no released JSON document
    or CSV header holds an exact-count key (:data:`EXACT_COUNT_KEYS`), and that no released
    text file holds any number of ``private_values`` (exact counts the caller knows, e.g.
    the true number of clients, written as a number token).
    """
    path = Path(path)
    try:
        manifest = load_json(path / MANIFEST)
    except ArtifactError as err:
        return [str(err)]
    problems = []
    if manifest.get("dp") is not True:
        problems.append(f"{MANIFEST}: 'dp' is {manifest.get('dp')!r}, expected true for a DP artifact")
    listed = {o.get("path"): o for o in manifest.get("outputs", [])}
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {MANIFEST}
    for name in sorted(on_disk - set(listed)):
        problems.append(f"{name}: on disk but not in {MANIFEST} (unclassified)")
    for name in sorted(set(listed) - on_disk):
        problems.append(f"{name}: in {MANIFEST} but missing")
    for ref in manifest.get("inputs", []):
        if not ref.get("public") and ref.get("sha256") is not None:
            problems.append(f"{MANIFEST}: private input {ref.get('path')} is fingerprinted by its sha256")
    secrets = {float(v) for v in private_values}
    for name in sorted(on_disk & set(listed)):
        release = listed[name].get("release")
        try:
            check_release_class(name, release)
        except ValueError as err:
            problems.append(str(err))
            continue
        if release == NONPRIVATE:
            continue
        problems.extend(_released_file_problems(path / name, name, secrets))
    if PRIVACY_FILE not in listed:
        problems.append(f"{PRIVACY_FILE}: missing; a DP artifact records its mechanisms' events there")
    else:
        doc = load_json(path / PRIVACY_FILE) if (path / PRIVACY_FILE).is_file() else {}
        if not isinstance(doc, dict) or not doc.get("events"):
            problems.append(f"{PRIVACY_FILE}: holds no events")
    return problems


def _released_file_problems(file: Path, name: str, secrets: set[float]) -> list[str]:
    problems = []
    suffix = file.suffix.lower()
    if suffix in (".json", ".csv", ".txt", ".yaml", ".yml"):
        text = file.read_text()
        if suffix == ".json":
            bad = sorted(set(_json_keys(json.loads(text))) & EXACT_COUNT_KEYS)
        elif suffix == ".csv":
            bad = sorted(set(text.splitlines()[0].split(",") if text else []) & EXACT_COUNT_KEYS)
        else:
            bad = []
        if bad:
            problems.append(f"{name}: released file holds exact-count fields {bad}")
        leaked = sorted(_numbers_in_text(text) & secrets)
        if leaked:
            problems.append(f"{name}: released file contains the private value(s) {leaked}")
    return problems


def check_release_contract(path: str | Path, *, private_values: Iterable[float] = ()) -> None:
    """Raise :class:`ArtifactError` listing every release-contract violation of a DP artifact."""
    problems = release_contract_violations(path, private_values=private_values)
    if problems:
        raise ArtifactError(f"{path}: breaks the DP release contract: " + "; ".join(problems))



# ---------------------------------------------------------------------------- the manifest
@dataclass(frozen=True)
class Artifact:
    """A verified artifact directory and its manifest."""

    path: Path
    manifest: Mapping[str, Any]

    @property
    def stage(self) -> str:
        return self.manifest["stage"]

    @property
    def config(self) -> Mapping[str, Any]:
        return self.manifest.get("config", {})

    @property
    def content_hash(self) -> str:
        """Hash of the payload alone: a byte-identical re-run keeps it unchanged."""
        outputs = [(o["path"], o["sha256"]) for o in self.manifest["outputs"]]
        return sha256_bytes(canonical_json([self.stage, outputs]).encode())

    def file(self, name: str) -> Path:
        return self.path / name

    def has(self, name: str) -> bool:
        return any(o["path"] == name for o in self.manifest["outputs"])

    def input_ref(self) -> dict[str, str]:
        return {"path": str(self.path), "stage": self.stage, "sha256": self.content_hash}


def _manifest_problem(manifest: Mapping[str, Any]) -> str | None:
    """The first way ``manifest``'s fields break schema 1 (None: none); types only, files are checked by the reader."""
    if not isinstance(manifest.get("config", {}), dict):
        return f"'config' must be an object; got {_kind(manifest['config'])}"
    seed = manifest.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        return f"'seed' must be an integer or null; got {seed!r}"
    for key, needed in (("outputs", ("path", "sha256")), ("inputs", ("path", "stage"))):
        entries = manifest.get(key, [])
        if not isinstance(entries, list):
            return f"'{key}' must be a list of objects; got {_kind(entries)}"
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                return f"'{key}'[{i}] must be an object with {' and '.join(needed)}; got {_kind(entry)}"
            for field in needed:
                if not isinstance(entry.get(field), str) or not entry[field]:
                    return f"'{key}'[{i}].{field} must be a non-empty string; got {entry.get(field)!r}"
            digest = entry.get("sha256")
            if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                           and all(c in "0123456789abcdef" for c in digest)):
                return f"'{key}'[{i}].sha256 must be 64 hex digits{'' if key == 'outputs' else ' or null'}; got {digest!r}"
        if key == "outputs":
            names = [e["path"] for e in entries]
            for name in names:  # payload files live inside the artifact: no absolute path, no way up
                if Path(name).is_absolute() or ".." in Path(name).parts or name == MANIFEST:
                    return f"'outputs' path must name a file inside the artifact; got {name!r}"
            if len(set(names)) != len(names):
                return f"'outputs' lists a path twice ({sorted(n for n in set(names) if names.count(n) > 1)[0]!r})"
    return None


def _kind(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"[:80]


def check_manifest(manifest: Mapping[str, Any], where: str) -> None:
    """Refuse (ArtifactError, exit 2) a manifest whose config, seed, inputs or outputs are malformed."""
    problem = _manifest_problem(manifest)
    if problem:
        raise ArtifactError(f"{where}: {problem}; the manifest is damaged. Re-create the artifact.")


def partition_fingerprint(manifest: Mapping[str, Any], content_hash: str) -> str | None:
    """HMAC-SHA256 (RFC 2104) of a partition's content hash under the secret key its manifest holds; None for a
    partition written before keys were (or without one).

    Why a --dp train artifact may publish it: the key is 256 bits of OS entropy drawn independently of the data
    and kept in the partition artifact, which stays with the private data on the trusted machine. Without the key
    the fingerprint is a pseudo-random string whose distribution does not depend on the data (HMAC is a PRF), so
    it tells no neighbouring datasets apart; with the key (that is, with the partition, and so the data) it
    recognises the partition: same key and same content, which the dataset's recorded digest ties to the data.
    A partition re-created by the same command draws another key, so it never passes for the model's own.
    """
    import hashlib
    import hmac

    key = manifest.get(PARTITION_KEY)
    if not (isinstance(key, str) and len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
        return None
    # written in the letters a-p (one a nibble): a released file's numbers are checked against the private counts
    # (check_release_contract), and a hex digest's digit runs would match one by chance
    return hmac.new(bytes.fromhex(key), content_hash.encode(), hashlib.sha256).hexdigest().translate(_LETTERS)


_LETTERS = str.maketrans("0123456789abcdef", "abcdefghijklmnop")
