"""Every algorithm ``pflx train`` runs: its name -> (algorithm class, config class), built-ins and plugins.

The one place that knows which algorithms exist. ``cli/``, ``attack/`` and the plugin loader read
it; the engine (``pfl_cli.fl``) never does: it is handed a config whose class names its algorithm.

A third-party package adds an algorithm through the entry-point group ``pflx.algorithms``
(``name = "module:Class"``); the class subclasses :class:`pfl_cli.algorithms.base.Algorithm` and
declares ``name`` and ``config`` (a frozen dataclass extending :class:`pfl_cli.fl.config.TrainConfig`).
A plugin that fails to import, clashes with a known name or declares no config is reported in
one line by :func:`plugin_problems` and left out; the built-ins work regardless.

>>> cfg = train_config("fedavg", rounds=3)
>>> (cfg.algorithm, cfg.rounds, cfg.local_steps)
('fedavg', 3, 50)
>>> train_config("fedavg", local_step=3)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pfl_cli.errors.ConfigError: unknown key 'local_step' for algorithm 'fedavg' (did you mean 'local_steps'?); ...
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from dataclasses import dataclass
from typing import Any, Mapping

from pfl_cli.errors import ConfigError

ENTRY_POINT_GROUP = "pflx.algorithms"

# The built-ins, in the order `pflx algorithms` lists them: name -> module:Class. Named here so that one
# algorithm (its config) loads without the others, and an unknown name is refused without loading any.
BUILTINS = {
    "pefll": "pfl_cli.algorithms.pefll:PeFLL",
    "fedavg": "pfl_cli.algorithms.fedavg:FedAvg",
    "local": "pfl_cli.algorithms.local:Local",
    "pfedhn": "pfl_cli.algorithms.pfedhn:PFedHN",
    "pfedhn-pc": "pfl_cli.algorithms.pfedhn:PFedHNPC",
    "hyperfl": "pfl_cli.algorithms.hyperfl:HyperFL",
    "hyperfl-lpm": "pfl_cli.algorithms.hyperfl_lpm:HyperFLLPM",
    "fedprox": "pfl_cli.algorithms.fedprox:FedProx",
    "fedper": "pfl_cli.algorithms.fedper:FedPer",
    "fedrep": "pfl_cli.algorithms.fedrep:FedRep",
    "lg-fedavg": "pfl_cli.algorithms.lgfedavg:LGFedAvg",
    "ditto": "pfl_cli.algorithms.ditto:Ditto",
    "apfl": "pfl_cli.algorithms.apfl:APFL",
    "perfedavg": "pfl_cli.algorithms.perfedavg:PerFedAvg",
    "pfedme": "pfl_cli.algorithms.pfedme:PFedMe",
    "knnper": "pfl_cli.algorithms.knnper:KNNPer",
    "flowdup": "pfl_cli.algorithms.flowdup:FLowDUP",
    "ld-fedavg": "pfl_cli.algorithms.flowdup:LDFedAvg",
    "fedtta": "pfl_cli.algorithms.fedtta:FedTTA",
    "ldp-fedavg": "pfl_cli.algorithms.ldp_fedavg:LDPFedAvg",
    "ppsgd": "pfl_cli.algorithms.ppsgd:PPSGD",
    "centaur": "pfl_cli.algorithms.centaur:CENTAUR",
    "fedbabu": "pfl_cli.algorithms.fedbabu:FedBABU",
    "fedrod": "pfl_cli.algorithms.fedrod:FedRoD",
    "fedbn": "pfl_cli.algorithms.fedbn:FedBN",
    "fedala": "pfl_cli.algorithms.fedala:FedALA",
    "feddbe": "pfl_cli.algorithms.feddbe:FedDBE",
    "gpfl": "pfl_cli.algorithms.gpfl:GPFL",
    "pfedla": "pfl_cli.algorithms.pfedla:PFedLA",
    "fedpac": "pfl_cli.algorithms.fedpac:FedPAC",
    "fedproto": "pfl_cli.algorithms.fedproto:FedProto",
    "fednh": "pfl_cli.algorithms.fednh:FedNH",
    "fedcp": "pfl_cli.algorithms.fedcp:FedCP",
    "fedas": "pfl_cli.algorithms.fedas:FedAS",
    "fedfomo": "pfl_cli.algorithms.fedfomo:FedFomo",
    "apple": "pfl_cli.algorithms.apple:Apple",
    "scaffold": "pfl_cli.algorithms.scaffold:Scaffold",
    "feddyn": "pfl_cli.algorithms.feddyn:FedDyn",
    "fedopt": "pfl_cli.algorithms.fedopt:FedOpt",
    "fedexp": "pfl_cli.algorithms.fedexp:FedExP",
    "fedlc": "pfl_cli.algorithms.fedlc:FedLC",
    "fedamp": "pfl_cli.algorithms.fedamp:FedAMP",
    "fednova": "pfl_cli.algorithms.fednova:FedNova",
    "fedbuff": "pfl_cli.algorithms.fedbuff:FedBuff",
    "fedasync": "pfl_cli.algorithms.fedasync:FedAsync",
    "centralized": "pfl_cli.algorithms.centralized:Centralized",
    "moon": "pfl_cli.algorithms.moon:Moon",
    "fedsam": "pfl_cli.algorithms.fedsam:FedSAM",
    "ifca": "pfl_cli.algorithms.ifca:IFCA",
    "qffl": "pfl_cli.algorithms.qffl:QFFL",
    "cfl": "pfl_cli.algorithms.cfl:CFL",
    "fedem": "pfl_cli.algorithms.fedem:FedEM",
    "afl": "pfl_cli.algorithms.afl:AFL",
    "fedit": "pfl_cli.algorithms.fedit:FedIT",
    "ffa-lora": "pfl_cli.algorithms.ffa_lora:FFALoRA",
    "fedsa-lora": "pfl_cli.algorithms.fedsa_lora:FedSALoRA",
    "flexlora": "pfl_cli.algorithms.flexlora:FlexLoRA",
    "pefll-lora": "pfl_cli.algorithms.pefll_lora:PeFLLLoRA",
    "pfedhn-lora": "pfl_cli.algorithms.pfedhn_lora:PFedHNLoRA",
    "hyperfl-lpm-lora": "pfl_cli.algorithms.hyperfl_lpm_lora:HyperFLLPMLoRA",
    "feddpa": "pfl_cli.algorithms.feddpa:FedDPA",
}


@dataclass(frozen=True)
class Entry:
    """One algorithm: its name, class, config class and where it comes from."""

    name: str
    algorithm: type
    config: type
    origin: str = "built-in"      # or "plugin <distribution> (<module:Class>)"

    @property
    def dp(self) -> str:
        """Its declared DP support: "client-level", "example-level (required)", or "none"."""
        unit = self.algorithm.dp_unit
        if unit is None:
            return "none"
        return f"{unit}-level" + (" (required)" if self.algorithm.dp_required else "")

    @property
    def keys(self) -> list[str]:
        """The keys it takes: its config's fields but those it declares without effect (``inert_keys``, refused)."""
        inert = getattr(self.algorithm, "inert_keys", {}) or {}
        return [f.name for f in dataclasses.fields(self.config) if f.name not in inert]


