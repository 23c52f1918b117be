"""Options of ``pflx train`` and ``pflx predict``; each field is the flag of the same name.

:class:`TrainConfig` holds the keys every algorithm takes; each algorithm extends it in its own
module with the keys it reads and its paper's defaults (``pflx algorithms NAME``). Each key's
range is checked by name (:data:`KEY_RULES`), so one key means one thing in every algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from pfl_cli.fl.byzantine import ATTACK_NAMES
from pfl_cli.fl.robust import AGGREGATOR_NAMES
from pfl_cli.schema import register_choices

VARIANTS = ("fo", "hf")                # perfedavg: first-order MAML | Hessian-free
CLIENT_ARCHS = ("auto", "lenet", "mlp", "hyperfl-cnn", "mlp-bn", "lenet-bn", "lstm", "pfllib-cnn",
                "resnet18-cifar")  # -bn: FedBN; lstm: text; pfllib-cnn, resnet18-cifar: the papers' tables' nets
EMBEDDINGS = ("auto", "cnn", "cnn-x", "linear", "mlp", "mlp-x", "lstm", "lstm-x")
BACKBONE_TUNES = ("adapters", "probe", "full")  # models.pretrained.TUNES (kept here: no torch import for the schema)
HYPER_SIZES = ("S", "M", "L")
SERVER_OPTIMIZERS = ("adam", "sgd")
EVAL_DESCRIPTORS = ("all", "batch")
CLIENT_SETS = ("holdout", "train", "all")
COHORT_EXECS = ("auto", "vmap", "loop")
# model_arch values beyond CLIENT_ARCHS: a prefix and its argument (hf:DIR, pfl_cli.models.hf_checkpoint; issue 46)
OPEN_ARCHS = ("hf:",)

# Model kinds (DESIGN.md §9): ``model_arch`` KIND:NAME builds the client net from another source, one module per
# kind under pfl_cli.models.kinds (kept here as names: the config is checked without importing torch).
MODEL_KINDS = {"factory": "pfl_cli.models.kinds.factory", "torchvision": "pfl_cli.models.kinds.torchvision",
               "timm": "pfl_cli.models.kinds.timm"}


def model_kind(arch) -> str | None:
    """The model kind ``arch`` names (``torchvision`` for ``torchvision:resnet18``), None for a built-in net."""
    if not isinstance(arch, str) or ":" not in arch:
        return None
    kind, name = arch.split(":", 1)
    return kind if kind in MODEL_KINDS and name.strip() else None


def open_arch(arch) -> bool:
    """Whether ``arch`` is a ``model_arch`` beyond the built-in nets: a model kind's KIND:NAME or a transformers
    checkpoint directory (``hf:DIR``, :mod:`pfl_cli.models.hf_checkpoint`)."""
    return model_kind(arch) is not None or (isinstance(arch, str) and any(
        arch.startswith(p) and len(arch) > len(p) for p in OPEN_ARCHS))


def key(default, doc: str, source: str = "", **meta):
    """A config field with its one-line meaning and where its default comes from (``pflx algorithms X``)."""
    return field(default=default, metadata={"doc": doc, "source": source, **meta})


@dataclass(frozen=True)
class TrainConfig:
    """The keys every algorithm of ``pflx train`` takes; an algorithm's config extends it.

    Each algorithm module (``pfl_cli.algorithms.<name>``) declares a frozen subclass holding
    the keys it reads, with its paper's defaults, and its own :meth:`validate`. ``algorithm``
    names the algorithm the config belongs to and cannot be changed on a subclass.
    """

    algorithm: str = key("", "the algorithm these keys configure")
    rounds: int = key(1000, "communication rounds")
    clients_per_round: Optional[int] = key(5, "cohort size of every round (null: every train client)")
    batch_size: int = key(32, "client minibatch size")
    lr: float = key(2e-3, "client SGD step size")
    momentum: float = key(0.9, "client SGD momentum (buffer reset every round)")
    client_clip: float = key(50.0, "per-client gradient-norm clip before each step (0 = off)")
    lambda_theta: float = key(0.0, "client weight decay, added as 2*lambda_theta*param")
    model_arch: str = key("auto", "client net: auto (lstm for text, lenet for images >= 28x28, else mlp) | lenet | mlp"
                          " | hyperfl-cnn | mlp-bn | lenet-bn (batch-norm variants, for fedbn) | lstm | pfllib-cnn | "
                          "resnet18-cifar | factory:MODULE:CALLABLE | torchvision:NAME | timm:NAME | hf:DIR (a "
                          "transformers checkpoint directory on disk) (docs/models.md)",
                          choices=CLIENT_ARCHS, also=open_arch)
    model_kwargs: Optional[dict] = key(None, "keyword arguments of a model kind's constructor (factory:, torchvision:, "
                                       "timm:), e.g. {width: 8} (null = none)")
    model_weights: str = key("", "a model kind's local state dict (.pth / .safetensors, or the model.pt of a pflx "
                             "train run of one net), recorded with its sha256; \"\" = random init")
    model_head: str = key("", "the module a model kind's net has as its head (\"\" = its last nn.Linear)")
    mlp_hidden: tuple = key((32,), "hidden widths of the mlp client net")
    lstm_hidden: int = key(256, "width of both LSTM layers of the lstm client net (text data) and its embedding net",
                           "LEAF (Caldas et al. 2018): two LSTM layers of 256 units")
    eval_every: int = key(50, "rounds between evaluations (and checkpoints)")
    val_fraction: float = key(0.1, "share of every train client's samples held out for model selection")
    label_mask: bool = key(False, "headline accuracy with classes absent from a client's train data masked out")
    normalize: bool = key(True, "standardize inputs with train-pool statistics")
    checkpoint_every: int = key(0, "rounds between checkpoints (0 = at every evaluation)")
    device: str = key("auto", "auto | cpu | cuda[:N]")
    cohort_exec: str = key("auto", "cohort local SGD: vmap | loop | auto (the faster one measured)",
                           choices=COHORT_EXECS)
    seed: int = key(0, "seed of every named random stream")
    evaluate_hidden_labels: bool = key(False, "score unlabeled clients against their hidden labels (an oracle)")
    # -- a pre-trained backbone as the client net (issue 27): vit-s16 | resnet18 | vit-micro | resnet-micro
    backbone: str = key("", "a pre-trained backbone client net instead of model_arch (\"\" = none)")
    backbone_weights: str = key("", "its local state dict (.pth / .safetensors); \"\" = random", path="file")
    backbone_tune: str = key("adapters", "adapters (frozen backbone + adapters) | probe (classifier only) | full",
                             choices=BACKBONE_TUNES)
    # -- differential privacy (issue 10): --dp eps=E[,delta=D][,clip=C][,population=N]. Only an algorithm that
    # declares a DP variant (``dp_unit``) accepts dp_epsilon; dp_epsilon None = no DP.
    dp_epsilon: Optional[float] = key(None, "--dp eps: the privacy budget (null = no DP)")
    dp_delta: float = key(1e-6, "--dp delta; checked < 1/dp_population when that public bound is given")
    dp_clip: Optional[float] = key(None, "--dp clip: public L2 bound of a client's update or one sample's gradient")
    dp_population: Optional[int] = key(None, "--dp population: public bound N on the privacy units")
    dp_sampling_rate: Optional[float] = key(None, "Poisson rate q (client-level default clients_per_round / N)")
    dp_accountant: str = key("rdp", "rdp | pld")
    dp_noise: str = key("secure", "--dp noise: secure (OS entropy) | seeded (repeatable; simulation only)",
                        choices=("secure", "seeded"))
    # -- secure aggregation (issue 48): the server step reads the cohort's sums only (pfl_cli.fl.secagg)
    secagg: bool = key(False, "--secagg: run the round through simulated secure aggregation (the server reads sums "
                       "only); refused for an algorithm whose server reads individual updates")
    dp_mechanism: str = key("central", "--dp mechanism: central (the server adds Gaussian noise to the sum) | ddg "
                            "(distributed discrete Gaussian: each client adds its share before secure aggregation)",
                            choices=("central", "ddg"))
    dp_bits: int = key(20, "ddg: bits b of secure aggregation's modular arithmetic (sums mod 2^b)",
                       "Kairouz, Liu & Steinke, ICML 2021, §6: 16-20 bits per coordinate")
    dp_min_survivors: Optional[int] = key(None, "ddg: public minimum number of cohort clients whose noisy share "
                                          "reaches the sum (null: the whole cohort); the noise is calibrated for it")
    write_nonprivate: bool = key(False, "with --dp: also write diagnostics computed on private data (nonprivate*)")
    # -- federation conditions (issue 47; pfl_cli.fl.conditions): who answers a round, how much local work they
    # finish, how long the round takes on a simulated clock, and what their uploads cost on the wire
    availability: float = key(1.0, "probability that a client is online in a round (each client, each round)")
    availability_trace: str = key("", "CSV of 0/1, one row per client of the partition (its order), one column per "
                                      "time slot; round t reads column t mod slots (\"\" = none)", path="file")
    trace_slot_seconds: Optional[float] = key(None, "simulated seconds of one availability_trace column: round t "
                                                     "reads the column of the simulated clock at its start (null: "
                                                     "one column per round)")
    dropout: float = key(0.0, "probability that a selected client leaves mid-round and never answers")
    compute_speed: str = key("1", "local steps per simulated second: NUMBER | uniform:LO:HI | lognormal:MEDIAN:SIGMA "
                                  "(drawn once per client) | file:PATH (one number per client)", path="spec")
    network_speed: str = key("inf", "megabytes per simulated second of a client's link, up and down, in the forms "
                                    "of compute_speed (inf = transfers take no time)", path="spec")
    round_deadline: Optional[float] = key(None, "simulated seconds a round waits for answers (null: no deadline); "
                                                "late work is the algorithm's rule (dropped, or partial work kept)")
    over_selection: float = key(0.0, "select (1 + this) x clients_per_round clients; the server keeps the first "
                                     "clients_per_round to answer")
    compression: str = key("none", "upload compression of model deltas: none | topk (Stich et al. 2018) | qsgd "
                                   "(Alistarh et al. 2017) | sign (Karimireddy et al. 2019)",
                           choices=("none", "topk", "qsgd", "sign"))
    compression_density: float = key(0.01, "topk: share of a delta's coordinates sent")
    qsgd_levels: int = key(16, "qsgd: quantization levels s per coordinate")
    error_feedback: bool = key(True, "keep each client's compression error and add it to its next upload "
                                     "(Stich et al. 2018; Karimireddy et al. 2019)")
    # -- Byzantine clients (a federation condition, pfl_cli.fl.byzantine) and robust aggregation (a protection,
    # pfl_cli.fl.robust), issue 48; docs/robustness.md
    attack: str = key("none", "Byzantine clients' attack: none | label-flip | sign-flip | gaussian | backdoor "
                      "(model replacement with a pixel trigger) | alie | ipm", choices=ATTACK_NAMES)
    attack_fraction: float = key(0.2, "share of the train clients that are malicious (drawn once from the seed)")
    attack_scale: Optional[float] = key(None, "the attack's strength (null: its paper's default): sign-flip's "
                                        "multiplier, gaussian's sigma, backdoor's boost gamma, alie's z, ipm's "
                                        "epsilon")
    aggregator: str = key("mean", "the server's average: mean (FedAvg's) | median | trimmed-mean | krum | "
                          "multi-krum | bulyan | centered-clip | norm-bound", choices=AGGREGATOR_NAMES)
    robust_fraction: float = key(0.25, "share f / n of a cohort the aggregator tolerates as Byzantine "
                                 "(trimmed-mean, krum, multi-krum, bulyan)")
    robust_clip: Optional[float] = key(None, "radius of centered-clip and norm-bound (null: the median norm of "
                                       "the cohort's clipped vectors)")

    algorithm_class = None  # set by the algorithm that declares this config (``Algorithm.config``)

    def validate(self) -> None:
        """Every check on the keys, before any data is read or drawn (subclasses add theirs)."""
        check_keys(self)
        check_inert(self)
        from pfl_cli.fl.conditions.settings import check_conditions

        check_conditions(self)
        hidden = self.mlp_hidden if isinstance(self.mlp_hidden, (list, tuple)) else [self.mlp_hidden]
        if not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hidden):
            from pfl_cli.errors import ConfigError

            raise ConfigError(f"mlp_hidden must be a list of positive layer widths; got {self.mlp_hidden!r}.")
        if self.algorithm_class is None or self.algorithm != self.algorithm_class.name:
            from pfl_cli.errors import ConfigError

            raise ConfigError(f"algorithm: {type(self).__name__} configures "
                              f"{getattr(self.algorithm_class, 'name', None)!r}; got {self.algorithm!r} (build a "
                              "config with pfl_cli.registry.train_config).")
        from pfl_cli.fl.byzantine import check_attack
        from pfl_cli.fl.robust import check_aggregator

        check_attack(self)
        check_aggregator(self)

    def planned_cohort(self, num_clients: int | None = None) -> int | None:
        """Clients per round of a run over ``num_clients`` clients (None: every train client)."""
        return self.clients_per_round

    def server_floats(self, client_floats: int) -> int:
        """A lower bound on the floats of the server's own model, for the memory check (none by default)."""
        return 0


