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
    "label_prevalence", "rotations",
    "sizes", "distribution", "group_size", "group_mode", "continuous", "strictness", "client_alpha",
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


def _int_list(text: str):
    """'0,90,180' -> [0, 90, 180]; anything else is passed on for the core to refuse with its rule."""
    try:
        return [int(p) for p in str(text).split(",") if p.strip()]
    except ValueError:
        return text


def partition(
    ctx: typer.Context,
    out: OutOpt,
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="Dataset spec: builtin:digits, npz:PATH, csv:PATH, cifar10:DIR, mnist:DIR, leaf:DIR, ...")] = "builtin:digits",
    num_clients: Annotated[int, typer.Option("--num-clients", "-n", help="Number of clients (train + holdout).")] = 10,
    iid: Annotated[bool, typer.Option("--iid", help="IID split (the default scheme).")] = False,
    dirichlet: Annotated[Optional[str], typer.Option("--dirichlet", metavar="A", help="Dirichlet label skew with concentration A (a float or one per class, comma-separated).")] = None,
    scheme: Annotated[Optional[str], typer.Option("--scheme", help="iid | dirichlet | pathological | shards | quantity | natural | sizes | distribution | continuous | dominant.")] = None,
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
    sizes: Annotated[Optional[str], typer.Option("--sizes", metavar="FILE|LIST", help="Explicit client sizes (Flower's SizePartitioner): 30,50,20 or a file, one per line. Alone: IID labels; with --dirichlet/--classes-per-client/--distribution: those labels at these sizes.")] = None,
    distribution: Annotated[Optional[str], typer.Option("--distribution", metavar="FILE", help="Client x class matrix (.csv/.txt/.npy), row j = client j's label distribution (Flower's DistributionPartitioner).")] = None,
    client_alpha: Annotated[Optional[str], typer.Option("--client-alpha", metavar="A1,..,AJ", help="Flower's per-partition Dirichlet alpha: every class split over clients by Dir(A1..AJ). --dirichlet takes pflx's per-class form.")] = None,
    group_size: Annotated[Optional[int], typer.Option("--group-size", metavar="G", help="With --natural-id: G natural ids per client (Flower's GroupedNaturalIdPartitioner).")] = None,
    group_mode: Annotated[str, typer.Option("--group-mode", help="Leftover ids: allow-smaller | allow-bigger | drop-reminder | strict.")] = "allow-smaller",
    continuous: Annotated[Optional[str], typer.Option("--continuous", metavar="COL", help="Continuous-feature skew on a feature (name or index; Flower's ContinuousPartitioner).")] = None,
    strictness: Annotated[Optional[float], typer.Option("--strictness", metavar="S", help="With --continuous: 0 = IID, 1 = clients sorted by the column.")] = None,
    test_fraction: Annotated[Optional[float], typer.Option("--test-fraction", help="Split each client's samples; default: the official test pool if any, else 0.2.")] = None,
    holdout_clients: Annotated[str, typer.Option("--holdout-clients", metavar="F|N", help="Clients never used in training: a fraction F < 1 or a count N.")] = "0",
    plot: Annotated[bool, typer.Option("--plot", help="Also write partition.png, a clients x classes heatmap.")] = False,
    label_prevalence: Annotated[Optional[float], typer.Option("--label-prevalence", metavar="P", help="Only a fraction P in (0, 1] of train clients keep their labels; the other train clients and all holdout clients are unlabeled.")] = None,
    rotations: Annotated[Optional[str], typer.Option("--rotations", metavar="DEG,...", help="Rotated clients: each client draws one angle from this list (0,90,180,270), applied to its images when the data are loaded.")] = None,
    export: Annotated[Optional[str], typer.Option("--export", metavar="flower", help="Also print how to serve the artifact to another tool: flower (pfl_cli.interop.flower.ArtifactPartitioner). Not part of the config.")] = None,
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
    if export not in (None, "flower"):
        from pfl_cli.errors import ConfigError

        raise ConfigError(f"export must be flower; got {export!r}.")
    flags = explicit_flags(ctx, FLAGS)
    if iid:
        flags["scheme"] = "iid"
    if dirichlet is not None:
        flags["alpha"] = dirichlet
    if "alpha" in flags:
        flags["alpha"] = _number_or_list(flags["alpha"])
    if "rotations" in flags:
        flags["rotations"] = _int_list(flags["rotations"])
    if "client_alpha" in flags:
        flags["client_alpha"] = _number_or_list(flags["client_alpha"])
        if isinstance(flags["client_alpha"], float):
            flags["client_alpha"] = [flags["client_alpha"]]
    if "holdout_clients" in flags:
        flags["holdout_clients"] = _number_or_list(flags["holdout_clients"])
    cfg = stage_config(PartitionConfig, "partition", config_file=config, flags=flags, sets=set_)
    resolve_scheme(cfg)  # option conflicts fail before the dataset is read
    writer = ArtifactWriter(out, stage="partition", config={}, seed=cfg.seed, force=force)

    ds = load_dataset(cfg.dataset)
    train_pool = ds.num_samples if ds.pool is None else int((ds.pool == 0).sum())
    cfg = validate_config(
        cfg, num_samples=train_pool, num_classes=ds.num_classes, has_labels=ds.y is not None and bool((ds.y >= 0).all()),
        has_clients=ds.client is not None, has_test_pool=ds.has_test_pool, input_shape=ds.input_shape,
        clients=ds.client,
    )
    writer = ArtifactWriter(out, stage="partition", config=config_to_dict(cfg), seed=cfg.seed,
                            inputs=[ds.input_ref()], force=force)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same config and dataset); nothing to do.")
        report.result({"out": str(out), "up_to_date": True, **_export(export, out, cfg.dataset)}, *_export_text(export, out, cfg.dataset))
        return
    feature = None
    if cfg.scheme == "continuous":
        from pfl_cli.partition.continuous import feature_column

        feature = feature_column(ds.x, cfg.continuous, ds.extra.get("feature_names"), cfg.dataset)
    part = partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(cfg.seed, "partition"),
                            pool=ds.pool, client=ds.client, feature=feature)
    from pfl_cli.cli.partition_artifact import write_partition_artifact

    with writer:
        _, stats = write_partition_artifact(writer, part, ds, plot=cfg.plot)
    _print_summary(report, out, cfg, stats, export)


