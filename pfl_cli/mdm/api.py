"""The validated entry point of the ``mdm-fit`` stage: config, fit or K selection, mdm.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from pfl_cli.errors import ConfigError, check_memory
from pfl_cli.mdm.dp import DPMechanism, make_dp, parse_dp
from pfl_cli.mdm.init import MOMENT_CATEGORIES
from pfl_cli.mdm.model import params_to_dict
from pfl_cli.mdm.sample import sample_clients
from pfl_cli.mdm.select import Selection, parse_components
from pfl_cli.schema import register_choices

if TYPE_CHECKING:  # the fit (scipy) loads when it runs: a refusal or an up-to-date answer never loads it
    from pfl_cli.mdm.fit import MDMFit

DEFAULT_RESTARTS = 3


@dataclass(frozen=True)
class MDMFitConfig:
    """Options of ``pflx mdm-fit``; each field is the flag of the same name."""

    components: Any = "auto"
    rounds: int = 100
    cohort_size: int | None = None
    init_cohort_size: int | None = None
    restarts: int | None = None
    max_samples: int | None = None
    sample_bins: int | None = None
    bins: str | None = None
    validation_fraction: float = 0.2
    tie_tolerance: float = 0.01
    moment_category: str = "argmax"
    dp: str | None = None
    plot: bool = False
    write_nonprivate: bool = False
    seed: int = 0


register_choices(MDMFitConfig, moment_category=MOMENT_CATEGORIES)


@dataclass(frozen=True)
class MDMResult:
    """What ``mdm-fit`` produced: the fit, the K selection (if any) and the DP settings."""

    fit: MDMFit
    selection: Selection | None
    dp: DPMechanism | None
    config: MDMFitConfig


def _optional_int(name: str, value: Any, low: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low):
        raise ConfigError(f"{name.replace('_', '-')} must be an integer >= {low}; got {value!r}.")


def validate_config(cfg: MDMFitConfig) -> tuple[Any, DPMechanism | None]:
    """Check the options; return the parsed components (int or candidate tuple) and DP mechanism."""
    comps = parse_components(cfg.components)
    _optional_int("rounds", cfg.rounds, 0)
    for name in ("cohort_size", "init_cohort_size", "restarts", "max_samples", "sample_bins"):
        _optional_int(name, getattr(cfg, name), 1)
    if not isinstance(cfg.validation_fraction, (int, float)) or not 0 < cfg.validation_fraction < 1:
        raise ConfigError(f"validation-fraction must be in (0, 1); got {cfg.validation_fraction!r}.")
    if cfg.moment_category not in ("argmax", "first"):
        raise ConfigError(f"moment-category must be argmax or first; got {cfg.moment_category!r}.")
    from pfl_cli.privacy.release import check_nonprivate_request

    check_nonprivate_request(dp=cfg.dp is not None, write_nonprivate=cfg.write_nonprivate, plot=cfg.plot)
    sizes = [b for b in (cfg.max_samples, cfg.sample_bins) if b is not None]
    if sizes:  # the size model holds K probabilities per size bin, and the fit a few such arrays
        k_max = comps if isinstance(comps, int) else max(comps)
        check_memory(f"a size model of {min(sizes)} bins x {k_max} components (--max-samples/--sample-bins)",
                     8.0 * (min(sizes) + 1) * (k_max + 4) * 2, fix="Lower --max-samples, or bin sizes with "
                     "--sample-bins B.")
    dp = None
    if cfg.dp is not None:
        spec = parse_dp(cfg.dp)
        if not isinstance(comps, int):
            raise ConfigError("--dp needs a fixed --components K: choosing K compares log-likelihoods that DP does not "
                              "release. Fit without --dp to choose K, then refit with --dp --components K.")
        if cfg.restarts not in (None, 1):
            raise ConfigError(f"--dp runs one initialization (restarts 1): picking the best restart would use "
                              f"non-private log-likelihoods; got --restarts {cfg.restarts}.")
        if cfg.max_samples is None:
            raise ConfigError("--dp needs --max-samples M: a public bound on a client's size (the size model's "
                              "support and the default clip), never read from the private data. Give it, e.g. "
                              "--max-samples 500; larger clients are cut down to M.")
        dp = make_dp(spec.epsilon, spec.delta, clip=spec.clip, population=spec.population, noise=spec.noise)
        for name in ("cohort_size", "init_cohort_size"):
            if getattr(cfg, name) is not None:
                dp._rate(getattr(cfg, name), name)  # the population bound is needed: say so before any work
    return comps, dp


def run_mdm_fit(counts: np.ndarray, cfg: MDMFitConfig, *, rng: np.random.Generator,
                on_progress: Callable[[int, int, dict], None] | None = None) -> MDMResult:
    """Fit the MDM of ``cfg`` to client histograms (choosing K when asked).

    ``on_progress(done, total, status)``: EM rounds over all restarts and candidate K
    (:func:`~pfl_cli.mdm.fit.fit_mdm`); under DP its status holds public facts only.
    """
    from pfl_cli.mdm.fit import check_counts, fit_mdm
    from pfl_cli.mdm.select import select_components

    comps, dp = validate_config(cfg)
    restarts = cfg.restarts if cfg.restarts is not None else (1 if dp is not None else DEFAULT_RESTARTS)
    kwargs = dict(rounds=cfg.rounds, cohort_size=cfg.cohort_size, init_cohort_size=cfg.init_cohort_size,
                  restarts=restarts, max_samples=cfg.max_samples, sample_bins=cfg.sample_bins,
                  moment_category=cfg.moment_category, on_progress=on_progress)
    if isinstance(comps, int):
        return MDMResult(fit_mdm(counts, num_components=comps, rng=rng, dp=dp, **kwargs), None, dp, cfg)
    x, empty = check_counts(counts)
    sel = select_components(x, candidates=comps, rng=rng, validation_fraction=cfg.validation_fraction,
                            tie_tolerance=cfg.tie_tolerance, **kwargs)
    return MDMResult(dataclasses.replace(sel.fit, num_skipped=int(empty.sum())), sel, None, cfg)


def _finite(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def mdm_document(result: MDMResult) -> dict[str, Any]:
    """The ``mdm.json`` document (DESIGN.md §3).

    Under DP it holds only the released parameters and public settings: no client count,
    no cohort size, no log-likelihood (those go to :func:`nonprivate_document`).
    """
    fit, cfg = result.fit, result.config
    doc: dict[str, Any] = params_to_dict(fit.params)
    if fit.dp_info is not None:
        doc["fit"] = {"rounds": fit.rounds, "cohort_size": cfg.cohort_size, "init_cohort_size": cfg.init_cohort_size,
                      "restarts": 1, "max_samples": cfg.max_samples, "moment_category": cfg.moment_category,
                      "algorithm": "thesis Algorithm 5 (init) + Algorithm 6 (generalized EM), client-level DP"}
        doc["dp"] = fit.dp_info
        return doc
    doc.update({
        "log_likelihood": _finite(fit.log_likelihood),
        "mean_log_likelihood": _finite(fit.mean_log_likelihood),
        "num_clients": fit.num_clients,
        "skipped_empty_clients": fit.num_skipped,
        "fit": {
            "rounds": fit.rounds, "cohort_size": fit.cohort_size, "restarts": len(fit.restart_log_likelihoods),
            "best_restart": fit.best_restart,
            "restart_log_likelihoods": [_finite(v) for v in fit.restart_log_likelihoods],
            "moment_category": cfg.moment_category,
            "algorithm": "thesis Algorithm 5 (init) + Algorithm 6 (generalized EM)",
        },
    })
    if result.selection is not None:
        doc["selection"] = result.selection.to_dict()
    return doc


def nonprivate_document(result: MDMResult, counts: np.ndarray) -> dict[str, Any]:
    """``nonprivate.json`` of a DP fit: exact counts and the log-likelihood on the private data.

    Written only on request (``--write-nonprivate``); none of it is covered by the ledger.
    """
    from pfl_cli.mdm.dp import cap_client_sizes
    from pfl_cli.mdm.model import log_likelihood

    fit = result.fit
    from pfl_cli.mdm.fit import check_counts

    raw = check_counts(counts, private=True)[0]
    x = cap_client_sizes(raw, fit.params.max_samples)  # what the fit saw
    ll = float(log_likelihood(x, fit.params)) if len(x) else float("nan")
    return {
        "warning": "computed on the private data; not covered by privacy.json",
        "num_clients": fit.num_clients, "skipped_empty_clients": fit.num_skipped,
        "clients_capped_to_max_samples": int((raw.sum(axis=1) > fit.params.max_samples).sum()),
        "log_likelihood": _finite(ll),
        "mean_log_likelihood": _finite(ll / len(x)) if len(x) else None,
        "cohort_sizes": [int(row[2]) for row in fit.trace[:-1]],
    }


def trace_rows(result: MDMResult) -> tuple[list[str], list[list[Any]]]:
    """``trace.csv``: one row per (components, restart, round) with its log-likelihood."""
    fits = result.selection.fits if result.selection is not None else (result.fit,)
    header = ["components", "restart", "round", "clients", "log_likelihood", "mean_log_likelihood"]
    rows = []
    for f in fits:
        k = f.params.num_components
        for restart, rnd, clients, ll in f.trace:
            fin = np.isfinite(ll)
            rows.append([k, restart, rnd, clients, repr(float(ll)) if fin else "",
                         repr(float(ll) / clients) if fin and clients else ""])
    return header, rows


def simulated_histograms(result: MDMResult, num_clients: int, marginal: np.ndarray, *,
                         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """MDM-sampled and fully IID client histograms (same sizes law), for the t-SNE figure."""
    params = result.fit.params
    mdm = sample_clients(params, num_clients, rng=rng)
    iid = rng.multinomial(sample_clients(params, num_clients, rng=rng).sizes, marginal)
    return mdm.counts, np.asarray(iid)


def tsne_embedding(groups: list[np.ndarray], *, seed: int) -> np.ndarray:
    """2-D t-SNE of clients' class proportions (thesis Figure 3.3), all groups stacked."""
    from sklearn.manifold import TSNE

    x = np.concatenate(groups).astype(np.float64)
    x = x / np.maximum(x.sum(axis=1, keepdims=True), 1)
    perplexity = float(min(30.0, max(2.0, (len(x) - 1) / 3)))
    # Exact gradients are faster than Barnes-Hut's threaded tree code for a few hundred points.
    method = "exact" if len(x) <= 600 else "barnes_hut"
    return TSNE(n_components=2, perplexity=perplexity, init="pca", method=method, random_state=seed).fit_transform(x)
