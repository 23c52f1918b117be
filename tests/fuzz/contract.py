"""The contract every pflx command keeps, whatever it is given (issue 12).

Exit 0 with a valid artifact, or exit 2 (bad input) / 1 (a failure at run time, never caused
by input) with exactly one line on stderr, no traceback, no artifact, and no temp folder,
probe or lock file left beside ``--out``.
"""

from __future__ import annotations

from pathlib import Path

from pfl_cli.artifacts import read_artifact, sha256_file

# Run-time failures a valid request may still meet; anything else with exit 1 is a bug.
RUNTIME_MESSAGES = ("training diverged", "out of memory")


def snapshot(out: Path) -> dict[str, str] | None:
    """What ``out`` holds (file -> sha256), to prove a refused run left it unchanged."""
    if not out.is_dir():
        return None
    return {str(p.relative_to(out)): sha256_file(p) for p in sorted(out.rglob("*")) if p.is_file()}


def leftovers(out: Path) -> list[str]:
    """Hidden siblings of ``out`` a finished run must not leave (its checkpoint aside)."""
    if not out.parent.is_dir():
        return []
    return sorted(p.name for p in out.parent.iterdir()
                  if p.name.startswith(f".{out.name}.") and not p.name.endswith(".checkpoint"))


def check(res, *, out: Path | None, before: dict | None, stage: str | None, args) -> None:
    """Assert the contract on one finished command ``res`` (a tests.conftest.Run)."""
    where = f"args={[str(a) for a in args]!r}\nstderr={res.err!r}"
    assert res.code in (0, 1, 2), where
    assert "Traceback" not in res.err and "internal error" not in res.err, where
    if out is not None:
        assert leftovers(out) == [], where
    if res.code == 0:
        if out is not None and stage is not None and out.exists():
            read_artifact(out, stage)  # verifies every payload hash
        return
    errors = [line for line in res.err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("pflx: error: "), where
    if res.code == 1:
        assert any(m in res.err for m in RUNTIME_MESSAGES), where
    if out is not None:
        assert snapshot(out) == before, where