_BUILTIN_ENTRIES: dict[str, Entry] = {}  # loaded one by one, on first use
_PLUGINS: dict[str, Entry] | None = None
_PROBLEMS: list[str] = []


def entries() -> dict[str, Entry]:
    """Name -> :class:`Entry` of every usable algorithm: the built-ins, then the plugins that load."""
    return {**{name: _builtin(name) for name in BUILTINS}, **_plugin_entries()}


def key_owners_source() -> str:
    """``pfl_cli/algorithms/key_owners.py``: which built-in algorithms take each key (a test keeps it current)."""
    import textwrap

    owners: dict[str, list[str]] = {}
    for name in BUILTINS:
        for key in _builtin(name).keys:
            owners.setdefault(key, []).append(name)
    lines = []
    for key, names in sorted(owners.items()):
        parts = textwrap.wrap(" ".join(names), 96, break_on_hyphens=False)
        parts = [p + " " for p in parts[:-1]] + parts[-1:]
        if len(parts) == 1:
            lines.append(f"    {key!r}: {parts[0]!r},")
        else:
            lines += [f"    {key!r}: (", *(f"        {p!r}" for p in parts), "    ),"]
    body = "\n".join(lines)
    return ('"""Generated by ``pfl_cli.registry.key_owners_source()``: the built-in algorithms that take each config key.\n\n'
            "An unknown key's refusal names the key's owners from here, without loading every algorithm module\n"
            "(issue 49, finding 20). Regenerate:\n"
            "python -c \"from pfl_cli.registry import key_owners_source as s; print(s(), end='')\" > "
            'pfl_cli/algorithms/key_owners.py\n"""\n\n'
            f"KEY_OWNERS = {{\n{body}\n}}\n")


def _builtin(name: str) -> Entry:
    if name not in _BUILTIN_ENTRIES:
        cls = _load(BUILTINS[name])
        _BUILTIN_ENTRIES[name] = Entry(cls.name, cls, cls.config)
    return _BUILTIN_ENTRIES[name]


