"""`pflx train`: train PeFLL, FedAvg, Local, pFedHN, pFedHN-PC or HyperFL on a partition's train clients."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pfl_cli.cli.common import explicit_flags, stage_config
from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, OutOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter

FLAGS = (
    "algorithm", "rounds", "clients_per_round", "local_steps", "batch_size", "lr", "server_lr", "eval_every",
    "val_fraction", "label_mask", "finetune_steps", "local_epochs", "model_arch", "embedding", "embed_dim",
    "hyper_size", "standardize_descriptor", "device", "seed", "client_sizes",
)

# TrainConfig keys without a flag of their own: reachable through --config / --set (the help lists them).
SET_ONLY = (
    "momentum", "client_clip", "server_optimizer", "server_momentum", "server_clip", "lambda_h", "lambda_v",
    "lambda_theta", "mlp_hidden", "hyper_hidden", "descriptor_batch", "eval_descriptor", "normalize",
    "checkpoint_every",
    # hypernetwork family (issue 11)
    "hn_momentum", "hn_weight_decay", "embed_lr", "head_lr", "embed_rounds",
)


def train(
    ctx: typer.Context,
    out: OutOpt,
    partition: Annotated[Path, typer.Option("--partition", "-p", help="Partition artifact: role-0 clients train, holdout clients are only evaluated.")],
    algorithm: Annotated[str, typer.Option("--algorithm", help="pefll | fedavg | local | pfedhn | pfedhn-pc | hyperfl.")] = "pefll",
    rounds: Annotated[int, typer.Option("--rounds", help="Communication rounds (pefll, fedavg; local has none).")] = 1000,
    clients_per_round: Annotated[Optional[int], typer.Option("--clients-per-round", help="Cohort size of every round (default 5; pfedhn 1, as its paper; hyperfl every client, and its last round always takes every client).", show_default=False)] = None,
    local_steps: Annotated[int, typer.Option("--local-steps", help="Client SGD steps per round (pefll, fedavg).")] = 50,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Client minibatch size.")] = 32,
    lr: Annotated[float, typer.Option("--lr", help="Client SGD step size.")] = 2e-3,
    server_lr: Annotated[Optional[float], typer.Option("--server-lr", help="Server step: pefll (default 2e-4), fedavg on the mean delta (default 1), pfedhn (1e-2), pfedhn-pc (5e-2).")] = None,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Rounds between evaluations (and checkpoints).")] = 50,
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="Share of each train client's samples held out for model selection (0 = keep the last model).")] = 0.1,
    label_mask: Annotated[bool, typer.Option("--label-mask/--no-label-mask", help="Headline accuracy with classes absent from a client's train data masked out (both are always reported).")] = False,
    finetune_steps: Annotated[int, typer.Option("--finetune-steps", help="fedavg: local steps from the global model before evaluation.")] = 0,
    local_epochs: Annotated[Optional[int], typer.Option("--local-epochs", help="local: epochs per client (default 200); fedavg: epochs instead of --local-steps; hyperfl: hypernetwork epochs per round (default 5).")] = None,
    model_arch: Annotated[str, typer.Option("--model-arch", help="Client net: auto (lenet for images >= 28x28, else mlp) | lenet | mlp.")] = "auto",
    embedding: Annotated[str, typer.Option("--embedding", help="pefll embedding net: auto | cnn | cnn-x | linear | mlp | mlp-x.")] = "auto",
    embed_dim: Annotated[int, typer.Option("--embed-dim", help="pefll descriptor / pfedhn embedding dimension (0 = int(1 + clients / 4)); hyperfl embedding (0 = 64).")] = 0,
    hyper_size: Annotated[str, typer.Option("--hyper-size", help="pefll / pfedhn hypernetwork: S | M | L (1 / 3 / 5 hidden layers; hyperfl has one, with a ReLU).")] = "M",
    standardize_descriptor: Annotated[bool, typer.Option("--standardize-descriptor/--no-standardize-descriptor", help="pefll: the authors' code's frozen scalar standardization of descriptors.")] = True,
    client_sizes: Annotated[str, typer.Option("--client-sizes", help="pfedhn: mixed target-net widths from one hypernetwork, e.g. S,M,L (client j gets the size j mod 3; lenet conv1 8/16/32 filters, mlp widths x0.5/1/2).")] = "",
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda[:N].")] = "auto",
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the checkpoint an interrupted run of this same command left beside --out.")] = False,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Train a (personalized) federated model on a partition and write a train artifact.

    Keys without a flag, set with --config FILE.yaml or --set key=value: momentum, client_clip,
    server_optimizer (adam | sgd), server_momentum, server_clip, lambda_h, lambda_v, lambda_theta,
    mlp_hidden (e.g. [32]), hyper_hidden, descriptor_batch, eval_descriptor (all | batch), normalize,
    checkpoint_every (0 = at every evaluation); pfedhn / pfedhn-pc / hyperfl: hn_momentum and
    hn_weight_decay (pfedhn server SGD, default 0.9 and 1e-3), embed_lr (pfedhn embedding rows,
    default the server lr; hyperfl eta_v, default --lr), head_lr (hyperfl classifier eta_g, default
    0.1), embed_rounds (pfedhn new clients' embedding rounds, default 20).

    While training, the latest checkpoint is kept in .<out>.checkpoint/ beside --out; --resume
    continues from it after a kill, with the same result as an uninterrupted run.

    Examples: pflx train --partition runs/part --algorithm pefll --out runs/pefll ;
    pflx train --partition runs/part --algorithm fedavg --rounds 500 --finetune-steps 10 --out runs/fedavg ;
    pflx train --partition runs/part --out runs/pefll --resume
    """
    from pfl_cli.cli.train_run import run_train
    from pfl_cli.fl.config import TrainConfig

    cfg = stage_config(TrainConfig, "train", config_file=config, flags=explicit_flags(ctx, FLAGS), sets=set_)
    run_train(cfg, partition=partition, out=out, resume=resume, force=force, report=Reporter(fmt))