KEY_RULES: dict[str, tuple] = {
    # name: (kind, low, high); kind "int" | "float" (finite) | "pos" (finite > 0) | "frac" (low <= v <= high)
    **{k: ("int", 0, None) for k in ("rounds", "embed_dim", "finetune_steps", "checkpoint_every", "seed",
                                     "embed_rounds", "head_epochs", "body_epochs", "new_client_epochs")},
    **{k: ("int", 1, None) for k in ("dp_min_survivors", "clients_per_round", "qsgd_levels", "local_steps",
                                     "batch_size", "descriptor_batch",
                                     "eval_every", "hyper_hidden", "lstm_hidden", "subspace_dim", "subspace_nnz",
                                     "feature_dim", "local_epochs", "K", "knn_k", "adapt_steps", "adapt_hidden")},
    **{k: ("float", 0.0, None) for k in ("client_clip", "server_clip", "lambda_h", "lambda_v", "lambda_theta",
                                         "lambda_reg", "hn_weight_decay", "mu", "lam", "alpha_lr", "personal_clip",
                                         "personal_weight_decay", "over_selection")},
    **{k: ("frac", 0.0, 1.0) for k in ("labeled_rate", "interpolation", "alpha", "availability",
                                       "compression_density", "attack_fraction", "robust_fraction")},
    **{k: ("below1", 0.0, 1.0) for k in ("momentum", "server_momentum", "hn_momentum", "personal_momentum",
                                         "val_fraction", "dropout")},
    **{k: ("pos", None, None) for k in ("lr", "server_lr", "embed_lr", "head_lr", "beta", "personal_lr",
                                        "knn_scale", "adapt_lr", "adapt_model_lr", "round_deadline",
                                        "trace_slot_seconds", "robust_clip")},
}