def _plugin_entries() -> dict[str, Entry]:
    global _PLUGINS
    if _PLUGINS is None:
        _PROBLEMS.clear()
        _PLUGINS = _plugins(BUILTINS)
    return _PLUGINS


def reload() -> dict[str, Entry]:
    """Read the entry points again (a package installed since the first look)."""
    global _PLUGINS
    _PLUGINS = None
    return entries()


def plugin_problems() -> list[str]:
    """One line per plugin that was left out, naming it and why."""
    _plugin_entries()
    return list(_PROBLEMS)


def names() -> tuple[str, ...]:
    """Every usable algorithm's name, without importing the built-ins' modules."""
    return (*BUILTINS, *_plugin_entries())


def stackable_names() -> list[str]:
    """The algorithms whose runs stack on a run axis (:mod:`pfl_cli.fl.stack`): loads every entry."""
    from pfl_cli.fl.stack import stackable_names as among

    return among({e.name: e.algorithm for e in entries().values()})


def get(name: str) -> Entry:
    """The entry of ``name``; an unknown name is refused with the known ones and a "did you mean"."""
    if name in BUILTINS:
        return _builtin(name)
    plugins = _plugin_entries()
    if name not in plugins:
        known = names()
        hint = difflib.get_close_matches(str(name), list(known), n=1)
        tip = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"algorithm must be one of {', '.join(known)}; got {name!r}{tip}.")
    return plugins[name]


# ---------------------------------------------------------------------------- configs
# Other tools' names of pflx's keys: a look-alike by spelling would point elsewhere (learning_rate is closer to
# dp_sampling_rate than to lr).
SYNONYMS = {
    "learning_rate": "lr", "client_lr": "lr", "local_lr": "lr", "step_size": "lr", "server_learning_rate": "server_lr",
    "global_lr": "server_lr", "num_rounds": "rounds", "communication_rounds": "rounds", "global_rounds": "rounds",
    "epochs": "local_epochs", "num_epochs": "local_epochs", "local_iterations": "local_steps",
    "local_iters": "local_steps", "num_steps": "local_steps", "steps": "local_steps", "batch": "batch_size",
    "batchsize": "batch_size", "clients_per_round_fraction": "clients_per_round", "num_clients": "clients_per_round",
    "join_clients": "clients_per_round", "cohort_size": "clients_per_round", "model": "model_arch",
    "arch": "model_arch", "architecture": "model_arch", "prox_mu": "mu", "proximal_mu": "mu",
}


def unknown_key(key: str, entry: Entry, where: str = "") -> ConfigError:
    """One line: the key, the algorithm, a "did you mean" and the keys it takes."""
    # The built-ins' keys come from a generated table: loading every algorithm module to name a key's
    # owners would cost a refusal ~0.7 CPU s (issue 49, finding 20); the plugins are asked.
    from pfl_cli.algorithms.key_owners import KEY_OWNERS

    owners = [*KEY_OWNERS.get(key, "").split(), *(e.name for e in _plugin_entries().values() if key in e.keys)]
    if owners:  # another algorithm's key: say whose, rather than a look-alike of this one's
        tip = f" (a key of {', '.join(owners)})"
        if where.startswith("config file"):  # a recipe shared by several algorithms: each one's own section
            tip = f" (a key of {', '.join(owners)}: a recipe shared by algorithms keeps it under train: {owners[0]}:)"
    else:
        hint = [SYNONYMS[key]] if SYNONYMS.get(key) in entry.keys else difflib.get_close_matches(key, entry.keys, n=1)
        tip = f" (did you mean {hint[0]!r}?)" if hint else ""
    return ConfigError(f"unknown {where}key {key!r} for algorithm {entry.name!r}{tip}; {entry.name} takes: "
                       f"{', '.join(entry.keys)}.")


