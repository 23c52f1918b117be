"""The four questions ``pflx privacy-account`` answers ("give two, get the third").

1. epsilon from noise: noise multiplier, sampling rate, steps, delta -> epsilon;
2. noise from epsilon: epsilon, sampling rate, steps, delta -> the smallest noise multiplier;
3. steps from epsilon and noise -> the most steps that fit;
4. composition: the ledgers of earlier DP stages -> epsilon of all their events together.

:func:`answer` validates a :class:`PrivacyAccountConfig`, picks the direction from the
fields that are set, and returns a :class:`PrivacyReport` whose ``statement`` says in
plain words what is protected and under which sampling assumption (in the manner of
TF Privacy's ``compute_dp_sgd_privacy`` statement).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from typing import TYPE_CHECKING

from pfl_cli.errors import InputError, check_param
from pfl_cli.privacy.choices import ACCOUNTANTS, DEFAULT_MAX_NOISE, DEFAULT_MAX_STEPS, DEFAULT_MIN_NOISE, NEIGHBORINGS, UNITS
from pfl_cli.schema import register_choices

# dp_accounting (and scipy, ~2 CPU s) load when an answer is computed, after every option is checked:
# a refusal never pays for them (issue 49, finding 20).
if TYPE_CHECKING:
    from dp_accounting import dp_event

    from pfl_cli.privacy.ledger import PrivacyLedger

SAMPLING = ("poisson", "without-replacement")
_RELATION_WORDS = {"add-remove": "adding or removing", "replace": "replacing"}
_UNIT_WORDS = {"example": "example (one data point)", "client": "client (all data of one client)"}


@dataclass(frozen=True)
class PrivacyAccountConfig:
    """Options of ``pflx privacy-account``; each field is one flag (``--noise-multiplier``...)."""

    noise_multiplier: Optional[float] = None
    sampling_rate: Optional[float] = None
    population: Optional[int] = None
    cohort_size: Optional[int] = None
    steps: Optional[int] = None
    epsilon: Optional[float] = None
    delta: Optional[float] = None
    accountant: str = "auto"   # auto: a ledger's own (the tightest for a composition); rdp for a mechanism
    neighboring: str = "add-remove"
    sampling: str = "poisson"
    unit: str = "example"
    max_noise: float = DEFAULT_MAX_NOISE
    max_steps: int = DEFAULT_MAX_STEPS


register_choices(PrivacyAccountConfig, accountant=("auto", *ACCOUNTANTS, "all"), neighboring=NEIGHBORINGS,
                 sampling=SAMPLING, unit=UNITS)


@dataclass(frozen=True)
class PrivacyReport:
    """The answer to one question; ``to_dict`` is the ``--format json`` document."""

    direction: str
    epsilon: float
    delta: float
    accountant: str
    neighboring: str
    unit: str
    events: tuple
    statement: str
    noise_multiplier: Optional[float] = None
    sampling_rate: Optional[float] = None
    steps: Optional[int] = None
    target_epsilon: Optional[float] = None
    by_accountant: dict = field(default_factory=dict)
    tighter: Optional[str] = None
    notes: tuple = ()

    def ledger(self) -> PrivacyLedger:
        from pfl_cli.privacy.ledger import PrivacyLedger

        return PrivacyLedger(self.unit, self.delta, self.events, self.neighboring, self.notes)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "direction": self.direction,
            "epsilon": _finite(self.epsilon),
            "delta": self.delta,
            "accountant": self.accountant,
            "neighboring": self.neighboring,
            "unit": self.unit,
            "noise_multiplier": self.noise_multiplier,
            "sampling_rate": self.sampling_rate,
            "steps": self.steps,
            "target_epsilon": self.target_epsilon,
            "events": [_event_to_dict(e) for e in self.events],
            "statement": self.statement,
            "notes": list(self.notes),
        }
        if self.by_accountant:
            out["by_accountant"] = {k: {**v, "epsilon": _finite(v.get("epsilon"))} for k, v in self.by_accountant.items()}
            out["tighter"] = self.tighter
        return out


def _event_to_dict(event) -> dict:
    from pfl_cli.privacy.events import event_to_dict

    return event_to_dict(event)


def _finite(x: Optional[float]) -> Optional[float]:
    return x if x is None or math.isfinite(x) else None


# ---------------------------------------------------------------------------- validation
def _number(name: str, value: Any, *, integer: bool = False) -> Any:
    """Config-file values may arrive as strings ("1e-5"): coerce, or say what was wrong."""
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
        if integer:
            check_param(name, number.is_integer(), "must be a whole number", value)
            return int(number)
        return number
    except (TypeError, ValueError):
        raise InputError(f"{name} must be a number; got {value!r}.") from None


def _validated(cfg: PrivacyAccountConfig) -> dict[str, Any]:
    v = {
        "noise_multiplier": _number("--noise-multiplier", cfg.noise_multiplier),
        "sampling_rate": _number("--sampling-rate", cfg.sampling_rate),
        "population": _number("--population", cfg.population, integer=True),
        "cohort_size": _number("--cohort-size", cfg.cohort_size, integer=True),
        "steps": _number("--steps", cfg.steps, integer=True),
        "epsilon": _number("--epsilon", cfg.epsilon),
        "delta": _number("--delta", cfg.delta),
        "max_noise": _number("--max-noise", cfg.max_noise),
        "max_steps": _number("--max-steps", cfg.max_steps, integer=True),
    }
    check_param("--accountant", cfg.accountant in ("auto", *ACCOUNTANTS, "all"), "must be one of auto, rdp, pld, all",
                cfg.accountant)
    check_param("--neighboring", cfg.neighboring in NEIGHBORINGS, "must be add-remove or replace", cfg.neighboring)
    check_param("--sampling", cfg.sampling in SAMPLING, f"must be one of {', '.join(SAMPLING)}", cfg.sampling)
    check_param("--unit", cfg.unit in UNITS, f"must be one of {', '.join(UNITS)}", cfg.unit)
    if v["noise_multiplier"] is not None:
        check_param("--noise-multiplier", v["noise_multiplier"] > 0, "must be > 0", v["noise_multiplier"])
    if v["sampling_rate"] is not None:
        check_param("--sampling-rate", 0 < v["sampling_rate"] <= 1, "must be in (0, 1]", v["sampling_rate"])
    if v["steps"] is not None:
        check_param("--steps", v["steps"] >= 1, "must be >= 1", v["steps"])
    if v["epsilon"] is not None:
        check_param("--epsilon", v["epsilon"] > 0, "must be > 0", v["epsilon"])
    if v["delta"] is not None:
        check_param("--delta", 0 < v["delta"] < 1, "must be in the open interval (0, 1)", v["delta"])
    check_param("--max-noise", v["max_noise"] > DEFAULT_MIN_NOISE, "must be > 0.01", v["max_noise"])
    check_param("--max-steps", v["max_steps"] >= 1, "must be >= 1", v["max_steps"])
    return v


def _sampling_rate(v: dict[str, Any], cfg: PrivacyAccountConfig) -> tuple[Optional[float], list[str]]:
    pop, cohort, rate = v["population"], v["cohort_size"], v["sampling_rate"]
    if (pop is None) != (cohort is None):
        raise InputError("--population and --cohort-size go together (sampling rate = cohort / population); give both.")
    if pop is not None:
        if rate is not None:
            raise InputError("give either --sampling-rate or --population with --cohort-size, not both.")
        check_param("--population", pop >= 1, "must be >= 1", pop)
        check_param("--cohort-size", 1 <= cohort <= pop, f"must be in [1, population {pop}]", cohort)
        return cohort / pop, []
    if cfg.sampling == "without-replacement":
        raise InputError("--sampling without-replacement needs --population and --cohort-size (fixed-size cohorts).")
    if rate is None:
        return None, ["no --sampling-rate given: every unit takes part in every step (no sampling amplification)."]
    return rate, []


def _delta(v: dict[str, Any]) -> tuple[float, list[str]]:
    if v["delta"] is not None:
        return v["delta"], []
    if v["population"] is not None and v["population"] > 1:
        # A common rule (anchors-frameworks §8.4): delta well below 1/N, so that the
        # guarantee cannot be met by releasing one whole record of the population.
        delta = float(v["population"]) ** -1.1
        return delta, [f"no --delta given: using delta = 1/population^1.1 = {delta:.3g}."]
    raise InputError("--delta is required (e.g. --delta 1e-5; it should be well below 1/population).")


# ---------------------------------------------------------------------------- answering
def answer(cfg: PrivacyAccountConfig, ledgers: Sequence[tuple[str, PrivacyLedger]] = ()) -> PrivacyReport:
    """Answer the question ``cfg`` asks; ``ledgers`` (name, ledger) pairs select composition.

    Raises
    ------
    InputError
        Contradictory or missing options, or bad values (one line each).
    PrivacyBudgetError
        A target no noise level (or step count) in the search range can meet.
    """
    v = _validated(cfg)
    if ledgers:
        return _compose(cfg, v, ledgers)
    given = {k for k in ("noise_multiplier", "epsilon") if v[k] is not None}
    if not given:
        raise InputError(
            "nothing to account: give --noise-multiplier (-> epsilon), --epsilon (-> noise multiplier), both "
            "(-> steps), or artifact directories holding privacy.json (-> their composition)."
        )
    if given == {"noise_multiplier", "epsilon"} and v["steps"] is not None:
        raise InputError("--epsilon, --noise-multiplier and --steps all given: give two of them and pflx computes the third.")
    rate, notes = _sampling_rate(v, cfg)
    delta, delta_notes = _delta(v)
    notes += delta_notes
    make = _event_factory(cfg, v, rate)
    names = ACCOUNTANTS if cfg.accountant == "all" else ("rdp" if cfg.accountant == "auto" else cfg.accountant,)
    if given == {"noise_multiplier"}:
        return _epsilon_direction(cfg, v, make, rate, delta, names, notes)
    if given == {"epsilon"}:
        return _noise_direction(cfg, v, make, rate, delta, names, notes)
    return _steps_direction(cfg, v, make, rate, delta, names, notes)


def _event_factory(cfg: PrivacyAccountConfig, v: dict[str, Any], rate: Optional[float]) -> Callable[[float, int], dp_event.DpEvent]:
    from pfl_cli.privacy.events import sampled_gaussian_event, sampled_without_replacement_gaussian_event

    if cfg.sampling == "without-replacement":
        return lambda z, t: sampled_without_replacement_gaussian_event(z, v["population"], v["cohort_size"], t)
    return lambda z, t: sampled_gaussian_event(z, rate, t)


def _side_by_side(run: Callable[[str], Any], names: Sequence[str], better: Callable[[Any], float]) -> tuple[str, Any, dict]:
    """Run each accountant; keep the tighter answer, and each one's result or error."""
    results, table = {}, {}
    for name in names:
        try:
            results[name] = run(name)
        except InputError as err:
            if len(names) == 1:
                raise
            table[name] = {"error": str(err)}
    if not results:
        raise InputError(" ".join(t["error"] for t in table.values()))
    best = min(results, key=lambda n: better(results[n]))
    return best, results, table


