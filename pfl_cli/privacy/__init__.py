"""Differential privacy shared by every DP stage: mechanisms, the ledger, accounting.

- :mod:`~pfl_cli.privacy.mechanisms` -- Gaussian (analytic or classic) and Laplace
  calibration, L2/L1 clipping, noise draws from an explicit generator (thesis §2.4).
- :mod:`~pfl_cli.privacy.events` -- dp_accounting events to and from plain JSON.
- :mod:`~pfl_cli.privacy.ledger` -- :class:`PrivacyLedger`, the ``privacy.json`` document.
- :mod:`~pfl_cli.privacy.accounting` -- epsilon by RDP or PLD, noise and steps calibration.
- :mod:`~pfl_cli.privacy.query` -- the four questions ``pflx privacy-account`` answers.
- :mod:`~pfl_cli.privacy.release` -- the DP release contract's checks: ``--dp`` parsing
  (eps > 0, delta in (0, 1) and < 1/population, clip > 0) and ``--write-nonprivate``.
- :mod:`~pfl_cli.privacy.audit` -- the empirical privacy audit (Clopper-Pearson lower bound
  on epsilon); :mod:`~pfl_cli.privacy.audit_cases` applies it to every release of pflx.

The DP release contract
-----------------------
An (epsilon, delta) that pflx prints is a promise to the people whose data was used. Under
``--dp`` every file a stage writes, and every number it prints, is one of:

(a) ``mechanism`` -- the output of a mechanism whose dp_accounting events are in
    ``privacy.json``;
(b) ``post-processing`` -- a function of mechanism outputs and of public inputs only: the
    config, public data (a server dataset), user-given bounds; ``privacy.json`` itself;
(c) ``nonprivate`` -- a diagnostic computed on the private data. Off by default; written
    only with ``--write-nonprivate`` to a file named ``nonprivate*``.

``manifest.json`` carries ``"dp": true`` and a ``"release"`` class per output file
(:class:`pfl_cli.artifacts.ArtifactWriter` with ``dp=True`` refuses to finish otherwise),
and withholds the hashes of private inputs. Bounds that calibrate noise -- a maximum client
size, clip norms, a radius -- are public: given by the user or computed from public data,
never from the private data; a stage that needs one and lacks it says so and exits 2. No
exact count of the private data (clients, cohort sizes, points, clipped fractions, costs)
is released. ``delta < 1/n`` is checked against a public population bound
(``population=N``), because n itself is private. :func:`pfl_cli.manifest.check_release_contract`
checks a finished artifact file by file.
"""

from pfl_cli.lazy import lazy_names

# Lazy (PEP 562): importing one submodule (fl.loop needs privacy.randomness in every run) must not
# load dp_accounting and much of scipy, seconds of start-up a run without --dp never uses (issue 26).
_EXPORTS = {
    "ACCOUNTANTS": "choices",
    "NEIGHBORING": "accounting",
    "NoiseCalibration": "accounting",
    "StepsCalibration": "accounting",
    "cache_clear": "accounting",
    "cache_info": "accounting",
    "calibrate_noise": "accounting",
    "compute_epsilon": "accounting",
    "max_steps": "accounting",
    "event_from_dict": "events",
    "event_key": "events",
    "event_to_dict": "events",
    "laplace_event": "events",
    "sampled_gaussian_event": "events",
    "sampled_without_replacement_gaussian_event": "events",
    "UNITS": "choices",
    "PrivacyLedger": "ledger",
    "compose_ledgers": "ledger",
    "clip_l1": "mechanisms",
    "clipped_gaussian_sum": "mechanisms",
    "clip_l2": "mechanisms",
    "gaussian_noise": "mechanisms",
    "gaussian_sigma": "mechanisms",
    "laplace_noise": "mechanisms",
    "laplace_scale": "mechanisms",
    "symmetric_gaussian_noise": "mechanisms",
}


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)


__all__ = [
    "ACCOUNTANTS",
    "NEIGHBORING",
    "UNITS",
    "NoiseCalibration",
    "PrivacyLedger",
    "StepsCalibration",
    "cache_clear",
    "cache_info",
    "calibrate_noise",
    "clip_l1",
    "clip_l2",
    "clipped_gaussian_sum",
    "compose_ledgers",
    "compute_epsilon",
    "event_from_dict",
    "event_key",
    "event_to_dict",
    "gaussian_noise",
    "gaussian_sigma",
    "laplace_event",
    "laplace_noise",
    "laplace_scale",
    "max_steps",
    "sampled_gaussian_event",
    "sampled_without_replacement_gaussian_event",
    "symmetric_gaussian_noise",
]
