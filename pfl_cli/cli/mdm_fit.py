"""`pflx mdm-fit`: learn how clients' label histograms are distributed (thesis ch. 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from pfl_cli.cli.common import explicit_flags, stage_config
from pfl_cli.cli.options import ConfigOpt, ForceOpt, Format, FormatOpt, OutOpt, SeedOpt, SetOpt
from pfl_cli.cli.output import Reporter, core_progress

FLAGS = ("components", "rounds", "cohort_size", "init_cohort_size", "restarts", "max_samples", "sample_bins", "bins",
         "validation_fraction", "dp", "plot", "write_nonprivate", "seed")


def mdm_fit(
    ctx: typer.Context,
    out: OutOpt,
    partition: Annotated[Optional[Path], typer.Option("--partition", "-p", help="Partition artifact: fit its train clients' train-label histograms.")] = None,
    counts: Annotated[Optional[Path], typer.Option("--counts", help="Histograms file (.csv or .npy): one row per client, one column per category.")] = None,
    bins: Annotated[Optional[str], typer.Option("--bins", metavar="W:N|E0,E1,..", help="--counts holds client,value rows; bin the value (income: 5000:41).")] = None,
    components: Annotated[str, typer.Option("--components", "-k", help="K, or auto (1-6), a range 1-6 or a list 2,3,5: chosen on a validation cohort.")] = "auto",
    rounds: Annotated[int, typer.Option("--rounds", help="Rounds of Algorithm 6.")] = 100,
    cohort_size: Annotated[Optional[int], typer.Option("--cohort-size", help="Clients per round (default all: full-batch EM).")] = None,
    init_cohort_size: Annotated[Optional[int], typer.Option("--init-cohort-size", help="Clients of Algorithm 5's cohort (default --cohort-size).")] = None,
    restarts: Annotated[Optional[int], typer.Option("--restarts", help="Initializations; keep the best log-likelihood (default 3; 1 with --dp).")] = None,
    max_samples: Annotated[Optional[int], typer.Option("--max-samples", metavar="M", help="Largest client size the size model covers (default the largest seen; required with --dp: a public bound).")] = None,
    sample_bins: Annotated[Optional[int], typer.Option("--sample-bins", help="Model client sizes on this many bins instead of per integer.")] = None,
    validation_fraction: Annotated[float, typer.Option("--validation-fraction", help="Clients held out to choose K.")] = 0.2,
    dp: Annotated[Optional[str], typer.Option("--dp", metavar="eps=E[,delta=D][,clip=B][,population=N][,noise=secure|seeded]", help="Client-level DP: clipped uploads, Gaussian noise on the sums (needs --max-samples). noise=seeded: repeatable noise from the published seed, simulation only.")] = None,
    plot: Annotated[bool, typer.Option("--plot", help="Also write mdm.png: t-SNE of true, IID and MDM-sampled histograms (nonprivate.png with --dp --write-nonprivate).")] = False,
    write_nonprivate: Annotated[bool, typer.Option("--write-nonprivate", help="With --dp: also write diagnostics on the private data (nonprivate.json, nonprivate_trace.csv, --plot), flagged in manifest.json.")] = False,
    seed: SeedOpt = 0,
    config: ConfigOpt = None,
    set_: SetOpt = None,
    force: ForceOpt = False,
    fmt: FormatOpt = Format.human,
) -> None:
    """Fit a mixture of Dirichlet-multinomials to client histograms and write an mdm-fit artifact.

    Examples: pflx mdm-fit --partition runs/part --components auto --out runs/mdm ;
    pflx mdm-fit --counts income.csv --bins 5000:41 --components 3 --out runs/income ;
    pflx mdm-fit --partition runs/part --components 2 --max-samples 200 --dp eps=1,delta=1e-6 --out runs/mdm-dp
    """
    from pfl_cli.artifacts import ArtifactWriter, read_artifact
    from pfl_cli.cli.mdm_artifact import partition_histograms, read_counts, write_mdm_artifact
    from pfl_cli.config import config_to_dict
    from pfl_cli.errors import ConfigError
    from pfl_cli.mdm.api import MDMFitConfig, run_mdm_fit, validate_config
    report = Reporter(fmt)
    cfg = stage_config(MDMFitConfig, "mdm-fit", config_file=config, flags=explicit_flags(ctx, FLAGS), sets=set_)
    validate_config(cfg)
    if (partition is None) == (counts is None):
        raise ConfigError("give exactly one input: --partition DIR (a partition artifact) or --counts FILE.")
    ArtifactWriter(out, stage="mdm-fit", config={}, seed=cfg.seed, force=force)  # --out problems first
    if partition is not None:
        if cfg.bins is not None:
            raise ConfigError("--bins bins a continuous column of --counts client,value rows; a partition has class labels.")
        art = read_artifact(partition, "partition", flag="--partition")
        hist, ref = partition_histograms(art, flag="--partition"), art.input_ref()
    else:
        hist, ref = read_counts(counts, cfg.bins)
    if cfg.dp is None:  # under --dp the number of clients is private: nothing is said about it
        for name in ("cohort_size", "init_cohort_size"):
            size = getattr(cfg, name)
            if size is not None and size > len(hist):
                report.warn(f"--{name.replace('_', '-')} {size} is more than the {len(hist)} clients; every round "
                            f"uses all {len(hist)}.")
    writer = ArtifactWriter(out, stage="mdm-fit", config=config_to_dict(cfg), seed=cfg.seed, inputs=[ref], force=force,
                            dp=cfg.dp is not None)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same config and input); nothing to do.")
        report.result({"out": str(out), "up_to_date": True})
        return
    with report.progress("mdm-fit", None, unit="round") as bar:
        result = run_mdm_fit(hist, cfg, rng=_fit_rng(cfg), on_progress=core_progress(bar, _round_status))
    with writer:
        doc = write_mdm_artifact(writer, result, hist, plot=cfg.plot, seed=cfg.seed,
                                 write_nonprivate=cfg.write_nonprivate)
    _print_summary(report, out, doc, result)


def _round_status(status: dict) -> str:
    """What a progress line says beside the round count (the core leaves the log-likelihood out under --dp)."""
    text = f"K {status['components']}, restart {status['restart']}/{status['restarts']}"
    if "mean_log_likelihood" in status:
        text += f", mean log-likelihood {status['mean_log_likelihood']:.4f}"
    return text


def _fit_rng(cfg):
    """The fit's generator: under --dp its draws come from OS entropy unless noise=seeded (issue 21)."""
    from pfl_cli.mdm.dp import parse_dp
    from pfl_cli.privacy.randomness import noise_source

    return noise_source("seeded" if cfg.dp is None else parse_dp(cfg.dp).noise, cfg.seed).numpy("mdm-fit")


