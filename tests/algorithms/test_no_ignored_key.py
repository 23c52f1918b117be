"""No ignored key: every key an algorithm accepts changes what it computes, or is refused (issue 39, item 3).

Generated from the registry (DESIGN.md §7), like scikit-learn's check_estimator: for every algorithm and every
field of its config, a tiny run (digits, 4 train clients, 2 rounds) with the key at a second valid value must
differ from the run at the base value in what the run yields: the selected weights, the algorithm's final
state, the metrics history, the headline numbers it reports each round, the checkpoints it hands out, and
under --dp the mechanism it releases. A second value that is refused passes too (only this key differs from a
base run that ran: the value was not ignored); a value that runs and changes nothing fails.

The second values come from the key's type, range and base value (:func:`candidates`), tried in turn until one
changes the run; strings without declared choices take theirs from :data:`OVERRIDES`. A key whose effect
needs a companion (the DP keys need --dp, backbone_tune a backbone) is run beside it (:data:`CONTEXT`), keys
that choose the client net on images (:data:`IMAGES`); a key a companion's setting may leave inert is checked a
second time beside it (:data:`BESIDE`: local_steps beside a set local_epochs). Left unchecked: the three keys of
:data:`INERT`, each with its reason, the key that acts on the written files only (:data:`WRITES`, checked where
named), the protection that changes what the server reads, not the model (:data:`PROTECTIONS`, checked where
named), and the round keys of an algorithm without rounds (:data:`ROUND_KEYS`). A new algorithm or key is covered
without new test code.

The default tier runs every key of one representative (fedrod: FedAvg's round, private heads, no DP), the
server step (server_lr, server_momentum) of every algorithm that takes one, the keys of defect 3, and every
optional tuple key off by default (FedNova's local_epochs_range: probed with tuples of its declared type, which
scalar probes never reached), and local_steps beside local_epochs on FedNova and FedAvg; the full product (every
algorithm x every key, tens of minutes on 2 busy cores) is ``slow``.
"""

from __future__ import annotations

import dataclasses

import kind_nets
import numpy as np
import pytest

from pfl_cli import registry
from pfl_cli.errors import PflxError
from pfl_cli.fl.config import KEY_RULES

# The shared tiny settings, each where the algorithm takes it (values every algorithm accepts).
BASE = {"rounds": 2, "clients_per_round": 2, "local_steps": 2, "batch_size": 8, "eval_every": 2,
        "mlp_hidden": (8,), "val_fraction": 0.2}
# A key changes nothing by design, whatever the data: why.
INERT = {
    "algorithm": "names the config's algorithm; another value is another algorithm (its own suite)",
    "device": "auto is the cpu on a machine without a GPU; the suite compares runs on one device",
    "cohort_exec": "an execution strategy (vmap or a loop) with equal results by design "
                   "(tests/fl/test_fl_cohort.py::test_every_cohort_exec_gives_the_same_numbers)",
}
# A protection (DESIGN.md section 9) changes what the server may read, not the model: the same numbers by design,
# checked where named. (Without --dp a run under secagg differs by float rounding only, sum then divide, which
# passed here as a change; under --dp it is bit-identical, which failed.)
PROTECTIONS = {
    "secagg": "the server reads the cohort's sums only and computes the same model "
              "(tests/fl/test_secagg.py::test_secagg_round_equals_the_plain_round_and_reads_no_individual_update, "
              "::test_central_dp_under_secagg_equals_dp_fedavg_bit_for_bit; where a server reads individual updates "
              "it is refused: ::test_secagg_refused_in_one_line_naming_the_individual_read)",
}
# A key that acts on the files ``pflx train`` writes, not on the run this suite observes: where that is checked.
WRITES = {"write_nonprivate": "adds the nonprivate* files of a DP run "
                              "(tests/cli/test_train_dp.py::test_write_nonprivate_adds_only_nonprivate_files)"}
