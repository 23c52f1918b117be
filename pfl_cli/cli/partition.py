"""`pflx partition`: split a centralized dataset into federated clients."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from pfl_cli.cli.common import explicit_flags, stage_config
from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, OutOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter

FLAGS = (
    "dataset", "scheme", "num_clients", "alpha", "min_size", "self_balancing", "classes_per_client", "assign",
    "class_shares", "shards_per_client", "quantity", "natural_id", "test_fraction", "holdout_clients", "plot", "seed",
    "dominant_classes", "uniform_share",
)


def _number_or_list(text: str | None):
    """'0.1' -> 0.1; '0.1,0.5,...' -> [0.1, 0.5, ...] (one alpha per class)."""
    if text is None:
        return None
    parts = [p for p in str(text).split(",") if p.strip()]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        return text  # the core reports the bad value with the rule
    return values[0] if len(values) == 1 else values


def partition(
    ctx: typer.Context,
    out: OutOpt,
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="Dataset spec: builtin:digits, npz:PATH, csv:PATH, cifar10:DIR, mnist:DIR, leaf:DIR, ...")] = "builtin:digits",
    num_clients: Annotated[int, typer.Option("--num-clients", "-n", help="Number of clients (train + holdout).")] = 10,
    iid: Annotated[bool, typer.Option("--iid", help="IID split (the default scheme).")] = False,
    dirichlet: Annotated[Optional[str], typer.Option("--dirichlet", metavar="A", help="Dirichlet label skew with concentration A (a float or one per class, comma-separated).")] = None,
    scheme: Annotated[Optional[str], typer.Option("--scheme", help="iid | dirichlet | pathological | shards | quantity | natural | dominant.")] = None,
    alpha: Annotated[Optional[str], typer.Option("--alpha", help="Dirichlet concentration (same as --dirichlet).")] = None,
    min_size: Annotated[int, typer.Option("--min-size", help="Smallest client size; missed draws are repaired, impossible requests refused.")] = 1,
    self_balancing: Annotated[bool, typer.Option("--self-balancing", help="Dirichlet: stop giving classes to clients already above n/J samples.")] = False,
    classes_per_client: Annotated[Optional[int], typer.Option("--classes-per-client", metavar="N", help="Pathological split: N classes per client.")] = None,
    assign: Annotated[str, typer.Option("--assign", help="Class assignment: random (pFedHN/PeFLL balanced) | deterministic | first-deterministic.")] = "random",
    class_shares: Annotated[str, typer.Option("--class-shares", help="Pathological shares within a class: uniform (U(0.4,0.6), pFedHN) | equal (PeFLL).")] = "uniform",
    shards_per_client: Annotated[Optional[int], typer.Option("--shards-per-client", help="FedAvg shards: label-sorted shards per client.")] = None,
    quantity: Annotated[Optional[str], typer.Option("--quantity", help="Size skew: lognormal:SIGMA | dirichlet:A | linear | square | exponential.")] = None,
    dominant_classes: Annotated[Optional[int], typer.Option("--dominant-classes", metavar="D", help="HyperFL/FedPAC split: client i's group (i mod ceil(C/2)) has D dominant classes starting at class 2g; all clients one size.")] = None,
    uniform_share: Annotated[float, typer.Option("--uniform-share", help="With --dominant-classes: share of each client spread uniformly over all classes (the rest over its dominant classes).")] = 0.2,
    natural_id: Annotated[bool, typer.Option("--natural-id", help="One client per natural id (LEAF users, the client column).")] = False,
    test_fraction: Annotated[Optional[float], typer.Option("--test-fraction", help="Split each client's samples; default: the official test pool if any, else 0.2.")] = None,
    holdout_clients: Annotated[str, typer.Option("--holdout-clients", metavar="F|N", help="Clients never used in training: a fraction F < 1 or a count N.")] = "0",
    plot: Annotated[bool, typer.Option("--plot", help="Also write partition.png, a clients x classes heatmap.")] = False,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Split a dataset into federated clients and write a partition artifact.

    Examples: pflx partition --dirichlet 0.1 --num-clients 50 --out runs/part ;
    pflx partition --dataset cifar10:data --classes-per-client 2 --num-clients 100 --holdout-clients 0.1 --out runs/c10
    """
    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.config import config_to_dict
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels, resolve_scheme, validate_config
    from pfl_cli.rng import make_rng

    report = Reporter(fmt)
    flags = explicit_flags(ctx, FLAGS)
    if iid:
        flags["scheme"] = "iid"
    if dirichlet is not None:
        flags["alpha"] = dirichlet
    if "alpha" in flags:
        flags["alpha"] = _number_or_list(flags["alpha"])
    if "holdout_clients" in flags:
        flags["holdout_clients"] = _number_or_list(flags["holdout_clients"])
    cfg = stage_config(PartitionConfig, "partition", config_file=config, flags=flags, sets=set_)
    resolve_scheme(cfg)  # option conflicts fail before the dataset is read
    writer = ArtifactWriter(out, stage="partition", config={}, seed=cfg.seed, force=force)

    ds = load_dataset(cfg.dataset)
    train_pool = ds.num_samples if ds.pool is None else int((ds.pool == 0).sum())
    cfg = validate_config(
        cfg, num_samples=train_pool, num_classes=ds.num_classes, has_labels=ds.y is not None,
        has_clients=ds.client is not None, has_test_pool=ds.has_test_pool,
    )
    writer = ArtifactWriter(out, stage="partition", config=config_to_dict(cfg), seed=cfg.seed,
                            inputs=[ds.input_ref()], force=force)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same config and dataset); nothing to do.")
        report.result({"out": str(out), "up_to_date": True})
        return
    part = partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(cfg.seed, "partition"),
                            pool=ds.pool, client=ds.client)
    from pfl_cli.cli.partition_artifact import write_partition_artifact

    with writer:
        _, stats = write_partition_artifact(writer, part, ds, plot=cfg.plot)
    _print_summary(report, out, cfg, stats)


def _print_summary(report: Reporter, out, cfg, stats: dict) -> None:
    from rich.table import Table

    het = stats.get("heterogeneity", {})
    size = stats["train_size"]
    table = Table(title=f"partition -> {out}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("dataset", cfg.dataset),
        ("scheme", cfg.scheme),
        ("clients", f"{stats['num_clients']} ({stats['num_train_clients']} train, {stats['num_holdout_clients']} holdout)"),
        ("samples", f"{stats['num_train_samples']} train, {stats['num_test_samples']} test"),
        ("train size", f"min {size['min']:.0f}  median {size['median']:.0f}  max {size['max']:.0f}"),
    ]
    if het:
        rows += [
            ("classes per client", f"mean {het['classes_per_client']['mean']:.2f}"),
            ("label entropy", f"mean {het['label_entropy_bits']['mean']:.3f} of {het['max_label_entropy_bits']:.3f} bits"),
            ("JS to global", f"mean {het['js_divergence_to_global']['mean']:.3f}"),
        ]
    info = stats["scheme_info"]
    if info.get("repaired"):
        rows.append(("repair", f"{info['samples_moved']} sample(s) moved to {info['clients_below_min_size']} client(s)"))
    for key, value in rows:
        table.add_row(key, str(value))
    data = {"out": str(out), "up_to_date": False, "scheme": cfg.scheme, **{k: v for k, v in stats.items() if k != "global_label_distribution"}}
    report.result(data, table)
