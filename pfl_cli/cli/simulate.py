"""`pflx simulate`: simulated clients from server data, written as a partition artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pfl_cli.cli.common import explicit_flags, stage_config
from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, OutOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter, core_progress

FLAGS = ("dataset", "mode", "num_clients", "replacement", "shortage", "test_fraction", "holdout_clients", "plot", "seed")


def simulate(
    ctx: typer.Context,
    out: OutOpt,
    model: Annotated[Optional[Path], typer.Option("--model", "-m", help="mdm-fit artifact to draw client histograms from.")] = None,
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="Server data spec: builtin:digits, npz:PATH, cifar10:DIR, ...")] = "builtin:digits",
    num_clients: Annotated[Optional[int], typer.Option("--num-clients", "-n", help="Simulated clients (conditional-iid: one per true client).")] = None,
    mode: Annotated[str, typer.Option("--mode", help="mdm | iid (fully IID, same sizes) | conditional-iid (copies --like's histograms).")] = "mdm",
    like: Annotated[Optional[Path], typer.Option("--like", metavar="PARTITION_DIR", help="True clients: histograms for conditional-iid, sizes for iid.")] = None,
    replacement: Annotated[bool, typer.Option("--replacement/--no-replacement", help="Clients sample the server data independently / clients are disjoint.")] = True,
    shortage: Annotated[str, typer.Option("--shortage", help="When a class runs short: error | cap (fewer samples) | replace (reuse samples).")] = "cap",
    test_fraction: Annotated[Optional[float], typer.Option("--test-fraction", help="Test share of each client; default: the official test pool if any, else 0.2.")] = None,
    holdout_clients: Annotated[str, typer.Option("--holdout-clients", metavar="F|N", help="Clients never used in training: a fraction F < 1 or a count N.")] = "0",
    plot: Annotated[bool, typer.Option("--plot", help="Also write partition.png, a clients x classes heatmap.")] = False,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Simulate clients from server data with an MDM (or IID baselines) and write a partition artifact.

    Examples: pflx simulate --model runs/mdm --dataset builtin:digits --num-clients 200 --out runs/sim ;
    pflx simulate --mode conditional-iid --like runs/part --out runs/cond ;
    pflx simulate --model runs/mdm --mode iid --num-clients 200 --no-replacement --shortage error --out runs/iid
    """
    from pfl_cli.artifacts import ArtifactWriter, read_artifact
    from pfl_cli.cli.mdm_artifact import partition_histograms
    from pfl_cli.cli.partition import _number_or_list, _print_summary
    from pfl_cli.cli.partition_artifact import write_partition_artifact
    from pfl_cli.config import config_to_dict
    from pfl_cli.data import load_dataset
    from pfl_cli.errors import check_memory
    from pfl_cli.readers import read_mdm
    from pfl_cli.rng import make_rng
    from pfl_cli.simulate import SimulateConfig, simulate_partition, validate_config

    report = Reporter(fmt)
    flags = explicit_flags(ctx, FLAGS)
    if "holdout_clients" in flags:
        flags["holdout_clients"] = _number_or_list(flags["holdout_clients"])
    cfg = stage_config(SimulateConfig, "simulate", config_file=config, flags=flags, sets=set_)
    ArtifactWriter(out, stage="partition", config={}, seed=cfg.seed, force=force)  # --out problems first
    params, like_counts, inputs = None, None, []
    if model is not None:
        art = read_artifact(model, "mdm-fit", flag="--model")
        params = read_mdm(art, "--model")[1]
        inputs.append(art.input_ref())
    if like is not None:
        art = read_artifact(like, "partition", flag="--like")
        like_counts = partition_histograms(art, flag="--like")
        inputs.append(art.input_ref())
    ds = load_dataset(cfg.dataset)
    cfg = validate_config(cfg, has_model=params is not None, like_clients=None if like_counts is None else len(like_counts),
                          has_labels=ds.y is not None and bool((ds.y >= 0).all()))
    # Histograms, CSR offsets and stats hold a few int64 values per client and class.
    check_memory(f"--num-clients {cfg.num_clients} x {ds.num_classes} classes", 8.0 * 4 * cfg.num_clients *
                 (ds.num_classes + 4), fix="Lower --num-clients.")
    writer = ArtifactWriter(out, stage="partition", config=config_to_dict(cfg), seed=cfg.seed,
                            inputs=[*inputs, ds.input_ref()], force=force)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same config and inputs); nothing to do.")
        report.result({"out": str(out), "up_to_date": True})
        return
    with report.progress("simulate", None, unit="step") as bar:
        part = simulate_partition(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(cfg.seed, "simulate"),
                                  model=params, like_counts=like_counts, pool=ds.pool, x=ds.x,
                                  on_progress=core_progress(bar, lambda status: status["step"]))
    with writer:
        _, stats = write_partition_artifact(writer, part, ds, plot=cfg.plot)
    _print_summary(report, out, _Shown(cfg.dataset, f"simulate ({cfg.mode})"), stats)


class _Shown:
    """The two config fields the partition summary prints."""

    def __init__(self, dataset: str, scheme: str) -> None:
        self.dataset, self.scheme = dataset, scheme