# The round keys of an algorithm without rounds (``federated = False``: Local) change nothing it trains. They are
# accepted, not refused: a recipe's shared train section holds them for every algorithm it runs, Local included
# (recipes/hyperfl/lpm-digits-smoke.yaml with --set algorithm=local).
# Without rounds label_mask selects no round either: it only picks the headline metrics.json reports
# (tests/cli/test_headline_unmasked.py checks that).
ROUND_KEYS = ("rounds", "clients_per_round", "eval_every", "checkpoint_every", "label_mask")
# A key whose effect shows only beside another key: the companion settings of its run and of the base run it is
# compared with. DP: what every DP variant asks besides (public inputs only, e.g. PeFLL's fixed descriptor size).
DP = {"dp_epsilon": 8.0, "dp_clip": 1.0, "dp_population": 40, "dp_noise": "seeded", "normalize": False,
      "standardize_descriptor": False, "embed_dim": 4}
DP_KEYS = ("dp_epsilon", "dp_delta", "dp_clip", "dp_population", "dp_sampling_rate", "dp_accountant", "dp_noise",
           "write_nonprivate", "dp_mechanism", "dp_bits", "dp_min_survivors")
# The distributed mechanism's own keys act beside dp_mechanism=ddg under --secagg, on a fixed cohort (2 of the 4
# train clients) and without the central mechanism's population bound, on an algorithm that runs under --secagg
# (elsewhere they are refused). dp_mechanism itself: its ddg is refused beside the central base run's population
# bound; tests/privacy/test_distributed_dp.py runs it.
DDG_KEYS, DDG = ("dp_bits", "dp_min_survivors"), {"secagg": True, "dp_mechanism": "ddg", "clients_per_round": 2}
# Fine-tuning LoRA adapters: one fine-tuning step before each evaluation (pfl_cli.fl.finetune).
FINETUNE_LORA = {"finetune_adapters": "lora", "finetune_steps": 1}
# A CONTEXT value that stands for the algorithm's own default of that key.
DEFAULT = "<default>"
CONTEXT = {**{k: DP for k in DP_KEYS}, "server_momentum": {"server_optimizer": "sgd"},
           # local_steps acts in rounds of steps; local_epochs, where it is set (FLowDUP, LD-FedAvg, FedTTA), wins
           "local_steps": {"local_epochs": None},
           # FedALA's start phase stops on the loss's spread over ala_num_pre_loss epochs, or at ala_max_start_epochs
           "ala_threshold": {"ala_max_start_epochs": 30},
           "ala_num_pre_loss": {"ala_max_start_epochs": 30, "ala_threshold": 1.0},
           "backbone_tune": {"backbone": "resnet-micro"}, "backbone_weights": {"backbone": "resnet-micro"},
           # the LoRA keys of a full-weight method act under adapters=lora (pfl_cli.fl.adapters; a LoRA algorithm has
           # no adapters key and takes them alone), or on FedAvg's family under finetune_adapters=lora, which acts
           # where a client is fine-tuned (pfl_cli.fl.finetune; each key where the algorithm takes it)
           **{k: {"adapters": "lora", **FINETUNE_LORA} for k in ("lora_rank", "lora_alpha", "lora_dropout",
                                                                 "lora_base_weights")},
           "finetune_adapters": {"finetune_steps": 1},
           # FedExP's eps acts where its step extrapolates (eta_g > 1): clients whose updates disagree, which the
           # tiny run's two clients do at a large client lr (at the base lr eta_g = 1 whatever eps)
           "eps": {"lr": 0.5},
           # FedNova's per-client epoch range replaces local_epochs, which must then stay at its default (a set
           # local_epochs beside it is refused as ignored): small()'s local_epochs 1 is put back
           "local_epochs_range": {"local_epochs": DEFAULT},
           # Byzantine clients and robust aggregation (issue 48): a key of one attack or aggregator acts beside it,
           # on a cohort of every train client (each round meets the malicious one; f = 1 of 4 at the default)
           "attack_fraction": {"attack": "sign-flip", "clients_per_round": 4},
           "attack_scale": {"attack": "sign-flip", "clients_per_round": 4},
           "robust_fraction": {"aggregator": "trimmed-mean", "clients_per_round": 4},
           "robust_clip": {"aggregator": "norm-bound", "clients_per_round": 4},
           # a model kind's keys act on a model kind's net (a user factory: tests/kind_nets.py)
           **{k: {"model_arch": f"factory:{kind_nets.FILE}:mlp"} for k in ("model_kwargs", "model_weights", "model_head")},
           # CFL's split needs both thresholds met: eps1 and the warm-up act where some update exceeds eps2
           "cfl_eps1": {"cfl_eps2": 0.0}, "cfl_warmup_rounds": {"cfl_eps2": 0.0},
           # the LoRA targets: on an MLP with two hidden layers "fc1" adapts one of its two layers, "*" both
           "lora_targets": {"mlp_hidden": (8, 8), "adapters": "lora", **FINETUNE_LORA},
           # IA3's feed-forward layers are among its targets: beside adapter=ia3, on both of the MLP's hidden layers
           "ia3_feedforward": {"adapter": "ia3", "mlp_hidden": (8, 8)},
           # an asynchronous server (FedBuff, FedAsync) runs at most one job per train client: its concurrency acts
           # below the suite's 4 train clients; its deadline (a job's timeout) where some job is slower than it
           "concurrency": {"concurrency": 2}, "round_deadline": {"compute_speed": "uniform:0.5:4"}}
