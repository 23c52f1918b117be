"""`pflx attack`: how much of a client's data its uploads reveal to a curious server (HyperFL §5)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pfl_cli.cli.common import explicit_flags, stage_config
from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, OutOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter
from pfl_cli.overlap import ALLOW_HELP

FLAGS = ("clients", "images", "batch_size", "attack", "iterations", "lr", "unknowns_lr", "tv", "rog_scale", "upload", "local_steps",
         "infer_labels", "lpips_weights", "device", "seed")


def attack_command(
    ctx: typer.Context,
    out: OutOpt,
    model: Annotated[Path, typer.Option("--model", "-m", help="Train artifact (pflx train --out) of an algorithm whose upload pflx models: ditto, fedavg, hyperfl, hyperfl-lpm, knnper, ldp-fedavg, pefll, pfedhn or pfedhn-pc (fedavg and ldp-fedavg --dp runs too).")],
    partition: Annotated[Path, typer.Option("--partition", "-p", help="Partition artifact over the model's dataset; its clients' train samples are attacked.")],
    clients: Annotated[str, typer.Option("--clients", help="Whose images: holdout | train clients.")] = "holdout",
    images: Annotated[int, typer.Option("--images", help="Images attacked in all (a multiple of --batch-size).")] = 8,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Images behind one upload (one client's batch).")] = 1,
    attack: Annotated[str, typer.Option("--attack", help="dlg | ig | rog | analytic | all (analytic where its closed form holds).")] = "ig",
    iterations: Annotated[int, typer.Option("--iterations", help="Adam steps of dlg / ig / rog, at most 100000 (paper: IG 10000, ROG 100).")] = 2000,
    lr: Annotated[float, typer.Option("--lr", help="Initial Adam step of dlg / ig / rog (paper: IG 0.1, ROG 0.05), decayed 10x at 3/8, 5/8, 7/8.")] = 0.1,
    unknowns_lr: Annotated[Optional[float], typer.Option("--unknowns-lr", help="Initial Adam step of the joint attack's unknowns (hyperfl's embedding and classifier, pfedhn-pc's head); default --lr, the paper's one optimizer.")] = None,
    tv: Annotated[float, typer.Option("--tv", help="ig total-variation weight.")] = 1e-6,
    rog_scale: Annotated[int, typer.Option("--rog-scale", help="rog: optimize the image at 1/N of its side, upsampled bilinearly.")] = 2,
    upload: Annotated[str, typer.Option("--upload", help="gradient: the gradient, or the delta after --local-steps k steps; weights: the weights after the client's whole local update of a trained round (less the model the server sent).")] = "gradient",
    local_steps: Annotated[int, typer.Option("--local-steps", help="--upload gradient: 0 the client uploads its gradient at the server's model (the papers' setting); k its delta after k local SGD steps as trained.")] = 0,
    infer_labels: Annotated[bool, typer.Option("--infer-labels", help="Infer labels with the iDLG rule (batch size 1) instead of knowing them.")] = False,
    lpips_weights: Annotated[Optional[str], typer.Option("--lpips-weights", help="Local AlexNet-LPIPS state dict (features.N.* + lin0..4.model.1.weight) to also score LPIPS; nothing is downloaded.")] = None,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda[:N].")] = "auto",
    allow_unchecked_overlap: Annotated[bool, typer.Option("--allow-unchecked-overlap", help=ALLOW_HELP)] = False,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Rebuild clients' images from what they would upload, as an honest-but-curious server.

    For each target (--batch-size train images of one client) the trained algorithm computes the
    client's upload (fedavg: its gradient at the global model, or its delta after --local-steps
    local SGD steps; pefll: its descriptor v and the same for theta = h(v); ldp-fedavg: its
    noised DP-SGD delta; pfedhn / pfedhn-pc: the same for theta = h(v_i), pfedhn-pc's feature
    extractor only; hyperfl: its hypernetwork gradient, or phi_i - phi after --local-steps of step
    2; --upload weights: the weights after the round's local update as trained, less the model
    the server sent: hyperfl's classifier epoch and hypernetwork epochs, the others' local steps); the
    attacks rebuild the images from it, all targets as one batched optimization, HyperFL's
    embedding and classifier (pfedhn-pc's head) optimized with them. Labels are known unless
    --infer-labels.

    Writes metrics.json (mean / median PSNR, SSIM and, with --lpips-weights, LPIPS per attack),
    images.csv (one row per image and attack), reconstructions.png (originals and
    reconstructions; a feature-error bar chart for vector data) and reconstructions.npz (the
    images the figure draws, as arrays).

    Example: pflx attack --model runs/fedavg --partition runs/part --images 8 --attack all --out runs/attack
    """
    from pfl_cli.attack.config import AttackConfig
    from pfl_cli.cli.attack_run import run_attack

    from pfl_cli.cli.figures import require_matplotlib

    require_matplotlib("pflx attack (reconstructions.png)")
    cfg = stage_config(AttackConfig, "attack", config_file=config, flags=explicit_flags(ctx, FLAGS), sets=set_)
    run_attack(cfg, model=model, partition=partition, out=out, force=force, report=Reporter(fmt),
               allow_unchecked=allow_unchecked_overlap)
