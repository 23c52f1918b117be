"""The federation-condition keys of ``pflx train`` checked before any data is read (no torch import).

A condition key away from its default makes the run a run under conditions
(:func:`conditions_active`); an algorithm declares what it can run under (class attributes of
:class:`pfl_cli.algorithms.base.Algorithm`: ``conditions_refused``, ``partial_work``,
``compressible_upload``), and a product it cannot run is refused here, in one line, before any work.
"""

from __future__ import annotations

import math
from pfl_cli.errors import ConfigError

# key -> its default: a run with every one at its default runs no condition (the plain round loop)
CONDITION_DEFAULTS = {"availability": 1.0, "availability_trace": "", "trace_slot_seconds": None, "dropout": 0.0,
                      "compute_speed": "1",
                      "network_speed": "inf", "round_deadline": None, "over_selection": 0.0, "compression": "none"}
# keys whose values depend on which clients a round drew (the clock, the deadline, over-selection, the
# compressor's error memory): under --dp the Poisson cohort is the mechanism's secret, so they are refused there
NOT_UNDER_DP = ("compute_speed", "network_speed", "round_deadline", "over_selection", "compression",
                "trace_slot_seconds")
# keys of a synchronous round's selection, which an asynchronous server (pfl_cli.fl.asynchronous) has not
NOT_ASYNCHRONOUS = ("availability", "availability_trace", "trace_slot_seconds", "over_selection")
SPEED_FORMS = "NUMBER, uniform:LO:HI, lognormal:MEDIAN:SIGMA or file:PATH"


def set_conditions(cfg) -> list[str]:
    """The condition keys ``cfg`` sets away from their defaults."""
    return [k for k, d in CONDITION_DEFAULTS.items() if getattr(cfg, k, d) != d]


def conditions_active(cfg) -> bool:
    return bool(set_conditions(cfg))


def parse_speed(spec: str, name: str) -> tuple:
    """``"2"`` -> ("const", 2.0); ``"uniform:LO:HI"``, ``"lognormal:MEDIAN:SIGMA"``, ``"file:PATH"``.

    >>> parse_speed("uniform:0.5:2", "compute_speed")
    ('uniform', 0.5, 2.0)
    >>> parse_speed("inf", "network_speed")
    ('const', inf)
    """
    text = str(spec).strip()
    kind, _, rest = text.partition(":")
    fix = f"give {name} as {SPEED_FORMS}"
    if kind == "file" and rest:  # read (and checked) when training starts: predict never opens it
        return ("file", rest)
    try:
        numbers = [float(v) for v in rest.split(":")] if rest else []
        if not rest:
            value = float(kind)
    except ValueError:
        raise ConfigError(f"{name} must be {SPEED_FORMS} with numbers; got {spec!r}.") from None
    if not rest:
        if not value > 0 or math.isnan(value):
            raise ConfigError(f"{name} must be > 0; got {spec!r}. {fix[0].upper() + fix[1:]}.")
        return ("const", value)
    if kind not in ("uniform", "lognormal") or len(numbers) != 2 or not all(math.isfinite(v) for v in numbers):
        raise ConfigError(f"{name} must be {SPEED_FORMS}; got {spec!r}.")
    a, b = numbers
    if kind == "uniform" and not 0 < a <= b:
        raise ConfigError(f"{name}: uniform:LO:HI needs 0 < LO <= HI; got {spec!r}.")
    if kind == "lognormal" and not (a > 0 and b >= 0):
        raise ConfigError(f"{name}: lognormal:MEDIAN:SIGMA needs MEDIAN > 0 and SIGMA >= 0; got {spec!r}.")
    return (kind, a, b)


def refusal(cls) -> str:
    """Why algorithm class ``cls`` cannot run under federation conditions ("" when it can)."""
    if not getattr(cls, "federated", True):
        return "it trains no federated rounds (each client trains alone)"
    return getattr(cls, "conditions_refused", "")


def check_conditions(cfg) -> None:
    """Every rule of the condition keys, and the algorithm's declared capabilities, in one line each."""
    keys = set_conditions(cfg)
    if not keys:
        return
    cls = cfg.algorithm_class
    why = refusal(cls) if cls is not None else ""
    if why:
        raise ConfigError(f"{', '.join(keys)}: algorithm {cfg.algorithm!r} cannot run under federation conditions: "
                          f"{why}; drop {', '.join(keys)}.")
    if cfg.availability <= 0:
        raise ConfigError(f"availability must be in (0, 1] (no client would ever answer at 0); got {cfg.availability}.")
    if cfg.compression_density <= 0:
        raise ConfigError(f"compression_density must be in (0, 1]; got {cfg.compression_density}.")
    for name in ("compute_speed", "network_speed"):
        parse_speed(getattr(cfg, name), name)
    if cfg.availability_trace and cfg.availability != 1.0:
        raise ConfigError(f"availability and availability_trace: give one of them (the trace says who is online); "
                          f"got availability={cfg.availability} and availability_trace={cfg.availability_trace!r}.")
    if cfg.over_selection and cfg.clients_per_round is None:
        raise ConfigError(f"over_selection selects more than clients_per_round clients; clients_per_round is null "
                          f"(every train client); got over_selection={cfg.over_selection}. Set clients_per_round.")
    if cfg.compression != "none" and not getattr(cls, "compressible_upload", False):
        raise ConfigError(f"compression: algorithm {cfg.algorithm!r} does not upload a model delta (what topk, qsgd "
                          f"and sign compress); got compression={cfg.compression!r}. Drop it, or use a method whose "
                          "upload is one (`pflx algorithms NAME` says, under conditions).")
    if getattr(cls, "asynchronous", False):
        bad = [k for k in keys if k in NOT_ASYNCHRONOUS]
        if bad:
            raise ConfigError(f"{', '.join(bad)}: algorithm {cfg.algorithm!r} aggregates updates as they arrive "
                              "(asynchronously), with no rounds of selected clients to be online or over-selected in; "
                              "under it use dropout, round_deadline (a job's timeout), compute_speed and "
                              "network_speed.")
    if cfg.dp_epsilon is not None:
        bad = [k for k in keys if k in NOT_UNDER_DP]
        if bad:
            raise ConfigError(f"{', '.join(bad)} under --dp: they depend on which clients the private Poisson sample "
                              "drew (the clock, the deadline, the compressor's memory), which --dp does not release; "
                              "under --dp use availability, availability_trace and dropout only.")