# A key checked a second time, beside a companion set where that companion could leave it inert (its own CONTEXT
# above is the setting where it acts): local_steps beside a set local_epochs, a round of epochs counting no steps
# (FedNova, FLowDUP, LD-FedAvg, FedTTA and FedOpt set local_epochs by default; --set local_epochs=E on FedAvg's
# family). There a second value must change the run or be refused (pfl_cli.fl.config.NEEDS).
BESIDE = {"local_steps": {"local_epochs": 1}}
# Keys that choose the client net act on images (digits' 8x8 vectors take only the mlp): their runs read
# digits as 1x32x32 images.
IMAGES = ("model_arch", "backbone", "backbone_tune", "backbone_weights")
# ... with a small client lr: FedTTA's LeNet on them reaches NaN in 2 rounds at its defaults (noted in issue 39's
# report), and a key's effect shows at any lr.
IMAGE_SETTINGS = {"lr": 1e-4}
# An algorithm that runs only on a pre-trained backbone (HyperFL-LPM): every run of it takes one, on images.
NEEDS_BACKBONE = {"backbone": "resnet-micro"}
# The contexts a key meets beside the plain run (DESIGN.md section 7: every algorithm x every key x every context):
# --dp with each DP unit (client-level with the Poisson rate and the population both given: every client joins at
# the rate; example-level DP-SGD), stacked runs (--seeds, tune --stack), and each partition kind.
SETTINGS = {
    "plain": {},
    "dp": {"keys": {"client": {**DP, "dp_sampling_rate": 0.25}, "example": {**DP, "dp_sampling_rate": 0.25}}},
    "stacked": {},
    "dirichlet": {"partition": "dirichlet"},
    "iid": {"partition": "iid"},
}
# The default tier runs these cases of the product and SAMPLE more drawn by a hash of their names (the same every
# run); the whole product is slow. Pinned: issue 49, finding 5 (clients_per_round under sampled client-level DP).
PINNED = {("fedavg", "clients_per_round", "dp")}
SAMPLE = 1
# Values to try where the key's type cannot give one (strings without declared choices).
OVERRIDES = {
    "client_sizes": ["S,L"],
    "dp_accountant": ["pld"],
    "dp_min_survivors": [1],
    "backbone": ["resnet-micro", "vit-micro"],
    "backbone_weights": [lambda: _backbone_file("resnet-micro")],
    # federation conditions (pfl_cli.fl.conditions): a speed distribution, a link speed, a trace of the suite's
    # 6 clients (4 train + 2 holdout) over two slots
    "compute_speed": ["uniform:1:4"],
    "network_speed": ["0.01"],
    "availability_trace": [lambda: _trace_file(6)],
    "model_kwargs": [{"width": 4}],
    "model_weights": [lambda: kind_nets.weights_file(_scratch() / "mlp.pth")],
    "model_head": ["3"],  # a Linear that is not the head (its output is not the net's): refused
    "lora_targets": ["fc1"],
    "ia3_feedforward": ["fc1"],
    "flex_ranks": ["1,2"],
    "lora_base_weights": [lambda: _lora_base_file()],
}