def check_keys(cfg) -> None:
    """The range of every key ``cfg`` has (:data:`KEY_RULES`) and the choices its fields declare; None passes
    for an optional key."""
    import math

    from pfl_cli.errors import ConfigError

    for f in fields(cfg):
        value = getattr(cfg, f.name)
        choices = f.metadata.get("choices")
        also = f.metadata.get("also") or (lambda v: False)  # values beyond the choices (model kinds' KIND:NAME)
        if choices is not None and value not in choices and not also(value):
            raise ConfigError(f"{f.name} must be one of {', '.join(map(str, choices))}; got {value!r}.")
        rule = KEY_RULES.get(f.name)
        if rule is None or (value is None and _optional(f)):
            continue
        kind, low, high = rule
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{f.name} must be an integer >= {low}; got {value!r}.")
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{f.name} must be a finite number; got {value!r}.")
        if kind == "pos" and value <= 0:
            raise ConfigError(f"{f.name} must be a finite number > 0; got {value!r}.")
        if kind == "float" and value < low:
            raise ConfigError(f"{f.name} must be a finite number >= 0; got {value!r}.")
        if kind == "frac" and not low <= value <= high:
            raise ConfigError(f"{f.name} must be a fraction in [0, 1]; got {value!r}.")
        if kind == "below1" and not 0.0 <= value < 1.0:
            raise ConfigError(f"{f.name} must be in [0, 1); got {value!r}.")


