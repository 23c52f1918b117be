"""What an artifact is: ``pflx show DIR``.

:func:`describe` opens any stage's artifact with every payload hash verified (a missing or
edited file is refused, named), reports its inputs with their own stages and whether they still
match the hashes this artifact recorded, and the stage's headline numbers; :func:`lineage`
follows the inputs back to the datasets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pfl_cli.errors import ArtifactError
from pfl_cli.manifest import MANIFEST, PRODUCER, Artifact
from pfl_cli.readers import read_artifact
from pfl_cli.readers.artifact import input_location

STAGES = tuple(PRODUCER) + ("privacy-account",)


def open_artifact(path: str | Path) -> Artifact:
    """Any stage's artifact, hashes verified; refusals name the file (ArtifactError, exit 2)."""
    path = Path(path)
    if path.is_dir() and not (path / MANIFEST).is_file():
        raise ArtifactError(f"{path}: not a pflx artifact (no {MANIFEST}); pass a directory a pflx command wrote with --out.")
    return read_artifact(path, STAGES, flag="artifact")


def _input_status(ref: dict[str, Any], art: Artifact) -> str:
    """``ok`` when the input artifact of ``art`` is still there with the recorded hash (looked for as
    :func:`pfl_cli.readers.artifact.input_location` says); datasets are not re-read."""
    if ref.get("stage") == "dataset":
        return "dataset (not re-read)"
    if ref.get("stage") == "file":  # a file a path-valued key names (pfl_cli.readers.files)
        from pfl_cli.errors import InputError
        from pfl_cli.readers.files import locate_file

        try:
            locate_file(art, ref)
        except InputError as err:
            return "changed since (hash differs)" if "changed" in str(err) else "missing"
        return "ok"
    where = input_location(art, ref)
    try:
        found = read_artifact(where, ref["stage"], flag="input")
    except ArtifactError as err:
        return "missing" if not where.exists() else f"unreadable: {err}"
    if ref.get("sha256") is None:  # a DP artifact withholds the hash of its private inputs
        return "ok (hash withheld under --dp)"
    return "ok" if found.content_hash == ref.get("sha256") else "changed since (hash differs)"


def _pick(doc: dict, *keys: str) -> dict:
    return {k: doc[k] for k in keys if k in doc and doc[k] is not None}


FLAG = "artifact"  # how error messages name the directory show was given


def _partition(art: Artifact) -> dict:
    from pfl_cli.readers import read_partition_files

    stats = read_partition_files(art, FLAG)[2]
    het = stats.get("heterogeneity", {})
    numbers = _pick(stats, "num_clients", "num_train_clients", "num_holdout_clients", "num_classes",
                    "num_train_samples", "num_test_samples")
    numbers["scheme"] = stats.get("scheme_info", {}).get("scheme", art.config.get("scheme", art.config.get("mode")))
    for key, name in (("js_divergence_to_global", "mean_js_to_global"), ("label_entropy_bits", "mean_label_entropy_bits"),
                      ("classes_per_client", "mean_classes_per_client")):
        if isinstance(het.get(key), dict):
            numbers[name] = het[key]["mean"]
    if "size_coefficient_of_variation" in het:
        numbers["size_coefficient_of_variation"] = het["size_coefficient_of_variation"]
    return numbers


def _mdm(art: Artifact) -> dict:
    from pfl_cli.readers import read_mdm

    doc = read_mdm(art, FLAG)[0]
    return _pick(doc, "num_components", "tau", "num_categories", "log_likelihood", "mean_log_likelihood", "num_clients")


def _metrics(art: Artifact) -> dict:
    from pfl_cli.readers import read_metrics

    return read_metrics(art, FLAG)


def _train(art: Artifact) -> dict:
    doc = _metrics(art)
    numbers = _pick(doc, "algorithm", "rounds", "best_round", "label_mask")
    for group in ("train", "holdout", "val"):
        if isinstance(doc.get(group), dict):
            numbers[f"{group}_mean_accuracy"] = doc[group].get("mean_accuracy")
            numbers[f"{group}_mean_accuracy_lm"] = doc[group].get("mean_accuracy_lm")
    return numbers


def _predict(art: Artifact) -> dict:
    """mean_accuracy is unmasked whatever --label-mask chose for the run's own headline (as train's and compare's
    are); the label-masked number is its own, labelled entry."""
    doc = _metrics(art)
    numbers = _pick(doc, "algorithm", "clients", "num_clients", "mean_accuracy", "mean_accuracy_lm", "optimizer_steps",
                    "personalized")
    if "mean_accuracy_nolm" in doc:
        numbers["mean_accuracy"] = doc["mean_accuracy_nolm"]
    elif doc.get("label_mask"):  # an artifact without the unmasked number: no headline rather than a masked one
        numbers.pop("mean_accuracy", None)
    return numbers


