"""The body of `pflx compare`: read the runs, compute the table (:mod:`pfl_cli.compare`), write the artifact, print.

The ``compare`` artifact (DESIGN.md section 3): ``table.md``, ``table.csv``, ``table.json`` (per
configuration and client group: mean and interval over seeds, fairness across clients),
``clients.csv`` (label, group, seed, client_id, accuracy, accuracy_lm, balanced_accuracy, macro_f1,
global_accuracy of every run) and, with
``--plot``, ``clients.png``. With ``--nonprivate`` over --dp runs every file is named
``nonprivate-*``: the numbers are diagnostics on private clients, not releases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pfl_cli.cli.output import Reporter


def run_compare(runs: Sequence[Path], *, out: Path, nonprivate: bool, level: float, plot: bool, force: bool,
                report: Reporter, spec: Path | None = None, metric: str = "accuracy") -> None:
    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.compare import compare, read_runs
    from pfl_cli.compare.table import CLIENT_COLUMNS, CSV_COLUMNS, check_metric

    config = {"level": level, "nonprivate": nonprivate, "plot": plot, "metric": metric}
    ArtifactWriter(out, stage="compare", config=config, seed=None, force=force)  # --out problems first
    if not 0.0 < level < 1.0:
        from pfl_cli.errors import ConfigError

        raise ConfigError(f"--level must be in (0, 1); got {level!r}.")
    check_metric(metric)  # before any training of --spec
    if not runs and spec is None:
        from pfl_cli.errors import InputError

        raise InputError("RUN: give train or predict artifacts to compare, or --spec FILE.yaml to train them first.")
    if spec is not None:
        from pfl_cli.compare.spec import load_spec

        parsed = load_spec(spec)
        config["spec"] = parsed.to_dict()
        runs = [*run_spec(parsed, out=out, force=force, report=report, nonprivate=nonprivate), *runs]
    groups = read_runs(runs, nonprivate=nonprivate)
    table = compare(groups, level=level, metric=metric)
    inputs = list({g.input_ref["sha256"]: dict(g.input_ref) for g in groups}.values())
    writer = ArtifactWriter(out, stage="compare", config=config, seed=None, inputs=inputs, force=force)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same runs and options); nothing to do.")
        report.result({"out": str(out), "up_to_date": True})
        return
    prefix = "nonprivate-" if table.nonprivate else ""
    with writer:
        writer.save_text(f"{prefix}table.md", table.markdown())
        writer.save_csv(f"{prefix}table.csv", CSV_COLUMNS, table.csv_rows())
        writer.save_json(f"{prefix}table.json", table.document())
        writer.save_csv(f"{prefix}clients.csv", CLIENT_COLUMNS, table.client_rows())
        if plot:
            from pfl_cli.cli.figures import comparison_boxes

            comparison_boxes(writer.path(f"{prefix}clients.csv"), writer.path(f"{prefix}table.json"),
                             writer.path(f"{prefix}clients.png"))
    _print(report, out, table, prefix)


def run_spec(spec, *, out: Path, force: bool, report: Reporter, nonprivate: bool = False) -> list[Path]:
    """Train every algorithm of ``spec`` with every seed (and predict its new clients), as `pflx train` and
    `pflx predict --clients holdout --no-predictions` would; a run already there with the same config and
    inputs is kept (nothing to do). Returns the artifact paths, train then predict, per algorithm and seed."""
    import json

    from pfl_cli.cli.common import stage_config, train_stage_config
    from pfl_cli.cli.options import Format
    from pfl_cli.cli.predict_run import run_predict
    from pfl_cli.cli.privacy_account import study_prior
    from pfl_cli.cli.train_run import run_train
    from pfl_cli.config import load_config_file
    from pfl_cli.fl.config import PredictConfig

    root = spec.runs if spec.runs is not None else out.with_name(f"{out.name}-runs")
    quiet = Reporter(Format.quiet)  # stdout stays the comparison's; one note per run on stderr
    configs = []
    for alg in spec.algorithms:  # every config resolved (and refused) before the first training
        named = load_config_file(alg.config, "train").get("algorithm") if alg.config is not None else None
        if named is not None and named != alg.name:
            from pfl_cli.errors import ConfigError

            raise ConfigError(f"--spec: algorithms.{alg.name}.config {alg.config} is a config of {named!r}; give "
                              f"it under algorithms.{named}, or a config of {alg.name!r}.")
        for seed in spec.seeds:
            sets = [f"{k}={json.dumps(v)}" for k, v in alg.sets] + [f"seed={seed}"]
            cfg = train_stage_config(config_file=alg.config, flags={"algorithm": alg.name}, sets=sets)
            # a private study's best.yaml on this partition: its ledger composes into each run's privacy.json
            configs.append((alg.name, seed, cfg, study_prior(alg.config, spec.partition, cfg)))
    for name, _seed, cfg, _study in configs:  # a --dp run releases no accuracy: refused before any training
        if cfg.dp_epsilon is not None and not (nonprivate and cfg.write_nonprivate):
            from pfl_cli.errors import ConfigError

            raise ConfigError(f"--spec: algorithms.{name} trains with --dp (its config sets dp_epsilon), and a --dp "
                              "run releases no accuracy to compare; pass --nonprivate and set write_nonprivate: true "
                              f"under algorithms.{name}.set to compare its diagnostics, or drop it from the spec.")
    predict_cfg = stage_config(PredictConfig, "predict", config_file=None,
                               flags={"clients": "holdout", "predictions": False}, sets=None)
    paths = []
    for i, (name, seed, cfg, study) in enumerate(configs, start=1):
        run = root / name / f"s{seed}"
        report.note(f"compare --spec: train {name} seed {seed} -> {run} ({i}/{len(configs)})")
        run_train(cfg, partition=spec.partition, out=run, resume=False, force=force, report=quiet, study=study)
        paths.append(run)
        if spec.new_clients:
            new = run.with_name(f"s{seed}-new")
            run_predict(predict_cfg, model=run, partition=spec.partition, out=new, force=force, report=quiet)
            paths.append(new)
    return paths


def _print(report: Reporter, out: Path, table, prefix: str) -> None:
    from rich.table import Table

    from pfl_cli.compare.table import GROUP_NAMES, TITLES, format_interval, format_pct

    runs = len({g.path for g in table.groups})
    m = table.metric
    title = f"compare -> {out}: {len({r['label'] for r in table.rows})} configurations, {runs} runs"
    rich_table = Table(title=title, title_justify="left", caption=table.markdown().split("\n\n", 1)[1].strip(),
                       caption_justify="left")
    for name, justify in (("algorithm", "left"), ("clients", "left"), ("seeds", "right"), (f"{TITLES[m]} %", "right"),
                          *([("accuracy %", "right")] if m != "accuracy" else []),
                          ("std", "right"), ("worst 10%", "right"), ("min", "right"), ("label-masked %", "right")):
        rich_table.add_column(name, justify=justify)
    for r in table.rows:
        rich_table.add_row(r["label"], GROUP_NAMES[(r["group"], r["source"])], str(r["num_seeds"]),
                           format_interval(r[m], r[f"{m}_ci"]),
                           *([format_interval(r["accuracy"], r["accuracy_ci"])] if m != "accuracy" else []),
                           format_pct(r["accuracy_std"]), format_pct(r["accuracy_worst10"]),
                           format_pct(r["accuracy_min"]), format_interval(r["accuracy_lm"], r["accuracy_lm_ci"]))
    doc = table.document()
    rows = [{k: v for k, v in row.items() if k not in ("config", "predict_config")} for row in doc["rows"]]
    report.result({"out": str(out), "up_to_date": False, "files_prefix": prefix, **doc, "rows": rows}, rich_table)
