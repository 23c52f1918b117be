"""Files a config names by path (path-valued keys: ``backbone_weights``, ``availability_trace``, and ``compute_speed``
/ ``network_speed`` in their ``file:PATH`` form), found again wherever the tree went.

A path-valued key is declared in the config schema (``key(..., path="file")``: the value is the path;
``path="spec"``: the value names a file in its ``file:PATH`` form only; :func:`path_keys`, :func:`key_file`). ``train``
records each such file as a manifest input (:func:`file_inputs`: ``stage: "file"``, the key, its sha256, kept
under --dp: a pre-trained file is a public input) beside the partition, so that, like an input artifact, it
is found from any working directory and after the tree moved (the writer adds ``relative_path``); the
model's payload names the file, not where it was. ``config.yaml`` holds the path relative to the artifact
(:func:`portable_config`), and :func:`pfl_cli.config.load_config_file` reads a relative path-valued key
relative to the config file first, so ``train --config RUN/config.yaml`` works from anywhere too.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

from pfl_cli.errors import InputError
from pfl_cli.formats import sha256_file

FILE_STAGE = "file"
# Where a model payload's client spec names the file of a path-valued key (pfl_cli.models.pretrained.backbone_spec)
SPEC_FIELDS = {"backbone_weights": "weights"}


def path_keys(cls: type) -> tuple[str, ...]:
    """The path-valued keys of a config dataclass (fields declared with ``path=...`` metadata)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("path"))


SPEC_PREFIX = "file:"


def key_file(cls: type, key: str, value) -> str | None:
    """The file the value of path-valued ``key`` of the config class ``cls`` names (None: it names none)."""
    kind = next((f.metadata.get("path") for f in dataclasses.fields(cls) if f.name == key), None)
    if not value or not isinstance(value, str):
        return None
    if kind == "spec":
        return value[len(SPEC_PREFIX):] or None if value.startswith(SPEC_PREFIX) else None
    return value


def with_key_file(cls: type, key: str, value: str, path: str) -> str:
    """``value`` of path-valued ``key`` naming ``path`` instead of the file it names (its form kept)."""
    kind = next((f.metadata.get("path") for f in dataclasses.fields(cls) if f.name == key), None)
    return SPEC_PREFIX + path if kind == "spec" else path


def file_inputs(cfg) -> list[dict]:
    """Manifest input references of the files ``cfg``'s path-valued keys name (a key left empty: none)."""
    refs = []
    for key in path_keys(type(cfg)):
        value = key_file(type(cfg), key, getattr(cfg, key))
        if value:
            path = Path(str(value))
            refs.append({"path": str(path), "stage": FILE_STAGE, "key": key, "public": True,
                         "absolute_path": str(path.resolve()),
                         "sha256": sha256_file(path) if path.is_file() else None})
    return refs


def portable_config(config: Mapping[str, Any], cls: type, out: str | Path) -> dict:
    """``config`` with its path-valued keys made relative to the artifact ``out`` (config.yaml: read relative to
    itself by ``train --config``, so it holds from any directory and in a moved tree)."""
    doc = dict(config)
    for key in path_keys(cls):
        named = key_file(cls, key, doc.get(key))
        if named:
            doc[key] = with_key_file(cls, key, doc[key],
                                     os.path.relpath(os.path.abspath(str(named)), os.path.abspath(str(out))))
    return doc


def locate_file(art, ref: Mapping[str, Any]) -> Path:
    """Where the file an artifact's ``file`` input names is now: relative to the artifact, where it was, as typed;
    the first with the recorded sha256. Refused (InputError, one line) when missing or changed, saying which."""
    candidates = []
    if ref.get("relative_path"):
        candidates.append(Path(os.path.normpath(os.path.join(os.path.abspath(art.path), str(ref["relative_path"])))))
    for key in ("absolute_path", "path"):
        if ref.get(key):
            candidates.append(Path(str(ref[key])))
    existing = [p for p in dict.fromkeys(candidates) if p.is_file()]
    for path in existing:
        if ref.get("sha256") is None or sha256_file(path) == ref["sha256"]:
            return path
    key = ref.get("key", "file")
    if existing:
        raise InputError(f"{key} {existing[0]}: changed since {art.path} was made (sha256 differs from the recorded "
                         f"{str(ref.get('sha256'))[:12]}); give the same file back.")
    tried = ", ".join(str(p) for p in dict.fromkeys(candidates))
    raise InputError(f"{key} {ref.get('path')}: missing (tried {tried}); {art.path} was made with it: put the file "
                     "back beside the artifacts, as it was.")


def located_files(art) -> dict[str, Path]:
    """``key -> path`` of every ``file`` input of ``art``, each found (or refused) by :func:`locate_file`."""
    return {str(ref.get("key")): locate_file(art, ref) for ref in art.manifest.get("inputs", [])
            if ref.get("stage") == FILE_STAGE}


def with_located_files(art, arch: dict) -> dict:
    """A model payload's ``arch`` with each spec's file field (:data:`SPEC_FIELDS`) pointing at the file found by
    :func:`located_files` (a payload of an artifact that records no file inputs: as it is)."""
    found = located_files(art)
    out = {}
    for name, spec in arch.items():
        if isinstance(spec, dict):
            spec = {**spec, **{field: str(found[key]) for key, field in SPEC_FIELDS.items()
                               if key in found and spec.get(field)}}
        out[name] = spec
    return out
