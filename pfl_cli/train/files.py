"""The files of a ``train`` artifact and the metrics they report (DESIGN.md section 3), written by
:func:`pfl_cli.train.run.run_train`, the stacked runs (:mod:`pfl_cli.train.stack`) and the Flower server app.

- ``config.yaml``: the resolved TrainConfig;
- ``model.pt``: the model payload of :func:`pfl_cli.fl.api.model_payload` (plain dicts and tensors,
  ``torch.load(weights_only=True)``);
- ``metrics.csv``: round, group, metric, value for every evaluation;
- ``metrics.json``: the selected model's summaries per group (train, holdout, val), how it was
  selected, parameter counts, floats communicated per client and round, and ``communication``: the
  floats down / up per client and round, bytes per round (float32) and total bytes, summed from the
  tensors the algorithm really exchanged (``pfl_cli.fl.communication``), with a per-message breakdown;
- ``clients.csv``: client_id, role (0 train, 1 holdout, as in the partition's stats.csv), n_train
  (fit + validation samples), n_test, accuracy, accuracy_lm (label-masked) of the selected model;
- ``train_samples.npz``: ``sample``, the sorted dataset indices of the train clients' train samples,
  and ``digest`` (uint8, 16 bytes a sample), their content digests (what predict and attack compare
  scored samples with, :mod:`pfl_cli.overlap`; not under ``--dp``);
- ``checkpoint/state.pt``: the last checkpoint of the run (absent for ``local``, which has no rounds).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from pfl_cli.fl.checkpoint import torch_bytes

METRIC_NAMES = ("mean_accuracy", "pooled_accuracy", "mean_accuracy_lm", "pooled_accuracy_lm")
# clients.csv (and nonprivate-clients.csv, predict's clients.csv): the first six columns as before, then the
# per-client balanced accuracy and macro-F1 and the global model's accuracy (pfl_cli.fl.evaluate); empty: undefined.
CLIENT_COLUMNS = ("client_id", "role", "n_train", "n_test", "accuracy", "accuracy_lm", "balanced_accuracy",
                  "macro_f1", "global_accuracy")


# ---------------------------------------------------------------------------- shared with predict and attack
def clean(obj: Any) -> Any:
    """``obj`` with non-finite floats as None (JSON has no NaN) and numpy scalars as Python ones."""
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def csv_float(value: float) -> Any:
    return "" if not math.isfinite(value) else float(value)


def write_train_files(writer, config: dict, run, part, metrics: dict, record=None) -> None:
    """The files of a train artifact without DP: config.yaml, model.pt, metrics.csv, metrics.json, clients.csv,
    train_samples.npz.

    Also what the Flower ServerApp writes (``pfl_cli.interop.flower_app.server``).
    ``train_samples.npz`` (``sample``: the sorted dataset indices of the train clients' train
    samples; ``digest``: their content digests, :mod:`pfl_cli.data.digest`) lets predict and attack
    refuse any scored sample with the content of one the model trained on, on any partition, also
    once the partition is gone (:mod:`pfl_cli.overlap`). ``record`` is ``(sample, digest)`` from
    :func:`pfl_cli.overlap.training_record`; without it (the Flower server reads no samples) the
    indices alone are written, and predict digests them from the dataset. A DP artifact holds
    neither (which records trained is what DP protects).
    """
    import yaml

    from pfl_cli.fl.store import ROLE_TRAIN

    writer.save_text("config.yaml", yaml.safe_dump(_portable(config, run, writer), sort_keys=False))
    writer.path("model.pt").write_bytes(torch_bytes(portable_model(run.model)))
    writer.save_csv("metrics.csv", ["round", "group", "metric", "value"], run.outcome.history)
    writer.save_json("metrics.json", metrics)
    writer.save_csv("clients.csv", CLIENT_COLUMNS,
                    client_rows(part, [run.outcome.best.groups[g] for g in ("train", "holdout")
                                       if g in run.outcome.best.groups]))
    if record is None:
        trained = np.asarray(part.role)[part.train_owner()] == ROLE_TRAIN
        writer.save_npz("train_samples.npz", sample=np.unique(np.asarray(part.train_indices, np.int64)[trained]))
    else:
        writer.save_npz("train_samples.npz", sample=record[0], digest=record[1])


def _portable(config: dict, run, writer) -> dict:
    """config.yaml's keys, path-valued ones relative to the artifact (pfl_cli.readers.files)."""
    from pfl_cli.readers.files import portable_config

    return portable_config(config, type(run.algorithm.cfg), writer.out)