def _epsilon_direction(cfg, v, make, rate, delta, names, notes) -> PrivacyReport:
    from pfl_cli.privacy.accounting import compute_epsilon

    z, steps = v["noise_multiplier"], v["steps"] or 1
    event = make(z, steps)
    best, res, table = _side_by_side(
        lambda a: compute_epsilon(event, delta, accountant=a, neighboring=cfg.neighboring), names, lambda e: e
    )
    table.update({a: {"epsilon": e} for a, e in res.items()})
    eps = res[best]
    head = f"{_guarantee(eps, delta, cfg.unit, best)}: {_mechanism(z, rate, steps, cfg, v)}."
    return _report("epsilon", eps, delta, best, cfg, event, head, z, rate, steps, None, table, names, notes)


def _noise_direction(cfg, v, make, rate, delta, names, notes) -> PrivacyReport:
    from pfl_cli.privacy.accounting import calibrate_noise

    target, steps = v["epsilon"], v["steps"] or 1

    def run(acc: str):
        return calibrate_noise(
            lambda z: make(z, steps), target, delta, accountant=acc, neighboring=cfg.neighboring, max_noise=v["max_noise"]
        )

    best, res, table = _side_by_side(run, names, lambda c: c.noise_multiplier)
    table.update({a: {"noise_multiplier": c.noise_multiplier, "epsilon": c.epsilon} for a, c in res.items()})
    cal = res[best]
    if cal.at_lower_bound:
        notes.append(f"even the smallest noise searched ({cal.noise_multiplier:g}) meets the target; less may too.")
    head = (
        f"Noise multiplier {cal.noise_multiplier:.6g} is the smallest that keeps "
        f"{_mechanism(None, rate, steps, cfg, v)} within epsilon {target:g} at delta {delta:g}. "
        f"{_guarantee(cal.epsilon, delta, cfg.unit, best)}."
    )
    return _report("noise", cal.epsilon, delta, best, cfg, cal.event, head, cal.noise_multiplier, rate, steps, target,
                   table, names, notes)


