"""The privacy names a config is checked against, in a module that imports nothing heavy.

A refused ``privacy-account`` or ``cluster`` (a bad value, a missing flag) checks its options against
these before any accounting; ``dp_accounting`` and scipy (~2 CPU s) load only when epsilon is
computed (issue 49, finding 20). :mod:`pfl_cli.privacy.accounting` and :mod:`pfl_cli.privacy.ledger`
re-export them.
"""

from __future__ import annotations

ACCOUNTANTS = ("rdp", "pld")
NEIGHBORINGS = ("add-remove", "replace")  # the keys of accounting.NEIGHBORING
UNITS = ("example", "client")
DEFAULT_MIN_NOISE = 1e-2
DEFAULT_MAX_NOISE = 1e4
DEFAULT_MAX_STEPS = 10**7