def resolve_train_config(*, file_values: Mapping[str, Any] | None = None,
                         flag_values: Mapping[str, Any] | None = None,
                         overrides: Mapping[str, Any] | None = None, ignore=(),
                         labels: tuple[str, str, str] = ("config file ", "flag ", "--set ")) -> Any:
    """The config of the algorithm the layers name (``--set`` > flag > file > pefll), over its defaults.

    A key the algorithm does not take is refused whichever layer holds it. A recipe shared by
    several algorithms keeps the keys they all take in its ``train:`` section and each algorithm's
    own keys in a section under it named after the algorithm (``train: {lr: 0.05, pefll: {...},
    fedavg: {...}}``): the section of the algorithm that runs applies on top of the shared keys
    (below flags and ``--set``), the others are left aside.
    """
    from pfl_cli.config import resolve_config
    from pfl_cli.fl.config import TrainConfig, inert_refusal
    from pfl_cli.schema import coerce_field

    file_values, sections = _split_sections(file_values or {})
    layers = tuple(zip(labels, (file_values, flag_values or {}, overrides or {})))
    name = "pefll"
    for _, layer in layers:
        if "algorithm" in layer:
            name = coerce_field(TrainConfig, "algorithm", layer["algorithm"])
    entry = get(name)
    own = sections.get(name, {})
    if "algorithm" in own:
        raise ConfigError(f"{labels[0]}section {name}: sets algorithm; the section of an algorithm holds its own "
                          "keys, the algorithm is named in the train section, by --algorithm or --set.")
    inert = entry.algorithm.inert_keys
    if sections or file_values.get("algorithm", name) != name:
        # a recipe shared by algorithms: its shared keys go to each algorithm where they act, as they go only
        # where taken (Per-FedAvg takes no momentum from a section that sets it for FedAvg and PeFLL)
        file_values = {k: v for k, v in file_values.items() if str(k).strip().replace("-", "_") not in inert}
    file_values = {**file_values, **own}
    layers = ((labels[0], file_values),) + layers[1:]
    taken = set(entry.keys)
    asked = []  # keys the algorithm declares inert, given in a layer: refused whatever their value
    for where, layer in layers:
        for k in layer:
            k = str(k).strip().replace("-", "_")
            if k in inert:
                asked.append((k, where))
            elif k not in taken and k not in ignore:
                raise unknown_key(k, entry, where)
    overrides = _typed_steps_count_steps(entry, file_values, flag_values or {}, overrides or {})
    cfg = resolve_config(entry.config, file_values=file_values, flag_values=flag_values, overrides=overrides,
                         ignore=ignore)  # a value of the wrong type is refused first, as for any key
    if asked:
        raise inert_refusal(asked[0][0], entry.name, inert[asked[0][0]], where=asked[0][1])
    cfg.validate()
    return cfg


def _typed_steps_count_steps(entry, file_values: Mapping, flag_values: Mapping, overrides: Mapping) -> dict:
    """``overrides``, with ``local_epochs: null`` where the user typed local_steps (a flag or ``--set``; a train_config
    keyword) and no layer sets local_epochs, on an algorithm whose rounds count epochs by default (FedNova, FedOpt,
    FLowDUP, LD-FedAvg, FedTTA): the count typed selects step counting (issue 49, finding 11). A local_steps in a
    config file beside the default epochs is still refused (a recipe's shared key meant for another algorithm)."""
    def keys(layer):
        return {str(k).strip().replace("-", "_") for k in layer}

    typed = "local_steps" in keys(flag_values) | keys(overrides)
    default_epochs = getattr(entry.config(), "local_epochs", None)
    if not typed or default_epochs is None or "local_steps" not in entry.keys:
        return dict(overrides)
    if "local_epochs" in keys(file_values) | keys(flag_values) | keys(overrides):
        return dict(overrides)
    return {**overrides, "local_epochs": None}


