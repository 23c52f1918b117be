"""Read the train and predict artifacts a comparison is made of: one record per run and client group.

A train artifact gives its training clients (``clients.csv`` rows of role 0) and the holdout
clients it evaluated while training (role 1); a predict artifact of ``--clients holdout`` gives
the new clients, served with its algorithm's own protocol. Every artifact is opened with
:func:`pfl_cli.readers.read_artifact` (stage, schema, hashes) and its documents with
:mod:`pfl_cli.readers`; a predict artifact is tied to its train artifact by the model's content
hash, so it inherits the algorithm, the configuration and the seed it was trained with.

Under ``--dp`` a train artifact releases no accuracy (its ``metrics.json`` holds public facts only,
DESIGN.md section 3). Such a run is refused unless the caller opts into its ``nonprivate-clients.csv``
(written by ``train --write-nonprivate``): diagnostics on the private clients, outside the guarantee.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pfl_cli.errors import ArtifactError, InputError
from pfl_cli.formats import canonical_json, read_utf8, sha256_bytes
from pfl_cli.manifest import Artifact
from pfl_cli.readers import input_location, read_artifact

FLAG = "RUN"
STAGES = ("train", "predict")
# Keys of a run's config that say which draw it is, not which method: runs differing only there are seeds of one row.
SEED_KEYS = ("seed",)
CLIENT_COLUMNS = ("client_id", "role", "accuracy", "accuracy_lm")


@dataclass(frozen=True)
class ClientGroup:
    """One run's per-client test accuracies on one group of clients ("train" or "new")."""

    path: str                  # the artifact directory, as given
    stage: str                 # the artifact's stage: "train" or "predict"
    group: str                 # "train": training clients; "new": clients never trained on
    source: str                # where the new clients' numbers come from: "predict" or "train" (its holdout evaluation)
    algorithm: str
    config: Mapping[str, Any]  # the training config without its seed
    seed: int | None           # the training run's seed
    client_id: np.ndarray      # int64 (n,)
    accuracy: np.ndarray       # float64 (n,), NaN: no scored test sample
    accuracy_lm: np.ndarray    # float64 (n,), label-masked
    predict_config: Mapping[str, Any] | None = None  # predict's config without its seed (new clients from predict)
    nonprivate: bool = False   # read from a DP artifact's nonprivate-clients.csv
    input_ref: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """The row this group belongs to: algorithm and training config without the seed."""
        return sha256_bytes(canonical_json([self.algorithm, dict(self.config)]).encode())


@dataclass(frozen=True)
class _Run:
    art: Artifact
    given: str
    partition: str            # the partition's content hash
    dataset: str              # the dataset spec
    groups: tuple[ClientGroup, ...]
    model_hash: str | None = None  # predict: the train artifact's content hash


def _refuse(path: str, message: str) -> InputError:
    return InputError(f"{FLAG} {path}: {message}")


def _without_seed(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in SEED_KEYS}


def _input(art: Artifact, given: str, stage: str) -> Mapping[str, Any]:
    for ref in art.manifest.get("inputs", []):
        if ref.get("stage") == stage:
            return ref
    raise ArtifactError(f"{FLAG} {given}: manifest.json names no {stage} input; the manifest is damaged. "
                        "Re-create the artifact.")


def _partition_hash(art: Artifact, given: str) -> str:
    """The content hash of the run's partition; under --dp (hash withheld) read from the partition itself."""
    ref = _input(art, given, "partition")
    if ref.get("sha256"):
        return str(ref["sha256"])
    where = input_location(art, ref)
    if not (where / "manifest.json").is_file():
        raise _refuse(given, f"its manifest withholds the partition's sha256 (a --dp run) and the partition it names "
                      f"({where}) is not here to read, nor beside the run where its manifest places it; restore it "
                      "there (moved together with the run, it is found from any directory).")
    return read_artifact(where, "partition", flag=f"{FLAG} {given}: partition").content_hash