def small(name: str, **values) -> dict:
    """BASE, and the algorithm's own epoch/step/round counts at 1 and widths at 8, with ``values``."""
    from pfl_cli.fl.config import TrainConfig

    entry = registry.get(name)
    defaults = entry.config()
    out = {k: v for k, v in BASE.items() if k in entry.keys}
    common = {f.name for f in dataclasses.fields(TrainConfig)}
    for f in dataclasses.fields(entry.config):
        value = getattr(defaults, f.name)
        if f.name in out or f.name in common or isinstance(value, bool) or not isinstance(value, int):
            continue
        if f.name.endswith(("_epochs", "_steps", "_rounds")) and value > 1:
            out[f.name] = 1
        elif f.name.endswith(("_hidden", "_dim")) and value > 8:
            out[f.name] = 8
    out = {**out, **values}
    if (entry.algorithm.dp_unit == "client" and "clients_per_round" not in values
            and {"dp_epsilon", "dp_sampling_rate", "dp_population"} <= {k for k, v in values.items() if v is not None}):
        out.pop("clients_per_round", None)  # each client joins at the rate: a cohort size there is refused
    if "local_steps" not in values and out.get("local_epochs", getattr(defaults, "local_epochs", None)) is not None:
        out.pop("local_steps", None)  # a round of local_epochs epochs counts no steps: BASE's local_steps is refused
    return out


def candidates(name: str, key: str, base) -> list:
    """Second values of ``key`` from its type, range and ``base`` value, the likeliest to bite first."""
    field = {f.name: f for f in dataclasses.fields(registry.get(name).config)}[key]
    if key in OVERRIDES:
        return [v for v in OVERRIDES[key] if v != base]
    choices = field.metadata.get("choices")
    if choices:
        return [c for c in choices if c != base]
    if isinstance(base, bool):
        return [not base]
    kind, low, high = KEY_RULES.get(key, ("any", None, None))
    if isinstance(base, int):
        out = [base + 1, base - 1, base + 2, 2 * base + 1]
        return list(dict.fromkeys(v for v in out if (low is None or v >= low) and v != base))
    if isinstance(base, float):
        if kind in ("below1", "frac"):
            out = [base / 2 if base else 0.5, 0.9, 0.0]
        else:
            out = [base / 2 if base else 0.5, 2 * base + 1, 1e-3]
        return [v for v in out if v != base]
    if base is None:  # an optional key off by default: values of its declared type (a tuple key gets tuples)
        inner = _declared_tuple(name, key)
        if inner is not None:
            return {int: [(1, 2), (2, 3), (1,), (2,)], float: [(0.5, 1.0), (0.5,)]}.get(inner, [])
        return [1, 0.5, 1e-3, 2]
    if isinstance(base, tuple):
        return [base + (8,), (base[0] + 1,)]
    return []


def _declared_tuple(name: str, key: str):
    """The element type of ``key``'s declared type on ``name`` when it is a (possibly optional) tuple, else None."""
    import typing

    kind = typing.get_type_hints(registry.get(name).config)[key]
    arms = [a for a in typing.get_args(kind) if a is not type(None)] if typing.get_origin(kind) is typing.Union \
        else [kind]
    for arm in arms:
        if typing.get_origin(arm) is tuple and typing.get_args(arm):
            return typing.get_args(arm)[0]
    return None


def _optional_tuple(name: str, key: str) -> bool:
    """Whether ``key`` of ``name`` is a tuple key that is off (null) by default."""
    return getattr(registry.get(name).config(), key) is None and _declared_tuple(name, key) is not None


