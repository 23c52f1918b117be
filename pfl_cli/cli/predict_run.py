"""The body of `pflx predict`: read the model and the partition, personalize, evaluate, write, print.

The ``predict`` artifact:

- ``metrics.json``: ``algorithm``, ``clients`` (holdout | train | all), ``label_mask``, the effective
  ``finetune_steps`` / ``eval_descriptor``, ``headline_metric``; ``mean_accuracy`` and
  ``pooled_accuracy``: the headline pair (label-masked when ``label_mask`` is true);
  ``mean_accuracy_nolm`` / ``pooled_accuracy_nolm``: without label masking;
  ``mean_accuracy_lm`` / ``pooled_accuracy_lm``: with label masking; ``loss`` (mean cross-entropy per
  test sample); ``accuracy_std``, ``accuracy_worst10``, ``accuracy_min`` (fairness across the clients with
  scored test samples, no label masking: standard deviation, mean of the worst ceil(0.1 n), minimum) and
  the same with label masking (``_lm``); ``num_clients``, ``num_samples`` (test samples); ``protocol`` (how the models were made:
  the one protocol that served every client, or, when clients with trained state of their own stand beside
  clients without, e.g. train clients never sampled in training, both with their counts), ``rounds`` (of the
  new-client protocol where one served, e.g. pFedHN's embedding rounds), ``new_clients`` (clients served
  without trained state, by the algorithm's paper protocol for new clients), ``protocols`` (one
  ``{protocol, rounds, clients}`` per protocol that served a client); ``optimizer_steps`` (optimizer
  steps taken while predicting: local SGD steps plus server-side embedding steps; PeFLL takes none); ``personalized``; ``device``; ``model`` (the train
  artifact's input reference); ``overlap_unchecked`` (true: ``--allow-unchecked-overlap`` scored a
  partition that could not be checked against the samples a ``--dp`` model trained on,
  :mod:`pfl_cli.overlap`). Mean accuracy averages per-client accuracies over clients with test
  samples; pooled accuracy is correct / total over all their test samples.
- ``clients.csv``: client_id, role (0 train, 1 holdout), n_train, n_test, accuracy, accuracy_lm, balanced_accuracy,
  macro_f1, global_accuracy, protocol (the protocol that served the client).
- ``predictions.npz`` (unless ``--no-predictions``): one row per sample of every predicted client,
  ``client_id`` int64, ``split`` uint8 (0 = the client's train samples, from which its model or
  descriptor was built; 1 = its test samples), ``sample`` int64 (index in the dataset's sample
  order), ``predicted`` int64 (argmax over all classes), ``probabilities`` float32 (n, C).
- metrics.json also has ``num_unlabeled_clients`` (predicted clients without labels),
  ``num_evaluated_clients`` (clients with at least one scored test sample) and
  ``hidden_label_oracle`` (true with ``--evaluate-hidden-labels``: unlabeled clients were
  scored against labels they never showed).
- ``models.pt`` with ``--save-models``: ``{"client_id": LongTensor (n,), "weights": {name: Tensor}}``;
  the weights have a leading client axis when ``personalized``, and are the one global model
  otherwise (FedAvg without fine-tuning).
- ``adapters/`` with ``--save-models`` on a LoRA model (fedit, ffa-lora, fedsa-lora; fedit's IA3 adapters with
  ``adapter=ia3`` as peft's IA3): ``client-<id>/`` per client
  (``global/`` for one global adapter), each ``adapter_config.json`` + ``adapter_model.safetensors`` in peft's
  format, which ``PeftModel.from_pretrained(base, DIR)`` loads (:mod:`pfl_cli.models.lora_export`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pfl_cli.cli.output import Reporter, core_progress
from pfl_cli.cli.common import load_partition_dataset
from pfl_cli.cli.train_run import accuracy_table
from pfl_cli.fl.checkpoint import torch_bytes
from pfl_cli.train.files import CLIENT_COLUMNS, clean, client_rows, has_global_model
from pfl_cli.compare.stats import FAIRNESS_KEYS
from pfl_cli.fl.evaluate import CLASS_METRICS
from pfl_cli.errors import ArtifactError, ConfigError


def _check_config(cfg) -> None:
    from pfl_cli.fl.config import CLIENT_SETS, EVAL_DESCRIPTORS

    if cfg.clients not in CLIENT_SETS:
        raise ConfigError(f"--clients must be one of {', '.join(CLIENT_SETS)}; got {cfg.clients!r}.")
    if cfg.eval_descriptor is not None and cfg.eval_descriptor not in EVAL_DESCRIPTORS:
        raise ConfigError(f"--eval-descriptor must be one of {', '.join(EVAL_DESCRIPTORS)}; "
                          f"got {cfg.eval_descriptor!r}.")
    if cfg.batch_size < 1:
        raise ConfigError(f"batch_size must be an integer >= 1 (samples per evaluation chunk); got {cfg.batch_size}.")
    if cfg.finetune_steps is not None and cfg.finetune_steps < 0:
        raise ConfigError(f"finetune_steps must be an integer >= 0; got {cfg.finetune_steps}.")


def read_model(path: Path):
    """The train artifact at ``path``: its Artifact, model.pt payload, TrainConfig and metrics.json (all checked)."""
    from pfl_cli.artifacts import read_artifact
    from pfl_cli.readers import read_metrics, read_model_payload
    from pfl_cli.registry import config_from_artifact

    art = read_artifact(path, "train", flag="--model")
    metrics = read_metrics(art, "--model")
    payload = read_model_payload(art, "--model", num_classes=metrics["dataset"]["num_classes"])
    train_cfg = config_from_artifact(art.config, what=f"--model {path}", made_by=art.manifest.get("version"))
    return art, payload, train_cfg, metrics


def _override(given, trained):
    return trained if given is None else given


def check_same_dataset(partition: Path, info: dict, train_metrics: dict, command: str) -> None:
    """Refuse a partition over another dataset than the model's (labels hash; classes for a DP model)."""
    trained_on = (train_metrics.get("dataset") or {}).get("labels_sha256")
    # A DP model withholds the hash of its (private) training data: only the label space is checked then.
    withheld = trained_on is None and "dp" in train_metrics
    if withheld and int(info["num_classes"]) != int(train_metrics["dataset"]["num_classes"]):
        raise ArtifactError(f"--partition {partition}: {info['num_classes']} classes, but the model was trained on "
                            f"{train_metrics['dataset']['num_classes']}; {command} needs the same label space.")
    if not withheld and info.get("labels_sha256") != trained_on:
        raise ArtifactError(
            f"--partition {partition}: the partition is over a different dataset than the model (labels hash "
            f"{str(info.get('labels_sha256'))[:12]} of {info['spec']}, the model's {str(trained_on)[:12]} of "
            f"{(train_metrics.get('dataset') or {}).get('spec')}); {command} needs a partition of the same dataset, "
            "e.g. one from pflx simulate over it.")


