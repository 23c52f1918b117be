"""Choosing the number of components K on a held-out validation cohort (thesis app. A.1.1).

1. Fit Algorithms 5 + 6 for every candidate K.
2. Evaluate the log-likelihood (Eq. 3.4) of clients the fits have not seen.
3. Take the K with the highest validation log-likelihood;
4. among (approximate) ties take the smallest K: every K whose mean validation
   log-likelihood per client is within ``tie_tolerance`` nats of the best (thesis App. A.1),
   or within one standard error of its paired per-client difference to the best -- the
   one-standard-error rule, so a small validation cohort's noise does not pick a larger K.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from pfl_cli.errors import InfeasibleError, InputError, check_param

if TYPE_CHECKING:  # the fit (scipy) loads when K is chosen, not when --components is parsed
    from pfl_cli.mdm.fit import MDMFit

DEFAULT_CANDIDATES = (1, 2, 3, 4, 5, 6)
MAX_CANDIDATES = 1000
TIE_TOLERANCE = 0.01


@dataclass(frozen=True)
class Selection:
    """Result of :func:`select_components`.

    Attributes
    ----------
    chosen : int
        The selected K.
    fit : MDMFit
        The fit of the selected K (on the training clients).
    candidates : tuple of int
    validation_log_likelihood : tuple of float
        Mean validation log-likelihood per client, one per candidate.
    validation_total : tuple of float
        The same, summed over the validation clients.
    fits : tuple of MDMFit
        Every candidate's fit, in ``candidates`` order.
    num_validation_clients, num_train_clients : int
    tie_tolerance : float
    """

    chosen: int
    fit: MDMFit
    candidates: tuple
    validation_log_likelihood: tuple
    validation_total: tuple
    fits: tuple
    num_validation_clients: int
    num_train_clients: int
    tie_tolerance: float

    def to_dict(self) -> dict[str, Any]:
        """The ``selection`` block of ``mdm.json``."""
        return {
            "candidates": list(self.candidates),
            "validation_log_likelihood": [float(v) for v in self.validation_log_likelihood],
            "validation_log_likelihood_total": [float(v) for v in self.validation_total],
            "train_log_likelihood": [float(f.mean_log_likelihood) for f in self.fits],
            "chosen": int(self.chosen),
            "rule": f"smallest K whose mean validation log-likelihood per client is within max({self.tie_tolerance} nats, "
                    "one standard error of the paired per-client difference) of the best",
            "tie_tolerance": float(self.tie_tolerance),
            "num_validation_clients": int(self.num_validation_clients),
            "num_train_clients": int(self.num_train_clients),
        }


def _standard_error(diff: np.ndarray) -> float:
    return float(np.std(diff, ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0


def parse_components(value: Any) -> tuple[int, ...] | int:
    """``3`` -> 3; ``"auto"`` -> (1, ..., 6); ``"1-6"`` -> (1, ..., 6); ``"2,4,6"`` -> (2, 4, 6).

    Examples
    --------
    >>> parse_components("2-4"), parse_components("3"), parse_components("auto")
    ((2, 3, 4), 3, (1, 2, 3, 4, 5, 6))
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        check_param("components", value >= 1, "must be an integer >= 1, a range A-B, a list or 'auto'", value)
        return int(value)
    text = str(value).strip().lower()
    bad = InputError(f"components must be an integer >= 1, a range such as 1-6, a list such as 2,3,5, or 'auto'; got {value!r}.")
    try:
        if text == "auto":
            return DEFAULT_CANDIDATES
        if "-" in text:
            lo, hi = (int(p) for p in text.split("-", 1))
            values = _candidate_range(lo, hi)
        elif "," in text:
            values = tuple(sorted({int(p) for p in text.split(",") if p.strip()}))
        else:
            single = int(text)
            if single < 1:
                raise bad
            return single
    except InputError:
        raise
    except ValueError:
        raise bad from None
    if not values or values[0] < 1:
        raise bad
    return values


def _candidate_range(lo: int, hi: int) -> tuple[int, ...]:
    # Every candidate is a whole fit; a range like 1-10**12 is a typo, refused before it is built.
    if hi - lo + 1 > MAX_CANDIDATES:
        raise InputError(f"components {lo}-{hi} names {hi - lo + 1} candidates, more than {MAX_CANDIDATES}; each is "
                         "a whole fit. Give a shorter range.")
    return tuple(range(lo, hi + 1))