def portable_model(model: dict) -> dict:
    """The model payload naming a backbone's weights file by name, not by where it was (the manifest's ``file``
    input finds it again: pfl_cli.readers.files); the bytes of model.pt then do not depend on the directory."""
    arch = model.get("arch")

    def backbone(s) -> bool:  # the specs whose file a manifest input finds again (SPEC_FIELDS); a model kind's
        return isinstance(s, dict) and s.get("arch") == "backbone" and bool(s.get("weights"))  # keeps its path

    if not isinstance(arch, dict) or not any(backbone(s) for s in arch.values()):
        return model
    return {**model, "arch": {k: ({**s, "weights": Path(str(s["weights"])).name} if backbone(s) else s)
                              for k, s in arch.items()}}


def write_dp_artifact(writer, cfg, config: dict, run, part, metrics: dict, prior=None) -> dict:
    """The train artifact under --dp: only what the ledger covers, diagnostics as nonprivate* on request.
    Returns metrics.json's ``dp`` block (with ``prior``: ``epsilon_total``, privacy.json's epsilon).

    - ``model.pt``: the last round's model, the output of the DP mechanism (no selection by
      private validation accuracy; inputs are not standardized with private statistics);
    - ``privacy.json``: the ledger (after ``prior``'s events: the private study that chose the config, on
      the same data, whose epsilon composes with this run's); ``config.yaml``: the public config;
    - ``metrics.json``: public facts only (algorithm, rounds, sizes, the mechanism's calibration);
    - with ``--write-nonprivate``: ``nonprivate.json`` (accuracies of the model on the private
      clients), ``nonprivate-metrics.csv`` (every evaluation), ``nonprivate-clients.csv``.

    The checkpoint is not part of a DP artifact; while the run lasts it lives beside --out, mode 0600,
    holding released state and client-held state only (:func:`pfl_cli.fl.dp.private_snapshot`).
    """
    import yaml

    from pfl_cli.artifacts import MECHANISM, NONPRIVATE, POST_PROCESSING

    writer.save_text("config.yaml", yaml.safe_dump(_portable(config, run, writer), sort_keys=False),
                     release=POST_PROCESSING)
    writer.path("model.pt", release=MECHANISM).write_bytes(torch_bytes(portable_model(run.model)))
    from pfl_cli.privacy.randomness import statement

    ledger = run.dp.ledger() if prior is None else prior.compose(run.dp.ledger())
    doc = ledger.to_dict(accountant=cfg.dp_accountant)
    writer.save_json("privacy.json", {**doc, **statement(cfg.dp_noise)}, release=POST_PROCESSING)
    # Exact counts of the private data (clients without labels; the realized Poisson cohorts behind the
    # communication totals) are diagnostics, not releases.
    private_keys = ("train", "holdout", "val", "dataset", "best_round", "communication", "num_unlabeled_clients")
    public = {k: v for k, v in metrics.items() if k not in private_keys}
    public["dataset"] = {"spec": metrics["dataset"]["spec"], "num_classes": metrics["dataset"]["num_classes"]}
    public["dp"] = {**clean(run.dp.info()), "noise": cfg.dp_noise}
    if prior is not None:  # the guarantee of the model is the total, not this run's share of it
        public["dp"]["epsilon_total"] = doc["epsilon"]
    writer.save_json("metrics.json", public, release=POST_PROCESSING)
    if cfg.write_nonprivate:
        outcome = run.outcome
        writer.save_json("nonprivate.json", {
            "note": "accuracies measured on the private clients: NOT covered by the DP guarantee of privacy.json",
            **{g: metrics[g] for g in ("train", "holdout", "val", "communication", "num_unlabeled_clients")
               if g in metrics}}, release=NONPRIVATE)
        writer.save_csv("nonprivate-metrics.csv", ["round", "group", "metric", "value"], outcome.history,
                        release=NONPRIVATE)
        writer.save_csv("nonprivate-clients.csv", CLIENT_COLUMNS,
                        client_rows(part, [outcome.best.groups[g] for g in ("train", "holdout")
                                           if g in outcome.best.groups]), release=NONPRIVATE)
    return public["dp"]


