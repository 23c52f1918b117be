"""Each benchmark figure printed beside its target, the exit status that says whether all were met, timing.

    v = Verdicts()
    v.check("pflx core (dirichlet)", f"{secs:.3f} s", "< 2 s", secs < 2)
    sys.exit(v.finish())   # 1 when any target was missed
"""

from __future__ import annotations

import time


def best_of(fn, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn()`` (seconds): the least disturbed by other jobs."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


class Verdicts:
    def __init__(self) -> None:
        self.missed: list[str] = []
        self.checked = 0

    def check(self, label: str, figure: str, target: str, ok: bool) -> bool:
        self.checked += 1
        if not ok:
            self.missed.append(label)
        print(f"  {label:<46} {figure:>22}   target {target:<16} {'ok' if ok else 'MISSED'}", flush=True)
        return ok

    def note(self, label: str, figure: str) -> None:
        """A figure without a target (context for the ones with)."""
        print(f"  {label:<46} {figure:>22}", flush=True)

    def finish(self) -> int:
        if self.missed:
            print(f"  MISSED {len(self.missed)} of {self.checked} targets: {'; '.join(self.missed)}", flush=True)
            return 1
        return 0
