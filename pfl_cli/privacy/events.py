"""dp_accounting events as plain JSON: the audit record of every DP stage.

Compatibility contract. An event is written as a JSON object whose ``"type"`` is the
name of its ``dp_accounting.dp_event`` class and whose other keys are exactly that
class's attributes, nested events written the same way, recursively::

    {"type": "SelfComposedDpEvent", "count": 1000,
     "event": {"type": "PoissonSampledDpEvent", "sampling_probability": 0.01,
               "event": {"type": "GaussianDpEvent", "noise_multiplier": 1.1}}}

The mapping follows dp_accounting's own contract (event classes and their parameters are
never removed and never change meaning), so a ``privacy.json`` written today is read,
and accounted to the same epsilon, by every later pflx. Nothing is pickled. Reading an
unknown type, a missing or unknown attribute, or a value of the wrong kind is an
:class:`~pfl_cli.errors.InputError`, never a guess.

The builders at the end (:func:`sampled_gaussian_event`, ...) make the events the DP
stages record, so every stage describes "T rounds of a sampled Gaussian" identically.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

import attr
from dp_accounting import dp_event

from pfl_cli.errors import InputError, check_param

# Every concrete event class dp_accounting defines, by name. A closed registry read from
# the library itself, so a new dp_accounting event becomes readable without code here.
EVENT_TYPES: dict[str, type] = {
    name: cls
    for name, cls in vars(dp_event).items()
    if isinstance(cls, type) and issubclass(cls, dp_event.DpEvent) and cls is not dp_event.DpEvent
}


def _field_to_json(value: Any) -> Any:
    if isinstance(value, dp_event.DpEvent):
        return event_to_dict(value)
    if isinstance(value, (list, tuple)):
        return [_field_to_json(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int) or (hasattr(value, "dtype") and getattr(value, "dtype").kind in "iu"):
        return int(value)
    number = float(value)
    if not math.isfinite(number):
        raise InputError(f"event parameter {value!r} is not finite; a privacy ledger records only finite numbers.")
    return number


def event_to_dict(event: dp_event.DpEvent) -> dict[str, Any]:
    """The JSON-ready dict of ``event`` (see the module docstring for the format).

    Examples
    --------
    >>> from dp_accounting import GaussianDpEvent
    >>> event_to_dict(GaussianDpEvent(1.5))
    {'type': 'GaussianDpEvent', 'noise_multiplier': 1.5}
    """
    if not isinstance(event, dp_event.DpEvent):
        raise TypeError(f"event must be a dp_accounting DpEvent; got {type(event).__name__}.")
    out: dict[str, Any] = {"type": type(event).__name__}
    for field in attr.fields(type(event)):
        out[field.name] = _field_to_json(getattr(event, field.name))
    return out


def _field_from_json(value: Any, where: str) -> Any:
    if isinstance(value, Mapping):
        return event_from_dict(value, where=where)
    if isinstance(value, list):
        return [_field_from_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    raise InputError(f"{where}: unexpected value {value!r} in a privacy event.")


def event_from_dict(data: Mapping[str, Any], *, where: str = "event") -> dp_event.DpEvent:
    """Rebuild a ``DpEvent`` from :func:`event_to_dict`'s output.

    Parameters
    ----------
    data : mapping
        The serialized event.
    where : str, default="event"
        Where the event sits in its document, named in error messages.

    Raises
    ------
    InputError
        Unknown ``type``, missing or unknown attributes.

    Examples
    --------
    >>> event_from_dict({"type": "LaplaceDpEvent", "noise_multiplier": 2.0})
    LaplaceDpEvent(noise_multiplier=2.0)
    """
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: expected an event object with a 'type'; got {type(data).__name__}.")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in EVENT_TYPES:
        raise InputError(
            f"{where}: unknown event type {kind!r}; known types are dp_accounting's event classes "
            "(e.g. GaussianDpEvent, PoissonSampledDpEvent, SelfComposedDpEvent, ComposedDpEvent)."
        )
    cls = EVENT_TYPES[kind]
    fields = attr.fields(cls)
    names = {f.name for f in fields}
    unknown = sorted(set(data) - names - {"type"})
    if unknown:
        raise InputError(f"{where}: {kind} has no attribute {unknown[0]!r}; its attributes are {sorted(names)}.")
    required = [f.name for f in fields if f.default is attr.NOTHING]
    missing = [name for name in required if name not in data]
    if missing:
        raise InputError(f"{where}: {kind} is missing attribute {missing[0]!r}.")
    kwargs = {name: _field_from_json(data[name], f"{where}.{name}") for name in names if name in data}
    _check_fields(kind, kwargs, where)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:
        raise InputError(f"{where}: cannot build {kind} ({err}).") from None


# What a read event's parameters must satisfy, by attribute name across dp_accounting's classes: an
# event that breaks them (a negative count, a probability of 2, zero noise) would account to a
# meaningless epsilon (a negative count composes to epsilon 0), so it is refused when read.
_COUNTS = ("count", "num_buckets", "source_dataset_size", "sample_size", "dataset_size", "truncated_batch_size",
           "step_counts", "sensitivity")
_PROBABILITIES = ("sampling_probability", "sampling_probs")
_POSITIVE = ("noise_multiplier", "standard_deviation")
_NONNEGATIVE = ("noise_parameter", "mean", "shape", "rho", "xi", "sensitivities")
_LISTS = ("events", "step_counts", "sampling_probs", "sensitivities")  # the attributes that hold lists


def _check_fields(kind: str, kwargs: Mapping[str, Any], where: str) -> None:
    def values(name: str) -> list:
        value = kwargs[name]
        return list(value) if isinstance(value, list) else [value]

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

    for name in kwargs:
        rule = None
        value = kwargs[name]
        if name == "event" and not isinstance(value, dp_event.DpEvent):
            rule = "must be an event object"
        elif name == "events" and not (isinstance(value, list) and all(isinstance(e, dp_event.DpEvent) for e in value)):
            rule = "must be a list of event objects"
        elif isinstance(value, list) and name not in _LISTS:  # a list would pass the rules below vacuously
            rule = "must be a single value, not a list"
        elif name in _LISTS and name != "events" and not (isinstance(value, list) and value):
            rule = "must be a non-empty list"
        elif name in _COUNTS and not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                                       for v in values(name)):
            rule = "must be an integer >= 1"
        elif name in _PROBABILITIES and not all(number(v) and 0 < v <= 1 for v in values(name)):
            rule = "must be a probability in (0, 1]"
        elif name in _POSITIVE and not all(number(v) and v > 0 for v in values(name)):
            rule = "must be a finite number > 0"
        elif name in _NONNEGATIVE and not all(number(v) and v >= 0 for v in values(name)):
            rule = "must be a finite number >= 0"
        if rule:
            raise InputError(f"{where}: {kind}.{name} {rule}; got {kwargs[name]!r}. The ledger is invalid; "
                             "re-create it with the stage that wrote it.")
    if kind == "SampledWithoutReplacementDpEvent" and kwargs["sample_size"] > kwargs["source_dataset_size"]:
        raise InputError(f"{where}: {kind}.sample_size {kwargs['sample_size']} exceeds source_dataset_size "
                         f"{kwargs['source_dataset_size']}. The ledger is invalid; re-create it.")


def event_key(event: dp_event.DpEvent) -> str:
    """A canonical string of ``event``: equal events give equal keys (cache keys, hashes)."""
    return json.dumps(event_to_dict(event), sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------------------- builders
def _check_rate(sampling_rate: float) -> float:
    ok = isinstance(sampling_rate, (int, float)) and not isinstance(sampling_rate, bool)
    check_param("sampling rate", ok and 0 < sampling_rate <= 1, "must be in (0, 1]", sampling_rate)
    return float(sampling_rate)


def _check_noise(noise_multiplier: float) -> float:
    ok = isinstance(noise_multiplier, (int, float)) and not isinstance(noise_multiplier, bool)
    check_param(
        "noise multiplier", ok and math.isfinite(noise_multiplier) and noise_multiplier > 0, "must be > 0", noise_multiplier
    )
    return float(noise_multiplier)


def _check_steps(steps: int) -> int:
    ok = isinstance(steps, int) and not isinstance(steps, bool)
    check_param("steps", ok and steps >= 1, "must be an integer >= 1", steps)
    return int(steps)


def sampled_gaussian_event(
    noise_multiplier: float, sampling_rate: float | None = None, steps: int = 1
) -> dp_event.DpEvent:
    """``steps`` Poisson-sampled Gaussian releases: DP-SGD / DP-FedAvg (anchors §8.1).

    ``SelfComposed(PoissonSampled(q, Gaussian(z)), T)``. With ``sampling_rate=None``
    there is no sampling (every record takes part in every step) and the event is
    ``SelfComposed(Gaussian(z), T)``, which is also valid under replace-one
    neighbouring. A rate, even 1.0, is always recorded as Poisson sampling: the ledger
    says exactly what was assumed.

    Examples
    --------
    >>> sampled_gaussian_event(1.1, 0.01, 1000)  # doctest: +NORMALIZE_WHITESPACE
    SelfComposedDpEvent(event=PoissonSampledDpEvent(sampling_probability=0.01,
        event=GaussianDpEvent(noise_multiplier=1.1)), count=1000)
    >>> sampled_gaussian_event(2.0)
    GaussianDpEvent(noise_multiplier=2.0)
    """
    step: dp_event.DpEvent = dp_event.GaussianDpEvent(_check_noise(noise_multiplier))
    if sampling_rate is not None:
        step = dp_event.PoissonSampledDpEvent(_check_rate(sampling_rate), step)
    return _repeat(step, _check_steps(steps))


def sampled_without_replacement_gaussian_event(
    noise_multiplier: float, population: int, sample_size: int, steps: int = 1
) -> dp_event.DpEvent:
    """``steps`` Gaussian releases on fixed-size cohorts drawn without replacement.

    dp_accounting accounts this only with the RDP accountant under replace-one
    neighbouring.
    """
    ok = isinstance(population, int) and isinstance(sample_size, int) and 1 <= sample_size <= population
    check_param("cohort size", ok, "must be an integer in [1, population]", sample_size)
    step = dp_event.SampledWithoutReplacementDpEvent(
        population, sample_size, dp_event.GaussianDpEvent(_check_noise(noise_multiplier))
    )
    return _repeat(step, _check_steps(steps))


def laplace_event(scale_over_sensitivity: float, steps: int = 1) -> dp_event.DpEvent:
    """``steps`` Laplace releases with noise scale / L1 sensitivity = ``scale_over_sensitivity``."""
    check_param("laplace noise multiplier", scale_over_sensitivity > 0, "must be > 0", scale_over_sensitivity)
    return _repeat(dp_event.LaplaceDpEvent(float(scale_over_sensitivity)), _check_steps(steps))


def _repeat(event: dp_event.DpEvent, steps: int) -> dp_event.DpEvent:
    return event if steps == 1 else dp_event.SelfComposedDpEvent(event, steps)