def _export(export: str | None, out, spec: str) -> dict:
    if export is None:
        return {}
    from pfl_cli.interop.flower_snippet import snippet

    return {"export": {export: snippet(out, spec)}}


def _export_text(export: str | None, out, spec: str) -> list:
    from rich.text import Text

    doc = _export(export, out, spec)
    return [Text(f"\nserve it to a Flower app:\n{doc['export'][export]}")] if doc else []


def _print_summary(report: Reporter, out, cfg, stats: dict, export: str | None = None) -> None:
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
    if "labels" in info:
        lab = info["labels"]
        rows.append(("labels", f"prevalence {lab['label_prevalence']:g}: {lab['labeled_train_clients']} labeled train "
                               f"clients, {lab['unlabeled_train_clients']} unlabeled train, "
                               f"{lab['unlabeled_holdout_clients']} unlabeled holdout"))
    if "rotations" in info:
        rows.append(("rotations", ", ".join(f"{deg}°: {n}" for deg, n in info["rotations"].items())))
    if info.get("repaired"):
        rows.append(("repair", f"{info['samples_moved']} sample(s) moved to {info['clients_below_min_size']} client(s)"))
    for key, value in rows:
        table.add_row(key, str(value))
    data = {"out": str(out), "up_to_date": False, "scheme": cfg.scheme, **{k: v for k, v in stats.items() if k != "global_label_distribution"}}
    report.result({**data, **_export(export, out, cfg.dataset)}, table, *_export_text(export, out, cfg.dataset))