def read_client_accuracies(art: Artifact, given: str, name: str) -> dict[str, np.ndarray]:
    """``clients.csv`` (or ``nonprivate-clients.csv``): client_id, role, accuracy, accuracy_lm, checked.

    Rules: the file is listed in the manifest; its header has the four columns; ids are integers
    (unique), roles 0 or 1, accuracies empty (no scored test sample) or numbers in [0, 1].
    """
    from pfl_cli.readers._rules import listed, refuse

    listed(art, FLAG, name)
    text = read_utf8(art.file(name), f"{FLAG} {given}: {name}", ArtifactError)
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in CLIENT_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise refuse(art, FLAG, name, f"lacks the columns {missing}")
    ids, roles, acc, acc_lm = [], [], [], []
    for line, row in enumerate(reader, start=2):
        try:
            ids.append(int(row["client_id"]))
            roles.append(int(row["role"]))
            pair = [float(row[c]) if row[c] not in ("", None) else math.nan for c in ("accuracy", "accuracy_lm")]
        except (TypeError, ValueError):
            raise refuse(art, FLAG, name, f"line {line}: client_id and role must be integers and accuracies "
                         "numbers or empty", dict(row)) from None
        if roles[-1] not in (0, 1) or any(not (math.isnan(v) or 0.0 <= v <= 1.0) for v in pair):
            raise refuse(art, FLAG, name, f"line {line}: role must be 0 or 1 and accuracies in [0, 1] or empty",
                         dict(row))
        acc.append(pair[0])
        acc_lm.append(pair[1])
    if len(set(ids)) != len(ids):
        raise refuse(art, FLAG, name, "client_id must be unique")
    return {"client_id": np.asarray(ids, dtype=np.int64), "role": np.asarray(roles, dtype=np.int64),
            "accuracy": np.asarray(acc, dtype=np.float64), "accuracy_lm": np.asarray(acc_lm, dtype=np.float64)}


def _read_train(art: Artifact, given: str, nonprivate: bool) -> _Run:
    from pfl_cli.readers import read_metrics

    metrics = read_metrics(art, FLAG)
    private = art.manifest.get("dp") is True
    name = "clients.csv"
    if private:
        if not nonprivate:
            raise _refuse(given, "a --dp train artifact releases no accuracy (its metrics.json holds public facts "
                          "only); pass --nonprivate to compare the diagnostics of its nonprivate-clients.csv (not "
                          "covered by DP), or compare without it.")
        name = "nonprivate-clients.csv"
        if not art.has(name):
            raise _refuse(given, "a --dp train artifact without nonprivate-clients.csv; train it with "
                          "--write-nonprivate to compare its accuracies on the private clients.")
    table = read_client_accuracies(art, given, name)
    base = dict(path=given, stage="train", algorithm=str(metrics["algorithm"]), config=_without_seed(art.config),
                seed=art.manifest.get("seed"), nonprivate=private, input_ref=art.input_ref())
    groups = []
    for role, group, source in ((0, "train", "train"), (1, "new", "train")):
        rows = table["role"] == role
        if rows.any():
            groups.append(ClientGroup(group=group, source=source, client_id=table["client_id"][rows],
                                      accuracy=table["accuracy"][rows], accuracy_lm=table["accuracy_lm"][rows],
                                      **base))
    spec = str((metrics.get("dataset") or {}).get("spec") or _input(art, given, "dataset")["path"])
    return _Run(art, given, _partition_hash(art, given), spec, tuple(groups))


def _read_predict(art: Artifact, given: str) -> _Run:
    from pfl_cli.readers import read_metrics

    metrics = read_metrics(art, FLAG)
    if metrics.get("clients") != "holdout":
        raise _refuse(given, f"compare reads predict artifacts of the new clients (--clients holdout); this one "
                      f"predicted --clients {metrics.get('clients')}, whose train clients the train artifact reports.")
    table = read_client_accuracies(art, given, "clients.csv")
    model = _input(art, given, "train")
    group = ClientGroup(path=given, stage="predict", group="new", source="predict", algorithm=str(metrics["algorithm"]),
                        config={}, seed=None, client_id=table["client_id"], accuracy=table["accuracy"],
                        accuracy_lm=table["accuracy_lm"], predict_config=_without_seed(art.config),
                        input_ref=art.input_ref())
    spec = str(_input(art, given, "dataset")["path"])
    return _Run(art, given, _partition_hash(art, given), spec, (group,), model_hash=model.get("sha256"))