def fingerprint(name: str, images: bool = False, setting: str = "plain", **values) -> dict:
    """What a tiny run of ``name`` yields: weights, final state, history, checkpoints (flattened); ``setting``: a
    :data:`SETTINGS` entry (the partition kind it reads; "stacked": run 0 of two seeds trained as one stack)."""
    import torch

    from pfl_cli.fl.api import train_federated

    ds, part = _data(SETTINGS[setting].get("partition", "pathological"))
    x = np.kron(ds.x.reshape(-1, 1, 8, 8), np.ones((1, 1, 4, 4), dtype=ds.x.dtype)) if images else ds.x
    cfg = registry.train_config(name, **small(name, **values))
    checkpoints, progress = [], []  # what a run hands out: checkpoints, and the headline numbers it reports
    if setting == "stacked":
        from pfl_cli.fl.stack import train_stacked

        got = train_stacked(x, ds.y, ds.num_classes, part, [cfg, dataclasses.replace(cfg, seed=cfg.seed + 1)],
                            device=torch.device("cpu"),
                            on_checkpoint=[lambda c: checkpoints.append(int(c["round"])), None],
                            on_progress=lambda r, done, total, latest: r == 0 and progress.append(
                                (done, sorted(latest.items()))))[0]
        if got.error is not None:
            raise got.error
        run = got.run
    else:
        run = train_federated(x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"),
                              on_checkpoint=lambda c: checkpoints.append(int(c["round"])),
                              on_progress=lambda done, total, latest: progress.append((done, sorted(latest.items()))))
    ledger = run.dp.info() if run.dp is not None else None  # what a DP run releases about its mechanism
    return {"weights": _flat(run.model["weights"]), "state": _flat(run.algorithm.state()),
            "history": [list(r) for r in run.outcome.history] + [ledger], "checkpoints": checkpoints + progress}


def same(a: dict, b: dict) -> bool:
    if a["history"] != b["history"] or a["checkpoints"] != b["checkpoints"]:
        return False
    for part in ("weights", "state"):
        if a[part].keys() != b[part].keys():
            return False
        for k, x in a[part].items():
            y = b[part][k]
            if isinstance(x, np.ndarray) != isinstance(y, np.ndarray):
                return False
            if isinstance(x, np.ndarray) and (x.shape != y.shape or not np.array_equal(x, y)):
                return False
            if not isinstance(x, np.ndarray) and x != y:
                return False
    return True


def check_key(name: str, key: str, companions: dict | None = None, setting: str = "plain") -> str:
    """The key's verdict: "" when a second value changes the run, or every second value is refused; else what
    was ignored. The values are tried in turn until one changes the run (in a 2-round run, eval_every 3 and 4
    are alike, 1 is not). ``companions``: the key's companion settings instead of its :data:`CONTEXT` (a
    :data:`BESIDE` entry).

    The base run (the key at its base value) must run: a value refused against it is refused because of
    this key alone, which keeps the promise as a change of the run does.
    """
    companions = CONTEXT.get(key, {}) if companions is None else companions
    context, images = _context(name, key, companions=companions, setting=setting)
    try:
        reference = _base(name, images, tuple(sorted(context.items())), setting)
    except PflxError:
        if key in context or not companions:
            raise
        # the algorithm refuses the key's companion (no backbone for FedRoD's two heads): the key is tried alone
        context = {k: v for k, v in context.items() if k not in companions or k in NEEDS_BACKBONE and
                   _needs_backbone(name)}
        reference = _base(name, images, tuple(sorted(context.items())), setting)
    if key == "label_mask" and not _masking_shows(reference):
        return ""  # the key picks the masked accuracy as the headline; on this run both are equal everywhere
    base_value = getattr(registry.train_config(name, **small(name, **context)), key)
    values = candidates(name, key, base_value)
    if not values:
        return f"{name}: no second value of {key} from its type; give it one in OVERRIDES"
    ignored = []
    for value in values:
        value = value() if callable(value) else value
        try:
            got = fingerprint(name, images, setting, **{**context, key: value})
        except PflxError:
            continue  # refused: only this key differs from the base run, which ran
        if not same(got, reference):
            return ""
        if base_value == "auto":
            base_value = value  # what auto resolves to on this data (FLowDUP's embedding: mlp-x on digits)
            continue
        ignored.append(f"{value!r} gives the run of {base_value!r}")
    if ignored:
        return (f"{name}: key {key} is accepted and changes nothing ({'; '.join(ignored)}); make it act, or refuse "
                "it where it does not (Algorithm.inert_keys, pfl_cli.fl.config.NEEDS)")
    return ""  # every other value refused: the key is not ignored either


