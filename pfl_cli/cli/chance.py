"""The near-chance warning of ``train`` and ``predict`` (issue 33): a run whose defaults did not learn says so.

A run that ends at chance looks like any other run in its table; this adds one warning line
on stderr (``pflx: warning: ...``, the Reporter's warn, nothing with ``--format quiet``) that
names ``pflx tune``.

The rule: a group's **unmasked** mean accuracy below chance + 5 points, chance being 1/C for
C classes. Why these choices:

- *Unmasked*, whatever the headline: its chance level is 1/C for every model. Label masking
  raises a client's chance to 1/(its own classes), 50 % for two classes a client, so a masked
  headline at chance would pass a 1/C rule unseen.
- *An absolute 5 points*, not a ratio: 1.5 x chance is 75 % for two classes (a model may
  honestly stop there) and 1.5 % for 100 classes (half a point above chance); 5 points is
  "within a few points of chance" for any C (15 % for digits' 10 classes, 55 % for 2).
- Only values a run releases: a ``--dp`` train artifact releases no accuracies (its diagnostics
  on private data are not a release), so it never warns; predict's accuracies are its own
  result on the clients it was given and are judged like train's.
"""

from __future__ import annotations

import math

MARGIN = 0.05  # points above chance (as a fraction) under which a run warns


def chance_level(num_classes: int) -> float:
    """Accuracy of uniform guessing over ``num_classes`` classes."""
    return 1.0 / max(int(num_classes), 1)


def near_chance(accuracies: dict[str, float | None], num_classes: int, algorithm: str) -> str | None:
    """The warning line for the groups (name -> unmasked mean accuracy) under chance + MARGIN; None if none is.

    A group with no score (None, NaN: unlabeled clients not scored) is not judged.
    """
    chance = chance_level(num_classes)
    low = {g: a for g, a in accuracies.items() if a is not None and math.isfinite(a) and a < chance + MARGIN}
    if not low:
        return None
    which = " and ".join(f"the {g} clients' {100 * a:.1f}%" for g, a in low.items())
    return (f"{which} unmasked mean accuracy {'is' if len(low) == 1 else 'are'} within {100 * MARGIN:.0f} points of "
            f"chance ({100 * chance:.1f}% for {num_classes} classes): {algorithm}'s settings may not suit this task; "
            f"`pflx tune --algorithm {algorithm}` searches them on validation data.")
