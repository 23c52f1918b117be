"""The privacy ledger every DP stage writes to ``privacy.json`` (DESIGN.md §3).

Compatibility contract. ``privacy.json`` is::

    {"unit": "example" | "client", "delta": 1e-6, "epsilon": 0.81, "accountant": "pld",
     "neighboring": "add-remove" | "replace",
     "events": [<serialized DpEvent>, ...], "notes": ["FedDP-Init step 1: ...", ...]}

``events`` (format: :mod:`pfl_cli.privacy.events`) is the audit record: ``epsilon`` and
``accountant`` are derived from it and are recomputed, never trusted, when a ledger is
read back. Keys are never removed and never change meaning.

The privacy unit is what one guarantee protects (thesis §2.4): one data point
(``example``, data-point-level DP) or all data of one client (``client``, client-level DP).
Guarantees about different units do not compose into either, so ledgers of different
units are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from dp_accounting import dp_event

from pfl_cli.errors import InputError, PrivacyBudgetError, check_param
from pfl_cli.privacy.accounting import check_accountant, check_delta, check_neighboring, compute_epsilon
from pfl_cli.privacy.events import event_from_dict, event_to_dict

from pfl_cli.privacy.choices import UNITS  # noqa: E402,F401 - re-exported


@dataclass(frozen=True)
class PrivacyLedger:
    """What a DP stage released, as dp_accounting events, plus the guarantee's terms.

    Parameters
    ----------
    unit : {"example", "client"}
        The privacy unit protected.
    delta : float
        The delta at which the stage states its epsilon, in (0, 1).
    events : tuple of DpEvent
        Every release, in order (e.g. one event per FedDP-Init step).
    neighboring : {"add-remove", "replace"}, default="add-remove"
    notes : tuple of str, default=()
        One human line per event or step, e.g. "FedDP-Init step 1: sum of outer products".
    accountant : {"rdp", "pld"} or None, default=None
        The accountant the stage calibrated with and stated its epsilon by (``privacy.json``'s
        ``accountant``); ``pflx privacy-account`` uses it by default, so that it prints the
        stage's own epsilon. None: not recorded (a composition of ledgers of different ones).

    Examples
    --------
    >>> from dp_accounting import GaussianDpEvent, LaplaceDpEvent
    >>> a = PrivacyLedger("example", 1e-6, (GaussianDpEvent(4.2),))
    >>> b = PrivacyLedger("example", 1e-6, (LaplaceDpEvent(5.0),))
    >>> len(a.compose(b).events)
    2
    """

    unit: str
    delta: float
    events: tuple = ()
    neighboring: str = "add-remove"
    notes: tuple = field(default=())
    accountant: str | None = None

    def __post_init__(self) -> None:
        check_param("unit", self.unit in UNITS, f"must be one of {', '.join(UNITS)}", self.unit)
        if self.accountant is not None:
            check_accountant(self.accountant)
        check_delta(self.delta)
        check_neighboring(self.neighboring)
        # Accept lists for convenience but store tuples, so the ledger stays immutable.
        object.__setattr__(self, "events", tuple(self.events))
        object.__setattr__(self, "notes", tuple(str(n) for n in self.notes))
        for i, event in enumerate(self.events):
            if not isinstance(event, dp_event.DpEvent):
                raise TypeError(f"events[{i}] must be a dp_accounting DpEvent; got {type(event).__name__}.")

    # -- algebra -------------------------------------------------------------------
    def compose(self, other: "PrivacyLedger") -> "PrivacyLedger":
        """Both ledgers' events in one ledger (sequential composition).

        Raises
        ------
        PrivacyBudgetError
            Different privacy units or neighbouring relations: their guarantees are about
            different things and do not add up. Different deltas: choose one first.
        """
        if self.unit != other.unit:
            raise PrivacyBudgetError(
                f"cannot compose a ledger of privacy unit {self.unit!r} with one of unit {other.unit!r}: they protect different "
                "units (one data point vs all data of one client), so their epsilons do not add up to either "
                "guarantee. Account them separately."
            )
        if self.neighboring != other.neighboring:
            raise PrivacyBudgetError(
                f"cannot compose ledgers under different neighbouring relations ({self.neighboring} vs "
                f"{other.neighboring}); account them separately."
            )
        if not math.isclose(self.delta, other.delta, rel_tol=1e-12):
            raise PrivacyBudgetError(
                f"cannot compose ledgers stated at different deltas ({self.delta:g} vs {other.delta:g}); "
                "restate one with .with_delta() first."
            )
        same = self.accountant if self.accountant == other.accountant else None
        return PrivacyLedger(self.unit, self.delta, self.events + other.events, self.neighboring,
                             self.notes + other.notes, same)

    def with_delta(self, delta: float) -> "PrivacyLedger":
        """The same events stated at another delta (events do not depend on delta)."""
        return PrivacyLedger(self.unit, delta, self.events, self.neighboring, self.notes, self.accountant)

    def event(self) -> dp_event.DpEvent:
        """All events as one ``ComposedDpEvent``."""
        return dp_event.ComposedDpEvent(list(self.events))

    def epsilon(self, accountant: str = "pld") -> float:
        """Epsilon of all events together at ``self.delta``."""
        return compute_epsilon(self.event(), self.delta, accountant=accountant, neighboring=self.neighboring)

    # -- privacy.json ------------------------------------------------------------------
    def to_dict(self, accountant: str = "pld") -> dict[str, Any]:
        """The ``privacy.json`` document, with epsilon computed by ``accountant``.

        PLD (the default, the tighter of the two) cannot account every event, e.g.
        sampling without replacement; then the RDP accountant answers, and the document's
        ``accountant`` says which one did.
        """
        check_accountant(accountant)
        try:
            epsilon = self.epsilon(accountant)
        except InputError:
            if accountant != "pld":
                raise
            accountant, epsilon = "rdp", self.epsilon("rdp")
        return {
            "unit": self.unit,
            "delta": self.delta,
            "epsilon": epsilon if math.isfinite(epsilon) else None,
            "accountant": accountant,
            "neighboring": self.neighboring,
            "events": [event_to_dict(e) for e in self.events],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "privacy.json") -> "PrivacyLedger":
        """Read a ``privacy.json`` document; ``epsilon`` is ignored (recomputed), ``accountant`` kept as the default.

        Raises
        ------
        InputError
            A missing key, an unknown event type, or a field out of range.
        """
        if not isinstance(data, Mapping):
            raise InputError(f"{where}: expected a JSON object; got {type(data).__name__}.")
        for key in ("unit", "delta", "events"):
            if key not in data:
                raise InputError(f"{where}: missing key {key!r}; a privacy ledger needs unit, delta and events.")
        events = data["events"]
        if not isinstance(events, Sequence) or isinstance(events, (str, bytes)):
            raise InputError(f"{where}: 'events' must be a list of events; got {type(events).__name__}.")
        notes = data.get("notes", [])
        if not isinstance(notes, Sequence) or isinstance(notes, (str, bytes)):
            raise InputError(f"{where}: 'notes' must be a list of strings; got {type(notes).__name__}.")
        parsed = tuple(event_from_dict(e, where=f"{where}: events[{i}]") for i, e in enumerate(events))
        try:
            return cls(data["unit"], data["delta"], parsed, data.get("neighboring", "add-remove"), tuple(notes),
                       data.get("accountant"))
        except InputError as err:
            raise InputError(f"{where}: {err}") from None


def compose_ledgers(ledgers: Sequence[PrivacyLedger]) -> PrivacyLedger:
    """Fold :meth:`PrivacyLedger.compose` over ``ledgers`` (at least one)."""
    check_param("ledgers", len(ledgers) >= 1, "must hold at least one ledger", len(ledgers))
    total = ledgers[0]
    for ledger in ledgers[1:]:
        total = total.compose(ledger)
    return total
