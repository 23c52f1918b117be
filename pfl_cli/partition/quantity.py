"""Quantity skew: client sizes first, then (optionally) each client's own label draw.

Size laws (``--quantity``): ``lognormal:SIGMA`` (weights ~ LogNormal(0, SIGMA^2); FedLab's
unbalanced split), ``dirichlet:A`` (weights ~ Dir(A * 1_J)), and Flower's ``linear``,
``square`` and ``exponential`` (weights proportional to i, i^2, e^i for client i = 1..J).
Weights become integer sizes by largest remainder, then clients under ``min_size`` are
topped up from the largest ones. Combined with a label scheme, client j then fills its size
from its own label distribution q_j (FedDyn's "inner Dirichlet"), with classes that run out
redistributed over the classes that still have samples.
"""

from __future__ import annotations

import numpy as np

from pfl_cli.errors import ConfigError
from pfl_cli.partition._alloc import largest_remainder, owners_from_counts, repair_plan

LAWS = ("lognormal", "dirichlet", "linear", "square", "exponential")


def parse_quantity(spec: str) -> tuple[str, float | None]:
    """``"lognormal:0.5"`` -> ``("lognormal", 0.5)``; ``"linear"`` -> ``("linear", None)``."""
    law, _, arg = str(spec).partition(":")
    law = law.strip().lower()
    if law not in LAWS:
        raise ConfigError(f"quantity must be one of lognormal:SIGMA, dirichlet:A, linear, square, exponential; got {spec!r}.")
    if law in ("lognormal", "dirichlet"):
        try:
            value = float(arg)
        except ValueError:
            raise ConfigError(f"quantity {law} needs a number, as in {law}:0.5; got {spec!r}.") from None
        if not value > 0 or not np.isfinite(value):
            raise ConfigError(f"quantity {law} parameter must be > 0; got {spec!r}.")
        return law, value
    if arg:
        raise ConfigError(f"quantity {law} takes no parameter; got {spec!r}.")
    return law, None


def client_sizes(law: str, param: float | None, *, num_clients: int, total: int, min_size: int, rng) -> tuple[np.ndarray, dict]:
    """Integer client sizes summing to ``total``, each at least ``min_size``."""
    ids = np.arange(1, num_clients + 1, dtype=np.float64)
    if law == "lognormal":
        weights = rng.lognormal(0.0, param, size=num_clients)
    elif law == "dirichlet":
        weights = rng.dirichlet(np.full(num_clients, param))
    elif law == "linear":
        weights = ids
    elif law == "square":
        weights = ids**2
    else:
        weights = np.exp(ids - ids.max())  # e^i, shifted to avoid overflow; the ratios are unchanged
    sizes = largest_remainder(weights, total)
    give, need = repair_plan(sizes, min_size)
    sizes = sizes - give + need
    info = {"repaired": bool(need.any())}
    if need.any():
        info.update(clients_below_min_size=int(np.count_nonzero(need)), samples_moved=int(need.sum()))
    return sizes, info


def fill_counts(sizes: np.ndarray, q: np.ndarray, supply: np.ndarray) -> np.ndarray:
    """Counts (J, C) with row sums ``sizes`` and column sums at most ``supply``.

    Each client's counts follow its label distribution ``q[j]``; when a class is
    over-demanded it is scaled down to its supply and the clients' shortfall is spread
    over the classes that still have samples, in proportion to ``q`` (at most C rounds,
    each vectorized over clients and classes). ``sizes.sum()`` must not exceed ``supply.sum()``.
    """
    num_clients, num_classes = q.shape
    counts = np.zeros((num_clients, num_classes), dtype=np.int64)
    left = supply.astype(np.int64).copy()
    open_ = left > 0
    want = sizes.astype(np.int64).copy()
    for _ in range(num_classes + 1):
        if want.sum() == 0 or not open_.any():
            break
        w = q * open_
        rows = w.sum(axis=1)
        w = np.where(rows[:, None] > 0, w / np.where(rows[:, None] > 0, rows[:, None], 1), open_ / open_.sum())
        ask = np.floor(w * want[:, None]).astype(np.int64)
        demand = ask.sum(axis=0)
        over = demand > left
        # Over-demanded classes are cut to their supply in proportion to the asks, then closed.
        scale = np.where(over, left / np.maximum(demand, 1), 1.0)
        got = np.floor(ask * scale[None, :]).astype(np.int64)
        counts += got
        left -= got.sum(axis=0)
        want -= got.sum(axis=1)
        open_ = left > 0
        if not over.any():
            break
    # Rounding leftovers (fewer than C per client): a client still short takes them from its own
    # classes first, largest q[j, c] first, so that flooring never hands it a class outside its
    # label distribution; only when its own classes have run out does it take any class left.
    for j in np.flatnonzero(want):
        for own_only in (True, False):
            order = np.argsort(-q[j], kind="stable")
            for c in order[(q[j, order] > 0) if own_only else slice(None)]:
                take = min(int(want[j]), int(left[c]))
                counts[j, c] += take
                left[c] -= take
                want[j] -= take
            if want[j] == 0:
                break
    return counts


def sized_owners(labels: np.ndarray, sizes: np.ndarray, q: np.ndarray, num_classes: int, rng) -> np.ndarray:
    """Owner of each sample when client j takes ``sizes[j]`` samples distributed like ``q[j]``."""
    supply = np.bincount(labels, minlength=num_classes)
    counts = fill_counts(sizes, q, supply)
    owner, _ = owners_from_counts(counts, labels, rng)
    return owner