def _steps_direction(cfg, v, make, rate, delta, names, notes) -> PrivacyReport:
    from pfl_cli.privacy.accounting import max_steps

    target, z = v["epsilon"], v["noise_multiplier"]

    def run(acc: str):
        return max_steps(
            lambda t: make(z, t), target, delta, accountant=acc, neighboring=cfg.neighboring, limit=v["max_steps"]
        )

    best, res, table = _side_by_side(run, names, lambda c: -c.steps)
    table.update({a: {"steps": c.steps, "epsilon": c.epsilon} for a, c in res.items()})
    cal = res[best]
    if cal.at_upper_bound:
        notes.append(f"the search stopped at --max-steps {cal.steps}; more steps may fit.")
    head = (
        f"At most {cal.steps} steps fit within epsilon {target:g} at delta {delta:g}: "
        f"{_mechanism(z, rate, cal.steps, cfg, v)}. {_guarantee(cal.epsilon, delta, cfg.unit, best)}."
    )
    return _report("steps", cal.epsilon, delta, best, cfg, cal.event, head, z, rate, cal.steps, target,
                   table, names, notes)


def _compose(cfg: PrivacyAccountConfig, v: dict[str, Any], ledgers: Sequence[tuple[str, PrivacyLedger]]) -> PrivacyReport:
    from pfl_cli.privacy.ledger import compose_ledgers

    flags = [f for f, k in (("--noise-multiplier", "noise_multiplier"), ("--epsilon", "epsilon"), ("--steps", "steps"),
                            ("--sampling-rate", "sampling_rate"), ("--population", "population")) if v[k] is not None]
    if flags:
        raise InputError(f"{flags[0]} does not apply when composing ledgers: pass either artifact directories or "
                         "mechanism flags, not both.")
    deltas = {name: ledger.delta for name, ledger in ledgers}
    first_name, first = ledgers[0]
    for name, ledger in ledgers[1:]:
        if ledger.unit != first.unit:
            raise InputError(
                f"cannot compose {first_name} ({first.unit}-level) with {name} ({ledger.unit}-level): they protect "
                "different units (one data point vs all data of one client), so their epsilons do not add up to "
                "either guarantee. Account them separately."
            )
        if not math.isclose(ledger.delta, first.delta, rel_tol=1e-9):
            raise InputError(
                f"mismatched delta: {first_name} states its guarantee at delta {first.delta:g} but {name} at "
                f"{ledger.delta:g}. Re-run the stages with one delta before composing their ledgers."
            )
    if v["delta"] is not None and not math.isclose(v["delta"], first.delta, rel_tol=1e-9):
        raise InputError(
            f"mismatched delta: --delta {v['delta']:g} but the ledgers state delta {first.delta:g}. Drop --delta or "
            "pass the ledgers' delta."
        )
    total = compose_ledgers([ledger for _, ledger in ledgers])
    names, why = _ledger_accountants(cfg.accountant, ledgers)
    best, res, table = _side_by_side(total.epsilon, names, lambda e: e)
    table.update({a: {"epsilon": e} for a, e in res.items()})
    eps = res[best]
    head = (
        f"{len(ledgers)} ledger(s) ({', '.join(deltas)}) composed, {len(total.events)} release(s) in all. "
        f"{_guarantee(eps, total.delta, total.unit, best)}."
    )
    body = [head, f"Accountant: {best.upper()}, {why}."]
    body += _above_claims(eps, best, total.delta, ledgers)
    body += [f"Neighbouring datasets differ by {_RELATION_WORDS[total.neighboring]} one {total.unit}."]
    body += [f"- {n}" for n in total.notes]
    multi = cfg.accountant == "all"
    return PrivacyReport(
        "compose", eps, total.delta, best, total.neighboring, total.unit, total.events, "\n".join(body),
        by_accountant=table if multi else {}, tighter=best if multi else None, notes=total.notes,
    )


