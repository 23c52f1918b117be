"""`pflx cluster`: differentially private federated k-means (FedDP-Init + FedDP-Lloyds)."""

from __future__ import annotations

import math

from pathlib import Path
from typing import Annotated, Optional

import typer

from pfl_cli.cli.common import explicit_flags, stage_config
from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, OutOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter
from pfl_cli.errors import ConfigError

FLAGS = (
    "server_data", "k", "privacy_unit", "radius", "split", "min_server_weight", "lloyds_steps", "lloyds_calibration",
    "composition", "init", "client_clip", "k_candidates", "reference_n_init", "write_nonprivate", "seed",
)


def _pairs(flag: str, text: str) -> dict[str, str]:
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep or not value.strip():
            raise ConfigError(f"{flag} takes key=value pairs separated by commas; got {text!r}.")
        out[key.strip().replace("-", "_")] = value.strip()
    return out


def _number(flag: str, key: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{flag} {key} must be a number; got {value!r}.") from None
    if not math.isfinite(number):  # nan / inf cannot be a budget fraction, a radius or a clip
        raise ConfigError(f"{flag} {key} must be a finite number; got {value!r}.")
    return number


def parse_dp(text: str) -> dict[str, float]:
    """'eps=1' / 'eps=1,delta=1e-6,population=5000' -> {'epsilon': 1.0, 'delta': 1e-6, ...} (validated)."""
    from pfl_cli.privacy.release import parse_dp_spec

    spec = parse_dp_spec(text, keys=("eps", "delta", "population"))
    out = {"epsilon": spec.epsilon, "delta": spec.delta, "noise": spec.noise}
    if spec.population is not None:
        out["population"] = spec.population
    return out


def parse_k_candidates(text: str) -> list[int]:
    """'1-20' or '2,4,8' or '1-5,10' -> sorted list of ints."""
    ks: set[int] = set()
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            lo, sep, hi = part.partition("-")
            ks.update(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    except ValueError:
        raise ConfigError(f"--k-candidates takes ranges and numbers like 1-20 or 2,4,8; got {text!r}.") from None
    if not ks:
        raise ConfigError(f"--k-candidates must name at least one k; got {text!r}.")
    return sorted(ks)


def cluster(
    ctx: typer.Context,
    out: OutOpt,
    partition: Annotated[Path, typer.Option("--partition", "-p", help="Partition artifact: client i's points are its train samples' features.")],
    server_data: Annotated[Optional[str], typer.Option("--server-data", help="Server dataset spec (npz:PATH, gmm:server?seed=0, ...).")] = None,
    k: Annotated[Optional[int], typer.Option("--k", help="Number of clusters.")] = None,
    dp: Annotated[Optional[str], typer.Option("--dp", metavar="eps=E[,delta=D][,population=N][,noise=secure|seeded]", help="Total privacy budget (delta default 1e-6; population: public bound on the privacy units, delta < 1/N is checked; noise=seeded: repeatable noise from the published seed, simulation only).")] = None,
    no_dp: Annotated[bool, typer.Option("--no-dp", help="Non-private federated k-means (no clipping, no noise).")] = False,
    privacy_unit: Annotated[str, typer.Option("--privacy-unit", help="example (data-point level) | client (client level).")] = "example",
    radius: Annotated[Optional[float], typer.Option("--radius", help="Clip every point to this norm (a public bound; default: the public server data's radius).")] = None,
    split: Annotated[Optional[str], typer.Option("--split", help="Budget fractions eps1,eps2,eps3G,eps3L[,eps4G,eps4L] (default Tables D.2/D.3).")] = None,
    min_server_weight: Annotated[float, typer.Option("--min-server-weight", help="Drop server points with a smaller noisy weight.")] = 5.0,
    lloyds_steps: Annotated[Optional[int], typer.Option("--lloyds-steps", "-T", help="FedDP-Lloyds steps (default 0 after FedDP-Init, 2 after a baseline init).")] = None,
    lloyds_calibration: Annotated[str, typer.Option("--lloyds-calibration", help="basic_text (eps/T, delta/T per step) | pld_joint.")] = "basic_text",
    composition: Annotated[str, typer.Option("--composition", help="pld: scale the split until the PLD total meets eps | basic: steps sum to eps.")] = "pld",
    init: Annotated[str, typer.Option("--init", help="feddp | server-kmeans++ | server-lloyds | sphere-packing | random | kfed (--no-dp).")] = "feddp",
    client_clip: Annotated[Optional[str], typer.Option("--client-clip", help="Client-level bounds, e.g. outer=1500,sums=21,lloyds_sums=120.")] = None,
    k_candidates: Annotated[Optional[str], typer.Option("--k-candidates", help="Plot W(k) of the weighted server data for these k (e.g. 1-20), in the centers' own projection: no extra privacy.")] = None,
    reference_n_init: Annotated[int, typer.Option("--reference-n-init", help="Restarts of the centralized (non-private) reference k-means.")] = 2,
    write_nonprivate: Annotated[bool, typer.Option("--write-nonprivate", help="With --dp: also write nonprivate.json (costs, point counts, clipped fraction on the private data), flagged in manifest.json.")] = False,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Cluster the clients' data with differentially private federated k-means.

    Examples: pflx cluster --partition runs/gmm --server-data "gmm:server?seed=0" --k 10 --dp eps=1 --out runs/km ;
    pflx cluster --partition runs/gmm --server-data "gmm:server?seed=0" --k 10 --no-dp --init kfed --out runs/kfed
    """
    from pfl_cli.cli.cluster_run import run_cluster

    flags = explicit_flags(ctx, FLAGS)
    if "split" in flags:
        flags["split"] = [_number("--split", "value", v) for v in flags["split"].split(",") if v.strip()]
    if "client_clip" in flags:
        flags["client_clip"] = {key: _number("--client-clip", key, v) for key, v in _pairs("--client-clip", client_clip).items()}
    if "k_candidates" in flags:
        flags["k_candidates"] = parse_k_candidates(k_candidates)
    if dp is not None and no_dp:
        raise ConfigError("--dp and --no-dp exclude each other; pass one.")
    if dp is not None:
        flags.update(parse_dp(dp))
    if no_dp:
        flags["no_dp"] = True
    from pfl_cli.cluster import ClusterConfig

    cfg = stage_config(ClusterConfig, "cluster", config_file=config, flags=flags, sets=set_)
    run_cluster(cfg, partition=partition, out=out, force=force, report=Reporter(fmt))
