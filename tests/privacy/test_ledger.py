"""The privacy ledger: composition, privacy.json round trips, refusals."""

from __future__ import annotations

import dataclasses
import json

import dp_accounting as dpa
import pytest

from pfl_cli.errors import InputError, PrivacyBudgetError
from pfl_cli.privacy import PrivacyLedger, compose_ledgers, compute_epsilon, gaussian_sigma, sampled_gaussian_event


def _init_ledger(unit="example", delta=1e-6):
    # FedDP-Init's four releases at the data-point split [0.2, 0.2, 0.45, 0.15] of eps_init = 1
    # (specs/clustering.md §3.5): Gaussian steps as noise multipliers, Laplace steps as scale / sensitivity.
    events = (
        dpa.GaussianDpEvent(gaussian_sigma(0.2, delta)),
        dpa.LaplaceDpEvent(1 / 0.2),
        dpa.GaussianDpEvent(gaussian_sigma(0.45, delta)),
        dpa.LaplaceDpEvent(1 / 0.15),
    )
    notes = ("step 1: outer products", "step 2: histogram", "step 3: sums", "step 3: counts")
    return PrivacyLedger(unit, delta, events, notes=notes)


def test_feddp_init_reference_composition():
    # specs/clustering.md §7.2 item 9: RDP 0.853 +- 0.01 (PLD 0.811 at a coarser discretization).
    ledger = _init_ledger()
    assert ledger.epsilon("rdp") == pytest.approx(0.853, abs=0.01)
    assert ledger.epsilon("rdp") <= 1.0  # never above the nominal sum of the step budgets


def test_privacy_json_round_trip_gives_the_same_epsilon():
    ledger = _init_ledger()
    doc = json.loads(json.dumps(ledger.to_dict("rdp")))
    assert set(doc) == {"unit", "delta", "epsilon", "accountant", "neighboring", "events", "notes"}
    assert doc["accountant"] == "rdp" and doc["events"][1] == {"type": "LaplaceDpEvent", "noise_multiplier": 5.0}
    back = PrivacyLedger.from_dict(doc)
    assert back == dataclasses.replace(ledger, accountant="rdp")  # the accountant the stage stated its epsilon by
    assert back.epsilon("rdp") == doc["epsilon"]


def test_composition_of_two_ledgers_equals_one_ledger_of_both_events():
    a = PrivacyLedger("client", 1e-6, (sampled_gaussian_event(1.2, 0.01, 100),), notes=("mdm-fit",))
    b = PrivacyLedger("client", 1e-6, (dpa.GaussianDpEvent(5.0), dpa.LaplaceDpEvent(4.0)), notes=("cluster",))
    both = PrivacyLedger("client", 1e-6, a.events + b.events)
    assert a.compose(b).epsilon("rdp") == both.epsilon("rdp")
    assert compose_ledgers([a, b]).events == both.events
    assert a.compose(b).notes == ("mdm-fit", "cluster")
    assert both.epsilon("rdp") == compute_epsilon(dpa.ComposedDpEvent(list(both.events)), 1e-6)


def test_pld_falls_back_to_rdp_when_pld_cannot_account():
    event = dpa.SampledWithoutReplacementDpEvent(100, 10, dpa.GaussianDpEvent(2.0))
    doc = PrivacyLedger("client", 1e-6, (event,), neighboring="replace").to_dict()
    assert doc["accountant"] == "rdp" and doc["epsilon"] > 0


@pytest.mark.parametrize(
    "other, message",
    [
        (PrivacyLedger("client", 1e-6), "cannot compose a ledger of privacy unit 'example' with one of unit 'client'"),
        (PrivacyLedger("example", 1e-5), "cannot compose ledgers stated at different deltas (1e-06 vs 1e-05)"),
        (PrivacyLedger("example", 1e-6, neighboring="replace"), "cannot compose ledgers under different neighbouring"),
    ],
    ids=["unit", "delta", "neighboring"],
)
def test_incompatible_ledgers_are_refused(other, message):
    with pytest.raises(PrivacyBudgetError) as err:
        PrivacyLedger("example", 1e-6).compose(other)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"unit": "example", "delta": 1e-6}, "privacy.json: missing key 'events'"),
        ({"unit": "user", "delta": 1e-6, "events": []}, "privacy.json: unit must be one of example, client; got 'user'."),
        ({"unit": "example", "delta": 2, "events": []}, "privacy.json: delta must be in the open interval (0, 1); got 2."),
        ({"unit": "example", "delta": 1e-6, "events": [{"type": "FooDpEvent"}]},
         "privacy.json: events[0]: unknown event type 'FooDpEvent'"),
        ({"unit": "example", "delta": 1e-6, "events": "x"}, "privacy.json: 'events' must be a list of events; got str."),
    ],
    ids=["missing", "unit", "delta", "event", "events-type"],
)
def test_bad_privacy_json_is_refused(doc, message):
    with pytest.raises(InputError) as err:
        PrivacyLedger.from_dict(doc)
    assert str(err.value).startswith(message)