def _ledger_accountants(requested: str, ledgers: Sequence[tuple[str, PrivacyLedger]]) -> tuple[tuple, str]:
    """The accountants to run on ledgers, and the words that say why (issue 21: one epsilon per artifact).

    ``auto``: one ledger's own accountant (the one its stage calibrated with and stated its
    epsilon by); for a composition, or a ledger that records none, the tightest valid one (every
    accountant gives a valid upper bound, so the smallest holds).
    """
    if requested == "all":
        return ACCOUNTANTS, "the tighter of those run side by side"
    if requested != "auto":
        return (requested,), "as --accountant asks"
    if len(ledgers) == 1 and ledgers[0][1].accountant is not None:
        return (ledgers[0][1].accountant,), f"the one {ledgers[0][0]} calibrated with (--accountant overrides)"
    return ACCOUNTANTS, "the tightest valid one of rdp and pld (--accountant overrides)"


def _above_claims(eps: float, accountant: str, delta: float, ledgers: Sequence[tuple[str, PrivacyLedger]]) -> list[str]:
    """A line for every way the printed epsilon exceeds what the stages themselves stated, saying why."""
    claims = []
    for name, ledger in ledgers:
        if ledger.accountant is None:
            return []
        try:
            claims.append((name, ledger.accountant, ledger.epsilon(ledger.accountant)))
        except InputError:
            return []
    slack = 1e-9 * max(1.0, abs(eps))
    if len(claims) == 1:
        name, own, claim = claims[0]
        if eps > claim + slack:
            return [f"Note: this epsilon is above the {claim:.4g} that {name} states by the {own.upper()} accountant, "
                    f"because the {accountant.upper()} accountant's bound is looser for these releases; both are "
                    f"valid upper bounds, so the smaller ({claim:.4g}) holds."]
        return []
    total = sum(c for _, _, c in claims)
    if eps > total + slack:
        return [f"Note: this epsilon is above the sum {total:.4g} of the stages' own epsilons because all releases "
                f"are stated at one delta {delta:g} (basic composition would state the sum at the sum of the "
                f"deltas)."]
    return []


