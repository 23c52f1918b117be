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
# Columns train and predict write since they count classes (pfl_cli.fl.evaluate); read when present, NaN when an
# older artifact lacks them.
EXTRA_CLIENT_COLUMNS = ("balanced_accuracy", "macro_f1", "global_accuracy")


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
    # Per client (NaN: undefined, or an artifact written before these were counted): balanced accuracy,
    # macro-F1, the global model's accuracy.
    balanced_accuracy: np.ndarray | None = None
    macro_f1: np.ndarray | None = None
    client_global_accuracy: np.ndarray | None = None
    # The global model's accuracy on the union of the group's test splits (metrics.json's global_accuracy);
    # None without a global model or from an older artifact (``global_model`` says which: True, False, None).
    global_accuracy: float | None = None
    global_model: bool | None = None

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
    """``clients.csv`` (or ``nonprivate-clients.csv``): client_id, role, accuracy, accuracy_lm, checked; and
    balanced_accuracy, macro_f1, global_accuracy where the file has them (NaN columns where it does not).

    Rules: the file is listed in the manifest; its header has the four columns; ids are integers
    (unique), roles 0 or 1, accuracies (and the optional columns) empty (undefined) or numbers in [0, 1].
    """
    from pfl_cli.readers._rules import listed, refuse

    listed(art, FLAG, name)
    text = read_utf8(art.file(name), f"{FLAG} {given}: {name}", ArtifactError)
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in CLIENT_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise refuse(art, FLAG, name, f"lacks the columns {missing}")
    ids, roles = [], []
    scores = ("accuracy", "accuracy_lm", *(c for c in EXTRA_CLIENT_COLUMNS if c in reader.fieldnames))
    values: dict[str, list] = {c: [] for c in scores}
    for line, row in enumerate(reader, start=2):
        try:
            ids.append(int(row["client_id"]))
            roles.append(int(row["role"]))
            got = [float(row[c]) if row[c] not in ("", None) else math.nan for c in scores]
        except (TypeError, ValueError):
            raise refuse(art, FLAG, name, f"line {line}: client_id and role must be integers and {', '.join(scores)} "
                         "numbers or empty", dict(row)) from None
        if roles[-1] not in (0, 1) or any(not (math.isnan(v) or 0.0 <= v <= 1.0) for v in got):
            raise refuse(art, FLAG, name, f"line {line}: role must be 0 or 1 and {', '.join(scores)} in [0, 1] or "
                         "empty", dict(row))
        for c, v in zip(scores, got):
            values[c].append(v)
    if len(set(ids)) != len(ids):
        raise refuse(art, FLAG, name, "client_id must be unique")
    out = {"client_id": np.asarray(ids, dtype=np.int64), "role": np.asarray(roles, dtype=np.int64)}
    for c in ("accuracy", "accuracy_lm", *EXTRA_CLIENT_COLUMNS):
        out[c] = np.asarray(values[c], dtype=np.float64) if c in values else np.full(len(ids), np.nan)
    return out


def _per_client(table: Mapping[str, np.ndarray], rows) -> dict[str, np.ndarray]:
    """The optional per-client columns of ``rows`` as ClientGroup fields."""
    return {"balanced_accuracy": table["balanced_accuracy"][rows], "macro_f1": table["macro_f1"][rows],
            "client_global_accuracy": table["global_accuracy"][rows]}


def _global(summary: Any, global_model: Any) -> dict[str, Any]:
    """ClientGroup's ``global_accuracy`` and ``global_model`` from a group summary of metrics.json."""
    value = summary.get("global_accuracy") if isinstance(summary, Mapping) else None
    return {"global_accuracy": None if value is None else float(value),
            "global_model": global_model if isinstance(global_model, bool) else None}


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
    # The groups' summaries: metrics.json's, or under --dp the nonprivate.json beside nonprivate-clients.csv.
    summaries = _nonprivate_summaries(art, given) if private else metrics
    groups = []
    for role, group, source, summary in ((0, "train", "train", "train"), (1, "new", "train", "holdout")):
        rows = table["role"] == role
        if rows.any():
            groups.append(ClientGroup(group=group, source=source, client_id=table["client_id"][rows],
                                      accuracy=table["accuracy"][rows], accuracy_lm=table["accuracy_lm"][rows],
                                      **_per_client(table, rows), **_global(summaries.get(summary),
                                                                            metrics.get("global_model")), **base))
    spec = str((metrics.get("dataset") or {}).get("spec") or _input(art, given, "dataset")["path"])
    return _Run(art, given, _partition_hash(art, given), spec, tuple(groups))


def _nonprivate_summaries(art: Artifact, given: str) -> Mapping[str, Any]:
    """nonprivate.json of a --dp train artifact (the group summaries train --write-nonprivate writes), or {}."""
    import json

    from pfl_cli.readers._rules import listed

    if not art.has("nonprivate.json"):
        return {}
    listed(art, FLAG, "nonprivate.json")
    try:
        doc = json.loads(read_utf8(art.file("nonprivate.json"), f"{FLAG} {given}: nonprivate.json", ArtifactError))
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{FLAG} {given}: nonprivate.json is not JSON ({err}); re-create the artifact.") from None
    return doc if isinstance(doc, dict) else {}


def _read_predict(art: Artifact, given: str) -> _Run:
    from pfl_cli.readers import read_metrics

    metrics = read_metrics(art, FLAG)
    if metrics.get("clients") != "holdout":
        raise _refuse(given, f"compare reads predict artifacts of the new clients (--clients holdout); this one "
                      f"predicted --clients {metrics.get('clients')}, whose train clients the train artifact reports.")
    table = read_client_accuracies(art, given, "clients.csv")
    model = _input(art, given, "train")
    every = np.ones(len(table["client_id"]), dtype=bool)
    group = ClientGroup(path=given, stage="predict", group="new", source="predict", algorithm=str(metrics["algorithm"]),
                        config={}, seed=None, client_id=table["client_id"], accuracy=table["accuracy"],
                        accuracy_lm=table["accuracy_lm"], predict_config=_without_seed(art.config),
                        input_ref=art.input_ref(), **_per_client(table, every),
                        **_global(metrics, metrics.get("global_model")))
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
