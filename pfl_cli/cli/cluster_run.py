"""The body of `pflx cluster`: read inputs, call the core, write the artifact, print."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pfl_cli.cli.output import Reporter, core_progress
from pfl_cli.errors import ArtifactError, ConfigError, InputError


def _check_config(cfg) -> None:
    if cfg.server_data is None:
        raise ConfigError("--server-data is required: the server's own dataset spec (e.g. npz:server.npz).")
    if cfg.k is None:
        raise ConfigError("--k is required: the number of clusters.")
    if cfg.no_dp and cfg.epsilon is not None:
        raise ConfigError("--dp and --no-dp exclude each other; pass one.")
    if not cfg.no_dp and cfg.epsilon is None:
        raise ConfigError("pass a privacy budget with --dp eps=E[,delta=D], or --no-dp for the non-private variant.")
    # Ranges that need no data, checked before any is read (the core checks the rest against the data).
    for name, ok, rule in (("k", cfg.k >= 1, "an integer >= 1"),
                           ("min_server_weight", cfg.min_server_weight >= 0, "a number >= 0"),
                           ("radius", cfg.radius is None or cfg.radius > 0, "a number > 0"),
                           ("lloyds_steps", cfg.lloyds_steps is None or cfg.lloyds_steps >= 0, "an integer >= 0"),
                           ("reference_n_init", cfg.reference_n_init >= 1, "an integer >= 1"),
                           ("server_n_init", cfg.server_n_init >= 1, "an integer >= 1")):
        if not ok:
            raise ConfigError(f"{name} must be {rule}; got {getattr(cfg, name)!r}.")
    if cfg.k_candidates:
        from pfl_cli.cli.figures import require_matplotlib

        require_matplotlib("--k-candidates (k_selection.png)")
    from pfl_cli.privacy.release import check_nonprivate_request, parse_dp_spec

    check_nonprivate_request(dp=not cfg.no_dp, write_nonprivate=cfg.write_nonprivate)
    if not cfg.no_dp:  # a budget from a config file or --set gets the --dp checks too
        spec = f"eps={cfg.epsilon},delta={cfg.delta}" + ("" if cfg.population is None else f",population={cfg.population}")
        parse_dp_spec(f"{spec},noise={cfg.noise}", keys=("eps", "delta", "population"))


def client_points(partition: Path):
    """Train clients' feature vectors grouped by client, their CSR offsets, holdout points, inputs."""
    from pfl_cli.cli.common import load_partition_dataset
    from pfl_cli.partition.base import ROLE_TRAIN, offsets_from_sizes

    part, info, artifact, ds = load_partition_dataset(partition)
    if int(np.prod(ds.input_shape)) == 0:
        raise InputError(f"--partition {partition}: dataset {info['spec']} has no features (input shape "
                         f"{list(ds.input_shape)}); k-means needs feature vectors. Use a dataset with feature columns.")
    owner = part.train_owner()
    train = part.role[owner] == ROLE_TRAIN
    points = ds.features(part.train_indices[train])
    offsets = offsets_from_sizes(part.train_sizes[part.role == ROLE_TRAIN])
    holdout = ds.features(part.train_indices[~train]) if (~train).any() else None
    if len(points) == 0:
        raise InputError(f"--partition {partition}: its train clients hold no samples; nothing to cluster.")
    return points, offsets, holdout, [artifact.input_ref(), ds.input_ref()]