def open_model_stage(stage: str, cfg, *, model: Path, partition: Path, out: Path, force: bool, report: Reporter,
                     up_to_date_hint: str = "", allow_unchecked: bool = False):
    """What a stage reading a train artifact and a partition starts with (the scoring stages of
    :data:`pfl_cli.overlap.SCORING_STAGES`: predict, attack).

    Checks ``--out`` first, reads the model and the partition's dataset, refuses a partition
    over another dataset and any scored sample the model trained on (:mod:`pfl_cli.overlap`),
    and returns ``(writer, model_art, payload, train_cfg, part, ds, unchecked)`` (``unchecked``:
    the overlap could not be checked and ``--allow-unchecked-overlap`` accepted that; a warning
    says so), or None after reporting that ``out`` is up to date.
    """
    from pfl_cli.overlap import ALLOW_FLAG, check_unseen_samples

    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.config import config_to_dict

    from pfl_cli.artifacts import read_artifact
    from pfl_cli.readers import read_metrics, read_model_payload
    from pfl_cli.registry import config_from_artifact

    ArtifactWriter(out, stage=stage, config={}, seed=cfg.seed, force=force)  # --out problems first
    model_art = read_artifact(model, "train", flag="--model")
    train_metrics = read_metrics(model_art, "--model")
    part, info, part_art, ds = load_partition_dataset(partition)
    check_same_dataset(partition, info, train_metrics, stage)
    unchecked = check_unseen_samples(stage, cfg.clients, model=model, model_art=model_art, partition=partition,
                                     part=part, part_art=part_art, info=info, ds=ds, allow_unchecked=allow_unchecked)
    writer = ArtifactWriter(out, stage=stage, config=config_to_dict(cfg), seed=cfg.seed,
                            inputs=[model_art.input_ref(), part_art.input_ref(), ds.input_ref()], force=force)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same config and inputs); nothing to do.{up_to_date_hint}")
        report.result({"out": str(out), "up_to_date": True})
        return None
    # the weights (and torch) once the output is known not to be up to date
    payload = read_model_payload(model_art, "--model", num_classes=train_metrics["dataset"]["num_classes"])
    train_cfg = config_from_artifact(model_art.config, what=f"--model {model}", made_by=model_art.manifest.get("version"))
    if unchecked:
        report.warn(f"{ALLOW_FLAG}: {stage} scores --partition {partition} unchecked: --model {model} lists no "
                    "training samples (--dp) and its own partition is not at hand, so some scored samples may be "
                    "samples it trained on; metrics.json says overlap_unchecked: true.")
    return writer, model_art, payload, train_cfg, part, ds, unchecked


