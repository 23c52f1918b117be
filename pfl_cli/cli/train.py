"""`pflx train`: train PeFLL, FedAvg, Local or a local-DP baseline on a partition's train clients."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer

from pfl_cli.cli.common import explicit_flags, stage_config
from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, OutOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter

FLAGS = (
    "algorithm", "rounds", "clients_per_round", "local_steps", "batch_size", "lr", "server_lr", "eval_every",
    "val_fraction", "label_mask", "finetune_steps", "local_epochs", "model_arch", "embedding", "embed_dim",
    "hyper_size", "standardize_descriptor", "write_nonprivate", "device", "seed",
)

# TrainConfig keys without a flag of their own: reachable through --config / --set (the help lists them).
SET_ONLY = (
    "momentum", "client_clip", "server_optimizer", "server_momentum", "server_clip", "lambda_h", "lambda_v",
    "lambda_theta", "mlp_hidden", "hyper_hidden", "descriptor_batch", "eval_descriptor", "normalize",
    "checkpoint_every", "dp_sampling_rate", "dp_accountant",
)


def train(
    ctx: typer.Context,
    out: OutOpt,
    partition: Annotated[Path, typer.Option("--partition", "-p", help="Partition artifact: role-0 clients train, holdout clients are only evaluated.")],
    algorithm: Annotated[str, typer.Option("--algorithm", help="pefll | fedavg | local | ldp-fedavg | ppsgd | centaur (the last three: local-DP baselines, need --dp).")] = "pefll",
    rounds: Annotated[int, typer.Option("--rounds", help="Communication rounds (pefll, fedavg; local has none).")] = 1000,
    clients_per_round: Annotated[int, typer.Option("--clients-per-round", help="Cohort size of every round.")] = 5,
    local_steps: Annotated[int, typer.Option("--local-steps", help="Client SGD steps per round (pefll, fedavg).")] = 50,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Client minibatch size.")] = 32,
    lr: Annotated[float, typer.Option("--lr", help="Client SGD step size.")] = 2e-3,
    server_lr: Annotated[Optional[float], typer.Option("--server-lr", help="Server step: pefll (default 2e-4), fedavg on the mean delta (default 1).")] = None,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Rounds between evaluations (and checkpoints).")] = 50,
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="Share of each train client's samples held out for model selection (0 = keep the last model).")] = 0.1,
    label_mask: Annotated[bool, typer.Option("--label-mask/--no-label-mask", help="Headline accuracy with classes absent from a client's train data masked out (both are always reported).")] = False,
    finetune_steps: Annotated[int, typer.Option("--finetune-steps", help="fedavg: local steps from the global model before evaluation.")] = 0,
    local_epochs: Annotated[Optional[int], typer.Option("--local-epochs", help="local: epochs per client (default 200); fedavg: epochs instead of --local-steps.")] = None,
    model_arch: Annotated[str, typer.Option("--model-arch", help="Client net: auto (lenet for images >= 28x28, else mlp) | lenet | mlp.")] = "auto",
    embedding: Annotated[str, typer.Option("--embedding", help="pefll embedding net: auto | cnn | cnn-x | linear | mlp | mlp-x.")] = "auto",
    embed_dim: Annotated[int, typer.Option("--embed-dim", help="pefll descriptor dimension l (0 = int(1 + clients / 4)).")] = 0,
    hyper_size: Annotated[str, typer.Option("--hyper-size", help="pefll hypernetwork: S | M | L (1 / 3 / 5 hidden layers).")] = "M",
    standardize_descriptor: Annotated[bool, typer.Option("--standardize-descriptor/--no-standardize-descriptor", help="pefll: the authors' code's frozen scalar standardization of descriptors.")] = True,
    dp: Annotated[Optional[str], typer.Option("--dp", metavar="eps=E[,delta=D][,clip=C][,population=N]", help="Differential privacy: fedavg, pefll: client-level DP-FedAvg (clip C of a client's update, required; N: public bound on the clients, sets q = clients-per-round / N); ldp-fedavg, ppsgd, centaur: example-level DP-SGD on each client (N: bound on a client's records). delta default 1e-6, checked < 1/N.")] = None,
    write_nonprivate: Annotated[bool, typer.Option("--write-nonprivate", help="With --dp: also write accuracies measured on the private clients, to nonprivate* files (they are not covered by the DP guarantee).")] = False,
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
    checkpoint_every (0 = at every evaluation), dp_sampling_rate (client-level Poisson rate q; default
    clients_per_round / train clients), dp_accountant (rdp | pld); --dp sets dp_epsilon, dp_delta,
    dp_clip and dp_population.

    Under --dp the artifact holds only what the DP guarantee covers (config.yaml, model.pt of the
    last round, privacy.json, metrics.json without accuracies); accuracies on the private clients go
    to nonprivate* files with --write-nonprivate.

    While training, the latest checkpoint is kept in .<out>.checkpoint/ beside --out; --resume
    continues from it after a kill, with the same result as an uninterrupted run.

    Examples: pflx train --partition runs/part --algorithm pefll --out runs/pefll ;
    pflx train --partition runs/part --algorithm fedavg --rounds 500 --finetune-steps 10 --out runs/fedavg ;
    pflx train --partition runs/part --out runs/pefll --resume ;
    pflx train --partition runs/part --algorithm fedavg --dp eps=4,clip=1,population=1000 --set normalize=false --out runs/dp
    """
    from pfl_cli.cli.train_run import run_train
    from pfl_cli.fl.config import TrainConfig
    from pfl_cli.privacy.release import parse_dp_spec

    flags = explicit_flags(ctx, FLAGS)
    if dp is not None:
        spec = parse_dp_spec(dp, keys=("eps", "delta", "clip", "population"))
        flags.update({f"dp_{k}": v for k, v in dataclasses.asdict(spec).items() if v is not None})
    cfg = stage_config(TrainConfig, "train", config_file=config, flags=flags, sets=set_)
    run_train(cfg, partition=partition, out=out, resume=resume, force=force, report=Reporter(fmt))