def _plot_k_selection(path: Path, sel: dict, k: int) -> None:
    from pfl_cli.cli.figures import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(sel["k"], sel["weighted_cost"], marker="o")
    ax.axvline(k, color="grey", linestyle=":", label=f"--k {k}")
    ax.set_xlabel("k")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # k is a count: no fractional ticks
    ax.set_ylabel("weighted server k-means cost / total weight")
    ax.set_title(f"Choosing k (Scott 2026 thesis, Fig. D.5), projection dim {sel['projection_dim']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _metrics(cfg, res, points, offsets, holdout, server) -> tuple[dict, dict | None]:
    """``metrics.json`` and, under DP, ``nonprivate.json``: what is computed on private data goes to the latter."""
    from pfl_cli.cluster import evaluate_clustering
    from pfl_cli.cluster.kmeans import kmeans_cost
    from pfl_cli.rng import make_rng

    released = {
        "k": res.k, "dimension": int(points.shape[1]), "init": res.init, "lloyds_steps": res.lloyds_steps,
        "privacy_unit": res.privacy_unit if res.ledger else None, "epsilon": res.epsilon, "delta": res.delta,
        "accountant": res.accountant, "radius": res.radius, "projection_dim": res.projection_dim,
        "server_points": int(len(server)), "server_points_kept": res.server_points_kept, "budget": res.budget,
    }
    if res.k_selection:
        released["k_selection"] = res.k_selection
    if res.ledger is not None and not cfg.write_nonprivate:
        return {**released, "population": cfg.population}, None  # nothing computed on the private data
    private = evaluate_clustering(points, res.centers, rng=make_rng(cfg.seed, "cluster-reference"),
                                  reference_n_init=cfg.reference_n_init, init_centers=res.init_centers)
    private.update({"num_clients": len(offsets) - 1, "clipped_fraction": res.clipped_fraction})
    if holdout is not None:
        private["holdout_normalized_cost"] = kmeans_cost(holdout, res.centers) / len(holdout)
    if res.ledger is None:
        return {**released, **private}, None
    released["population"] = cfg.population
    return released, {"warning": "computed on the private data; not covered by privacy.json", **private}


def _fit_rng(cfg):
    """The fit's generator: its mechanisms draw from OS entropy under --dp unless noise=seeded."""
    from pfl_cli.privacy.randomness import noise_source

    return noise_source("seeded" if cfg.no_dp else cfg.noise, cfg.seed).numpy("cluster")


def run_cluster(cfg, *, partition: Path, out: Path, force: bool, report: Reporter) -> None:
    from pfl_cli.artifacts import MECHANISM, NONPRIVATE, POST_PROCESSING, ArtifactWriter, public_input
    from pfl_cli.config import config_to_dict
    from pfl_cli.data import load_dataset

    _check_config(cfg)
    ArtifactWriter(out, stage="cluster", config={}, seed=cfg.seed, force=force)  # --out problems first
    points, offsets, holdout, inputs = client_points(partition)
    server_ds = load_dataset(cfg.server_data)
    server = server_ds.features(np.arange(server_ds.num_samples))
    writer = ArtifactWriter(out, stage="cluster", config=config_to_dict(cfg), seed=cfg.seed,
                            inputs=[*inputs, public_input(server_ds.input_ref())], force=force, dp=not cfg.no_dp)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same config and inputs); nothing to do.")
        report.result({"out": str(out), "up_to_date": True})
        return
    from pfl_cli.cluster import fit_feddp_kmeans  # the core (scipy, dp_accounting): after the checks
    from pfl_cli.cluster.api import progress_steps

    # One step per protocol release, and one for the evaluation on the client data when there is one
    # (without DP, or with --write-nonprivate). The steps' names are all a progress line says: no cost.
    evaluates = int(cfg.no_dp or cfg.write_nonprivate)
    total = progress_steps(cfg.init, cfg.lloyds_steps, cfg.k_candidates) + evaluates
    with report.progress("cluster", total, unit="step") as bar:
        tick = core_progress(bar, lambda status: status["step"])
        res = fit_feddp_kmeans(
            points, offsets, server, k=cfg.k, epsilon=None if cfg.no_dp else cfg.epsilon, delta=cfg.delta,
            privacy_unit=cfg.privacy_unit, radius=cfg.radius, split=cfg.split,
            min_server_weight=cfg.min_server_weight, lloyds_steps=cfg.lloyds_steps,
            lloyds_calibration=cfg.lloyds_calibration, composition=cfg.composition, init=cfg.init,
            client_clip=cfg.client_clip, k_candidates=cfg.k_candidates, server_n_init=cfg.server_n_init,
            gaussian_method=cfg.gaussian_method, rng=_fit_rng(cfg),
            on_progress=lambda done, _total, status: tick(done, total, status),
        )
        metrics, nonprivate = _metrics(cfg, res, points, offsets, holdout, server)
        if evaluates:
            tick(total, total, {"step": "k-means cost on the client data" + (" (nonprivate.json)" if not cfg.no_dp
                                                                            else "")})
    if res.ledger is not None:
        metrics["noise"] = cfg.noise
    dp = res.ledger is not None
    with writer:
        np.save(writer.path("centers.npy", release=MECHANISM if dp else None), res.centers)
        writer.save_json("metrics.json", metrics, release=POST_PROCESSING if dp else None)
        if dp:
            from pfl_cli.privacy.randomness import statement
            from pfl_cli.privacy.release import population_note

            ledger = {**res.ledger.to_dict(res.accountant), **statement(cfg.noise)}
            ledger["notes"].append(population_note(cfg.population))
            writer.save_json("privacy.json", ledger, release=POST_PROCESSING)
            if cfg.write_nonprivate:
                writer.save_json("nonprivate.json", nonprivate, release=NONPRIVATE)
        if res.k_selection:  # noisy weights and the released projection: post-processing
            _plot_k_selection(writer.path("k_selection.png", release=POST_PROCESSING if dp else None),
                              res.k_selection, res.k)
    _print_summary(report, out, metrics)


def _print_summary(report: Reporter, out: Path, m: dict) -> None:
    from rich.table import Table

    table = Table(title=f"cluster -> {out}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    eps = "none (--no-dp)" if m["epsilon"] is None else f"{m['epsilon']:.4f} at delta {m['delta']:g} ({m['accountant']})"
    rows = [("init", f"{m['init']} + {m['lloyds_steps']} FedDP-Lloyds steps"), ("k", str(m["k"])), ("epsilon", eps)]
    if "noise" in m:
        from pfl_cli.privacy.randomness import stamp

        rows.append(("noise", stamp(m["noise"])))
    if "num_points" in m:  # without DP; under DP nothing computed on the private data is printed
        rows += [
            ("clients / points", f"{m['num_clients']} / {m['num_points']} (d = {m['dimension']})"),
            ("cost / point", f"{m['normalized_cost']:.4f}"),
            ("centralized k-means", f"{m['centralized_normalized_cost']:.4f} (gap {100 * m['relative_gap']:.2f}%)"),
        ]
    for key, value in rows:
        table.add_row(key, value)
    report.result({"out": str(out), "up_to_date": False, **m}, table)