def run_predict(cfg, *, model: Path, partition: Path, out: Path, force: bool, report: Reporter, plot: bool = False,
                allow_unchecked: bool = False) -> None:
    from pfl_cli.fl.api import predict_clients
    from pfl_cli.fl.device import check_device, resolve_device

    _check_config(cfg)
    check_device(cfg.device)  # --device cuda without a GPU: refused before any work
    inputs = open_model_stage("predict", cfg, model=model, partition=partition, out=out, force=force, report=report,
                              up_to_date_hint=f" `pflx show --plot {out}` draws its histogram." if plot else "",
                              allow_unchecked=allow_unchecked)
    if inputs is None:
        return
    writer, model_art, payload, train_cfg, part, ds, unchecked = inputs
    device = resolve_device(cfg.device)
    from pfl_cli import registry

    servers = "; ".join(e.algorithm.serves_unlabeled for e in registry.entries().values()
                        if e.algorithm.serves_unlabeled)
    with report.progress("predict", None, unit="client") as bar:
        run = predict_clients(payload, train_cfg, ds.x, ds.y, ds.num_classes, part, cfg, device=device,
                              labeled=ds.labeled, on_progress=core_progress(bar),
                              unlabeled_servers=servers)
    label_mask = train_cfg.label_mask if cfg.label_mask is None else cfg.label_mask
    s = run.evaluation.summary()
    metrics = clean({
        "algorithm": payload["algorithm"],
        "clients": cfg.clients,
        "label_mask": bool(label_mask),
        "headline_metric": "mean_accuracy_lm" if label_mask else "mean_accuracy_nolm",
        # as trained unless overridden; None for an algorithm without the key
        "finetune_steps": _override(cfg.finetune_steps, getattr(train_cfg, "finetune_steps", None)),
        "eval_descriptor": _override(cfg.eval_descriptor, getattr(train_cfg, "eval_descriptor", None)),
        "mean_accuracy": s["mean_accuracy_lm" if label_mask else "mean_accuracy"],
        "pooled_accuracy": s["pooled_accuracy_lm" if label_mask else "pooled_accuracy"],
        "mean_accuracy_nolm": s["mean_accuracy"],
        "pooled_accuracy_nolm": s["pooled_accuracy"],
        "mean_accuracy_lm": s["mean_accuracy_lm"],
        "pooled_accuracy_lm": s["pooled_accuracy_lm"],
        "loss": s["loss"],
        # fairness across the predicted clients (pfl_cli.compare.stats): unmasked, and label-masked (_lm)
        **{k: s[k] for k in (*FAIRNESS_KEYS, *(f"{k}_lm" for k in FAIRNESS_KEYS))},
        # balanced accuracy and macro-F1 (mean over clients, pooled), the global model's (pfl_cli.fl.evaluate)
        **{k: s[k] for k in CLASS_METRICS},
        "global_model": has_global_model(run.algorithm),
        "num_clients": s["num_clients"],
        "num_samples": s["num_samples"],
        "num_unlabeled_clients": int(len(run.unlabeled)),
        "num_evaluated_clients": int(np.sum(run.evaluation.n > 0)),
        "hidden_label_oracle": bool(cfg.evaluate_hidden_labels),
        "protocol": run.protocol["protocol"],
        "rounds": int(run.protocol["rounds"]),
        "new_clients": int(run.protocol["new_clients"]),
        "protocols": run.protocol["protocols"],
        "optimizer_steps": int(run.optimizer_steps),
        "personalized": bool(run.personalized),
        "device": str(device),
        "model": model_art.input_ref(),
        "overlap_unchecked": unchecked,
    })
    served = dict(zip(np.asarray(run.clients).tolist(), run.served_by.tolist()))
    by_id = {int(part.client_id[c]): p for c, p in served.items()}
    rows = [[*row, by_id[row[0]]] for row in client_rows(part, [run.evaluation])]  # + the protocol that served it
    with writer:
        writer.save_json("metrics.json", metrics)
        writer.save_csv("clients.csv", (*CLIENT_COLUMNS, "protocol"), rows)
        if run.predictions is not None:
            p = run.predictions
            writer.save_npz("predictions.npz", client_id=np.asarray(part.client_id, dtype=np.int64)[p["client"]],
                            split=p["split"], sample=p["sample"].astype(np.int64),
                            predicted=p["predicted"].astype(np.int64), probabilities=p["probabilities"])
        if plot:  # drawn from the CSV just written, exactly as `pflx show --plot` redraws it
            from pfl_cli.cli.figures import client_accuracy_histogram

            client_accuracy_histogram(writer.path("clients.csv"), writer.path("metrics.json"), writer.path("clients.png"))
        if cfg.save_models:
            import torch

            ids = torch.as_tensor(np.asarray(part.client_id)[run.clients], dtype=torch.int64)
            writer.path("models.pt").write_bytes(torch_bytes({"client_id": ids, "weights": run.params}))
            client_spec = (payload.get("arch") or {}).get("client")
            if isinstance(client_spec, dict) and client_spec.get("arch") == "lora":  # peft's format (issue 46)
                from pfl_cli.models.lora_export import write_adapters

                write_adapters(writer.path("adapters"), client_spec, run.params, ids.tolist(), run.personalized)
    _note_unseen_test_labels(report, part, ds.y, run.clients)
    _print_summary(report, out, metrics, s, ds.num_classes)


