"""`pflx tune`: search an algorithm's hyperparameters on validation data (an Optuna study) and write best.yaml."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Optional

import typer

from pfl_cli.cli.common import explicit_flags, train_stage_config
from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, OutOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter

FLAGS = ("algorithm", "rounds", "clients_per_round", "local_steps", "batch_size", "lr", "eval_every", "label_mask",
         "model_arch", "device", "seed", "write_nonprivate")


def tune(
    ctx: typer.Context,
    out: OutOpt,
    partition: Annotated[Path, typer.Option("--partition", "-p", help="Partition artifact: the study reads its train clients only (validation samples and validation clients carved from them); test splits and holdout clients are never read.")],
    algorithm: Annotated[str, typer.Option("--algorithm", help="The algorithm to tune (`pflx algorithms NAME` shows its search space).")] = "pefll",
    space: Annotated[Optional[list[str]], typer.Option("--space", metavar="KEY=SPEC", help="Search KEY over SPEC: log:LOW:HIGH | float:LOW:HIGH | int:LOW:HIGH | choice:A,B,... (repeatable); replaces or extends the algorithm's declared space.")] = None,
    trials: Annotated[int, typer.Option("--trials", help="Trials in the study (a resumed study runs the missing ones); under --dp the mean of the secret random number of trials.")] = 20,
    jobs: Annotated[int, typer.Option("--jobs", help="Trials run at once, each in its own process with one torch thread.")] = 1,
    stack: Annotated[int, typer.Option("--stack", help="Trials trained at once in this process, stacked on a run axis (fedavg, fedprox: their local SGD one batched call per step); K asks, then K tells; each trial pruned on its own curve. A stack's trials see the trials finished before it.")] = 1,
    sampler: Annotated[Optional[str], typer.Option("--sampler", help="tpe (default) | random | grid (every combination of choice/int values; the default under --dp is random, the only one allowed).", show_default=False)] = None,
    pruner: Annotated[Optional[str], typer.Option("--pruner", help="median (default: stop a trial whose validation curve is below the median of earlier trials at the same round) | halving (successive halving) | none; under --dp: none.", show_default=False)] = None,
    storage: Annotated[Optional[str], typer.Option("--storage", help="Optuna storage URL shared by several machines (e.g. postgresql://user@host/db); default: an SQLite file beside --out while running, study.db in the artifact.", show_default=False)] = None,
    study_name: Annotated[Optional[str], typer.Option("--study-name", help="The study's name in --storage (default: pflx-tune-ALGORITHM).", show_default=False)] = None,
    validation_fraction: Annotated[float, typer.Option("--validation-fraction", help="Share of each train client's samples held out as its validation samples.")] = 0.2,
    validation_clients: Annotated[Optional[float], typer.Option("--validation-clients", help="Share of the train clients held out as validation clients, which score methods whose headline is new clients (default 0.2 for them, 0 otherwise).", show_default=False)] = None,
    rounds: Annotated[int, typer.Option("--rounds", help="Rounds of every trial (default: the algorithm's).", show_default=False)] = 1000,
    clients_per_round: Annotated[Optional[int], typer.Option("--clients-per-round", help="Cohort size (default: the algorithm's).", show_default=False)] = None,
    local_steps: Annotated[int, typer.Option("--local-steps", help="Client SGD steps per round (default: the algorithm's).", show_default=False)] = 50,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Client minibatch size (default: the algorithm's).", show_default=False)] = 32,
    lr: Annotated[float, typer.Option("--lr", help="Client step size when it is not searched (default: the algorithm's).", show_default=False)] = 2e-3,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Rounds between evaluations: the points of each trial's validation curve, where the pruner looks.", show_default=False)] = 50,
    label_mask: Annotated[bool, typer.Option("--label-mask/--no-label-mask", help="Maximize label-masked accuracy instead of unmasked accuracy.", show_default=False)] = False,
    model_arch: Annotated[str, typer.Option("--model-arch", help="Client net: auto | lenet | mlp | ... | pfllib-cnn | resnet18-cifar | factory:MODULE:CALLABLE | torchvision:NAME | timm:NAME (as pflx train; docs/models.md).", show_default=False)] = "auto",
    dp: Annotated[Optional[str], typer.Option("--dp", metavar="eps=E[,delta=D][,clip=C][,population=N][,noise=secure|seeded]", help="Every trial trains under this DP budget and its validation score is released by the Gaussian mechanism; a secret random number of trials (mean --trials) runs and only the best config is released (Papernot & Steinke 2022); privacy.json accounts for the whole study.")] = None,
    dp_shape: Annotated[float, typer.Option("--dp-shape", help="Under --dp: shape eta of the truncated negative binomial number of trials (1: truncated geometric).")] = 1.0,
    dp_score_noise: Annotated[float, typer.Option("--dp-score-noise", help="Under --dp: noise multiplier of the Gaussian release of a trial's score (sum of client accuracies, and their count). Default: from the public federation size (--dp population=N): a 5-point standard error over N scored clients, at most 3 (3 without population); a noise that cannot resolve 10 points is refused.", show_default=False)] = 3.0,
    log: Annotated[Optional[list[str]], typer.Option("--log", help="Also log each trial as a run of an experiment tracker: wandb (offline unless WANDB_MODE says otherwise; the study a W&B group) | mlflow (the SQLite store LOG_DIR/mlflow.db unless MLFLOW_TRACKING_URI is set; the study an experiment) (repeatable): the searched keys as parameters, the validation curve, the score; refused with --dp. Not part of the config.")] = None,
    log_dir: Annotated[Optional[Path], typer.Option("--log-dir", help="Where --log writes (default: OUT.logs beside --out).", show_default=False)] = None,
    write_nonprivate: Annotated[bool, typer.Option("--write-nonprivate", help="With --dp: also write the trials' non-released scores to nonprivate-trials.csv (not covered by the guarantee).")] = False,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda[:N].")] = "auto",
    plot: Annotated[bool, typer.Option("--plot", help="Also write history.png (every trial's score, the best so far) and parallel.png (parallel coordinates of the searched keys).")] = False,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Search an algorithm's hyperparameters on validation data and write the best config as best.yaml.

    Each trial trains the algorithm as `pflx train` would, with the searched keys drawn by the
    sampler, on the partition's train clients only: a share of each client's train samples is its
    validation data, and for methods whose headline is clients unseen in training (pefll, flowdup,
    pfedhn, ...) a share of the train clients is held out as validation clients. The objective is the
    method's headline accuracy on that group. Test splits and holdout clients are never read: they
    stay for the final report (`pflx train --config OUT/best.yaml`, then `pflx compare`).

    Every algorithm declares its search space from its paper's tuning protocol (`pflx algorithms
    NAME`); --space KEY=SPEC replaces or adds a key. The privacy budget (dp_*), the seed and the
    algorithm cannot be searched. Trials that diverge or draw an invalid config are recorded as
    failed, pruned trials as pruned; the study goes on.

    The study is an Optuna study in an SQLite file: a killed tune continues where it stopped when the
    same command runs again; --storage URL puts it in a database several machines share (run the
    same command on each). Ctrl-C prints one line; the trial it stopped is recorded as interrupted, not
    counted, and run again. A study resumes only the same search: a command that differs in the algorithm,
    the base config, --space, --rounds, the objective, the validation carve, the partition or the pflx
    version is refused naming what differs; --force deletes that study and starts a fresh one. The
    artifact holds study.db, trials.csv (every trial's config, state and validation curve), best.yaml,
    metrics.json and, with --plot, history.png and parallel.png.

    Examples: pflx tune --partition runs/part --algorithm fedavg --trials 12 --rounds 100 --out runs/tune ;
    pflx tune --partition runs/part --algorithm pefll --space lambda_theta=log:1e-4:1e-1 --out runs/tune-pefll ;
    pflx train --partition runs/part --config runs/tune/best.yaml --out runs/tuned
    """
    from pfl_cli.cli.tune_run import run_tune
    from pfl_cli.tune.plan import TuneOptions
    from pfl_cli.privacy.release import parse_dp_spec

    flags = explicit_flags(ctx, FLAGS)
    if dp is not None:
        spec = parse_dp_spec(dp, keys=("eps", "delta", "clip", "population"))
        flags.update({f"dp_{k}": v for k, v in dataclasses.asdict(spec).items() if v is not None})
        if "noise" not in dp.lower():
            flags.pop("dp_noise")
    cfg = train_stage_config(config_file=config, flags=flags, sets=set_)
    if plot:
        from pfl_cli.cli.figures import require_matplotlib

        require_matplotlib("--plot")
    from pfl_cli.cli.loggers import check_study_loggers, default_log_dir

    options = TuneOptions(space=tuple(space or ()), trials=trials, jobs=jobs, stack=stack, sampler=sampler, pruner=pruner,
                          storage=storage, study_name=study_name, validation_fraction=validation_fraction,
                          validation_clients=validation_clients, dp_shape=dp_shape, dp_score_noise=dp_score_noise,
                          explicit=frozenset(explicit_flags(ctx, ("dp_shape", "dp_score_noise"))),
                          logs=check_study_loggers(log or (), private=cfg.dp_epsilon is not None),
                          log_dir=log_dir or default_log_dir(out))
    from pfl_cli.privacy.study import study_prior

    study = study_prior(config, partition, cfg)  # --config: a private study's best.yaml on this partition composes
    run_tune(cfg, options, partition=partition, out=out, force=force, report=Reporter(fmt), plot=plot, study=study)