# Keys that act only in some settings: key -> (whether ``cfg`` is one, when the key has no effect). A value other
# than the default elsewhere changes nothing, and is refused (check_inert). write_nonprivate's own refusal is in pfl_cli.fl.api.
DP_ONLY = ("dp_delta", "dp_clip", "dp_population", "dp_sampling_rate", "dp_accountant", "dp_noise")
# (an algorithm with a DP variant keeps them without --dp: a recipe holds them for the command that adds --dp eps=E)
NEEDS: dict[str, tuple] = {k: (lambda cfg: cfg.dp_epsilon is not None or cfg.algorithm_class.dp_unit is not None,
                               "on an algorithm without a DP variant (--dp is refused there)") for k in DP_ONLY}
NEEDS["dp_mechanism"] = (lambda cfg: cfg.algorithm_class.dp_unit is not None
                         and cfg.algorithm_class.__dict__.get("individual_reads") == "",
                         "on an algorithm without a DP variant that runs under --secagg (the distributed mechanism "
                         "adds each client's noise before secure aggregation; docs/privacy/secure-aggregation.md)")
NEEDS.update({k: (lambda cfg: cfg.dp_mechanism == "ddg", "without --set dp_mechanism=ddg (the distributed discrete "
                   "Gaussian's keys)") for k in ("dp_bits", "dp_min_survivors")})
