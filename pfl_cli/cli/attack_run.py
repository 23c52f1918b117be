"""The body of `pflx attack`: read the model and the partition, attack, write, print.

The ``attack`` artifact:

- ``metrics.json``: ``algorithm``, ``attacks``, ``clients``, ``images``, ``batch_size``,
  ``upload_mode`` (gradient | weights), ``local_steps``, ``upload_steps`` (SGD steps behind
  the message), ``iterations``, ``lr``, ``unknowns_lr``, ``labels`` (known | inferred) and
  ``label_accuracy``,
  ``upload`` (names of the message's tensors), ``device``, ``model``, ``overlap_unchecked`` (true:
  ``--allow-unchecked-overlap`` attacked a partition that could not be checked against the samples a
  ``--dp`` model trained on, :mod:`pfl_cli.overlap`); per attack
  ``{attack: {mean_psnr, median_psnr, mean_ssim, median_ssim, mean_lpips, median_lpips}}`` under
  ``results`` (SSIM null for vector data, LPIPS null without ``--lpips-weights``). PSNR / SSIM compare images scaled to [0, 1] by the dataset's value range.
- ``images.csv``: image, client_id, sample (dataset index), label, attack, psnr, ssim, lpips.
- ``reconstructions.png``: a row of originals and one row per attack (images, the first
  16), or each attack's mean absolute feature error (vector data).
- ``reconstructions.npz``: what the figure draws, every image: ``original`` and
  ``reconstruction_<attack>`` in [0, 1], shaped (n, C, H, W) for images or (n, features),
  with ``client_id``, ``sample`` and ``label`` per image (the rows of ``images.csv``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pfl_cli.attack.config import OPTIMIZED
from pfl_cli.cli.output import Reporter
from pfl_cli.cli.predict_run import open_model_stage
from pfl_cli.train.files import clean

MAX_SHOWN = 16  # images per row of reconstructions.png


def _refuse_unattacked(train_cfg) -> None:
    """The command's refusal names every algorithm whose uploads pflx attack models (the registry's)."""
    from pfl_cli import registry
    from pfl_cli.attack.protocol import attackable
    from pfl_cli.errors import InputError

    if not attackable(train_cfg.algorithm_class):
        attacked = ", ".join(sorted(e.name for e in registry.entries().values() if attackable(e.algorithm)))
        raise InputError(f"--model: algorithm {train_cfg.algorithm!r} is not attacked: pflx attack models the "
                         f"uploads of {attacked}.")


def run_attack(cfg, *, model: Path, partition: Path, out: Path, force: bool, report: Reporter,
               allow_unchecked: bool = False) -> None:
    from pfl_cli.attack.api import attack_model, validate_attack_config
    from pfl_cli.fl.device import check_device, resolve_device

    validate_attack_config(cfg)
    check_device(cfg.device)  # --device cuda without a GPU: refused before any work
    inputs = open_model_stage("attack", cfg, model=model, partition=partition, out=out, force=force, report=report,
                              allow_unchecked=allow_unchecked)
    if inputs is None:
        return
    device = resolve_device(cfg.device)
    writer, model_art, payload, train_cfg, part, ds, unchecked = inputs
    _refuse_unattacked(train_cfg)
    optimized = [a for a in OPTIMIZED if cfg.attack in (a, "all")]
    with report.progress("attack", total=cfg.iterations * len(optimized), unit="iteration") as bar:
        done = {}

        def on_progress(name, it, total, mean_psnr):
            bar.advance(it - done.get(name, 0), status=f"{name} iteration {it}/{total}, mean PSNR {mean_psnr:.2f} dB")
            done[name] = it

        run = attack_model(payload, train_cfg, ds.x, ds.y, ds.num_classes, part, cfg, device=device,
                           on_progress=on_progress)
    ids = np.asarray(part.client_id)[run.client]
    results = {a: _summary(run.psnr[a], run.ssim[a], run.lpips[a]) for a in run.reconstruction}
    metrics = clean({
        "algorithm": payload["algorithm"],
        "attacks": list(run.reconstruction),
        "clients": cfg.clients,
        "images": cfg.images,
        "batch_size": cfg.batch_size,
        "upload_mode": cfg.upload,
        "local_steps": cfg.local_steps,
        "upload_steps": run.upload_steps,
        "iterations": cfg.iterations,
        "lr": cfg.lr,
        "unknowns_lr": cfg.unknowns_lr if cfg.unknowns_lr is not None else cfg.lr,
        "labels": "inferred" if cfg.infer_labels else "known",
        "label_accuracy": run.label_accuracy,
        "upload": run.upload,
        "results": results,
        "device": str(device),
        "model": model_art.input_ref(),
        "overlap_unchecked": unchecked,
    })
    rows = [[i, int(ids[i]), int(run.sample[i]), int(run.label[i]), a, float(run.psnr[a][i]),
             None if run.ssim[a] is None else float(run.ssim[a][i]),
             None if run.lpips[a] is None else float(run.lpips[a][i])]
            for a in run.reconstruction for i in range(len(ids))]
    with writer:
        writer.save_json("metrics.json", metrics)
        writer.save_csv("images.csv", ["image", "client_id", "sample", "label", "attack", "psnr", "ssim",
                                        "lpips"], rows)
        writer.save_npz("reconstructions.npz", **_arrays(run, ids))
        _plot(writer.path("reconstructions.png"), run)
    _print_summary(report, out, metrics)


def _arrays(run, ids: np.ndarray) -> dict:
    """What reconstructions.png draws, as numbers: originals and each attack's reconstructions in [0, 1]."""
    shape = run.image_shape if run.image_shape is not None else run.original.shape[1:]
    arrays = {"client_id": ids.astype(np.int64), "sample": run.sample.astype(np.int64),
              "label": run.label.astype(np.int64), "original": run.original.reshape(-1, *shape)}
    for a, rec in run.reconstruction.items():
        arrays[f"reconstruction_{a}"] = rec.reshape(-1, *shape)
    return arrays


