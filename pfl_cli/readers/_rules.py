"""The small checks every reader is made of; each failure names the file and the rule."""

from __future__ import annotations

import math
from typing import Any

from pfl_cli.manifest import PRODUCER, Artifact
from pfl_cli.errors import ArtifactError


def refuse(art: Artifact, flag: str, name: str, rule: str, got: Any = ..., fix: str = "") -> ArtifactError:
    """The error for payload file ``name`` of ``art`` breaking ``rule`` (with the value found, when given)."""
    found = "" if got is ... else f"; got {shown(got)}"
    fix = fix or f"Re-create it with `{producer(art)}`."
    return ArtifactError(f"{flag} {art.path}: {name}: {rule}{found}. {fix}")


def producer(art: Artifact) -> str:
    return PRODUCER.get(art.stage, f"pflx {art.stage}")


def shown(value: Any) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def listed(art: Artifact, flag: str, name: str) -> None:
    """Refuse to read a payload file the manifest does not list (its hash was never verified)."""
    if not art.has(name):
        raise refuse(art, flag, name, "missing from manifest.json's outputs, so its content is unverified",
                     fix="The artifact is incomplete; re-create it" + f" with `{producer(art)}`.")
