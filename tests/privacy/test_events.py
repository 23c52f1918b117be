"""Event serialization: explicit JSON dicts, round trips, refusal of unknown types."""

from __future__ import annotations

import json

import dp_accounting as dpa
import pytest

from pfl_cli.errors import InputError
from pfl_cli.privacy import event_from_dict, event_key, event_to_dict, sampled_gaussian_event
from pfl_cli.privacy.events import sampled_without_replacement_gaussian_event

EVENTS = [
    dpa.GaussianDpEvent(1.1),
    dpa.LaplaceDpEvent(2.0),
    dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.1)), 1000),
    dpa.SampledWithoutReplacementDpEvent(1000, 10, dpa.GaussianDpEvent(0.9)),
    dpa.ComposedDpEvent([dpa.GaussianDpEvent(4.2), dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(5.0), 3)]),
    dpa.NonPrivateDpEvent(),
    dpa.ZCDpEvent(0.5),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_round_trip_through_json(event):
    text = json.dumps(event_to_dict(event))
    assert event_from_dict(json.loads(text)) == event


def test_format_is_an_explicit_type_tagged_dict():
    assert event_to_dict(EVENTS[2]) == {
        "type": "SelfComposedDpEvent",
        "event": {
            "type": "PoissonSampledDpEvent",
            "sampling_probability": 0.01,
            "event": {"type": "GaussianDpEvent", "noise_multiplier": 1.1},
        },
        "count": 1000,
    }


def test_event_key_is_canonical():
    assert event_key(dpa.GaussianDpEvent(1.0)) == event_key(dpa.GaussianDpEvent(1.0))
    assert event_key(dpa.GaussianDpEvent(1.0)) != event_key(dpa.GaussianDpEvent(1.5))


@pytest.mark.parametrize(
    "data, message",
    [
        ({"type": "MagicDpEvent"}, "event: unknown event type 'MagicDpEvent'"),
        ({"noise_multiplier": 1.0}, "event: unknown event type None"),
        ({"type": "GaussianDpEvent"}, "event: GaussianDpEvent is missing attribute 'noise_multiplier'."),
        ({"type": "GaussianDpEvent", "noise_multiplier": 1, "sigma": 2}, "event: GaussianDpEvent has no attribute 'sigma'"),
        ({"type": "ComposedDpEvent", "events": [{"type": "Nope"}]}, "event.events[0]: unknown event type 'Nope'"),
    ],
    ids=["unknown", "untyped", "missing", "extra", "nested"],
)
def test_bad_documents_are_refused(data, message):
    with pytest.raises(InputError) as err:
        event_from_dict(data)
    assert str(err.value).startswith(message)


def test_builders():
    assert sampled_gaussian_event(1.1, 0.01, 1000) == EVENTS[2]
    assert sampled_gaussian_event(2.0) == dpa.GaussianDpEvent(2.0)  # rate 1, one step: no wrappers
    assert sampled_without_replacement_gaussian_event(0.9, 1000, 10) == EVENTS[3]
    with pytest.raises(InputError, match=r"sampling rate must be in \(0, 1\]; got 1.5."):
        sampled_gaussian_event(1.0, 1.5)
    with pytest.raises(InputError, match="noise multiplier must be > 0; got 0.0."):
        sampled_gaussian_event(0.0, 0.5)
    with pytest.raises(InputError, match="steps must be an integer >= 1; got 0."):
        sampled_gaussian_event(1.0, 0.5, 0)