def _model_of(run: _Run, trained: Mapping[str, Artifact]) -> Artifact:
    """The train artifact a predict run used: among the RUNs, else at the path its manifest records."""
    if run.model_hash in trained:
        return trained[run.model_hash]
    ref = _input(run.art, run.given, "train")
    where = input_location(run.art, ref)
    if (where / "manifest.json").is_file():
        model = read_artifact(where, "train", flag=f"{FLAG} {run.given}: model")
        if model.content_hash == run.model_hash:
            return model
    raise _refuse(run.given, f"its model (the train artifact {where}, sha256 {str(run.model_hash)[:12]}) is neither "
                  "among the RUNs nor at that path; pass the train artifact too.")


def read_runs(paths: Sequence[str | Path], *, nonprivate: bool = False) -> list[ClientGroup]:
    """Every client group of the train and predict artifacts at ``paths``, checked to form one comparison.

    Refused (InputError / ArtifactError, exit 2, one line naming the RUN): a missing directory, an
    artifact of another stage, runs over different datasets or partitions, a --dp train artifact
    (unless ``nonprivate`` and it holds nonprivate-clients.csv), a predict artifact of clients other
    than the holdout clients, the same seed of the same configuration twice, and predict runs of one
    configuration with different predict settings.
    """
    if not paths:
        raise InputError(f"{FLAG}: give at least one train or predict artifact.")
    runs = []
    for path in paths:
        given = str(path)
        art = read_artifact(path, STAGES, flag=FLAG)
        runs.append(_read_train(art, given, nonprivate) if art.stage == "train" else _read_predict(art, given))
    first = runs[0]
    for run in runs[1:]:
        if run.dataset != first.dataset:
            raise _refuse(run.given, f"runs over dataset {run.dataset}, but RUN {first.given} over {first.dataset}; "
                          "compare runs on one partition of one dataset.")
        if run.partition != first.partition:
            raise _refuse(run.given, f"its partition (sha256 {run.partition[:12]}) differs from that of RUN "
                          f"{first.given} ({first.partition[:12]}); compare runs on one partition.")
    trained = {r.art.content_hash: r.art for r in runs if r.art.stage == "train"}
    groups: list[ClientGroup] = []
    for run in runs:
        if run.art.stage == "train":
            groups += run.groups
            continue
        model = _model_of(run, trained)
        (g,) = run.groups
        if model.manifest.get("dp") is True and not nonprivate:
            raise _refuse(run.given, "its model is a --dp train artifact, and predict's accuracies on the new clients "
                          "are not covered by DP; pass --nonprivate to compare them.")
        groups.append(dataclasses.replace(g, algorithm=str(model.config.get("algorithm", g.algorithm)),
                                          config=_without_seed(model.config), seed=model.manifest.get("seed"),
                                          nonprivate=model.manifest.get("dp") is True))
    _check_unique(groups)
    return groups


def _check_unique(groups: Sequence[ClientGroup]) -> None:
    seen: dict[tuple, ClientGroup] = {}
    settings: dict[str, ClientGroup] = {}
    for g in groups:
        if g.source == "predict":  # first: two predict settings of one model would also read as a repeated seed
            other = settings.setdefault(g.key, g)
            if canonical_json(dict(other.predict_config or {})) != canonical_json(dict(g.predict_config or {})):
                differ = sorted(k for k in {**(other.predict_config or {}), **(g.predict_config or {})}
                                if (other.predict_config or {}).get(k) != (g.predict_config or {}).get(k))
                raise _refuse(g.path, f"its predict settings differ from those of RUN {other.path} for the same "
                              f"{g.algorithm} configuration ({', '.join(differ)}); compare one predict setting per "
                              "training configuration.")
        where = (g.key, g.group, g.source, g.seed)
        if where in seen:
            raise _refuse(g.path, f"seed {g.seed} of this {g.algorithm} configuration is already given by RUN "
                          f"{seen[where].path}; give each seed of a configuration once (train --seed).")
        seen[where] = g
