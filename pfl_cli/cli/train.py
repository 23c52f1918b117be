"""`pflx train`: train PeFLL, FedAvg, Local, the hypernetwork family, a personalized baseline or a local-DP baseline on a partition's train clients."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from pfl_cli.cli.common import explicit_flags, train_stage_config
from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, OutOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter
from pfl_cli.errors import InputError

FLAGS = (
    "algorithm", "rounds", "clients_per_round", "local_steps", "batch_size", "lr", "server_lr", "eval_every",
    "val_fraction", "label_mask", "finetune_steps", "local_epochs", "model_arch", "embedding", "embed_dim",
    "hyper_size", "standardize_descriptor", "write_nonprivate", "device", "seed", "client_sizes",
    "dropout", "round_deadline", "compression",
    "secagg",
)



def train(
    ctx: typer.Context,
    out: OutOpt,
    partition: Annotated[Path, typer.Option("--partition", "-p", help="Partition artifact: role-0 clients train, holdout clients are only evaluated.")],
    algorithm: Annotated[str, typer.Option("--algorithm", help="The algorithm (`pflx algorithms` lists them); every other key defaults to its paper's value (`pflx algorithms NAME`).")] = "pefll",
    rounds: Annotated[int, typer.Option("--rounds", help="Communication rounds (pefll, fedavg; local has none).", show_default=False)] = 1000,
    clients_per_round: Annotated[Optional[int], typer.Option("--clients-per-round", help="Cohort size of every round (default: the algorithm's paper; pflx algorithms NAME).", show_default=False)] = None,
    local_steps: Annotated[int, typer.Option("--local-steps", help="Client SGD steps per round (every federated algorithm but fedrep, which counts epochs). On an algorithm whose rounds count epochs by default (fednova, fedopt, flowdup, ld-fedavg, fedtta) it selects step counting, unless local_epochs is given too.", show_default=False)] = 50,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Client minibatch size.", show_default=False)] = 32,
    lr: Annotated[float, typer.Option("--lr", help="Client SGD step size.", show_default=False)] = 2e-3,
    server_lr: Annotated[Optional[float], typer.Option("--server-lr", help="Server step: pefll (adam 2e-4; sgd 1, Alg. 8), fedavg on the mean delta (default 1), pfedhn (1e-2), pfedhn-pc (5e-2).")] = None,
    eval_every: Annotated[int, typer.Option("--eval-every", help="Rounds between evaluations (and checkpoints).", show_default=False)] = 50,
    val_fraction: Annotated[float, typer.Option("--val-fraction", help="Share of each train client's samples held out for model selection (0 = keep the last model).", show_default=False)] = 0.1,
    label_mask: Annotated[bool, typer.Option("--label-mask/--no-label-mask", help="Headline accuracy with classes absent from a client's train data masked out: a test sample of such a class is always wrong, and a client whose test labels are all absent from its train labels scores 0% (Dirichlet partitions have such clients). Both are always reported.", show_default=False)] = False,
    finetune_steps: Annotated[int, typer.Option("--finetune-steps", help="fedavg, fedprox: local steps from the global model before evaluation; perfedavg: its fine-tuning steps (0 = one).", show_default=False)] = 0,
    local_epochs: Annotated[Optional[int], typer.Option("--local-epochs", help="local: epochs per client (default 200); fedavg: epochs instead of --local-steps; hyperfl: hypernetwork epochs per round (default 5).")] = None,
    model_arch: Annotated[str, typer.Option("--model-arch", help="Client net: auto (lstm for text, lenet for images >= 28x28, else mlp) | lenet | mlp | hyperfl-cnn | mlp-bn | lenet-bn (batch-norm variants, for fedbn) | lstm (LEAF's Shakespeare LSTM, text data; width: --set lstm_hidden=W) | pfllib-cnn | resnet18-cifar | factory:MODULE:CALLABLE | torchvision:NAME | timm:NAME (keys model_kwargs, model_weights, model_head; docs/models.md).", show_default=False)] = "auto",
    embedding: Annotated[str, typer.Option("--embedding", help="pefll embedding net: auto | cnn | cnn-x | linear | mlp | mlp-x.", show_default=False)] = "auto",
    embed_dim: Annotated[int, typer.Option("--embed-dim", help="pefll descriptor / pfedhn embedding dimension (0 = int(1 + clients / 4)); hyperfl embedding (0 = 64).", show_default=False)] = 0,
    hyper_size: Annotated[str, typer.Option("--hyper-size", help="pefll / pfedhn hypernetwork: S | M | L (1 / 3 / 5 hidden layers; hyperfl has one, with a ReLU).", show_default=False)] = "M",
    standardize_descriptor: Annotated[bool, typer.Option("--standardize-descriptor/--no-standardize-descriptor", help="pefll: the authors' code's frozen scalar standardization of descriptors.", show_default=False)] = True,
    dp: Annotated[Optional[str], typer.Option("--dp", metavar="eps=E[,delta=D][,clip=C][,population=N][,noise=secure|seeded]", help="Differential privacy: fedavg, pefll: client-level DP-FedAvg (clip C of a client's update, required; N: public bound on the clients, sets q = clients-per-round / N); ldp-fedavg, ppsgd, centaur: example-level DP-SGD on each client (N: bound on a client's records). delta default 1e-6, checked < 1/N. noise=secure (default): noise and sampling from OS entropy; noise=seeded: repeatable from the published seed, simulation only.")] = None,
    write_nonprivate: Annotated[bool, typer.Option("--write-nonprivate", help="With --dp: also write accuracies measured on the private clients, to nonprivate* files (they are not covered by the DP guarantee).")] = False,
    allow_nonprivate_config: Annotated[bool, typer.Option("--allow-nonprivate-config", help="With --dp and --config: train with a config chosen by a study without --dp on this partition (refused otherwise: the choice of config is not covered by the run's epsilon). Not part of the config.")] = False,
    secagg: Annotated[bool, typer.Option("--secagg", help="Simulated secure aggregation: the server step reads only the cohort's sums (fedavg and the algorithms on its round; docs/privacy/secure-aggregation.md lists which; the others are refused naming what their server reads individually). With --dp: central DP-FedAvg on the secure sum, or --set dp_mechanism=ddg for distributed DP (each client adds its discrete Gaussian noise share).")] = False,
    client_sizes: Annotated[str, typer.Option("--client-sizes", help="pfedhn, pfedhn-pc: mixed target-net widths from one hypernetwork, e.g. S,M,L (client j gets the size j mod 3; lenet conv1 8/16/32 filters, mlp widths x0.5/1/2).", show_default=False)] = "",
    dropout: Annotated[float, typer.Option("--dropout", help="Federation conditions: probability that a selected client leaves mid-round and never answers (docs/federation-conditions.md).", show_default=False)] = 0.0,
    round_deadline: Annotated[Optional[float], typer.Option("--round-deadline", help="Simulated seconds a round waits for answers; late work is dropped (fedavg and most) or kept as partial work (fedprox, fednova). Client speeds: --set compute_speed=..., network_speed=....", show_default=False)] = None,
    compression: Annotated[str, typer.Option("--compression", help="Upload compression of model deltas (fedavg, fedprox, fednova): none | topk | qsgd | sign, with error feedback (--set error_feedback=false: without).", show_default=False)] = "none",
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda[:N].")] = "auto",
    plot: Annotated[bool, typer.Option("--plot", help="Also write curves.png: accuracy and loss against rounds, the selected round marked (not part of the config).")] = False,
    log: Annotated[Optional[list[str]], typer.Option("--log", help="Also log per-round metrics while training for an experiment tracker: tensorboard | csv | jsonl | wandb (offline unless WANDB_MODE says otherwise) | mlflow (the SQLite store LOG_DIR/mlflow.db unless MLFLOW_TRACKING_URI is set) (repeatable), into --log-dir; under --dp only released values (none per round: elapsed time only). Not part of the config.")] = None,
    log_dir: Annotated[Optional[Path], typer.Option("--log-dir", help="Where --log writes (default: OUT.logs beside --out; tensorboard --logdir it).", show_default=False)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the checkpoint an interrupted run of this same command left beside --out.")] = False,
    nproc: Annotated[int, typer.Option("--nproc", help="Processes on this machine (torch.distributed: gloo on CPU, NCCL with --device cuda, one GPU each); cohort and evaluation clients are split across them. At most the cohort size.")] = 1,
    seed: SeedOpt = 0,
    seeds: Annotated[Optional[str], typer.Option("--seeds", metavar="S1,S2,...", help="Train these seeds in one process, stacked on a run axis (fedavg, fedprox: the local SGD of every run's clients is one batched call per step), into OUT/seed-<s>/, each as `train --seed s --out OUT/seed-<s>` writes it (model.pt equal to float rounding; its manifest says stacked). With --dp each seed is its own mechanism (its own noise from OS entropy, its own privacy.json); with --log each its own folder LOG_DIR/seed-<s> (default OUT/seed-<s>.logs) and tracker run seed-<s>. Not with --nproc (one process).", show_default=False)] = None,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Train a (personalized) federated model on a partition and write a train artifact.

    Each algorithm owns its keys and their defaults, taken from its paper: `pflx algorithms NAME`
    lists them with their sources. A flag, a --config key or a --set key the algorithm does not
    take is refused. Flags below apply to the algorithms that have the key; their defaults are
    the algorithm's.

    Keys without a flag, set with --config FILE.yaml or --set key=value: momentum, client_clip,
    server_optimizer (adam | sgd), server_momentum, server_clip, lambda_h, lambda_v, lambda_theta,
    mlp_hidden (e.g. [32]), lstm_hidden (width of the text LSTM's two layers, 256), hyper_hidden, descriptor_batch, eval_descriptor (all | batch), normalize,
    checkpoint_every (0 = at every evaluation), cohort_exec (auto | vmap | loop: how a cohort's local
    SGD runs; auto takes the one measured faster for the device and client net).

    Clients without labels: evaluate_hidden_labels (score unlabeled clients against their hidden
    labels, an oracle). FLowDUP and LD-FedAvg (Scott 2026 thesis, ch. 5): subspace_dim (k), subspace_nnz,
    feature_dim (e), lambda_reg, labeled_rate (alpha), learnable_centre; flowdup's h_1 is --embedding
    (auto | cnn-x | mlp-x) and h_2's hidden width hyper_hidden. PeFLL descriptor analysis:
    track_descriptors (Spearman of descriptor vs label-distribution distances of holdout clients).

    Pre-trained backbones (hyperfl-lpm and HyperFL Table 2's local / fedavg baselines): backbone
    (vit-s16 | resnet18 | vit-micro | resnet-micro), backbone_weights (a local .pth / .safetensors
    state dict in timm's / torchvision's key layout; empty: random), backbone_tune (adapters | probe
    | full).

    Federation conditions (docs/federation-conditions.md), drawn from the seeded streams so --resume is
    byte-identical: availability (probability a client is online each round) or availability_trace (a CSV
    of 0/1, a row per client, a column per time slot: one per round, or per trace_slot_seconds of the
    simulated clock), dropout, compute_speed (local steps per simulated
    second) and network_speed (MB per simulated second), each NUMBER | uniform:LO:HI |
    lognormal:MEDIAN:SIGMA | file:PATH, round_deadline, over_selection (select (1 + o) x clients_per_round,
    keep the first to answer); compression (none | topk | qsgd | sign) with compression_density (topk),
    qsgd_levels and error_feedback. metrics.csv gains round_sim_seconds, clients_answered and sim_seconds
    (the simulated clock at each evaluation: accuracy against simulated time). Late work: fedprox and
    fednova keep a straggler's partial steps, every other algorithm drops it; local (no rounds) refuses
    conditions; compression is for fedavg, fedprox and fednova; under --dp only availability and dropout.
    Byzantine clients and robust aggregation (docs/robustness.md): attack (none | label-flip | sign-flip |
    gaussian | backdoor | alie | ipm), attack_fraction (share of the train clients that are malicious, default
    0.2), attack_scale (the attack's strength; default its paper's), aggregator (mean | median | trimmed-mean |
    krum | multi-krum | bulyan | centered-clip | norm-bound: the FedAvg family's server average), robust_fraction
    (share of a cohort the aggregator tolerates, default 0.25), robust_clip (centered-clip's and norm-bound's
    radius; default the cohort's median norm). metrics.json's byzantine object and metrics.csv's groups honest and
    backdoor report the honest clients' accuracy and the backdoor's success rate.

    DP keys: dp_sampling_rate (client-level Poisson rate q; default
    clients_per_round / train clients), dp_accountant (rdp | pld); --dp sets dp_epsilon, dp_delta,
    dp_clip, dp_population and dp_noise (secure: noise and sampling from OS entropy, the default;
    seeded: repeatable from the published seed, simulation only). With --secagg: dp_mechanism (central:
    the server noises the secure sum | ddg: each client adds its discrete Gaussian share, Kairouz et al.
    2021), dp_bits (ddg: sums modulo 2^b) and dp_min_survivors (ddg: the public minimum cohort the noise is
    calibrated for; docs/privacy/secure-aggregation.md).

    Under --dp the artifact holds only what the DP guarantee covers (config.yaml, model.pt of the
    last round, privacy.json, metrics.json without accuracies); accuracies on the private clients go
    to nonprivate* files with --write-nonprivate.

    Baselines' keys (each its paper's symbol): mu (fedprox proximal weight, 0 = FedAvg), lam (ditto's
    lambda, default 0.1), head_epochs / body_epochs (fedrep, default 5 / 1), new_client_epochs (epochs
    a client without private state trains: fedrep/fedper its head, lg-fedavg its body, ditto its
    personal model, apfl its local model and alpha; default 20), alpha (apfl's initial mixing weight,
    default 0.5), alpha_lr (apfl's step on alpha, default lr; 0 keeps alpha fixed), variant (perfedavg:
    fo | hf; its alpha is --lr), beta (perfedavg's outer step, default lr; pfedme's server mixing,
    default 1), K (pfedme's inner steps, default 3), personal_lr (pfedme's inner step, default lr),
    lam is also pfedme's lambda (default 15), knn_k (knnper's k, default 10), knn_scale (knnper's
    distance scale T, default 100), interpolation (knnper's lambda, default 0.5; 0 = global model).
    Every federated baseline but fedrep trains --local-steps (or --local-epochs) per round.

    Hypernetwork family: pfedhn / pfedhn-pc / hyperfl: hn_momentum and
    hn_weight_decay (pfedhn server SGD, default 0.9 and 1e-3), embed_lr (pfedhn embedding rows,
    default the server lr; hyperfl eta_v, default --lr), head_lr (hyperfl classifier eta_g, default
    0.1), embed_rounds (pfedhn new clients' embedding rounds, default 20).

    While training, the latest checkpoint is kept in .<out>.checkpoint/ beside --out; --resume
    continues from it after a kill, with the same result as an uninterrupted run; without --resume
    such a run is refused (exit 2), and --force starts over, discarding the checkpoint.

    Examples: pflx train --partition runs/part --algorithm pefll --out runs/pefll ;
    pflx train --partition runs/part --algorithm fedavg --rounds 500 --finetune-steps 10 --out runs/fedavg ;
    pflx train --partition runs/part --algorithm pefll --out runs/pefll --resume (the same command plus --resume) ;
    pflx train --partition runs/part --algorithm fedavg --dp eps=4,clip=1,population=1000 --set normalize=false --out runs/dp
    """
    from pfl_cli.cli.train_run import run_train
    from pfl_cli.privacy.release import parse_dp_spec

    flags = explicit_flags(ctx, FLAGS)
    if dp is not None:
        spec = parse_dp_spec(dp, keys=("eps", "delta", "clip", "population"))
        flags.update({f"dp_{k}": v for k, v in dataclasses.asdict(spec).items() if v is not None})
        if "noise" not in dp.lower():  # the default: a config file's dp_noise stands
            flags.pop("dp_noise")
    cfg = train_stage_config(config_file=config, flags=flags, sets=set_)
    if plot:
        from pfl_cli.cli.figures import require_matplotlib

        require_matplotlib("--plot")
    from pfl_cli.cli.loggers import check_loggers, default_log_dir

    logs = check_loggers(log or ())  # an unknown or uninstalled logger is refused before any work
    # --config's file: a study's best.yaml composes its ledger or is refused (pfl_cli.train.run.study_of)
    source = {"config_file": config, "allow_nonprivate_config": allow_nonprivate_config}
    if seeds is not None:  # before --nproc launches anything: the stack is one process
        _train_seeds(cfg, seeds, ctx, partition=partition, out=out, resume=resume, force=force, fmt=fmt, nproc=nproc,
                     plot=plot, logs=logs, log_dir=log_dir, source=source, sets=set_)
        return
    if nproc != 1:
        _launch(cfg, nproc)
    rank = int(os.environ.get("RANK", "0"))
    run_train(cfg, partition=partition, out=out, resume=resume, force=force,
              report=Reporter(fmt if rank == 0 else Format.quiet), plot=plot,  # rank 0 alone reports and writes
              logs=logs, log_dir=log_dir or default_log_dir(out), **source)