NEEDS.update({k: (lambda cfg: bool(cfg.backbone), "without --set backbone=NAME (the client net is model_arch's)")
              for k in ("backbone_weights", "backbone_tune")})
NEEDS.update({k: (lambda cfg: model_kind(cfg.model_arch) is not None and not cfg.backbone,
                   "without a model kind's net (--set model_arch=KIND:NAME: factory, torchvision, timm)")
              for k in ("model_kwargs", "model_weights", "model_head")})
NEEDS["checkpoint_every"] = (lambda cfg: cfg.dp_epsilon is None, "under --dp (a DP run checkpoints every round, so "
                             "that a resumed run never releases a round twice; pfl_cli.fl.loop)")
# A round is local_steps steps or, where local_epochs is set, local_epochs passes over the client's data
# (Algorithm.round_schedule): beside local_epochs no algorithm reads local_steps (BESIDE in
# tests/algorithms/test_no_ignored_key.py). On a config without local_epochs (PeFLL's, the ISRL-DP algorithms')
# local_steps always counts.
# Federation conditions (pfl_cli.fl.conditions): a compressor's own settings act only with that compressor.
NEEDS["trace_slot_seconds"] = (lambda cfg: bool(cfg.availability_trace), "without availability_trace")
NEEDS["compression_density"] = (lambda cfg: cfg.compression == "topk", "without compression=topk")
NEEDS["qsgd_levels"] = (lambda cfg: cfg.compression == "qsgd", "without compression=qsgd")
NEEDS["error_feedback"] = (lambda cfg: cfg.compression != "none", "without compression (no compression error to keep)")
# Byzantine clients and robust aggregation (pfl_cli.fl.byzantine, pfl_cli.fl.robust): a key of one attack or
# aggregator acts only beside it.
NEEDS["attack_fraction"] = (lambda cfg: cfg.attack != "none", "without an attack (--set attack=NAME)")
NEEDS["attack_scale"] = (lambda cfg: _attack(cfg).corrupts_updates,
                         "beside attack none or label-flip (no uploaded update is scaled)")