def _candidate_progress(on_progress, index: int, count: int):
    """One candidate's round progress as progress over all ``count`` candidates (each fit has as many rounds)."""
    if on_progress is None:
        return None
    return lambda done, total, status: on_progress(index * total + done, count * total, status)


def select_components(
    counts: np.ndarray,
    *,
    candidates: Sequence[int] = DEFAULT_CANDIDATES,
    rng: np.random.Generator,
    validation_counts: np.ndarray | None = None,
    validation_fraction: float = 0.2,
    tie_tolerance: float = TIE_TOLERANCE,
    on_progress: Callable[[int, int, dict], None] | None = None,
    **fit_kwargs: Any,
) -> Selection:
    """Fit every candidate K and choose one by validation log-likelihood (thesis app. A.1.1).

    Parameters
    ----------
    counts : array_like of shape (n_clients, C)
        Client histograms. Without ``validation_counts``, a random
        ``validation_fraction`` of them is held out as the validation cohort.
    candidates : sequence of int, default=(1, ..., 6)
    rng : numpy.random.Generator
    validation_counts : array_like of shape (n_val, C), optional
        A separate validation cohort (e.g. fresh clients of a known MDM).
    validation_fraction : float, default=0.2
        In (0, 1); used without ``validation_counts``.
    tie_tolerance : float, default=0.01
        Nats per validation client within which candidates count as tied (at least;
        one standard error of the paired difference widens it for small cohorts).
    on_progress : callable(done, total, status), optional
        :func:`~pfl_cli.mdm.fit.fit_mdm`'s round progress, counted over all candidates.
    **fit_kwargs
        Passed to :func:`~pfl_cli.mdm.fit.fit_mdm` (rounds, cohort_size, restarts, ...).

    Returns
    -------
    Selection
    """
    from pfl_cli.mdm import _kernels as K
    from pfl_cli.mdm.fit import check_counts, fit_mdm

    cands = tuple(sorted({int(k) for k in candidates}))
    check_param("candidates", len(cands) >= 1 and cands[0] >= 1, "must be integers >= 1", list(candidates))
    check_param("tie_tolerance", tie_tolerance >= 0, "must be >= 0", tie_tolerance)
    x, _ = check_counts(counts)
    r_split, r_fit = rng.spawn(2)
    if validation_counts is None:
        check_param("validation_fraction", 0 < validation_fraction < 1, "must be in (0, 1)", validation_fraction)
        n_val = max(1, int(round(validation_fraction * len(x))))
        order = r_split.permutation(len(x))
        val, train = x[np.sort(order[:n_val])], x[np.sort(order[n_val:])]
    else:
        val, _ = check_counts(validation_counts, name="validation_counts")
        if val.shape[1] != x.shape[1]:
            raise InputError(f"validation_counts must have {x.shape[1]} categories like counts; got {val.shape[1]}.")
        train = x
    if len(train) < cands[-1]:
        raise InfeasibleError(
            f"components up to {cands[-1]} need at least {cands[-1]} training clients; {len(train)} remain after holding "
            f"out {len(val)} validation clients. Use fewer components or more clients."
        )
    if len(val) == 0:
        raise InputError("the validation cohort is empty; give more clients or a larger validation fraction.")
    vdata = K.encode(val)
    # Sizes above the training clients' largest would fall outside the size model.
    fit_kwargs.setdefault("max_samples", int(max(train.sum(axis=1).max(), val.sum(axis=1).max())))
    fits, per_client = [], []
    for i, (k, child) in enumerate(zip(cands, r_fit.spawn(len(cands)))):
        fit = fit_mdm(train, num_components=k, rng=child, on_progress=_candidate_progress(on_progress, i, len(cands)),
                      **fit_kwargs)
        fits.append(fit)
        per_client.append(K.client_log_likelihood(vdata, fit.params))
    totals = [float(v.sum()) for v in per_client]
    means = [t / len(val) for t in totals]
    best = int(np.argmax(means))
    chosen_i = next(i for i, m in enumerate(means)
                    if means[best] - m <= max(tie_tolerance, _standard_error(per_client[best] - per_client[i])))
    return Selection(
        chosen=cands[chosen_i], fit=fits[chosen_i], candidates=cands, validation_log_likelihood=tuple(means),
        validation_total=tuple(totals), fits=tuple(fits), num_validation_clients=len(val), num_train_clients=len(train),
        tie_tolerance=float(tie_tolerance),
    )
