"""Readers of an artifact's JSON documents: ``dataset.json``, ``stats.json``, ``metrics.json``, ``mdm.json``.

Each returns the parsed document once it has the shape every command relies on; a field
that is present must have its declared type (numbers finite or null: JSON has no NaN and pflx
writes a non-finite value as null).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from pfl_cli.formats import load_json
from pfl_cli.manifest import Artifact
from pfl_cli.errors import ArtifactError
from pfl_cli.readers._rules import is_int, is_number, listed, refuse

# kind -> (test, description); "?" after a kind: null allowed.
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "count": (lambda v: is_int(v) and v >= 0, "an integer >= 0"),
    "number": (is_number, "a finite number"),
    "fraction": (lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "numbers": (lambda v: isinstance(v, list) and all(is_number(x) for x in v), "a list of finite numbers"),
    "hex64": (lambda v: isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v),
              "64 hex digits"),
}


def _document(art: Artifact, flag: str, name: str) -> dict:
    listed(art, flag, name)
    try:
        doc = load_json(art.file(name))
    except ArtifactError as err:
        raise refuse(art, flag, name, f"must be a JSON document ({str(err).split(': ', 1)[-1].rstrip('.')})") from None
    if not isinstance(doc, dict):
        raise refuse(art, flag, name, "must be a JSON object", type(doc).__name__)
    return doc


def _check_fields(art: Artifact, flag: str, name: str, doc: Mapping, fields: Mapping[str, str], *,
                  required: tuple[str, ...] = (), prefix: str = "") -> None:
    for key in required:
        if key not in doc:
            raise refuse(art, flag, name, f"missing field {prefix}{key!r}")
    for key, kind in fields.items():
        if key not in doc:
            continue
        nullable = kind.endswith("?")
        test, what = _KINDS[kind.rstrip("?")]
        value = doc[key]
        if not ((nullable and value is None) or test(value)):
            raise refuse(art, flag, name, f"{prefix}{key} must be {what}{' or null' if nullable else ''}", value)


# ---------------------------------------------------------------------------- dataset.json
DATASET_FIELDS = {"spec": "str", "num_samples": "count", "num_classes": "count", "input_shape": "list",
                  "labels_sha256": "hex64?", "dtype": "str", "has_test_pool": "bool", "has_natural_clients": "bool",
                  "class_names": "list", "spec_given": "str", "source": "object"}
SOURCE_FIELDS = {"path": "str", "relative_path": "str", "kind": "str", "sha256": "hex64", "content_sha256": "hex64"}


def read_dataset_info(art: Artifact, flag: str) -> dict:
    """``dataset.json`` of a partition artifact: the dataset its clients index into.

    Rules: an object with ``spec`` (non-empty, and the manifest config's ``dataset`` when it
    names one), ``num_samples`` (integer >= 1), ``num_classes`` (integer >= 0), ``input_shape``
    (a list of integers >= 0), ``labels_sha256`` (64 hex digits or null); ``source`` (a file
    or directory dataset: where it was and its digest, :mod:`pfl_cli.data.location`) an object
    with an absolute ``path``, ``kind`` file or directory and 64-hex-digit digests.
    """
    name = "dataset.json"
    doc = _document(art, flag, name)
    _check_fields(art, flag, name, doc, DATASET_FIELDS, required=("spec", "num_samples", "num_classes"))
    if not doc["spec"]:
        raise refuse(art, flag, name, "spec must name the dataset", doc["spec"])
    if doc["num_samples"] < 1:
        raise refuse(art, flag, name, "num_samples must be >= 1", doc["num_samples"])
    shape = doc.get("input_shape", [])
    if not all(is_int(d) and d >= 0 for d in shape):  # 0: a dataset without features (refused where they are used)
        raise refuse(art, flag, name, "input_shape must be a list of integers >= 0", shape)
    source = doc.get("source")
    if source is not None:
        _check_fields(art, flag, name, source, SOURCE_FIELDS, required=("path", "kind"), prefix="source.")
        if source["kind"] not in ("file", "directory") or not os.path.isabs(source["path"]):
            raise refuse(art, flag, name, "source must name an absolute path and kind file or directory", source)
    said = art.config.get("dataset")  # as typed; dataset.json holds it with the path made absolute
    if isinstance(said, str) and said not in (doc["spec"], doc.get("spec_given")):
        raise refuse(art, flag, name, f"spec must be the dataset of the manifest's config ({said!r})", doc["spec"])
    return doc


# ---------------------------------------------------------------------------- stats.json
STATS_FIELDS = {"num_clients": "count", "num_train_clients": "count", "num_holdout_clients": "count",
                "num_classes": "count", "num_train_samples": "count", "num_test_samples": "count",
                "empty_clients": "count", "scheme_info": "object", "heterogeneity": "object",
                "global_label_distribution": "numbers"}
HETEROGENEITY_SUMMARIES = ("js_divergence_to_global", "label_entropy_bits", "classes_per_client")


def read_stats(art: Artifact, flag: str, *, num_clients: int | None = None, roles=None) -> dict:
    """``stats.json`` of a partition artifact ({} when the artifact has none).

    Rules: an object whose counts are integers >= 0; ``num_clients`` equals the clients of
    ``clients.npz`` and ``num_train_clients`` / ``num_holdout_clients`` its roles (when given);
    ``scheme_info`` and ``heterogeneity`` objects, whose summaries hold a finite ``mean``.
    """
    name = "stats.json"
    if not art.has(name):
        return {}
    doc = _document(art, flag, name)
    _check_fields(art, flag, name, doc, STATS_FIELDS)
    het = doc.get("heterogeneity", {})
    for key in HETEROGENEITY_SUMMARIES:
        if key in het and not (isinstance(het[key], dict) and is_number(het[key].get("mean"))):
            raise refuse(art, flag, name, f"heterogeneity.{key} must be an object with a finite mean", het[key])
    if "size_coefficient_of_variation" in het and not (het["size_coefficient_of_variation"] is None
                                                       or is_number(het["size_coefficient_of_variation"])):
        raise refuse(art, flag, name, "heterogeneity.size_coefficient_of_variation must be a finite number",
                     het["size_coefficient_of_variation"])
    if num_clients is not None and doc.get("num_clients", num_clients) != num_clients:
        raise refuse(art, flag, name, f"num_clients must be the {num_clients} clients of clients.npz",
                     doc["num_clients"])
    if roles is not None:
        for key, role in (("num_train_clients", 0), ("num_holdout_clients", 1)):
            count = int((roles == role).sum())
            if doc.get(key, count) != count:
                raise refuse(art, flag, name, f"{key} must be the {count} clients of role {role} in clients.npz",
                             doc[key])
    return doc


# ---------------------------------------------------------------------------- metrics.json
GROUP_FIELDS = {"mean_accuracy": "fraction?", "pooled_accuracy": "fraction?", "mean_accuracy_lm": "fraction?",
                "pooled_accuracy_lm": "fraction?", "loss": "number?", "num_clients": "count?",
                "num_samples": "count?", "accuracy_std": "fraction?", "accuracy_worst10": "fraction?",
                "accuracy_min": "fraction?", "accuracy_std_lm": "fraction?", "accuracy_worst10_lm": "fraction?",
                "accuracy_min_lm": "fraction?", "mean_balanced_accuracy": "fraction?",
                "pooled_balanced_accuracy": "fraction?", "mean_macro_f1": "fraction?", "pooled_macro_f1": "fraction?",
                "global_accuracy": "fraction?", "global_balanced_accuracy": "fraction?", "global_macro_f1": "fraction?"}
METRICS_FIELDS: dict[str, dict[str, str]] = {
    "train": {"algorithm": "str", "label_mask": "bool", "rounds": "count", "best_round": "count?",
              "dataset": "object", "train": "object", "holdout": "object", "val": "object", "selection": "str?"},
    "predict": {"algorithm": "str", "clients": "str", "num_clients": "count", "mean_accuracy": "fraction?",
                "pooled_accuracy": "fraction?", "mean_accuracy_nolm": "fraction?", "mean_accuracy_lm": "fraction?",
                "optimizer_steps": "count", "personalized": "bool", "label_mask": "bool",
                "accuracy_std": "fraction?", "accuracy_worst10": "fraction?", "accuracy_min": "fraction?",
                "accuracy_std_lm": "fraction?", "accuracy_worst10_lm": "fraction?", "accuracy_min_lm": "fraction?"},
    "cluster": {"k": "count", "init": "str?", "normalized_cost": "number?", "centralized_normalized_cost": "number?",
                "relative_gap": "number?", "num_clients": "count?"},
    "attack": {"algorithm": "str", "attacks": "list", "iterations": "count", "results": "object"},
}
METRICS_REQUIRED = {"train": ("algorithm", "dataset"), "predict": ("algorithm",)}


def read_metrics(art: Artifact, flag: str) -> dict:
    """``metrics.json`` of a train, predict, cluster or attack artifact.

    Rules: an object whose headline fields have their types (see :data:`METRICS_FIELDS`); a
    train artifact's names its ``algorithm`` (the manifest config's) and its ``dataset``
    (``num_classes`` an integer >= 1, ``labels_sha256`` 64 hex digits or null), and each group
    (train, holdout, val) holds accuracies in [0, 1] or null.
    """
    name = "metrics.json"
    doc = _document(art, flag, name)
    _check_fields(art, flag, name, doc, METRICS_FIELDS.get(art.stage, {}),
                  required=METRICS_REQUIRED.get(art.stage, ()))
    if art.stage == "train":
        _check_fields(art, flag, name, doc["dataset"], {"num_classes": "count", "labels_sha256": "hex64?",
                                                        "spec": "str"}, required=("num_classes",), prefix="dataset.")
        if doc["dataset"]["num_classes"] < 1:
            raise refuse(art, flag, name, "dataset.num_classes must be >= 1", doc["dataset"]["num_classes"])
        for group in ("train", "holdout", "val"):
            if group in doc:
                _check_fields(art, flag, name, doc[group], GROUP_FIELDS, prefix=f"{group}.")
        said = art.config.get("algorithm")
        if isinstance(said, str) and said != doc["algorithm"]:
            raise refuse(art, flag, name, f"algorithm must be the manifest config's ({said!r})", doc["algorithm"])
    return doc


# ---------------------------------------------------------------------------- mdm.json
def read_mdm(art: Artifact, flag: str):
    """``mdm.json`` of an mdm-fit artifact as ``(document, MDMParams)`` (the rules of ``params_from_dict``)."""
    from pfl_cli.mdm.model import params_from_dict

    name = "mdm.json"
    doc = _document(art, flag, name)
    try:
        params = params_from_dict(doc, where=f"{flag} {art.path}/{name}")
    except ValueError as err:
        raise ArtifactError(str(err).rstrip(".") + f". Re-create it with `pflx mdm-fit`.") from None
    _check_fields(art, flag, name, doc, {"num_components": "count", "num_categories": "count",
                                         "log_likelihood": "number?", "mean_log_likelihood": "number?",
                                         "num_clients": "count?"})
    return doc, params
