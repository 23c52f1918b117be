"""`pflx compare`: one table over train and predict runs -- mean and 95 % interval over seeds, fairness across clients."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pfl_cli.cli.options import ForceOpt, Format, FormatOpt, OutOpt
from pfl_cli.cli.output import Reporter


def compare_command(
    out: OutOpt,
    runs: Annotated[Optional[list[Path]], typer.Argument(metavar="[RUN]...", help="Train and predict artifacts (pflx train / pflx predict --clients holdout), all on one partition.", show_default=False)] = None,
    spec: Annotated[Optional[Path], typer.Option("--spec", help="A YAML spec (partition, seeds, algorithms with their config files, e.g. a tune artifact's best.yaml): run its trainings (and predict on the new clients) first, into its runs: directory (default <out>-runs), then compare them with the RUNs.", show_default=False)] = None,
    nonprivate: Annotated[bool, typer.Option("--nonprivate", help="Accept --dp train runs (and predict runs of --dp models) through their nonprivate-clients.csv (train --write-nonprivate): accuracies on the private clients, not covered by DP. The table's files are then named nonprivate-*.")] = False,
    level: Annotated[float, typer.Option("--level", help="Confidence level of the Student-t interval over seeds.")] = 0.95,
    metric: Annotated[str, typer.Option("--metric", help="The headline column: accuracy (mean per-client test accuracy), balanced_accuracy or macro_f1 (mean per-client, scikit-learn's definitions), global_accuracy (the global model on the union of the clients' test splits; refused for a method without one). Every metric keeps its columns in table.csv and table.json.")] = "accuracy",
    jobs: Annotated[int, typer.Option("--jobs", help="With --spec: each study's trials (tune: entries) run this many at once, each in its own process with one torch thread, as pflx tune --jobs; the trainings run one after another.")] = 1,
    plot: Annotated[bool, typer.Option("--plot", help="Also write clients.png: per-client accuracy of every configuration, training and new clients, one box each (needs the plot extra).")] = False,
    log: Annotated[Optional[list[str]], typer.Option("--log", help="With --spec: also log the protocol as one experiment of a tracker, pflx-compare-OUT (a W&B group / an MLflow experiment): wandb (offline unless WANDB_MODE says otherwise) | mlflow (the SQLite store LOG_DIR/mlflow.db unless MLFLOW_TRACKING_URI is set) (repeatable); each training a run NAME-sSEED with its config as parameters and its per-round metrics, each study trial a run STUDY-trial-N.")] = None,
    log_dir: Annotated[Optional[Path], typer.Option("--log-dir", help="Where --log writes (default: OUT.logs beside --out).", show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="With --spec: print the plan -- every study and run, its rounds, which are done already, the rounds left and an estimate of their time (two rounds of each algorithm timed here) -- and train and write nothing.")] = False,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Compare algorithms over seeds: mean and 95 % t-interval, and fairness across clients, in one table.

    Runs of the same algorithm and config (all but the seed) are the seeds of one row. For each
    row and group of clients (train: the training clients; new: clients never trained on, from
    predict artifacts of --clients holdout, else the train run's own holdout evaluation): the mean
    per-client test accuracy without label masking averaged over seeds, with the half-width of the
    two-sided Student-t interval (n/a with one seed: no spread to estimate, not zero), or the metric
    --metric picks (balanced accuracy, macro-F1, the global model's accuracy); the standard
    deviation across clients, the mean of the worst 10 % of clients (ceil(0.1 n) of them) and the
    minimum, each over one run's clients and averaged over seeds; the label-masked accuracy in its
    own column. Runs over different partitions or datasets, the same seed twice, or a --dp train
    run (it releases no accuracy; see --nonprivate) are refused.

    Writes table.md, table.csv, table.json, clients.csv (every run's per-client accuracies) and,
    with --plot, clients.png. --spec FILE.yaml trains algorithms x seeds first (runs already there
    with the same config are kept), then compares them; an algorithm's tune: entry (trials, rounds,
    space, ...) runs its study first, as pflx tune would, and its seeds train with the study's
    best.yaml. The seeds of an algorithm that stacks (fedavg, fedprox, pefll) train as one stack on a run
    axis in one process, each seed's model equal to its separate training, and its study runs
    tune --stack (the spec's stack: K, default 8; 1 trains every run alone). A rerun after a kill
    continues: studies resume, finished runs are kept, unfinished ones continue from their checkpoints.

    Examples: pflx compare runs/fedavg-s0 runs/fedavg-s1 runs/fedavg-s2 runs/pefll-s0 runs/pefll-s1
    runs/pefll-s2 --out runs/table ; pflx compare --spec spec.yaml --out runs/table
    """
    from pfl_cli.cli.compare_run import run_compare

    if plot:
        from pfl_cli.cli.figures import require_matplotlib

        require_matplotlib("--plot")
    from pfl_cli.cli.loggers import check_study_loggers, default_log_dir

    logs = check_study_loggers(log or (), private=False, command="compare")  # --dp runs of a spec log their elapsed time only
    if logs and spec is None:
        from pfl_cli.errors import ConfigError

        raise ConfigError("--log logs the runs that compare --spec trains; compare alone trains nothing: give --spec "
                          "FILE.yaml, or log when training (pflx train --log ...).")
    run_compare(list(runs or ()), out=out, nonprivate=nonprivate, level=level, plot=plot, force=force,
                report=Reporter(fmt), spec=spec, metric=metric, jobs=jobs, logs=logs,
                log_dir=log_dir or default_log_dir(out), dry_run=dry_run)
