"""`pflx privacy-account`: epsilon, noise or steps of a DP mechanism, or a composition of ledgers."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from pfl_cli.cli.common import explicit_flags, stage_config
from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter


class Accountant(str, enum.Enum):
    auto = "auto"
    rdp = "rdp"
    pld = "pld"
    all = "all"


class Neighboring(str, enum.Enum):
    add_remove = "add-remove"
    replace = "replace"


class Sampling(str, enum.Enum):
    poisson = "poisson"
    without_replacement = "without-replacement"


class Unit(str, enum.Enum):
    example = "example"
    client = "client"


_FLAGS = ("noise_multiplier", "sampling_rate", "population", "cohort_size", "steps", "epsilon", "delta",
          "accountant", "neighboring", "sampling", "unit", "max_noise", "max_steps")


def _read_ledgers(dirs: list[Path]):
    from pfl_cli.artifacts import PRODUCER, read_artifact
    from pfl_cli.errors import ArtifactError
    from pfl_cli.readers import read_ledger

    stages = ["mdm-fit", *[s for s in PRODUCER if s != "mdm-fit"], "privacy-account"]
    ledgers, inputs, seeded = [], [], []
    for path in dirs:
        art = read_artifact(path, stages, flag="ledger")
        if not art.has("privacy.json"):
            raise ArtifactError(f"ledger {path}: no privacy.json; this {art.stage!r} run was not differentially private "
                                "(ledgers are written by mdm-fit --dp, cluster --dp and DP train).")
        doc, ledger = read_ledger(art, "ledger")
        ledgers.append((str(path), ledger))
        inputs.append(art.input_ref())
        if isinstance(doc, dict) and doc.get("noise") == "seeded":
            seeded.append(str(path))
    return ledgers, inputs, seeded


def privacy_account(
    ctx: typer.Context,
    ledgers: Annotated[Optional[list[Path]], typer.Argument(help="Artifact directories whose privacy.json to compose.", show_default=False)] = None,
    noise_multiplier: Annotated[Optional[float], typer.Option("--noise-multiplier", "-z", help="Gaussian noise std / L2 sensitivity.")] = None,
    sampling_rate: Annotated[Optional[float], typer.Option("--sampling-rate", "-q", help="Poisson sampling rate in (0, 1] (default 1: no sampling).")] = None,
    population: Annotated[Optional[int], typer.Option("--population", help="Units in the population (with --cohort-size: q = cohort / population).")] = None,
    cohort_size: Annotated[Optional[int], typer.Option("--cohort-size", help="Units sampled per step.")] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", "--rounds", help="Number of steps or rounds (default 1).")] = None,
    epsilon: Annotated[Optional[float], typer.Option("--epsilon", help="Target epsilon: calibrate the noise, or with --noise-multiplier the steps.")] = None,
    delta: Annotated[Optional[float], typer.Option("--delta", help="Target delta in (0, 1) (default with --population: 1/N^1.1).")] = None,
    accountant: Annotated[Accountant, typer.Option("--accountant", help="auto: a ledger's own (the one its stage calibrated with), the tightest for a composition, rdp for a mechanism; rdp (fast), pld (tight) or all (side by side).")] = Accountant.auto,
    neighboring: Annotated[Neighboring, typer.Option("--neighboring", help="Neighbouring relation of the guarantee.")] = Neighboring.add_remove,
    sampling: Annotated[Sampling, typer.Option("--sampling", help="How each step's sample is drawn.")] = Sampling.poisson,
    unit: Annotated[Unit, typer.Option("--unit", help="The privacy unit one record stands for.")] = Unit.example,
    max_noise: Annotated[float, typer.Option("--max-noise", help="Upper end of the noise search.")] = 1e4,
    max_steps: Annotated[int, typer.Option("--max-steps", help="Upper end of the steps search.")] = 10**7,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write the answer as a privacy.json artifact.", show_default=False)] = None,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Account for privacy: give two of epsilon, noise and steps and get the third, or compose ledgers.

    Examples: `pflx privacy-account -z 1.1 -q 0.01 --steps 1000 --delta 1e-5`;
    `pflx privacy-account --epsilon 1 --population 10000 --cohort-size 100 --rounds 500 --delta 1e-6`;
    `pflx privacy-account runs/mdm runs/km --accountant all`.
    """
    from pfl_cli.privacy.query import PrivacyAccountConfig, answer

    flags = {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in explicit_flags(ctx, _FLAGS).items()}
    cfg = stage_config(PrivacyAccountConfig, "privacy-account", config_file=config, flags=flags, sets=set_)
    if out is not None:
        from pfl_cli.artifacts import ArtifactWriter

        ArtifactWriter(out, stage="privacy-account", config={}, seed=seed, force=force)  # --out problems first
    read, inputs, seeded = _read_ledgers(list(ledgers or []))
    report = answer(cfg, read)
    if out is not None:
        _write(out, cfg, report, seed, force, inputs)
    data, human = report.to_dict(), _human(report)
    if seeded:  # a ledger whose noise anyone holding its config can rebuild (issue 21)
        from pfl_cli.privacy.randomness import SEEDED_STATEMENT

        data["noise"] = "seeded"
        data["noise_statement"] = f"{', '.join(seeded)} drew with noise=seeded: {SEEDED_STATEMENT}"
        human.append(f"Note: {data['noise_statement']}.")
    Reporter(fmt).result(data, *human)


def _human(report) -> list:
    from rich.table import Table

    items: list = [report.statement]
    if report.by_accountant:
        table = Table("accountant", "epsilon", "noise multiplier", "steps", "note")
        for name, row in report.by_accountant.items():
            cells = [row.get("epsilon"), row.get("noise_multiplier"), row.get("steps")]
            table.add_row(name, *("" if c is None else f"{c:.6g}" for c in cells), row.get("error", ""))
        items += [table, f"Tighter: {report.tighter}."]
    return items


def _write(out: Path, cfg, report, seed: int, force: bool, inputs: list) -> None:
    from pfl_cli.artifacts import POST_PROCESSING, ArtifactWriter, public_input
    from pfl_cli.config import config_to_dict

    # Release contract: the answer is a function of public parameters and of released
    # ledgers only, so both files are post-processing and the ledgers' hashes stay public.
    writer = ArtifactWriter(out, stage="privacy-account", config=config_to_dict(cfg), seed=seed,
                            inputs=[public_input(i) for i in inputs], force=force, dp=True)
    if writer.up_to_date():
        return
    accountant = report.accountant if report.accountant in ("rdp", "pld") else "rdp"
    with writer:
        writer.save_json("privacy.json", report.ledger().to_dict(accountant), release=POST_PROCESSING)
        writer.save_json("report.json", report.to_dict(), release=POST_PROCESSING)
