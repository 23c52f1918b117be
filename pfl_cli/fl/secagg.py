"""Secure aggregation, simulated by construction: the server's step receives sums, never a client's update.

Secure aggregation (Bonawitz et al., CCS 2017, "Practical Secure Aggregation for Privacy-Preserving
Machine Learning", §3) lets the server learn the sum of the cohort's vectors and nothing else about
any one of them. pflx simulates the protocol, not its cryptography: each cohort client's contribution
(a row of its own, computed from its own data and the model it was sent) goes into :func:`secure_sum`,
which adds the rows up and keeps only the totals and the number of contributors. The server step of
an algorithm under ``--secagg`` (``aggregate_secure``) takes that :class:`SecureSum` and nothing
else: its ``total()`` and ``count()`` are all there is to read.

An algorithm declares what its server would have to read one client at a time (``individual_reads``,
a class attribute of :class:`pfl_cli.algorithms.base.Algorithm`); "" means it runs under secure
aggregation, and ``--secagg`` on any other is refused in one line naming that quantity
(:func:`check_secagg`). :func:`audit_individual_reads` is the instrument of the tests: under it every
contribution is overwritten with NaN as soon as it has been summed, so a server step that reads an
individual update by any path (a stashed reference, a closure) computes NaN.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Mapping

# the contribution that carries a client's weight (its fit size) beside its weighted model
WEIGHT = "__weight__"

_AUDIT = [False]


class SecureSum:
    """What the server learns from a round of secure aggregation: the sum of the rows, and how many there were.

    Built by :func:`secure_sum` only; it holds the totals and the count and no reference to the rows.
    ``modulus``: the totals are integers modulo it (the distributed-DP path, whose clients send integer
    vectors mod ``2**bits``), or None for real-valued sums.
    """

    __slots__ = ("_total", "_count", "_modulus")

    def __init__(self, total: dict, count: int, modulus: int | None = None) -> None:
        self._total, self._count, self._modulus = total, int(count), modulus

    def total(self) -> dict:
        """``{name: tensor}``: the sum over the cohort of each contribution (a copy the server may change)."""
        return {k: v.clone() for k, v in self._total.items()}

    def count(self) -> int:
        """How many clients contributed to the sum."""
        return self._count

    @property
    def modulus(self) -> int | None:
        return self._modulus

    def __repr__(self) -> str:
        return f"SecureSum(names={sorted(self._total)}, count={self._count}, modulus={self._modulus})"


def secure_sum(contributions: Mapping[str, Any], *, modulus: int | None = None, spent: tuple = ()) -> SecureSum:
    """The protocol, simulated: ``{name: (c, ...) rows}``, row i client i's own -> the :class:`SecureSum`.

    With ``modulus`` the rows are integers (int64) and the sum is taken modulo it, as the protocol's
    arithmetic in Z_m (Bonawitz et al. 2017, §3: inputs in Z_R). The rows are not kept; under
    :func:`audit_individual_reads` they are overwritten with NaN (or -1 for integers) once summed, and so are
    the per-client tensors of ``spent`` (dicts of stacked tensors the rows were computed from: the cohort's
    trained models, which stay on the clients' devices).
    """
    rows = dict(contributions)
    counts = {int(v.shape[0]) for v in rows.values()}
    if len(counts) > 1:
        raise ValueError(f"secure_sum: every contribution needs one row per client; got row counts {sorted(counts)}")
    count = counts.pop() if counts else 0
    total = {}
    for k, v in rows.items():
        s = v.sum(0)
        total[k] = s.remainder(modulus) if modulus is not None else s
    if _AUDIT[0]:
        for v in [*rows.values(), *(v for d in spent for v in d.values())]:
            v.fill_(-1 if not v.is_floating_point() else float("nan"))
    return SecureSum(total, count, modulus)


@contextmanager
def audit_individual_reads():
    """While active, :func:`secure_sum` poisons the rows it summed (NaN): the test that a server step under
    ``--secagg`` reads no individual update (it would compute NaN), whatever path it took to one."""
    before = _AUDIT[0]
    _AUDIT[0] = True
    try:
        yield
    finally:
        _AUDIT[0] = before


def individual_reads(cls) -> str | None:
    """What ``cls``'s server reads one client at a time ("" : nothing, it runs under --secagg), or None when
    the algorithm does not declare it (a plugin: refused under --secagg)."""
    return cls.__dict__.get("individual_reads")


def check_secagg(cfg) -> None:
    """Refuse ``--secagg`` in one line on an algorithm whose server reads individual updates."""
    from pfl_cli.errors import ConfigError

    if not getattr(cfg, "secagg", False):
        return
    cls = cfg.algorithm_class
    reads = individual_reads(cls)
    if reads is None:
        raise ConfigError(f"--secagg: algorithm {cfg.algorithm!r} does not declare what its server reads "
                          "(individual_reads), so it cannot be run under secure aggregation; drop --secagg.")
    if reads:
        raise ConfigError(f"--secagg: the {cfg.algorithm} server would read {reads}, and secure aggregation reveals "
                          "only the cohort's sum; drop --secagg, or use an algorithm that runs under it "
                          "(docs/privacy/secure-aggregation.md).")
    # the protections and conditions whose server step reads each upload (issue 48's trade-off, issue 47's codecs)
    if getattr(cfg, "aggregator", "mean") != "mean":
        raise ConfigError(f"--secagg: aggregator {cfg.aggregator!r} reads each client's update (a robust rule ranks or "
                          "clips them one by one), and secure aggregation reveals only the cohort's sum; drop "
                          "--secagg or --set aggregator=mean.")
    if getattr(cfg, "compression", "none") != "none":
        raise ConfigError(f"--secagg: compression {cfg.compression!r} is decoded per client (each upload's own "
                          "sparsity pattern or scale), and secure aggregation sums fixed-length rows; drop --secagg "
                          "or --compression.")


def table_rows(algorithms: Mapping[str, type]) -> list[tuple[str, str, str]]:
    """``(name, runs under --secagg, what breaks it)`` for every algorithm of a registry, in its order."""
    rows = []
    for name, cls in algorithms.items():
        reads = individual_reads(cls)
        if reads is None:
            rows.append((name, "no", "not declared"))
        else:
            rows.append((name, "no" if reads else "yes", reads or "-"))
    return rows


TABLE_BEGIN = "<!-- secagg-table: generated by tests/fl/test_secagg.py from the registry; do not edit -->"
TABLE_END = "<!-- /secagg-table -->"


def table_markdown(algorithms: Mapping[str, type]) -> str:
    """The docs table (docs/privacy/secure-aggregation.md) between its markers."""
    lines = [TABLE_BEGIN, "", "| algorithm | runs under `--secagg` | what its server would read individually |",
             "|---|---|---|"]
    lines += [f"| `{n}` | {ok} | {why} |" for n, ok, why in table_rows(algorithms)]
    return "\n".join(lines + ["", TABLE_END])


def cohort_mean(store, cohort, theta: dict, *, by_size: bool = True, secagg: bool = False) -> dict:
    """The server's average of the cohort's models ``theta`` (c, ...): :func:`pfl_cli.fl.params.weighted_mean`, or
    under ``--secagg`` the same mean from sums only.

    Each client sends ``n_i theta_i`` and ``n_i`` (its fit size; 1 each for a uniform mean), secure aggregation sums
    them, and the server divides the sums: McMahan et al. 2017 Alg. 1's weighted mean, equal to the plain one to
    the float rounding of sum-then-divide (tests/fl/test_secagg.py). The models are spent (audited) once summed.
    """
    import torch

    from pfl_cli.fl.params import weighted_mean

    if not secagg:
        return weighted_mean(store, cohort, theta, by_size=by_size)
    n = store.fit.length[cohort].to(torch.float32) if by_size else torch.ones(len(cohort), device=cohort.device)
    rows = {k: v * n.view(-1, *([1] * (v.dim() - 1))) for k, v in theta.items()}
    sums = secure_sum({**rows, WEIGHT: n}, spent=(theta,)).total()
    weight = sums.pop(WEIGHT).clamp_min(1.0)
    return {k: v / weight for k, v in sums.items()}