def _cluster(art: Artifact) -> dict:
    doc = _metrics(art)
    return _pick(doc, "k", "init", "normalized_cost", "centralized_normalized_cost", "relative_gap", "num_clients")


def _tune(art: Artifact) -> dict:
    doc = _metrics(art)
    numbers = _pick(doc, "algorithm")
    objective = doc.get("objective") if isinstance(doc.get("objective"), dict) else {}
    numbers["objective"] = f"{objective.get('metric')} on {objective.get('scored_on')}"
    best = doc.get("best") if isinstance(doc.get("best"), dict) else {}
    if "value" in best:
        numbers["best_trial"] = best.get("trial")
        numbers["best_validation"] = best.get("value")
    if "noisy_score" in best:  # under --dp: the released noisy score
        numbers["best_noisy_validation"] = best.get("noisy_score")
    for key, value in (best.get("params") or {}).items():
        numbers[f"best_{key}"] = value
    if isinstance(doc.get("trials"), dict):
        numbers["trials"] = ", ".join(f"{v} {k}" for k, v in doc["trials"].items())
    return numbers


def _compare(art: Artifact) -> dict:
    """Each row of the comparison: mean accuracy ± its interval over seeds (table.json, or its nonprivate twin)."""
    from pfl_cli.formats import load_json

    name = next((n for n in ("table.json", "nonprivate-table.json") if art.has(n)), None)
    doc = load_json(art.file(name)) if name else {}
    numbers: dict[str, Any] = {"nonprivate": True} if name and name.startswith("nonprivate") else {}
    for row in (doc.get("rows") if isinstance(doc, dict) else None) or []:
        if not isinstance(row, dict) or not isinstance(row.get("accuracy"), (int, float)):
            continue
        half = row.get("accuracy_ci")
        spread = f"± {100 * half:.1f}" if isinstance(half, (int, float)) else "± n/a"
        numbers[f"{row.get('label')} {row.get('group')}"] = (f"{100 * row['accuracy']:.1f} {spread} % "
                                                             f"({row.get('num_seeds')} seed{'' if row.get('num_seeds') == 1 else 's'})")
    return numbers


HEADLINES: dict[str, Callable[[Artifact], dict]] = {
    "partition": _partition, "mdm-fit": _mdm, "train": _train, "predict": _predict, "cluster": _cluster,
    "tune": _tune, "compare": _compare,
}


def headline(art: Artifact) -> dict[str, Any]:
    """The numbers a person looks at first, per stage; epsilon and delta wherever a privacy ledger is."""
    from pfl_cli.readers import read_ledger

    numbers = HEADLINES.get(art.stage, lambda _a: {})(art)
    if art.has("privacy.json"):  # the ledger validation privacy-account uses: show never prints a refused epsilon
        ledger = read_ledger(art, FLAG)[0]
        numbers.update({f"privacy_{k}": v for k, v in _pick(ledger, "epsilon", "delta", "unit", "accountant").items()})
    return numbers


def describe(path: str | Path) -> dict[str, Any]:
    """The ``pflx show`` document of one artifact (JSON-ready)."""
    art = open_artifact(path)
    m = art.manifest
    return {
        "path": str(art.path),
        "stage": art.stage,
        "tool_version": m.get("version"),
        "created_utc": m.get("created_utc"),
        "seed": m.get("seed"),
        "argv": m.get("argv"),
        "config": dict(art.config),
        "inputs": [{**ref, "status": _input_status(ref, art)} for ref in m.get("inputs", [])],
        "outputs": [{"path": o["path"], "bytes": o.get("bytes"), "sha256": o["sha256"], "verified": True}
                    for o in m.get("outputs", [])],
        "headline": headline(art),
    }


def lineage(path: str | Path) -> list[dict[str, Any]]:
    """The chain of artifacts ``path`` came from, depth first: this one (depth 0), its inputs, theirs, ...

    Inputs that are gone or changed are listed with their status and not followed.
    """
    chain: list[dict[str, Any]] = []

    def visit(ref: dict[str, Any], where: Path, depth: int, status: str) -> None:
        entry = {"depth": depth, "path": ref["path"], "stage": ref["stage"], "sha256": ref.get("sha256"), "status": status}
        chain.append(entry)
        if ref["stage"] in ("dataset", "file") or not status.startswith("ok"):
            return
        art = read_artifact(where, ref["stage"], flag="input")
        entry["headline"] = headline(art)
        for sub in art.manifest.get("inputs", []):
            visit(sub, input_location(art, sub) if sub["stage"] not in ("dataset", "file") else Path(), depth + 1,
                  _input_status(sub, art))

    root = open_artifact(path)
    visit({**root.input_ref()}, root.path, 0, "ok")
    return chain