def unseen_test_labels(part, y: np.ndarray, clients: np.ndarray) -> list[tuple[int, int, int]]:
    """(client id, test samples whose class is absent from the client's train labels, test samples)
    for each client that has such samples: label masking never predicts their class."""
    found = []
    for j in np.asarray(clients, dtype=np.int64):
        train, test = y[part.train_of(j)], y[part.test_of(j)]
        test = test[test >= 0]  # unlabeled samples are not scored
        unseen = int(np.sum(~np.isin(test, train[train >= 0])))
        if unseen:
            found.append((int(part.client_id[j]), unseen, len(test)))
    return found


def _note_unseen_test_labels(report: Reporter, part, y, clients) -> None:
    """One note per client whose test labels include classes absent from its train labels (Dirichlet
    partitions have them): masked accuracy counts those samples wrong, 0% when all are unseen."""
    if y is None:
        return
    for client, unseen, total in unseen_test_labels(part, np.asarray(y), clients):
        zero = " (all of them: 0% with label masking)" if unseen == total else ""
        report.note(f"note: client {client}: {unseen} of its {total} test samples have a class absent from its "
                    f"train data{zero}; label masking never predicts those classes.")


def _print_summary(report: Reporter, out: Path, m: dict, s: dict, num_classes: int) -> None:
    extra = (f"; {m['optimizer_steps']} optimizer steps; "
             f"{'one model per client' if m['personalized'] else 'one global model'}")
    if m["num_unlabeled_clients"]:
        extra += (f"; {m['num_unlabeled_clients']} clients without labels, "
                  + ("scored against their hidden labels (ORACLE evaluation: they never showed them)"
                     if m["hidden_label_oracle"] else "not scored (pass --evaluate-hidden-labels for an oracle score)"))
    table = accuracy_table(f"predict -> {out}: {m['algorithm']} model, {m['clients']} clients, {m['device']}",
                           {m["clients"]: clean(s)}, m["label_mask"], extra)
    report.result({"out": str(out), "up_to_date": False, **m}, table)
    from pfl_cli.cli.chance import near_chance

    warning = near_chance({m["clients"]: m["mean_accuracy_nolm"]}, num_classes, m["algorithm"])
    if warning:  # issue 33: predictions near chance say so
        report.warn(warning)
