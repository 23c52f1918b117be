"""The body of `pflx compare`: read the runs, compute the table (:mod:`pfl_cli.compare`), write the artifact, print.

The ``compare`` artifact (DESIGN.md section 3): ``table.md``, ``table.csv``, ``table.json`` (per
configuration and client group: mean and interval over seeds, fairness across clients),
``clients.csv`` (label, group, seed, client_id, accuracy, accuracy_lm, balanced_accuracy, macro_f1,
global_accuracy of every run) and, with
``--plot``, ``clients.png``. With ``--nonprivate`` over --dp runs every file is named
``nonprivate-*``: the numbers are diagnostics on private clients, not releases.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from pfl_cli.cli.output import Reporter


def run_compare(runs: Sequence[Path], *, out: Path, nonprivate: bool, level: float, plot: bool, force: bool,
                report: Reporter, spec: Path | None = None, metric: str = "accuracy", jobs: int = 1,
                logs: tuple[str, ...] = (), log_dir: Path | None = None, dry_run: bool = False) -> None:
    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.compare import compare, read_runs
    from pfl_cli.compare.table import CLIENT_COLUMNS, CSV_COLUMNS, check_metric

    config = {"level": level, "nonprivate": nonprivate, "plot": plot, "metric": metric}
    if dry_run and spec is None:
        from pfl_cli.errors import InputError

        raise InputError("--dry-run shows the plan of --spec FILE.yaml (its studies and runs); give --spec.")
    if not dry_run:
        ArtifactWriter(out, stage="compare", config=config, seed=None, force=force)  # --out problems first
    if not 0.0 < level < 1.0:
        from pfl_cli.errors import ConfigError

        raise ConfigError(f"--level must be in (0, 1); got {level!r}.")
    check_metric(metric)  # before any training of --spec
    if not runs and spec is None:
        from pfl_cli.errors import InputError

        raise InputError("RUN: give train or predict artifacts to compare, or --spec FILE.yaml to train them first.")
    if spec is not None:
        from pfl_cli import registry
        from pfl_cli.compare.spec import load_spec

        from pfl_cli.readers import read_artifact

        parsed = load_spec(spec, known=registry.names())
        read_artifact(parsed.partition, "partition", flag=f"--spec {spec}: partition", verify=False)  # before any work
        config["spec"] = parsed.to_dict()
        if dry_run:  # the plan: every config resolved and refused as a run would, nothing trained or written
            from pfl_cli.cli.compare_plan import print_plan

            root = parsed.runs if parsed.runs is not None else out.with_name(f"{out.name}-runs")
            print_plan(parsed, _plan_spec(parsed, nonprivate=nonprivate, jobs=jobs), root, report,
                       train_config=_train_config)
            return
        runs = [*run_spec(parsed, out=out, force=force, report=report, nonprivate=nonprivate, jobs=jobs, logs=logs,
                          log_dir=log_dir), *runs]
    groups = read_runs(runs, nonprivate=nonprivate)
    inputs = list({g.input_ref["sha256"]: dict(g.input_ref) for g in groups}.values())
    writer = ArtifactWriter(out, stage="compare", config=config, seed=None, inputs=inputs, force=force)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same runs and options); nothing to do.")
        report.result({"out": str(out), "up_to_date": True})
        return
    table = compare(groups, level=level, metric=metric)  # scipy's intervals: once the table is not up to date
    from pfl_cli.compare.paired import few_seeds_warnings

    for line in few_seeds_warnings(table.rows, metric, level):
        report.warn(line)
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


def run_spec(spec, *, out: Path, force: bool, report: Reporter, nonprivate: bool = False, jobs: int = 1,
             logs: tuple[str, ...] = (), log_dir: Path | None = None) -> list[Path]:
    """The protocol of ``spec``: each algorithm's study first where it has a ``tune:`` entry (as `pflx tune` would,
    into ``<runs>/tune-<name>``), then every algorithm with every seed (its config, or its study's best.yaml), and
    its new clients predicted, as `pflx train` and `pflx predict --clients holdout --no-predictions` would. A study
    resumes from its study.db and a run already there with the same config and inputs is kept (nothing to do), so a
    rerun after a kill continues where it stopped. One progress display counts the studies' and the trainings'
    rounds. ``jobs``: each study's trials at once, in that many processes (`pflx tune --jobs`). Returns the
    artifact paths, train then predict, per algorithm and seed. ``logs``: compare --log wandb|mlflow, the protocol
    one W&B group / MLflow experiment ``pflx-compare-OUT`` in ``log_dir``: each training a run ``NAME-sSEED``,
    each trial a run ``STUDY-trial-N`` (:class:`pfl_cli.cli.loggers.StudyLoggers`)."""
    from pfl_cli.cli.common import stage_config
    from pfl_cli.cli.options import Format
    from pfl_cli.cli.predict_run import run_predict
    from pfl_cli.cli.train_run import run_train, train_stack
    from pfl_cli.train.stack import StackMember
    from pfl_cli.errors import ConfigError
    from pfl_cli.fl.checkpoint import CHECKPOINT_FILE, checkpoint_dir
    from pfl_cli.fl.config import PredictConfig
    from pfl_cli.fl.stack import config_stacks
    from pfl_cli.cli.tune_protocol import run_study

    from pfl_cli.cli import interrupt

    if jobs < 1:
        raise ConfigError(f"--jobs must be an integer >= 1; got {jobs}.")
    # compare has no --resume: its rerun continues every unfinished training from its checkpoint by itself
    interrupt.continue_with("run the same command again (compare --spec continues where it stopped)")
    root = spec.runs if spec.runs is not None else out.with_name(f"{out.name}-runs")
    quiet = Reporter(Format.quiet)  # stdout stays the comparison's
    steps = _plan_spec(spec, nonprivate=nonprivate, jobs=jobs)  # every config resolved (and refused) before any work
    predict_cfg = stage_config(PredictConfig, "predict", config_file=None,
                               flags={"clients": "holdout", "predictions": False}, sets=None)
    paths = []
    group = f"pflx-compare-{out.name}"
    total = [sum(s.units for s in steps)]
    with report.progress("compare --spec", total[0], unit="round") as bar:
        i = 0
        while i < len(steps):
            step = steps[i]
            if step.kind == "tune":
                phase = _Phase(report, bar, step.label)
                options = step.options
                if logs:
                    import dataclasses

                    options = dataclasses.replace(options, logs=logs, log_dir=log_dir, log_group=group)
                best = run_study(step.cfg, options, partition=spec.partition, out=root / f"tune-{step.name}",
                                 force=force, report=phase)
                for run in (s for s in steps if s.kind == "train" and s.name == step.name):
                    run.cfg, run.study = _train_config(step.name, best, run.sets, run.seed, spec)
                phase.close(step.units, total)
                i += 1
                continue
            # the seeds of a stackable algorithm: up to spec.stack of them trained at once on a run axis
            batch = [step]
            if spec.stack > 1 and config_stacks(step.cfg):
                while (i + len(batch) < len(steps) and len(batch) < spec.stack
                       and steps[i + len(batch)].kind == "train" and steps[i + len(batch)].name == step.name):
                    batch.append(steps[i + len(batch)])
            i += len(batch)
            runs = [root / s.name / f"seed-{s.seed}" for s in batch]
            units = sum(s.units for s in batch)
            if len(batch) > 1:
                phase = _Phase(report, bar, f"train {step.name}")  # each line names its seed
                train_stack([StackMember(s.cfg, run, study=s.study, log_as=(f"{s.name}-s{s.seed}", group),
                                         log_dir=log_dir) for s, run in zip(batch, runs)],
                            partition=spec.partition, resume=None, force=force, report=phase, logs=logs)
            else:
                phase = _Phase(report, bar, step.label)
                run = runs[0]
                # a checkpoint a kill left: this training continues from it (its fingerprint checked on reading)
                resume = (checkpoint_dir(run) / CHECKPOINT_FILE).is_file()
                run_train(step.cfg, partition=spec.partition, out=run, resume=resume, force=force, report=phase,
                          study=step.study, logs=logs, log_dir=log_dir, log_as=(f"{step.name}-s{step.seed}", group))
            for s, run in zip(batch, runs):
                paths.append(run)
                if spec.new_clients:
                    new = run.with_name(f"seed-{s.seed}-new")
                    run_predict(predict_cfg, model=run, partition=spec.partition, out=new, force=force, report=quiet)
                    paths.append(new)
            phase.close(units, total)
    return paths


class _Step:
    """One step of a spec's protocol: a study (``kind`` "tune") or a training of one seed ("train"); ``units``: its
    rounds on the protocol's progress display (a trial or training of a method without rounds counts one)."""

    def __init__(self, kind: str, name: str, units: int, *, cfg=None, options=None, sets=(), seed=None,
                 study=(None, None)) -> None:
        self.kind, self.name, self.units, self.cfg, self.options = kind, name, units, cfg, options
        self.sets, self.seed, self.study = sets, seed, study

    @property
    def label(self) -> str:
        return f"tune {self.name}" if self.kind == "tune" else f"train {self.name} seed {self.seed}"


def _rounds(cfg) -> int:
    return cfg.rounds if cfg.algorithm_class.federated else 1


@contextmanager
def _naming(spec, name: str, config: Path | None) -> Iterator[None]:
    """A refused key or value of a spec's algorithm, said with where it is: its set (or its config file)."""
    from pfl_cli.errors import ConfigError

    try:
        yield
    except ConfigError as err:
        text = str(err)
        if text.startswith("--config") or text.startswith("--spec"):  # already says which file
            raise
        where = f"algorithms.{name}.set" + (f" (or its config {config})" if config is not None else "")
        raise ConfigError(f"--spec{'' if spec.path is None else f' {spec.path}'}: {where}: {text}") from None


def _train_config(name: str, config: Path | None, sets, seed: int, spec):
    """A seed's train config (defaults < config file < set < seed) and the private study it composes with."""
    import json

    from pfl_cli.cli.common import train_stage_config
    from pfl_cli.privacy.study import study_prior

    with _naming(spec, name, config):
        cfg = train_stage_config(config_file=config, flags={"algorithm": name},
                                 sets=[f"{k}={json.dumps(v)}" for k, v in sets] + [f"seed={seed}"])
    # a private study's best.yaml on this partition: its ledger composes into each run's privacy.json
    return cfg, study_prior(config, spec.partition, cfg)


def _plan_spec(spec, *, nonprivate: bool, jobs: int) -> list[_Step]:
    """The protocol's steps, every config and study option checked (ConfigError, one line) before any work."""
    import dataclasses
    import json

    from pfl_cli.cli.common import train_stage_config
    from pfl_cli.config import load_config_file
    from pfl_cli.errors import ConfigError
    from pfl_cli.cli.tune_protocol import check_study, tune_options
    from pfl_cli.fl.stack import UNSTACK_HINT, config_stacks

    studies, trainings = [], []
    for alg in spec.algorithms:
        file_keys = load_config_file(alg.config, "train")
        named = file_keys.get("algorithm")
        if named is not None and named != alg.name:
            raise ConfigError(f"--spec: algorithms.{alg.name}.config {alg.config} is a config of {named!r}; give "
                              f"it under algorithms.{named}, or a config of {alg.name!r}.")
        if alg.tune is None:
            for seed in spec.seeds:
                cfg, study = _train_config(alg.name, alg.config, alg.sets, seed, spec)
                trainings.append(_Step("train", alg.name, _rounds(cfg), cfg=cfg, sets=alg.sets, seed=seed,
                                       study=study))
            continue
        t = alg.tune
        at = f"--spec: algorithms.{alg.name}.tune"
        # the study's base: the algorithm's config file and set, with the study's own rounds, eval_every and seed
        budget = {"rounds": t.rounds, "eval_every": t.eval_every, "seed": t.seed}
        sets = [f"{k}={json.dumps(v)}" for k, v in alg.sets if budget.get(k) is None]
        sets += [f"{k}={json.dumps(v)}" for k, v in budget.items() if v is not None]
        with _naming(spec, alg.name, alg.config):
            cfg = train_stage_config(config_file=alg.config, flags={"algorithm": alg.name}, sets=sets)
        if cfg.dp_epsilon is not None:
            raise ConfigError(f"{at}: the study would train under --dp (dp_epsilon is set), which a spec does not run "
                              "yet (a private study's trial count is random and its release composes into every "
                              f"seed's budget); run pflx tune --dp, give its best.yaml as algorithms.{alg.name}.config "
                              "and drop tune:.")
        if t.stack is not None:  # the entry's own --stack: refused below, as pflx tune refuses it, where it cannot be
            study_stack = t.stack
        else:  # the spec's stack where the algorithm stacks and the trials are not spread over --jobs processes
            study_stack = spec.stack if config_stacks(cfg) and jobs == 1 else 1
        options = dataclasses.replace(tune_options(t, jobs=jobs), stack=study_stack)  # pflx tune --stack
        try:
            params = check_study(cfg, options)
        except ConfigError as err:  # a spec unstacks a study by its stack: key, not by a flag
            raise ConfigError(f"{at}: " + str(err).replace(UNSTACK_HINT, f"set stack: 1 under {at.split(' ')[-1]}")) \
                from None
        searched = {p.key for p in params}
        for where, keys in ((f"config {alg.config}", set(file_keys)), ("set", {k for k, _v in alg.sets})):
            fixed = sorted(searched & keys)
            if fixed:
                raise ConfigError(f"{at}: the study searches {fixed[0]!r}, which algorithms.{alg.name}.{where} "
                                  f"fixes (the search would be moot or overridden); drop {fixed[0]} from the "
                                  f"{where.split()[0]} and let the study choose it (tune.space: {{{fixed[0]}: SPEC}} "
                                  f"sets its range; `pflx algorithms {alg.name}` shows the declared space).")
        studies.append(_Step("tune", alg.name, t.trials * _rounds(cfg), cfg=cfg, options=options))
        # the seeds' configs come from the study's best.yaml: counted here with the study's base (its rounds
        # unless set gives the training's), resolved when the study is done
        train_rounds = _rounds(dataclasses.replace(cfg, **{k: v for k, v in alg.sets if k == "rounds"}))
        trainings += [_Step("train", alg.name, train_rounds, sets=alg.sets, seed=seed) for seed in spec.seeds]
    for step in trainings:  # a --dp run releases no accuracy: refused before any training
        cfg = step.cfg
        if cfg is not None and cfg.dp_epsilon is not None and not (nonprivate and cfg.write_nonprivate):
            raise ConfigError(f"--spec: algorithms.{step.name} trains with --dp (its config sets dp_epsilon), and a "
                              "--dp run releases no accuracy to compare; pass --nonprivate and set write_nonprivate: "
                              f"true under algorithms.{step.name}.set to compare its diagnostics, or drop it from the "
                              "spec.")
    return studies + trainings


class _Phase(Reporter):
    """The reporter of one step of the protocol: its progress feeds the protocol's one display (labelled with the
    step), its notes and result stay quiet (stdout is the comparison's), its warnings name the step."""

    def __init__(self, outer: Reporter, bar, label: str) -> None:
        from pfl_cli.cli.options import Format

        self.fmt, self._prose = Format.quiet, False
        self._consoles = outer._consoles  # the protocol's consoles (rich loads when one prints)
        self.outer, self.bar, self.label, self.units = outer, bar, label, 0

    def result(self, data, *human) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        self.outer.warn(f"{self.label}: {message}")

    @contextmanager
    def progress(self, description: str, total: int | None, unit: str = "step") -> Iterator[Any]:
        phase = self

        class _Handle:
            def advance(self, n: int = 1, status: str = "", total: int | None = None) -> None:
                phase.units += n
                phase.bar.advance(n, status="resumed" if status == "resumed" else
                                  ", ".join(p for p in (phase.label, status) if p))

        yield _Handle()

    def close(self, units: int, total: list[int]) -> None:
        """The step is done: the display counts its ``units`` (a step found up to date counts as resumed work, not
        as time spent; a step that counted more than planned widens ``total[0]``, the display's total)."""
        if self.units < units:
            self.bar.advance(units - self.units, status="resumed" if self.units == 0 else self.label)
        elif self.units > units:
            total[0] += self.units - units
            self.bar.advance(0, status=self.label, total=total[0])


def _print(report: Reporter, out: Path, table, prefix: str) -> None:
    from rich.table import Table

    from pfl_cli.compare.table import GROUP_NAMES, TITLES, format_interval, format_pct

    runs = len({g.path for g in table.groups})
    m = table.metric
    title = f"compare -> {out}: {len({r['label'] for r in table.rows})} configurations, {runs} runs"
    rich_table = Table(title=title, title_justify="left", caption=table.caption(), caption_justify="left")
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
    report.result({"out": str(out), "up_to_date": False, "files_prefix": prefix, **doc, "rows": rows}, rich_table,
                  *_paired_table(table))


def _paired_table(table) -> list:
    """The paired comparisons (:mod:`pfl_cli.compare.paired`) as a second table; none when nothing pairs."""
    from rich.table import Table

    from pfl_cli.compare.table import TITLES, format_p, format_points

    if not table.paired:
        return []
    out = Table(title="paired, against the first configuration of each group of clients", title_justify="left",
                caption=table.paired_markdown().rsplit("\n\n", 1)[1].strip(), caption_justify="left")
    for name in ("algorithm", "vs", "clients", "over", "pairs", "difference", "paired t p", "Wilcoxon p"):
        out.add_column(name, justify="right" if name in ("pairs", "difference", "paired t p", "Wilcoxon p") else "left")
    for p in table.paired:
        for c in (p["by_seed"], p["by_client"]):
            out.add_row(p["label"], p["reference"], p["group"], f"{c['over']} ({TITLES[c.get('metric', p['metric'])]})",
                        str(c["pairs"]), format_points(c["mean_difference"]), format_p(c["p_values"]["paired_t"]),
                        format_p(c["p_values"]["wilcoxon"]))
    return [out]