NEEDS["robust_fraction"] = (lambda cfg: _aggregator(cfg).uses_f, "beside an aggregator that assumes no number of "
                            "Byzantine clients (it acts with trimmed-mean, krum, multi-krum, bulyan)")
NEEDS["robust_clip"] = (lambda cfg: _aggregator(cfg).uses_clip, "beside an aggregator that clips nothing (it acts "
                        "with centered-clip and norm-bound)")


def _attack(cfg):
    from pfl_cli.fl.byzantine.attacks import ATTACKS

    return ATTACKS.get(cfg.attack, ATTACKS["none"])


def _aggregator(cfg):
    from pfl_cli.fl.robust import AGGREGATORS

    return AGGREGATORS.get(cfg.aggregator, AGGREGATORS["mean"])


# Client-level DP with the Poisson rate and the population both given samples each client at that rate: the cohort
# is drawn, never counted (pfl_cli.fl.dp), so a cohort size there changes nothing (issue 49, finding 5).
NEEDS["clients_per_round"] = (lambda cfg: not (cfg.dp_epsilon is not None and cfg.algorithm_class.dp_unit == "client"
                                               and cfg.dp_sampling_rate is not None and cfg.dp_population is not None),
                              "under client-level --dp with dp_sampling_rate and population given (each client joins "
                              "a round with probability dp_sampling_rate: the cohort is drawn, not counted)")
NEEDS["local_steps"] = (lambda cfg: getattr(cfg, "local_epochs", None) is None,
                        "beside local_epochs (a round is local_epochs epochs; set local_epochs=null to count steps)")


def inert_refusal(key: str, algorithm: str, why: str, got: Any = None, where: str = "") -> "ConfigError":
    """One line: ``key`` changes nothing ``algorithm`` computes, why, and to drop it."""
    from pfl_cli.errors import ConfigError

    value = f"; got {got!r}" if got is not None else ""
    return ConfigError(f"{where}{key} has no effect on algorithm {algorithm!r} because {why}{value}; drop it "
                       "(`pflx algorithms " + algorithm + "` lists the keys it reads).")


def check_inert(cfg) -> None:
    """Refuse a key set away from its default where it changes nothing: a key the algorithm declares inert
    (``Algorithm.inert_keys``), or a key whose companion (:data:`NEEDS`) is not set.

    >>> from pfl_cli.registry import train_config
    >>> train_config("fedrep", dp_delta=1e-5)
    Traceback (most recent call last):
    ...
    pfl_cli.errors.ConfigError: dp_delta has no effect on an algorithm without a DP variant (--dp is refused there); got 1e-05. Drop it.
    """
    from pfl_cli.errors import ConfigError

    inert = getattr(cfg.algorithm_class, "inert_keys", None) or {}
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "algorithm" or value == f.default:
            continue
        if f.name in inert:
            raise inert_refusal(f.name, cfg.algorithm, inert[f.name], value)
        need = NEEDS.get(f.name)
        if need is not None and not need[0](cfg):
            raise ConfigError(f"{f.name} has no effect {need[1]}; got {value!r}. Drop it.")


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _finite(v) -> bool:
    import math

    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# The rules an algorithm's own keys are checked against (check_own_keys), by the words its message uses.
