"""Empirical privacy audit report: each release's empirical epsilon lower bound beside its claim.

    python benchmarks/privacy_audit_report.py            # full audit (minutes)
    python benchmarks/privacy_audit_report.py --fast     # the fast tier's trial counts (seconds)

Prints one Markdown row per mechanism (the table in README.md) and exits non-zero when a
correct mechanism's claim is refuted or the deliberately broken mechanism is not caught.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from pfl_cli.privacy import audit_cases as cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="fast-tier trial counts")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    tier = cases.FAST_TRIALS if args.fast else cases.SLOW_TRIALS
    print(f"confidence {cases.CONFIDENCE}, trials per neighbour: {tier}, seed {args.seed}\n")
    print("| mechanism | claimed epsilon | delta | empirical lower bound | trials | verdict |")
    print("|---|---:|---:|---:|---:|---|")
    failures = 0
    for name, run in {**cases.CASES, **cases.BROKEN}.items():
        t0 = time.perf_counter()
        result = run(cases.trials_for(name, tier), np.random.default_rng(args.seed))
        expected = name not in cases.BROKEN
        ok = result.passed == expected
        failures += not ok
        verdict = ("ok" if result.passed else "REFUTED") + ("" if ok else " (UNEXPECTED)")
        if not expected and not result.passed:
            verdict = "refuted, as it must be"
        print(f"| {name} | {result.claimed_epsilon:.3f} | {result.delta:g} | {result.epsilon_lower_bound:.3f} | "
              f"{result.trials:,} | {verdict} |  <!-- {time.perf_counter() - t0:.1f} s -->", flush=True)
    print(f"\n{'all as expected' if not failures else f'{failures} UNEXPECTED verdict(s)'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