# ------------------------------------------------------------------------------------ cases
def _cases() -> list:
    cases = []
    for name, entry in registry.entries().items():
        for key in entry.keys:
            if key in INERT or key in WRITES or key in PROTECTIONS or (key in ROUND_KEYS
                                                                         and not entry.algorithm.federated):
                continue
            # ... and every optional tuple key (off by default), whose values are of no scalar's type
            default = name == "fedrod" or key in ("server_lr", "server_momentum") or _optional_tuple(name, key)
            cases.append(pytest.param(name, key, id=f"{name}-{key}",
                                      marks=() if default else pytest.mark.slow))
    return cases


@pytest.mark.parametrize("name, key", _cases())
def test_every_key_changes_the_run_or_is_refused(name, key):
    problem = check_key(name, key)
    assert not problem, problem


def _applies(name: str, key: str, setting: str) -> bool:
    entry = registry.get(name)
    if setting == "dp":  # an algorithm with a DP variant; a local-DP one runs under --dp in every setting
        return entry.algorithm.dp_unit is not None and not entry.algorithm.dp_required and key not in DP_KEYS
    if setting == "stacked":
        from pfl_cli.fl.stack import is_stackable

        return is_stackable(entry.algorithm)
    return True


def _setting_cases() -> list:
    """Every (algorithm, key) of :func:`_cases` in every setting but the plain one (tested above) where it applies;
    :data:`PINNED` and :data:`SAMPLE` drawn ones in the default tier, the rest ``slow``."""
    import zlib

    product = [(p.values[0], p.values[1], setting) for p in _cases() for setting in SETTINGS
               if setting != "plain" and _applies(p.values[0], p.values[1], setting)]
    drawn = set(sorted((c for c in product if c not in PINNED),
                       key=lambda c: zlib.crc32("/".join(c).encode()))[:SAMPLE])
    return [pytest.param(*c, id="-".join(c), marks=() if c in PINNED or c in drawn else pytest.mark.slow)
            for c in product]


@pytest.mark.parametrize("name, key, setting", _setting_cases())
def test_every_key_changes_the_run_or_is_refused_in_every_setting(name, key, setting):
    problem = check_key(name, key, setting=setting)
    assert not problem, f"{setting}: {problem}"


def _beside_cases() -> list:
    """Every algorithm taking a :data:`BESIDE` key and its companions; FedNova (local_epochs set by default) and
    FedAvg (--set local_epochs=E) in the default tier, the rest ``slow``."""
    return [pytest.param(name, key, id=f"{name}-{key}-beside-{'-'.join(companions)}",
                         marks=() if name in ("fednova", "fedavg") else pytest.mark.slow)
            for name, entry in registry.entries().items() for key, companions in BESIDE.items()
            if key in entry.keys and set(companions) <= set(entry.keys)]


@pytest.mark.parametrize("name, key", _beside_cases())
def test_key_beside_its_companion_changes_the_run_or_is_refused(name, key):
    """local_steps beside a set local_epochs (FedNova's default E = 2, or --set local_epochs=1 on FedAvg): a round
    of epochs takes no step count, so a second local_steps must change the run or be refused."""
    problem = check_key(name, key, companions=BESIDE[key])
    assert not problem, f"beside {BESIDE[key]}: {problem}"


@pytest.mark.parametrize("name, key", [(n, k) for n, e in registry.entries().items() for k in e.keys
                                        if _optional_tuple(n, k)])