def _print_summary(report: Reporter, out, doc: dict, result) -> None:
    import numpy as np
    from rich.table import Table

    params = result.fit.params
    # Under DP print only what mdm.json releases: no client count, no log-likelihood.
    what = ("DP: only the noisy parameters are released" if "dp" in doc
            else f"{doc['num_clients']} clients, mean log-likelihood {doc['mean_log_likelihood']:.4f}")
    if "dp" not in doc and result.selection is not None:  # K chosen on held-out clients: say where the rest went
        sel = result.selection
        what = (f"fitted on {sel.num_train_clients} clients ({sel.num_validation_clients} more held out to choose K "
                f"by validation log-likelihood), mean log-likelihood {doc['mean_log_likelihood']:.4f}")
    table = Table(title=f"mdm-fit -> {out}: K = {params.num_components}, {what}", title_justify="left")
    for col in ("component", "tau", "alpha_0", "mean size", "top categories (mean share)"):
        table.add_column(col)
    share = params.alpha / params.alpha.sum(axis=1, keepdims=True)
    for k in range(params.num_components):
        top = np.argsort(-share[k])[:3]
        table.add_row(str(k), f"{params.tau[k]:.3f}", f"{params.alpha[k].sum():.3g}", f"{params.mean_size()[k]:.1f}",
                      "  ".join(f"{j}:{share[k, j]:.2f}" for j in top))
    items = [table]
    sel = doc.get("selection")
    if sel:
        st = Table(title="K selection (mean validation log-likelihood per client)", title_justify="left")
        st.add_column("K")
        st.add_column("validation LL")
        for k, v in zip(sel["candidates"], sel["validation_log_likelihood"]):
            st.add_row(f"{k}{' *' if k == sel['chosen'] else ''}", f"{v:.4f}")
        items.append(st)
    if result.dp is not None:
        from pfl_cli.privacy.randomness import stamp

        items.append(stamp(result.dp.noise))
    data = {"out": str(out), "up_to_date": False, **{k: v for k, v in doc.items() if k not in ("num_samples",)}}
    if result.fit.privacy is not None:
        data["epsilon"] = result.dp.epsilon
    report.result(data, *items)