def _split_sections(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """A train section's shared keys, and its per-algorithm sections (a mapping under an algorithm's name)."""
    by_key = {n.replace("-", "_"): n for n in names()}  # a config file's keys arrive in snake_case
    shared: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        name = by_key.get(str(key).strip().replace("-", "_"))
        if name is not None and isinstance(value, Mapping):
            sections[name] = {str(k).strip().replace("-", "_"): v for k, v in value.items()}
        else:
            shared[key] = value
    return shared, sections


def train_config(algorithm: str = "pefll", **keys: Any) -> Any:
    """The frozen config of ``algorithm``: its paper's defaults with ``keys`` set (values typed and checked).

    The public way to build a training config in Python (tests, notebooks, benchmarks).
    """
    return resolve_train_config(overrides={"algorithm": algorithm, **keys}, labels=("", "", ""))


# Keys of the one flat TrainConfig (pflx <= 0.1.0, before each algorithm owned its config); a train artifact
# or checkpoint of that format holds all of them and is read by dropping those its algorithm does not take.
LEGACY_KEYS = frozenset((
    "algorithm rounds clients_per_round local_steps batch_size lr momentum client_clip server_optimizer server_lr "
    "server_momentum server_clip lambda_h lambda_v lambda_theta model_arch mlp_hidden embedding embed_dim hyper_size "
    "hyper_hidden descriptor_batch eval_descriptor standardize_descriptor label_mask finetune_steps local_epochs "
    "eval_every val_fraction normalize checkpoint_every mu lam head_epochs body_epochs new_client_epochs alpha "
    "alpha_lr variant beta K personal_lr knn_k knn_scale interpolation device cohort_exec seed "
    "evaluate_hidden_labels subspace_dim subspace_nnz feature_dim lambda_reg labeled_rate learnable_centre "
    "track_descriptors dp_epsilon dp_delta dp_clip dp_population dp_sampling_rate dp_accountant write_nonprivate "
    "hn_momentum hn_weight_decay embed_lr head_lr embed_rounds client_sizes").split())
# What an unset clients_per_round meant in that format (the class's default_cohort).
LEGACY_COHORT = {"pfedhn": 1, "pfedhn-pc": 1, "hyperfl": None}


def config_from_artifact(config: Mapping[str, Any], *, what: str, made_by: str | None) -> Any:
    """The config a train artifact (or checkpoint) recorded, in this version's form.

    The flat format of pflx 0.1.0 (every algorithm's keys in one file) loads: keys its algorithm
    does not take are dropped (that version ignored them) and an unset value takes the default
    the old code fell back to. Anything else that does not fit is refused, naming the version.
    """
    from pfl_cli.errors import ArtifactError

    values = dict(config)
    name = values.get("algorithm")
    try:
        entry = get(name)
    except ConfigError:
        raise ArtifactError(f"{what}: it was made by pflx {made_by or 'of an unknown version'} with algorithm "
                            f"{name!r}, which this pflx does not know (installed: {', '.join(names())}).") from None
    fields = {f.name: f for f in dataclasses.fields(entry.config)}
    extra = set(values) - set(fields)
    legacy = bool(extra) and extra <= LEGACY_KEYS
    if extra and not legacy:
        raise ArtifactError(f"{what}: it was made by pflx {made_by or 'of an unknown version'} and its config has "
                            f"keys this pflx's {name} does not take ({', '.join(sorted(extra))}); re-create it with "
                            "this version of pflx train.")
    if legacy:
        values = {k: v for k, v in values.items() if k in fields}
        if values.get("clients_per_round", 0) is None:
            values["clients_per_round"] = LEGACY_COHORT.get(name, 5)
        for k, v in list(values.items()):
            if v is None and fields[k].default is not None:
                values[k] = fields[k].default  # the value the old code fell back to for None
    try:
        return entry.config(**values)
    except TypeError as err:
        raise ArtifactError(f"{what}: it was made by pflx {made_by or 'of an unknown version'} and its config does "
                            f"not fit this pflx ({err}); re-create it with this version of pflx train.") from None


# ---------------------------------------------------------------------------- loading
def _load(target: str) -> type:
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _plugins(builtins: dict[str, Entry]) -> dict[str, Entry]:
    """The entry points of :data:`ENTRY_POINT_GROUP` that load and declare what an algorithm must."""
    from importlib.metadata import entry_points

    found: dict[str, Entry] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(getattr(ep, "dist", None), "name", None) or "?"
        label = f"plugin {ep.name!r} ({dist}: {ep.value})"
        try:
            cls = ep.load()
        except Exception as err:  # noqa: BLE001 - any failure of third-party code leaves the plugin out
            _PROBLEMS.append(f"{label} left out: importing it failed ({type(err).__name__}: {err}).")
            continue
        problem = _plugin_problem(ep.name, cls, builtins, found)
        if problem:
            _PROBLEMS.append(f"{label} left out: {problem}.")
            continue
        found[ep.name] = Entry(ep.name, cls, cls.config, origin=f"plugin {dist} ({ep.value})")
    return found


def _plugin_problem(name: str, cls: Any, builtins: dict, plugins: dict) -> str:
    from pfl_cli.algorithms.base import Algorithm
    from pfl_cli.fl.config import TrainConfig

    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        return "it is not a subclass of pfl_cli.algorithms.base.Algorithm"
    if name in builtins:
        return f"its name clashes with the built-in algorithm {name!r}"
    if name in plugins:
        return f"another plugin ({plugins[name].origin}) already registered {name!r}"
    if cls.name != name:
        return f"the class's name is {cls.name!r}, not the entry point's {name!r}"
    config = cls.__dict__.get("config")
    if not (isinstance(config, type) and dataclasses.is_dataclass(config) and issubclass(config, TrainConfig)):
        return "it declares no config (a frozen dataclass extending pfl_cli.fl.config.TrainConfig as `config`)"
    if config().algorithm != name:
        return f"its config's algorithm default is {config().algorithm!r}, not {name!r}"
    return ""