def _train_seeds(cfg, text: str, ctx, *, partition: Path, out: Path, resume: bool, force: bool, fmt, nproc: int,
                 plot: bool, logs: tuple[str, ...], log_dir: Path | None, source: dict, sets=None) -> None:
    """``--seeds S1,S2,...``: parse, refuse what does not combine with it, and train the seeds stacked."""
    from pfl_cli.cli.train_run import run_train_seeds
    from pfl_cli.train.stack import check_seeds

    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise InputError(f"--seeds must be comma-separated integers, e.g. 0,1,2; got {text!r}.") from None
    check_seeds(seeds, text)
    if ctx.get_parameter_source("seed").name != "DEFAULT":
        raise InputError(f"--seeds and --seed: give one of them; got --seed {cfg.seed} and --seeds {text}. "
                         "Put the seed in the --seeds list.")
    from pfl_cli.config import parse_overrides

    if "seed" in parse_overrides(list(sets or ())):  # --set outranks every flag: it would not be outranked silently
        raise InputError(f"--seeds and --set seed: give one of them; got --set seed={cfg.seed} and --seeds {text}. "
                         "Put the seed in the --seeds list.")
    # The stack is one process: its runs' local SGD is one batched call, which ranks would each repeat and write.
    if nproc != 1:
        raise InputError(f"--seeds trains its runs stacked in one process and does not combine with --nproc; got "
                         f"--nproc {nproc}. Drop --nproc, or train each seed with --seed S --nproc {nproc}.")
    run_train_seeds(cfg, seeds, partition=partition, out=out, resume=resume, force=force, report=Reporter(fmt),
                    plot=plot, logs=logs, log_dir=log_dir, **source)


def _launch(cfg, nproc: int) -> None:
    """``--nproc N``: check what can be checked here, then run N ranks of this command and exit with theirs."""
    from pfl_cli.cli.launch import INVOCATION, launch, without_nproc
    from pfl_cli.fl.api import validate_train_config
    from pfl_cli.fl.device import resolve_device
    from pfl_cli.fl.distributed import check_world_size, launched_size

    if launched_size() > 1:
        raise InputError("--nproc: this command already runs under torchrun (WORLD_SIZE is set); drop --nproc.")
    if nproc < 1:
        raise InputError(f"--nproc must be an integer >= 1; got {nproc}.")
    validate_train_config(cfg)
    check_world_size(cfg, nproc, resolve_device(cfg.device))
    raise typer.Exit(launch(without_nproc(INVOCATION), nproc))