def _summary(psnr: np.ndarray, ssim, lpips) -> dict:
    out = {}
    for name, v in (("psnr", psnr), ("ssim", ssim), ("lpips", lpips)):
        out[f"mean_{name}"] = None if v is None else float(np.mean(v))
        out[f"median_{name}"] = None if v is None else float(np.median(v))
    return out


def _plot(path: Path, run) -> None:
    from pfl_cli.cli.figures import pyplot

    plt = pyplot()

    attacks = list(run.reconstruction)
    if run.image_shape is None:
        fig, ax = plt.subplots(figsize=(8, 3))
        err = [np.abs(run.reconstruction[a] - run.original).reshape(len(run.original), -1).mean(0) for a in attacks]
        width = 0.8 / len(attacks)
        for k, (a, e) in enumerate(zip(attacks, err)):
            ax.bar(np.arange(len(e)) + k * width, e, width=width, label=a)
        ax.set_xlabel("feature")
        ax.set_ylabel("mean |error| (range 1)")
        ax.set_title("recovered-feature error per feature, mean over images", fontsize=9)
        ax.legend()
    else:
        n = min(len(run.original), MAX_SHOWN)
        rows = [("original", run.original, None)] + [(a, run.reconstruction[a], run.psnr[a]) for a in attacks]
        fig, axes = plt.subplots(len(rows), n, figsize=(1.1 * n + 0.8, 1.25 * len(rows)), squeeze=False)
        for r, (name, imgs, score) in enumerate(rows):
            for i in range(n):
                ax = axes[r, i]
                img = imgs[i].reshape(run.image_shape).transpose(1, 2, 0)
                ax.imshow(img[..., 0] if img.shape[2] == 1 else img, cmap="gray", vmin=0.0, vmax=1.0)
                ax.set_xticks([])
                ax.set_yticks([])
                if score is not None:
                    ax.set_title(f"{score[i]:.1f} dB", fontsize=7)
                if i == 0:
                    ax.set_ylabel(name, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _print_summary(report: Reporter, out: Path, m: dict) -> None:
    from rich.table import Table

    table = Table(title=f"attack -> {out}: {m['algorithm']} uploads, {m['images']} {m['clients']} images, "
                        f"batch {m['batch_size']}, labels {m['labels']}")
    keys = ["mean_psnr", "median_psnr", "mean_ssim", "median_ssim", "mean_lpips", "median_lpips"]
    keys = [k for k in keys if any(r[k] is not None for r in m["results"].values())]
    table.add_column("attack")
    for k in keys:
        table.add_column(k.replace("_", " ").replace("psnr", "PSNR").replace("ssim", "SSIM").replace("lpips", "LPIPS"))
    for a, r in m["results"].items():
        table.add_row(a, *(f"{r[k]:.3f}" if r[k] is not None else "-" for k in keys))
    report.result({"out": str(out), "up_to_date": False, **m}, table)