def test_optional_tuple_key_is_probed_with_a_value_it_takes(name, key):
    """An optional tuple key off by default (FedNova's local_epochs_range) gets second values of its type, and at
    least one its config takes in the suite's context: scalar probes are refused, and a key whose every probe is
    refused passes the suite above without ever running."""
    context, _ = _context(name, key, backbone=False)
    values = candidates(name, key, None)
    taken = []
    for value in values:
        try:
            registry.train_config(name, **small(name, **{**context, key: value}))
        except PflxError:
            continue
        taken.append(value)
    assert taken, f"{name}: no second value of {key} in {values} is taken; give the suite one its config takes"


def test_inert_table_holds_keys_that_exist():
    """The table of inert keys stays tiny and names only keys some algorithm takes."""
    every = {k for e in registry.entries().values() for k in e.keys}
    assert set(INERT) | set(WRITES) | set(PROTECTIONS) | set(ROUND_KEYS) <= every
    assert len(INERT) <= 3 and len(WRITES) <= 1 and len(PROTECTIONS) <= 1
    for entry in registry.entries().values():  # a declared inert key is a field of its config, not listed as taken
        fields = {f.name for f in dataclasses.fields(entry.config)}
        assert set(entry.algorithm.inert_keys) <= fields - set(entry.keys), entry.name


@pytest.mark.parametrize("name", [n for n, e in registry.entries().items() if e.algorithm.inert_keys])
def test_inert_keys_refused_in_every_layer(name):
    """A key an algorithm declares inert is refused whatever its value and wherever it is set: one line."""
    from pfl_cli.errors import ConfigError
    from pfl_cli.registry import get, resolve_train_config
    from pfl_cli.tune.space import resolve_space

    entry = get(name)
    for key in entry.algorithm.inert_keys:
        default = getattr(entry.config(), key)
        for layer in ("file_values", "flag_values", "overrides"):
            with pytest.raises(ConfigError, match=f"{key} has no effect on algorithm '{name}' because"):
                resolve_train_config(**{layer: {"algorithm": name, key: default}})
        with pytest.raises(ConfigError, match=f"--space {key} has no effect"):
            resolve_space(entry, {key: "float:0.1:0.9"})
        with pytest.raises(ConfigError, match=f"{key} has no effect on algorithm '{name}'"):
            registry.train_config(name, **{key: default})
        other = candidates(name, key, default)[0]
        other = other() if callable(other) else other
        with pytest.raises(ConfigError, match=f"{key} has no effect on algorithm '{name}'"):  # a config built in Python
            dataclasses.replace(entry.config(), **{key: other}).validate()


# ------------------------------------------------------------------------------------ helpers
_BASES: dict = {}
_DATA: dict = {}


def _context(name: str, key: str, backbone: bool = True, companions: dict | None = None,
             setting: str = "plain") -> tuple[dict, bool]:
    """The companion settings of ``key``'s runs (and of the base run) on ``name``, and whether they read images.
    ``backbone=False`` skips the base run that tells whether ``name`` needs a backbone (config checks only);
    ``companions`` replaces the key's :data:`CONTEXT` entry; ``setting`` adds its :data:`SETTINGS` keys."""
    entry = registry.get(name)
    dp = {**DP, "dp_sampling_rate": 0.25} if entry.algorithm.dp_unit == "example" else DP
    if key in DDG_KEYS and entry.algorithm.dp_unit == "client" and entry.algorithm.__dict__.get("individual_reads") == "":
        dp = {**{k: v for k, v in DP.items() if k != "dp_population"}, **DDG}
    context = dict(dp) if entry.algorithm.dp_required else {}  # a local-DP algorithm runs only under --dp
    extra = SETTINGS[setting].get("keys", {})
    context.update(extra.get(entry.algorithm.dp_unit, {}) if "client" in extra or "example" in extra else extra)
    if key not in DP_KEYS or entry.algorithm.dp_unit is not None:  # no DP variant: its DP keys alone
        context.update(dp if key in DP_KEYS else CONTEXT.get(key, {}) if companions is None else companions)
    needs_backbone = backbone and _needs_backbone(name)
    if needs_backbone:
        context = {**NEEDS_BACKBONE, **context}
    defaults = entry.config()
    context = {k: getattr(defaults, k) if v == DEFAULT else v for k, v in context.items() if k in entry.keys}
    images = key in IMAGES or needs_backbone
    if images:
        context = {**{k: v for k, v in IMAGE_SETTINGS.items() if k != key}, **context}
    return context, images