OWN_RULES = {
    "an integer >= 0": lambda v: _integer(v) and v >= 0,
    "an integer >= 1": lambda v: _integer(v) and v >= 1,
    "a finite number >= 0": lambda v: _finite(v) and v >= 0,
    "a finite number > 0": lambda v: _finite(v) and v > 0,
    "a number in (0, 1]": lambda v: _finite(v) and 0 < v <= 1,
    "a fraction in (0, 1]": lambda v: _finite(v) and 0 < v <= 1,
    "a number in [0, 1]": lambda v: _finite(v) and 0 <= v <= 1,
}


def check_own_keys(cfg, rules: dict) -> None:
    """Refuse the first key of ``rules`` (key -> a rule of :data:`OWN_RULES`) whose value in ``cfg`` breaks its
    rule, as "KEY must be RULE for ALGORITHM; got VALUE."; None passes for an optional key.

    Examples
    --------
    >>> from pfl_cli.registry import train_config
    >>> check_own_keys(train_config("fedcp"), {"fedcp_tau": "a finite number > 0"})
    >>> check_own_keys(train_config("fedcp", fedcp_tau=2.0), {"fedcp_tau": "an integer >= 1"})
    Traceback (most recent call last):
    ...
    pfl_cli.errors.ConfigError: fedcp_tau must be an integer >= 1 for fedcp; got 2.0.
    """
    from pfl_cli.errors import ConfigError

    optional = {f.name for f in fields(cfg) if _optional(f)}
    for name, rule in rules.items():
        value = getattr(cfg, name)
        if value is None and name in optional:
            continue
        if not OWN_RULES[rule](value):
            raise ConfigError(f"{name} must be {rule} for {cfg.algorithm}; got {value!r}.")


def _optional(f) -> bool:
    return f.default is None or "Optional" in str(f.type)


@dataclass(frozen=True)
class PredictConfig:
    """Options of ``pflx predict``."""

    clients: str = "holdout"
    label_mask: Optional[bool] = None     # None: as the model was trained
    finetune_steps: Optional[int] = None  # fedavg; None: as trained
    eval_descriptor: Optional[str] = None # pefll; None: as trained
    # --- hypernetwork family (issue 11): new-client protocols; None: as trained ---
    embed_rounds: Optional[int] = None    # pfedhn / pfedhn-pc: rounds training a new client's embedding
    local_epochs: Optional[int] = None    # hyperfl: local epochs training a new client's embedding and classifier
    save_models: bool = False
    batch_size: int = 256                 # evaluation chunk (samples per forward)
    device: str = "auto"
    seed: int = 0
    # -- clients without labels (issue 15) --
    evaluate_hidden_labels: bool = False  # score unlabeled clients against their hidden labels (an oracle)
    predictions: bool = True              # write predictions.npz (client, sample, predicted class, probabilities)


register_choices(PredictConfig, clients=CLIENT_SETS, eval_descriptor=EVAL_DESCRIPTORS)


CLIENT_SIZES = ("S", "M", "L")  # pFedHN App. B: LeNet conv1 with 8 / 16 / 32 filters; MLP widths x 1/2, 1, 2


def client_sizes(value: str) -> list[str]:
    """``"S,M,L"`` -> ``["S", "M", "L"]``; ``""`` -> ``[]`` (one size)."""
    return [s.strip() for s in str(value).split(",") if s.strip()]


def hidden_sizes(value) -> tuple[int, ...]:
    """``mlp_hidden`` as a tuple: ``32`` and ``[32]`` both mean one hidden layer of 32."""
    return (value,) if isinstance(value, int) and not isinstance(value, bool) else tuple(value)


def planned_cohort(cfg) -> int | None:
    """Clients per round of ``cfg`` known before the data is read (None: every train client, or data-dependent)."""
    return cfg.planned_cohort(cfg.dp_population)
