"""`pflx flower app`: write a Flower app that runs a pflx training recipe on a real federation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, OutOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter

flower_app = typer.Typer(help="Run pflx's algorithms on Flower's deployment engine (SuperLink, SuperNodes, "
                              "flwr run): pip install 'pflx[flower]'.", no_args_is_help=True)


@flower_app.command("app", no_args_is_help=True)
def app(
    partition: Annotated[Path, typer.Option("--partition", help="The partition artifact the server reads its public facts from (client ids, roles, dataset shape); each SuperNode names its own client of it in its node config.", show_default=False)],
    out: OutOpt,
    train_out: Annotated[Path | None, typer.Option("--train-out", help="Where the ServerApp writes the train artifact (default: <--out>-train).", show_default=False)] = None,
    round_timeout: Annotated[float, typer.Option("--round-timeout", help="Seconds the server waits for a round's replies; a client that does not reply in time is dropped from that round (recorded in participation.csv).")] = 120.0,
    connect_timeout: Annotated[float, typer.Option("--connect-timeout", help="Seconds the server waits for a SuperNode per client of the partition before it starts with those connected.")] = 120.0,
    min_clients: Annotated[int, typer.Option("--min-clients", help="Fewest replies a round needs; fewer fail the run (nothing is written).")] = 1,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Write a Flower app (pyproject.toml with [tool.flwr.app], a ServerApp and a ClientApp) that runs the
    train recipe --config on Flower: fedavg, fedprox, pefll and pfedhn. Start it with `flwr run APPDIR` against a
    SuperLink whose SuperNodes each hold one client (--node-config "partition-dir='PART' partition-id=K");
    the ServerApp writes a normal train artifact for predict, show and privacy-account.

    Example: pflx flower app --config recipes/flower/fedavg-digits.yaml --partition runs/part --out runs/app ;
    recipes/flower/run-local.sh runs/app runs/part 3
    """
    from pfl_cli.cli.common import train_stage_config
    from pfl_cli.config import config_to_dict
    from pfl_cli.errors import InputError
    from pfl_cli.interop.flower_app import check_deployable
    from pfl_cli.cli.flower_app_files import app_files

    cfg = train_stage_config(config_file=config, flags={"seed": seed} if seed else {}, sets=set_)
    check_deployable(cfg)
    for name, value, low in (("--round-timeout", round_timeout, 0), ("--connect-timeout", connect_timeout, 0)):
        if not value > low:
            raise InputError(f"{name} must be > {low} seconds; got {value}.")
    if min_clients < 1:
        raise InputError(f"--min-clients must be an integer >= 1; got {min_clients}.")
    if not (partition / "manifest.json").is_file():
        raise InputError(f"--partition {partition}: not a pflx artifact (no manifest.json); write one with "
                         "pflx partition --out DIR.")
    files = app_files(config_to_dict(cfg), partition=partition, out=train_out or out.with_name(out.name + "-train"),
                      round_timeout=round_timeout, connect_timeout=connect_timeout, min_clients=min_clients)
    _write_dir(out, files, force)
    Reporter(fmt).result({"out": str(out), "algorithm": cfg.algorithm, "files": sorted(files)},
                         f"flower app -> {out}: {cfg.algorithm}; run it with `flwr run {out}`")


def _write_dir(out: Path, files: dict[str, str], force: bool) -> None:
    """Write ``files`` into a fresh ``out`` atomically (a sibling temporary directory renamed into place)."""
    import shutil
    import tempfile

    from pfl_cli.errors import InputError

    if out.exists() and not force:
        raise InputError(f"--out {out} exists; pass --force to replace it.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def server_main(grid, context) -> None:
    """The generated ServerApp's ``main``: run the deployment (``pfl_cli.interop.flower_app.server.serve``),
    then write its ``train`` artifact atomically with ``pflx train``'s own writer."""
    import logging
    from logging import INFO

    from pfl_cli.interop.flower_app.server import log, serve

    # As `pflx` itself (cli/app.py): dp_accounting logs, through absl, every RDP order it drops as unstable;
    # dropping one only loosens the bound, and a line per order and calibration step would bury the run's log.
    logging.getLogger("absl").setLevel(logging.ERROR)
    run = serve(grid, context)
    write_deployment(run)
    log(INFO, f"wrote the train artifact {run.out}")


def write_deployment(run) -> None:
    """The train artifact of a Flower run: train's files plus participation.csv and metrics.json's
    ``wire`` (bytes measured on the wire) and ``deployment`` (which node held which client)."""
    import flwr

    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.train.files import train_metrics, write_train_files
    from pfl_cli.overlap import partition_input
    from pfl_cli.config import config_to_dict
    from pfl_cli.fl.api import TrainRun, model_payload
    from pfl_cli.fl.loop import TrainOutcome, evaluation_rows

    cfg, alg, part = run.cfg, run.algorithm, run.partition
    weights = alg.weights()
    outcome = TrainOutcome(weights=weights, history=run.history + evaluation_rows(run.evaluation),
                           best=run.evaluation, last_round=cfg.rounds, selection="last")
    train = TrainRun(model=model_payload(alg, weights), outcome=outcome, store=run.store, algorithm=alg, dp=alg.dp)
    metrics = train_metrics(cfg, train, run.info, run.store.device)
    deployment = {"engine": "flower", "flwr": flwr.__version__}
    # Measured per message kind and per node: what the realized cohorts were, so under --dp a diagnostic.
    measured = {"wire": run.meter.summary(metrics["communication"]),
                "deployment": {**deployment, "nodes": {str(int(part.client_id[c])): int(n)
                                                       for c, n in sorted(run.accepted.items())}}}
    config = config_to_dict(cfg)
    private = alg.dp is not None
    writer = ArtifactWriter(run.out, stage="train", config=config, seed=cfg.seed,
                            inputs=[partition_input(run.partition_artifact)], force=run.force, dp=private)
    participation = (["round", "client_id", "node_id", "status"], run.participation)
    with writer:
        if private:  # pflx train --dp's artifact: the ledger, the model, public facts; the rest on request
            from pfl_cli.artifacts import NONPRIVATE
            from pfl_cli.train.files import write_dp_artifact

            write_dp_artifact(writer, cfg, config, train, part, {**metrics, "deployment": deployment})
            if cfg.write_nonprivate:
                writer.save_json("nonprivate-deployment.json", measured, release=NONPRIVATE)
                writer.save_csv("nonprivate-participation.csv", *participation, release=NONPRIVATE)
            return
        write_train_files(writer, config, train, part, {**metrics, **measured})
        writer.save_csv("participation.csv", *participation)
