"""What a DP stage may release, and the checks every DP stage runs before it reads private data.

The release contract (the artifact side lives in :mod:`pfl_cli.artifacts`): under ``--dp``
every file of an artifact -- and every number a stage prints -- is

(a) ``mechanism``: the output of a mechanism whose events are in ``privacy.json``;
(b) ``post-processing``: a function of such outputs and of public inputs only (the config,
    public data such as a server dataset, user-given bounds);
(c) ``nonprivate``: a diagnostic computed on the private data, off by default, written only
    with ``--write-nonprivate`` to a file named ``nonprivate*`` and flagged in the manifest.

Bounds that calibrate noise (a maximum client size, clip norms, a radius) are public
inputs: given by the user or computed from public data, never from the private data.

``delta < 1/n``. The usual rule ties delta to the number n of privacy units, but n is
private: a stage that refused to run when ``delta >= n`` would release one bit about n
(whether the artifact exists) outside its ledger. pflx therefore checks the rule against
a *public* population bound ``population=N`` (the most privacy units the data can hold,
e.g. the number of enrolled users), before any private data is read; without it the rule
is not checked by the stage, and ``privacy.json`` says so (``population: null``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from pfl_cli.errors import ConfigError

DEFAULT_DELTA = 1e-6
_NAMES = {"eps": "epsilon", "epsilon": "epsilon", "delta": "delta", "clip": "clip", "population": "population",
          "noise": "noise"}


@dataclass(frozen=True)
class DPSpec:
    """A parsed, validated ``--dp eps=E[,delta=D][,clip=C][,population=N][,noise=secure|seeded]``."""

    epsilon: float
    delta: float = DEFAULT_DELTA
    clip: float | None = None
    population: int | None = None
    noise: str = "secure"   # where the mechanisms draw from: pfl_cli.privacy.randomness


def _number(key: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"--dp {key} must be a number; got {raw!r}.") from None
    if not math.isfinite(value):
        raise ConfigError(f"--dp {key} must be finite; got {raw!r}.")
    return value


def parse_dp_spec(text: str, *, keys: Iterable[str] = ("eps", "delta", "clip", "population", "noise"),
                  default_delta: float = DEFAULT_DELTA) -> DPSpec:
    """Parse and validate a ``--dp`` value; every error is one :class:`ConfigError` line.

    Parameters
    ----------
    text : str
        ``eps=E[,delta=D][,clip=C][,population=N][,noise=secure|seeded]`` (``epsilon=`` also accepted).
        ``noise`` (always accepted) is where the mechanisms draw: ``secure`` (OS entropy, the default) or
        ``seeded`` (repeatable from the published seed: simulation only).
    keys : iterable of str
        The keys this stage takes (``epsilon`` is always accepted as ``eps``).
    default_delta : float, default=1e-6

    Examples
    --------
    >>> parse_dp_spec("eps=1,delta=1e-6")
    DPSpec(epsilon=1.0, delta=1e-06, clip=None, population=None, noise='secure')
    >>> parse_dp_spec("eps=0")
    Traceback (most recent call last):
    ...
    pfl_cli.errors.ConfigError: --dp eps must be > 0; got 0.0. Example: --dp eps=1,delta=1e-6
    """
    from pfl_cli.privacy.randomness import DEFAULT_NOISE, check_noise

    keys = tuple(dict.fromkeys([*keys, "noise"]))
    allowed = set(keys) | ({"epsilon"} if "eps" in keys else set())
    usage = "eps=E" + "".join(f"[,{k}={k[0].upper()}]" for k in keys if k not in ("eps", "noise"))
    usage += "[,noise=secure|seeded]"
    values: dict[str, float] = {}
    noise = DEFAULT_NOISE
    for part in (p.strip() for p in str(text).split(",") if p.strip()):
        key, sep, raw = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in allowed:
            raise ConfigError(f"--dp takes {usage}; got {text!r}. Example: --dp eps=1,delta=1e-6")
        if key == "noise":
            noise = check_noise(raw.strip().lower())
            continue
        values[_NAMES[key]] = _number(key, raw.strip())
    if "epsilon" not in values:
        raise ConfigError(f"--dp needs eps=E; got {text!r}. Example: --dp eps=1,delta=1e-6")
    eps, delta = values["epsilon"], values.get("delta", default_delta)
    if eps <= 0:
        raise ConfigError(f"--dp eps must be > 0; got {eps!r}. Example: --dp eps=1,delta=1e-6")
    if not 0 < delta < 1:
        raise ConfigError(f"--dp delta must be in the open interval (0, 1); got {delta!r}.")
    clip = values.get("clip")
    if clip is not None and clip <= 0:
        raise ConfigError(f"--dp clip must be > 0 (a public L2 bound on one unit's contribution); got {clip!r}.")
    population = values.get("population")
    if population is not None:
        if population < 1 or population != int(population):
            raise ConfigError(f"--dp population must be a whole number >= 1 (a public bound on the privacy units); "
                              f"got {population!r}.")
        population = int(population)
        if delta >= 1 / population:
            raise ConfigError(f"--dp delta must be < 1/population = {1 / population:.3g} (a larger delta lets a "
                              f"mechanism publish one unit's data outright); got delta {delta!r} with population "
                              f"{population}. Lower delta, e.g. delta={_suggest_delta(population):g}.")
    return DPSpec(epsilon=eps, delta=delta, clip=clip, population=population, noise=noise)


def population_note(population: int | None) -> str:
    """The ``privacy.json`` note that says how ``delta < 1/n`` was checked."""
    if population is None:
        return ("delta < 1/n not checked: n (the number of privacy units) is private and no public population "
                "bound was given (--dp ...,population=N)")
    return f"delta < 1/{population} checked against the public population bound N = {population}"


def _suggest_delta(population: int) -> float:
    return 10.0 ** math.floor(math.log10(1.0 / population ** 1.1))


def check_nonprivate_request(*, dp: bool, write_nonprivate: bool, plot: bool = False, plot_flag: str = "--plot") -> None:
    """Refuse a private-data figure under ``--dp`` unless ``--write-nonprivate`` asks for it.

    Examples
    --------
    >>> check_nonprivate_request(dp=True, write_nonprivate=True, plot=True)
    >>> check_nonprivate_request(dp=True, write_nonprivate=False, plot=True)
    Traceback (most recent call last):
    ...
    pfl_cli.errors.ConfigError: --plot with --dp draws the private data, which no mechanism releases; add --write-nonprivate to write it as nonprivate.png (flagged in manifest.json), or drop --plot.
    """
    if write_nonprivate and not dp:
        raise ConfigError("--write-nonprivate only applies with --dp (without --dp every file is a plain diagnostic); "
                          "drop it or add --dp.")
    if dp and plot and not write_nonprivate:
        raise ConfigError(f"{plot_flag} with --dp draws the private data, which no mechanism releases; add "
                          f"--write-nonprivate to write it as nonprivate.png (flagged in manifest.json), or drop "
                          f"{plot_flag}.")
