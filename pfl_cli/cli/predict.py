"""`pflx predict`: models for a partition's clients from a trained model, and their test accuracy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pfl_cli.cli.common import explicit_flags, stage_config
from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, OutOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter
from pfl_cli.overlap import ALLOW_HELP

FLAGS = ("clients", "label_mask", "finetune_steps", "eval_descriptor", "embed_rounds", "local_epochs", "save_models",
         "device", "seed", "evaluate_hidden_labels", "predictions")


def predict(
    ctx: typer.Context,
    out: OutOpt,
    model: Annotated[Path, typer.Option("--model", "-m", help="Train artifact (pflx train --out).")],
    partition: Annotated[Path, typer.Option("--partition", "-p", help="Partition artifact over the dataset the model was trained on (e.g. from pflx simulate).")],
    clients: Annotated[str, typer.Option("--clients", help="Which of the partition's clients: holdout | train | all.")] = "holdout",
    label_mask: Annotated[Optional[bool], typer.Option("--label-mask/--no-label-mask", help="Headline accuracy with label masking: classes absent from a client's train data are never predicted, so a test sample of such a class is always wrong (a client whose test labels are all absent from its train labels scores 0%; Dirichlet partitions have such clients, and predict notes each). Default: as trained; both are always reported.", show_default=False)] = None,
    finetune_steps: Annotated[Optional[int], typer.Option("--finetune-steps", help="fedavg, fedprox, perfedavg: local steps from the global model per client (default: as trained).")] = None,
    eval_descriptor: Annotated[Optional[str], typer.Option("--eval-descriptor", help="pefll descriptor: all (every train sample) | batch (one batch) (default: as trained).")] = None,
    embed_rounds: Annotated[Optional[int], typer.Option("--embed-rounds", help="pfedhn, pfedhn-pc: rounds of --local-steps local steps that train a new client's embedding (hypernetwork frozen; default: as trained, 20).")] = None,
    local_epochs: Annotated[Optional[int], typer.Option("--local-epochs", help="hyperfl: epochs training a new client's embedding and classifier (global hypernetwork frozen); local: epochs per client (default: as trained).")] = None,
    save_models: Annotated[bool, typer.Option("--save-models", help="Also write models.pt: every client's model weights (and a LoRA model's adapters in peft's format: adapters/).")] = False,
    evaluate_hidden_labels: Annotated[bool, typer.Option("--evaluate-hidden-labels", help="Also score unlabeled clients against their hidden labels: an oracle evaluation, recorded as such (the clients never show their labels to the model).")] = False,
    predictions: Annotated[bool, typer.Option("--predictions/--no-predictions", help="Write predictions.npz: client_id, split, sample, predicted class and probabilities of every train and test sample.")] = True,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda[:N].")] = "auto",
    plot: Annotated[bool, typer.Option("--plot", help="Also write clients.png: a histogram of per-client accuracy (not part of the config).")] = False,
    allow_unchecked_overlap: Annotated[bool, typer.Option("--allow-unchecked-overlap", help=ALLOW_HELP)] = False,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Generate or fit models for a partition's clients from a train artifact and measure their test accuracy.

    PeFLL builds each client's model from its descriptor in one forward pass (no optimizer step);
    FedAvg uses the global model (fine-tuned --finetune-steps steps when asked); Local trains every
    client from the shared initialization; pFedHN / pFedHN-PC freeze the hypernetwork and train a
    fresh embedding (and head) per new client for --embed-rounds rounds; HyperFL trains a new
    embedding and classifier under the frozen global hypernetwork for --local-epochs. Clients the
    model was trained on (--clients train) get their trained models. The personalized baselines: each client's private
    state (heads, personal models) for the train clients of the partition they were trained on, and
    their paper's new-client protocol for every other client (fedrep/fedper: a new head on the frozen
    body; lg-fedavg: a new body under the global head; ditto, apfl, pfedme: personal training from
    the global model; perfedavg: fine-tuning; knnper: a kNN datastore, no optimizer step; fedprox:
    the global model). --set batch_size=N sets the evaluation chunk.

    Clients without labels (partition --label-prevalence, npz y = -1, csv labeled = 0) get models
    from algorithms that need no labels at prediction time (pefll with --embedding cnn-x|mlp-x,
    fedavg without fine-tuning, flowdup, ld-fedavg); their accuracy is reported only with
    --evaluate-hidden-labels, an oracle.

    metrics.json: mean_accuracy / pooled_accuracy are the headline (label-masked when label_mask is
    true), mean_accuracy_nolm / pooled_accuracy_nolm without masking, mean_accuracy_lm /
    pooled_accuracy_lm with masking; clients.csv has one row per client.

    Examples: pflx predict --model runs/pefll --partition runs/part --clients holdout --out runs/pred ;
    pflx predict --model runs/pefll --partition runs/sim --clients all --save-models --out runs/pred-sim
    """
    from pfl_cli.cli.predict_run import run_predict
    from pfl_cli.fl.config import PredictConfig

    cfg = stage_config(PredictConfig, "predict", config_file=config, flags=explicit_flags(ctx, FLAGS), sets=set_)
    if plot:
        from pfl_cli.cli.figures import require_matplotlib

        require_matplotlib("--plot")
    run_predict(cfg, model=model, partition=partition, out=out, force=force, report=Reporter(fmt), plot=plot,
                allow_unchecked=allow_unchecked_overlap)
