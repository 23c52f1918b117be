"""Checkpoints of a training run: fingerprint, sealed content, atomic writes, resume, round cross-check.

The latest checkpoint of ``train --out OUT`` lives in ``.OUT.checkpoint/state.pt`` beside OUT,
replaced atomically (:func:`pfl_cli.formats.write_atomic`). It carries a fingerprint of the
resolved config and the input hashes and a sha256 of its content (:func:`seal_checkpoint`);
it is resumed only when the content matches its sha256, the fingerprint matches the resuming
command's, and its round counter agrees with the evaluation history it stores.

In a distributed run every rank holds the same state (the server step is replicated), so
every rank reads the checkpoint and rank 0 alone writes it (:class:`Checkpointer`); a
checkpoint is therefore resumable with any number of ranks.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
from pathlib import Path
from typing import Any

from pfl_cli.errors import ArtifactError, ConfigError

CHECKPOINT_FILE = "state.pt"


def checkpoint_dir(out: Path) -> Path:
    """Where a running ``train --out OUT`` keeps its latest checkpoint: ``.OUT.checkpoint`` beside OUT."""
    out = Path(out)
    return out.parent / f".{out.name}.checkpoint"


def fingerprint(config: dict, inputs: list[dict]) -> str:
    """What a checkpoint must match to be resumed: the resolved config and the input hashes."""
    from pfl_cli.formats import canonical_json

    doc = {"config": config, "inputs": [[i["stage"], i["sha256"]] for i in inputs]}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def _canonical(obj: Any) -> Any:
    """A copy whose pickle depends on values only: fresh containers, interned strings.

    Pickle memoizes by object identity, so equal values that are one object in one run (a
    literal key) and two objects in another (keys read back from a checkpoint) would give
    different bytes.
    """
    if isinstance(obj, dict):
        return {_canonical(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_canonical(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple([_canonical(v) for v in obj])
    if type(obj) is str:
        return sys.intern(obj)
    return obj


def torch_bytes(obj: Any) -> bytes:
    """``torch.save`` into memory, byte-identical for equal values (whatever file name or origin)."""
    import torch

    buf = io.BytesIO()
    torch.save(_canonical(obj), buf)
    return buf.getvalue()


def content_sha256(obj: Any) -> str:
    """sha256 of a checkpoint's content: dict keys, sequences, tensors' dtype, shape and bytes, scalars.

    Computed from values rather than from the file's bytes, so the digest sealed into the file
    covers everything in it, and any changed byte of a tensor or a number shows.
    """
    import torch

    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, dict):
            digest.update(b"{%d" % len(value))
            for key in sorted(value, key=repr):
                feed(key)
                feed(value[key])
        elif isinstance(value, (list, tuple)):
            digest.update(b"[%d" % len(value))
            for item in value:
                feed(item)
        elif isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            digest.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            digest.update(f"{type(value).__name__}:{value!r};".encode())

    feed(obj)
    return digest.hexdigest()


# The train config's form in checkpoints: 2 = each algorithm's own config (pfl_cli.registry); absent = the flat one.
CONFIG_FORMAT = 2


def seal_checkpoint(state: dict, fp: str) -> dict:
    """``state`` with the fingerprint ``fp`` and the sha256 of both (checked by :func:`read_checkpoint`)."""
    body = {k: v for k, v in state.items() if k not in ("fingerprint", "sha256")}
    body["fingerprint"] = fp
    body["config_format"] = CONFIG_FORMAT
    return {**body, "sha256": content_sha256(body)}


def read_checkpoint(path: Path) -> dict:
    """A checkpoint whose content matches its sealed sha256 (without the seal)."""
    import torch

    restart = f"delete {path.parent} and run without --resume to start over"
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same advice
        raise ArtifactError(f"--resume: checkpoint {path} is unreadable or corrupt ({type(err).__name__}); "
                            f"{restart}.") from None
    if not isinstance(state, dict) or not {"fingerprint", "round", "sha256"} <= set(state):
        raise ArtifactError(f"--resume: {path} is not a pflx train checkpoint (no fingerprint, round and sha256); "
                            f"{restart}.")
    claimed = state.pop("sha256")
    if content_sha256(state) != claimed:
        raise ArtifactError(f"--resume: checkpoint {path} is corrupt: its content does not match its sha256 "
                            f"(a changed or damaged file); {restart}.")
    return state


def check_round_counter(state: dict, cfg, path: Path) -> None:
    """The round counter must agree with the evaluations the checkpoint stores.

    Evaluations run every ``eval_every`` rounds and at the last; a checkpoint of round r
    therefore holds them up to the last multiple of ``eval_every`` at most r.
    """
    r = state["round"]
    rounds = [row[0] for row in state.get("history", []) if isinstance(row, (list, tuple)) and row]
    ok = isinstance(r, int) and not isinstance(r, bool) and 1 <= r <= cfg.rounds
    if ok and not state.get("private_run"):  # a --dp checkpoint keeps no evaluations (fl.dp.private_snapshot)
        expected = r if r == cfg.rounds else (r // cfg.eval_every) * cfg.eval_every
        ok = (max(rounds) if rounds else 0) == expected and all(isinstance(x, int) and x <= r for x in rounds)
    if not ok:
        last = max(rounds) if rounds else None
        raise ArtifactError(f"--resume: checkpoint {path} claims round {r!r}, but its history ends at round {last} "
                            f"(evaluations every {cfg.eval_every} of {cfg.rounds} rounds); it is inconsistent. "
                            f"Delete {path.parent} and run without --resume to start over.")


def check_noise_mode(state: dict, cfg, path: Path) -> None:
    """A --dp run resumes only under the noise mode it started with (issue 21).

    A secure run continued with seeded noise would publish a seed that rebuilds its later rounds;
    a seeded run continued securely would no longer be the repeatable simulation it claims.
    """
    was = state.get("dp_noise") if state.get("private_run") else None
    now = getattr(cfg, "dp_noise", None) if getattr(cfg, "dp_epsilon", None) is not None else None
    if was != now:
        said = lambda mode: "no --dp" if mode is None else f"--dp ...,noise={mode}"  # noqa: E731
        param = "--dp" if None in (was, now) else "--dp noise"
        raise ConfigError(f"{param}: the checkpoint {path} was trained with {said(was)} and this command asks "
                          f"{said(now)}; resume with {said(was)}, or drop --resume (or delete {path.parent}) to "
                          "start over.")


def load_resume(path: Path, fp: str, cfg) -> dict:
    """The state of the checkpoint at ``path`` (which exists) to resume, once sealed, fingerprinted and consistent."""
    state = read_checkpoint(path)
    name = state.get("algorithm_name")
    if name is not None and name != cfg.algorithm:
        raise ConfigError(f"--resume: the checkpoint {path} is of an --algorithm {name} run and this command trains "
                          f"--algorithm {cfg.algorithm}; resume with --algorithm {name}, or drop --resume (or delete "
                          f"{path.parent}) to start over.")
    if state.get("config_format") != CONFIG_FORMAT:
        raise ConfigError(f"--resume: the checkpoint {path} was made by pflx 0.1.0 or earlier, whose train config "
                          "held every algorithm's keys in one format this pflx no longer resumes; drop --resume (or "
                          f"delete {path.parent}) to start over.")
    check_noise_mode(state, cfg, path)
    if state["fingerprint"] != fp:
        raise ConfigError(f"--resume: the checkpoint {path} belongs to a different config or different inputs "
                          f"(its fingerprint differs from this command's); resume only with the exact options "
                          f"and inputs of the interrupted run, or drop --resume (or delete {path.parent}) to "
                          "start over.")
    from pfl_cli.readers.checkpoint import check_checkpoint_state

    check_checkpoint_state(state, path)
    check_round_counter(state, cfg, path)
    return {k: v for k, v in state.items() if k != "fingerprint"}


class Checkpointer:
    """The checkpoint file of one run: sealed with ``fp``, written by rank 0 alone, atomically."""

    def __init__(self, out: Path, fp: str):
        self.dir = checkpoint_dir(out)
        self.path = self.dir / CHECKPOINT_FILE
        self.fp = fp
        self.written: list[int] = []  # rounds this run checkpointed

    def remove_torn_writes(self) -> None:
        """Delete temporary files of a checkpoint write cut short by a kill (the checkpoint itself is whole)."""
        from pfl_cli.fl.distributed import world

        if world()[0] != 0:  # rank 0 alone writes, so it alone cleans up
            return
        for stale in self.dir.glob(f".{CHECKPOINT_FILE}.tmp-*"):
            stale.unlink(missing_ok=True)

    def resume(self, cfg) -> dict | None:
        """The state to continue from, or None when there is no checkpoint."""
        return load_resume(self.path, self.fp, cfg) if self.path.is_file() else None

    def write(self, state: dict) -> None:
        from pfl_cli.formats import write_atomic
        from pfl_cli.fl.distributed import world

        if world()[0] == 0:  # every rank holds this same state; one file
            if state.get("private_run"):  # --dp: the server's own file, readable by its owner only
                self.dir.mkdir(parents=True, exist_ok=True)
                os.chmod(self.dir, 0o700)
            write_atomic(self.path, torch_bytes(seal_checkpoint(state, self.fp)))
            if state.get("private_run"):
                os.chmod(self.path, 0o600)
        self.written.append(int(state["round"]))