# ---------------------------------------------------------------------------- wording
def _guarantee(eps: float, delta: float, unit: str, accountant: str) -> str:
    e = f"{eps:.4g}" if math.isfinite(eps) else "infinity (no privacy)"
    return f"The result is (epsilon = {e}, delta = {delta:g})-DP for each {_UNIT_WORDS[unit]}, by the {accountant.upper()} accountant"


def _mechanism(z: Optional[float], rate: Optional[float], steps: int, cfg: PrivacyAccountConfig, v: dict[str, Any]) -> str:
    noise = f" with noise multiplier {z:g}" if z is not None else ""
    what = f"{steps} step(s) of the Gaussian mechanism{noise}"
    if cfg.sampling == "without-replacement":
        return (f"{what}, each on a fixed cohort of {v['cohort_size']} drawn without replacement from "
                f"{v['population']} {cfg.unit}s (the guarantee assumes that sampling)")
    if rate is None:
        return f"{what}, every {cfg.unit} in every step (no sampling amplification)"
    source = f" = {v['cohort_size']}/{v['population']}" if v["population"] is not None else ""
    return (f"{what}, each step on a Poisson sample with rate {rate:g}{source} (each {cfg.unit} joins each step "
            "independently with that probability; the guarantee assumes this sampling)")


def _report(direction, eps, delta, best, cfg, event, head, z, rate, steps, target, table, names, notes) -> PrivacyReport:
    body = [head, f"Neighbouring datasets differ by {_RELATION_WORDS[cfg.neighboring]} one {cfg.unit}."]
    body += [f"Note: {n}" for n in notes]
    multi = len(names) > 1
    return PrivacyReport(
        direction, eps, delta, best, cfg.neighboring, cfg.unit, (event,), "\n".join(body), z, rate, steps, target,
        table if multi else {}, best if multi else None, tuple(notes),
    )