PARTITIONS = {  # each partition kind a setting reads: 6 clients, 2 of them holdout
    "pathological": dict(scheme="pathological", classes_per_client=2, class_shares="equal"),
    "dirichlet": dict(scheme="dirichlet", alpha=0.3),
    "iid": dict(scheme="iid"),
}


def _data(kind: str = "pathological"):
    if kind not in _DATA:
        from pfl_cli.data import load_dataset
        from pfl_cli.partition import PartitionConfig, partition_labels
        from pfl_cli.rng import make_rng

        ds = load_dataset("builtin:digits")
        cfg = PartitionConfig(**PARTITIONS[kind], num_clients=6, holdout_clients=2, test_fraction=0.3)
        _DATA[kind] = (ds, partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(0, "partition"),
                                            pool=ds.pool))
    return _DATA[kind]


def _base(name: str, images: bool, context: tuple, setting: str = "plain") -> dict:
    if (name, images, context, setting) not in _BASES:
        _BASES[(name, images, context, setting)] = fingerprint(name, images, setting, **dict(context))
    return _BASES[(name, images, context, setting)]


def _needs_backbone(name: str) -> bool:
    """Whether ``name`` refuses to run without a backbone (its plain base run is refused for want of one)."""
    try:
        _base(name, False, ())
    except PflxError as err:
        return "backbone" in str(err)
    return False


def _masking_shows(run: dict) -> bool:
    """Whether a run's history has an evaluation whose label-masked accuracy differs from the plain one."""
    rows = {(r[0], r[1], r[2]): r[3] for r in run["history"] if isinstance(r, list)}
    return any(v != rows.get((rnd, group, metric + "_lm")) for (rnd, group, metric), v in rows.items()
               if metric in ("mean_accuracy", "pooled_accuracy"))


def _scratch():
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp(prefix="pflx-keys-"))


def _backbone_file(name: str) -> str:
    """A state dict of the backbone ``name`` unlike its seeded random weights (every entry 0.01), in a temp dir."""
    import tempfile
    from pathlib import Path

    import torch

    from pfl_cli.models.pretrained import PretrainedNet

    path = Path(tempfile.mkdtemp(prefix="pflx-keys-")) / f"{name}.pth"
    net = PretrainedNet(name, (1, 32, 32), 10, "adapters")
    torch.save({k: torch.full_like(v, 0.01) for k, v in net.backbone.state_dict().items()}, path)
    return str(path)


def _trace_file(clients: int) -> str:
    """An availability trace over ``clients`` clients and two time slots: half of them online in each."""
    import tempfile
    from pathlib import Path

    path = Path(tempfile.mkdtemp(prefix="pflx-keys-")) / "trace.csv"
    rows = [("1,0" if i % 2 else "0,1") for i in range(clients)]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def _lora_base_file() -> str:
    """A state dict of the LoRA algorithms' base net in this suite (digits' MLP 64-8-10) unlike its seeded random
    weights (every entry 0.01), in a temp dir."""
    import tempfile
    from pathlib import Path

    import torch

    from pfl_cli.models import build, client_spec

    path = Path(tempfile.mkdtemp(prefix="pflx-keys-")) / "base.pt"
    net = build(client_spec("mlp", (64,), 10, BASE["mlp_hidden"]))
    torch.save({k: torch.full_like(v, 0.01) for k, v in net.state_dict().items()}, path)
    return str(path)


def _flat(tree, prefix: str = "") -> dict:
    import torch

    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_flat(v, f"{prefix}/{k}"))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(_flat(v, f"{prefix}/{i}"))
    elif torch.is_tensor(tree):
        out[prefix] = tree.detach().cpu().double().numpy().copy()
    elif hasattr(tree, "state") and callable(tree.state):  # a ClientState
        out.update(_flat(tree.state(), prefix))
    else:
        out[prefix] = tree
    return out
