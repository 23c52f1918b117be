"""Benchmark: `pflx privacy-account` queries (issue 3 targets).

Times, each from a cold cache: an RDP epsilon query, a PLD epsilon query and an RDP noise
calibration on the DP-SGD event ``SelfComposed(PoissonSampled(q=0.01, Gaussian(z)), 1000)``
(anchors-frameworks §8.5), then the same RDP query repeated, which the epsilon cache
answers; the cold/warm ratio is measured in this run. Targets: RDP < 0.1 s, PLD < 2 s,
calibration < 1 s, and a repeated query answered from the cache.
"""

from __future__ import annotations

import sys
import time

from verdict import Verdicts

from pfl_cli.privacy import cache_clear, cache_info, calibrate_noise, compute_epsilon, sampled_gaussian_event

Q, Z, T, DELTA, TARGET_EPS = 0.01, 1.1, 1000, 1e-5, 1.0


def cold(fn, repeats: int = 3) -> float:
    """Best of ``repeats`` runs, each after emptying the cache, so nothing is remembered."""
    times = []
    for _ in range(repeats):
        cache_clear()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def warm(fn, repeats: int = 1000) -> float:
    """Mean time of ``repeats`` identical queries after one that fills the cache."""
    cache_clear()
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> dict[str, float]:
    def rdp_query():
        return compute_epsilon(sampled_gaussian_event(Z, Q, T), DELTA, accountant="rdp")

    def pld_query():
        return compute_epsilon(sampled_gaussian_event(Z, Q, T), DELTA, accountant="pld")

    def calibration():
        return calibrate_noise(lambda z: sampled_gaussian_event(z, Q, T), TARGET_EPS, DELTA, accountant="rdp")

    t_rdp, t_pld, t_cal = cold(rdp_query), cold(pld_query, 2), cold(calibration)
    t_cached = warm(rdp_query)
    hits = cache_info().hits
    cal = calibration()
    print(f"privacy-account: SelfComposed(PoissonSampled(q={Q}, Gaussian(z)), T={T}), delta={DELTA}")
    v = Verdicts()
    v.check(f"RDP epsilon (z={Z})", f"{t_rdp * 1e3:.2f} ms", "< 100 ms", t_rdp < 0.1)
    v.check(f"PLD epsilon (z={Z})", f"{t_pld * 1e3:.2f} ms", "< 2000 ms", t_pld < 2.0)
    v.check(f"RDP calibration (eps={TARGET_EPS})", f"{t_cal * 1e3:.2f} ms", "< 1000 ms", t_cal < 1.0)
    v.note("  calibrated", f"z={cal.noise_multiplier:.4f} in {cal.evaluations} evaluations")
    v.check("repeated RDP query (cached)", f"{t_cached * 1e3:.4f} ms", "< 1 ms", t_cached < 0.001 and hits > 0)
    v.note("cache speed-up (cold / cached)", f"{t_rdp / t_cached:.0f}x")
    return {"rdp_s": t_rdp, "pld_s": t_pld, "calibration_s": t_cal, "cached_s": t_cached, "ratio": t_rdp / t_cached,
            "exit": v.finish()}


if __name__ == "__main__":
    sys.exit(main()["exit"])
