"""Reader of ``privacy.json``: the ledger of DP events a stage released (one validation for every reader)."""

from __future__ import annotations

from pfl_cli.manifest import Artifact
from pfl_cli.errors import InputError
from pfl_cli.readers._rules import is_number, producer, refuse
from pfl_cli.readers.documents import _document


def read_ledger(art: Artifact, flag: str):
    """``(document, PrivacyLedger)`` of ``art``'s ``privacy.json``.

    Rules: every rule of :meth:`PrivacyLedger.from_dict` (unit, delta in (0, 1), known event
    types with parameters in range, e.g. a noise multiplier > 0), and the recorded ``epsilon``
    finite and >= 0 (or null) and ``accountant`` a string. ``show`` prints the recorded epsilon
    and ``privacy-account`` composes the events: both read the ledger here.
    """
    from pfl_cli.privacy.ledger import PrivacyLedger

    name = "privacy.json"
    doc = _document(art, flag, name)
    for key in ("unit", "neighboring", "accountant"):  # names, compared against the known ones
        if key in doc and not isinstance(doc[key], str):
            raise refuse(art, flag, name, f"{key} must be a string", doc[key])
    try:
        ledger = PrivacyLedger.from_dict(doc, where=f"{art.path}/{name}")
    except InputError as err:
        raise type(err)(str(err).rstrip(".") + f". Re-create it with `{producer(art)}`.") from None
    eps = doc.get("epsilon")
    if eps is not None and not (is_number(eps) and eps >= 0):
        raise refuse(art, flag, name, "epsilon must be a finite number >= 0", eps)
    return doc, ledger