def train_metrics(cfg, run, info: dict, device) -> dict:
    from pfl_cli.models import num_parameters

    outcome, arch = run.outcome, run.model["arch"]
    params = {name: int(num_parameters(spec)) for name, spec in arch.items() if "kind" in spec}
    if "subspace" in arch:  # flowdup, ld-fedavg: theta = theta_0 + P v, v in R^k (k floats, not a network)
        params["subspace_dim"] = int(arch["subspace"]["dim"])
    floats = cfg.algorithm_class.floats_per_client_round(arch)
    metrics: dict[str, Any] = {
        "algorithm": cfg.algorithm,
        "label_mask": bool(cfg.label_mask),
        "headline_metric": "mean_accuracy_lm" if cfg.label_mask else "mean_accuracy",
        "selection": outcome.selection,
        "best_round": int(outcome.best.round),
        "rounds": int(outcome.last_round),
        "device": str(device),
        "dataset": {"spec": info["spec"], "labels_sha256": info.get("labels_sha256"),
                    "num_classes": int(info["num_classes"])},
    }
    summaries = outcome.best.summaries()
    for group in ("train", "holdout", "val"):
        if group in summaries:
            metrics[group] = summaries[group]
    # Whether the groups' global_accuracy is scored: the method holds one model for every client
    # (pfl_cli.algorithms.base.Algorithm.global_model); a property of the method, public under --dp.
    metrics["global_model"] = has_global_model(run.algorithm)
    metrics["parameters"] = params
    metrics["floats_per_client_round"] = floats
    store = run.store
    metrics["num_unlabeled_clients"] = int(np.sum(~store.labeled))
    metrics["hidden_label_oracle"] = bool(cfg.evaluate_hidden_labels)
    metrics["communication"] = run.algorithm.traffic.summary()
    if "conditions" in outcome.extra:  # federation conditions (pfl_cli.fl.conditions): public settings, the clock
        metrics["conditions"] = outcome.extra["conditions"]
    if run.algorithm.byzantine is not None:  # Byzantine clients (issue 48): honest clients, backdoor success
        metrics["byzantine"] = run.algorithm.byzantine.metrics(outcome, outcome.history)
    return clean(metrics)


def has_global_model(alg) -> bool:
    from pfl_cli.fl.evaluate import global_model_of

    return not alg.personalized or global_model_of(alg) is not None


def client_rows(part, evals) -> list[list]:
    """clients.csv rows (:data:`CLIENT_COLUMNS`), in partition order."""
    rows = []
    for ev in evals:
        acc, acc_lm = ev.accuracy(False), ev.accuracy(True)
        more = ev.client_metrics()
        rows += [(int(c), [int(part.client_id[c]), int(part.role[c]), int(part.train_sizes[c]),
                           int(part.test_sizes[c]), csv_float(acc[i]), csv_float(acc_lm[i]),
                           *(csv_float(more[m][i]) for m in CLIENT_COLUMNS[6:])])
                 for i, c in enumerate(ev.clients)]
    return [row for _, row in sorted(rows, key=lambda r: r[0])]


