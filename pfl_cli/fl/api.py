"""The validated public entry points of ``train`` and ``predict``.

>>> from pfl_cli.data import load_dataset
>>> from pfl_cli.partition import PartitionConfig, partition_labels
>>> from pfl_cli.rng import make_rng
>>> ds = load_dataset("builtin:digits")
>>> cfg = PartitionConfig(scheme="pathological", classes_per_client=2, num_clients=20, holdout_clients=4,
...                       test_fraction=0.3)
>>> part = partition_labels(ds.y, cfg, num_classes=10, rng=make_rng(0, "partition"))
>>> from pfl_cli.registry import train_config
>>> cfg = train_config("pefll", rounds=20, eval_every=10, lr=0.05, clients_per_round=5)
>>> run = train_federated(ds.x, ds.y, 10, part, cfg)
>>> run.outcome.best.summaries()["holdout"]["num_clients"]
4
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.config import CLIENT_SETS, PredictConfig, TrainConfig, hidden_sizes
from pfl_cli.manifest import MODEL_FORMAT


def validate_train_config(cfg: TrainConfig) -> None:
    """Every check on the options, before any data is read or drawn: the config's own
    :meth:`~pfl_cli.fl.config.TrainConfig.validate`, then what the algorithm declares about DP."""
    cfg.validate()
    from pfl_cli.fl.secagg import check_secagg

    check_secagg(cfg)  # first: what the server would read one client at a time, whatever else the run lacks
    _check_degenerate(cfg)
    _validate_dp(cfg)
    _check_model_memory(cfg, list(hidden_sizes(cfg.mlp_hidden)))


def _check_model_memory(cfg: TrainConfig, hidden: list[int]) -> None:
    """Refuse widths whose weights alone outgrow memory, before any data is read.

    A lower bound: the input and output layers (unknown until the data is read) count with one
    unit each; weights, gradients and two Adam moments in float32.
    """
    from pfl_cli.errors import check_memory

    widths = [1, *hidden, 1]
    client = sum(a * b + b for a, b in zip(widths, widths[1:]))
    check_memory(f"a model with hidden widths {hidden} and the {cfg.algorithm} server model",
                 4.0 * 4 * (client + cfg.server_floats(client)), fix="Lower the widths.")


def _check_degenerate(cfg: TrainConfig) -> None:
    """Values that pass their type's range but cannot mean anything (issue 25; docs/reference/artifact-checks.md).

    FedRep's head_epochs >= 1 is its config's own rule (``FedRepConfig.validate``)."""
    if cfg.rounds == 0 and cfg.algorithm_class is not None and cfg.algorithm_class.federated:
        raise ConfigError(f"rounds must be >= 1 for the federated algorithm {cfg.algorithm!r} (0 rounds train "
                          "nothing); got 0. --algorithm local trains without rounds.")


def _validate_dp(cfg: TrainConfig) -> None:
    """--dp on an algorithm that declares a DP variant, with its public bounds (``pfl_cli.fl.dp``)."""
    cls = cfg.algorithm_class
    if cfg.dp_epsilon is None:
        if cls.dp_required:
            raise ConfigError(f"algorithm {cfg.algorithm!r} is a local-DP algorithm and needs --dp eps=E,clip=C "
                              "(the paper ran eps=4,delta=1e-5,clip=0.04).")
        if cfg.write_nonprivate:
            raise ConfigError("--write-nonprivate only applies with --dp (without DP every file is written).")
        return
    # Only now: pfl_cli.privacy imports dp_accounting and with it much of scipy, seconds of start-up
    # that a run without --dp does not need (issue 26).
    from pfl_cli.fl.dp import check_dp_options
    from pfl_cli.privacy import ACCOUNTANTS

    if cls.dp_unit is None:
        why = cls.__dict__.get("dp_refused", "")  # an algorithm's own reason, where it has one
        raise ConfigError(f"--dp is not supported by algorithm {cfg.algorithm!r}: " + (why or "it declares no DP variant "
                          "(`pflx algorithms` lists those that do)."))
    if cfg.dp_accountant not in ACCOUNTANTS:
        raise ConfigError(f"dp_accountant must be one of {', '.join(ACCOUNTANTS)}; got {cfg.dp_accountant!r}.")
    check_dp_options(cfg)
    from pfl_cli.privacy.distributed import check_distributed_options

    check_distributed_options(cfg)
    if cfg.dp_mechanism == "central":
        _check_population_bound(cfg)
    cls.check_dp_config(cfg)


def _check_population_bound(cfg: TrainConfig) -> None:
    """A public population bound N below the cohort asked for contradicts it (q = cohort / N would exceed 1)."""
    from pfl_cli.fl.config import planned_cohort

    cohort = planned_cohort(cfg)
    if cfg.dp_population is not None and cfg.dp_sampling_rate is None and cohort is not None \
            and cohort > cfg.dp_population:
        raise ConfigError(f"--dp population={cfg.dp_population:g} is a public bound on the enrolled clients, but "
                          f"the cohort is {cohort} clients per round (--clients-per-round, or the algorithm's default); "
                          "the population must be at least the cohort. Raise population= to the number of enrolled clients or lower --clients-per-round.")


def _validate_baselines(cfg: TrainConfig) -> None:
    """The personalized baselines' keys (issue 13)."""
    from pfl_cli.fl.config import VARIANTS

    for name in ("head_epochs", "body_epochs", "new_client_epochs"):
        _int(cfg, name, 0)
    _int(cfg, "K", 1)
    _int(cfg, "knn_k", 1)
    if not (isinstance(cfg.interpolation, (int, float)) and 0.0 <= cfg.interpolation <= 1.0):
        raise ConfigError(f"interpolation (knnper's lambda) must be in [0, 1]; got {cfg.interpolation!r}.")
    if cfg.variant not in VARIANTS:
        raise ConfigError(f"variant (perfedavg) must be one of {', '.join(VARIANTS)}; got {cfg.variant!r}.")
    for name in ("beta", "personal_lr", "knn_scale"):
        value = getattr(cfg, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not np.isfinite(value) or value <= 0):
            raise ConfigError(f"{name} must be a finite number > 0; got {value!r}.")
    for name in ("mu", "lam", "alpha_lr", "alpha"):
        value = getattr(cfg, name)
        if value is None and name != "mu" and name != "alpha":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite number >= 0; got {value!r}.")
    if cfg.alpha > 1:
        raise ConfigError(f"alpha (apfl's mixing weight) must be in [0, 1]; got {cfg.alpha!r}.")


def _int(cfg, name: str, low: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}; got {value!r}.")


@dataclass(frozen=True)
class TrainRun:
    """A finished training run: the model payload and everything the artifact reports."""

    model: dict[str, Any]        # the model.pt payload (see :func:`model_payload`)
    outcome: Any                 # pfl_cli.fl.loop.TrainOutcome
    store: Any
    algorithm: Any
    dp: Any = None               # the calibrated DP mechanism under --dp (``ledger()``, ``info()``)


def make_algorithm(cfg: TrainConfig, store, *, arch: dict | None = None):
    """The algorithm ``cfg`` configures (its class declared the config: ``Algorithm.config``), on ``store``,
    with torch's CPU threads chosen from the size of the nets it built (:mod:`pfl_cli.fl.threads`)."""
    import torch

    from pfl_cli.fl.threads import configure_threads

    alg = cfg.algorithm_class(cfg, store, arch=arch)
    configure_threads([v for v in vars(alg).values() if isinstance(v, torch.nn.Module)], store.device)
    return alg


def train_federated(x: np.ndarray, y: np.ndarray, num_classes: int, partition, cfg: TrainConfig, *,
                    device: Any = None, resume: dict | None = None, labeled: np.ndarray | None = None,
                    vocab_size: int | None = None,
                    on_checkpoint: Callable[[dict], None] | None = None,
                    on_progress: Callable[[int, int, dict], None] | None = None) -> TrainRun:
    """Train ``cfg.algorithm`` on a partition's train clients and evaluate on all its clients.

    Parameters
    ----------
    x, y : ndarray
        The dataset in sample order (the partition's indices point into it).
    num_classes : int
    partition : pfl_cli.partition.Partition
        Role 0 clients train; role 1 (holdout) clients are only evaluated.
    cfg : TrainConfig
    device : torch.device, optional
        Default: ``resolve_device(cfg.device)``.
    resume, on_checkpoint, on_progress
        See :func:`pfl_cli.fl.loop.run_rounds`.
    labeled : ndarray of bool (n_samples,), optional
        The dataset's labeled mark (``Dataset.labeled``); unknown labels (-1) and the clients a
        partition marks unlabeled are unlabeled in any case.
    vocab_size : int, optional
        Text data (``Dataset.extra["vocab_size"]``, e.g. LEAF Shakespeare's 80 letters): ``x`` holds
        token codes, read as codes (:func:`pfl_cli.fl.store.build_store`); ``model_arch`` auto is LEAF's LSTM.
    """
    from pfl_cli.fl.byzantine.threat import prepare_threat
    from pfl_cli.fl.device import resolve_device
    from pfl_cli.fl.distributed import held_clients
    from pfl_cli.fl.loop import run_rounds
    from pfl_cli.fl.store import build_store
    from pfl_cli.privacy.randomness import train_randomness

    validate_train_config(cfg)
    device = device if device is not None else resolve_device(cfg.device)
    # the carve's salt: the seed's stream, or under --dp the mechanism's randomness (OS entropy unless noise=seeded)
    store = build_store(x, y, num_classes, partition, val_fraction=cfg.val_fraction,
                        rng=train_randomness(cfg).numpy("validation-split"), stable_carve=cfg.dp_epsilon is not None,
                        device=device, normalize=cfg.normalize,
                        labeled=labeled, hidden_labels=cfg.evaluate_hidden_labels,
                        held=held_clients(partition.num_clients),  # a rank loads only its own clients
                        vocab_size=vocab_size)
    threat = prepare_threat(cfg, store)  # Byzantine clients: their data poisoned before the algorithm reads any
    alg = make_algorithm(cfg, store)
    alg.byzantine = threat
    if cfg.dp_epsilon is not None:
        alg.dp = plan_dp(cfg, store)  # calibrated before the first round
    outcome = run_rounds(alg, cfg, resume=resume, on_checkpoint=on_checkpoint, on_progress=on_progress)
    return TrainRun(model=model_payload(alg, outcome.weights), outcome=outcome, store=store, algorithm=alg,
                    dp=alg.dp)


def plan_dp(cfg: TrainConfig, store):
    """The calibrated mechanism of ``cfg.algorithm`` under --dp (from public inputs only)."""
    return cfg.algorithm_class.plan_dp(cfg, store)


def model_payload(alg, weights: dict) -> dict[str, Any]:
    """What ``model.pt`` holds: plain dicts, strings and tensors (``torch.load(weights_only=True)``)."""
    import torch

    return {
        "format": MODEL_FORMAT,
        "algorithm": alg.name,
        "arch": alg.arch,
        "normalization": {"mean": alg.store.mean.detach().cpu(), "std": alg.store.std.detach().cpu()},
        "weights": weights,
        "num_classes": torch.tensor(alg.store.num_classes),
    }


def model_vocab(arch: dict) -> int | None:
    """The vocabulary a trained model's nets read (text data), from its specs; None for numeric inputs."""
    vocabs = {spec["vocab"] for spec in arch.values() if isinstance(spec, dict) and "vocab" in spec}
    return vocabs.pop() if len(vocabs) == 1 else None


@dataclass(frozen=True)
class PredictRun:
    clients: np.ndarray          # client positions in the partition
    evaluation: Any              # GroupEval
    params: dict | None          # per-client weights when requested
    personalized: bool
    optimizer_steps: int         # torch optimizer steps taken while predicting + clients' local SGD steps
    algorithm: Any = None        # the algorithm that predicted, with the weights it predicted from
    predictions: dict | None = None  # predict_samples' arrays over fit and test samples (split 0 / 1)
    unlabeled: np.ndarray | None = None  # positions (in the partition) of the predicted clients without labels
    protocol: dict | None = None  # how the clients' models were made: served_protocols' dict
    served_by: np.ndarray | None = None  # per client (the order of ``clients``): the protocol that served it


def predict_clients(model: dict, train_cfg: TrainConfig, x: np.ndarray, y: np.ndarray, num_classes: int, partition,
                    cfg: PredictConfig, *, device: Any = None, labeled: np.ndarray | None = None,
                    unlabeled_servers: str = "",
                    on_progress: Callable[[int, int], None] | None = None) -> PredictRun:
    """Models for a partition's clients from a trained model (Alg. 7 for PeFLL) and their test accuracy.

    PeFLL generates each client's model from its descriptor with no optimizer step; FedAvg
    uses the global model (fine-tuned ``finetune_steps`` steps when asked); Local trains
    each client from the shared initialization. The trained weights are left untouched.

    Clients without labels (``labeled``, unknown labels, ``partition.labeled``) are served by
    algorithms that need no labels at prediction time; any other algorithm is refused with
    the list of those that can. Accuracy counts only samples with a label the evaluator may
    read: visible ones, or hidden ones too with ``cfg.evaluate_hidden_labels`` (an oracle).
    ``on_progress(clients_done, clients_total)`` is called after each chunk of clients is served.
    """
    import dataclasses

    from pfl_cli.fl.device import resolve_device
    from pfl_cli.fl.evaluate import NEW_CLIENT_STREAM, personalize_and_evaluate, predict_samples
    from pfl_cli.fl.store import ROLE_HOLDOUT, ROLE_TRAIN, build_store
    from pfl_cli.readers.model import restore
    from pfl_cli.rng import torch_generator

    if cfg.clients not in CLIENT_SETS:
        raise ConfigError(f"clients must be one of {', '.join(CLIENT_SETS)}; got {cfg.clients!r}.")
    if model.get("format") != MODEL_FORMAT:
        raise InputError(f"model: expected a {MODEL_FORMAT} payload; got format {model.get('format')!r}.")
    trained_classes = int(model["num_classes"])
    if int(num_classes) != trained_classes:
        raise InputError(f"num_classes: the partition's dataset must have the model's classes; the model was trained "
                         f"on {trained_classes}, the dataset has {int(num_classes)}.")
    overrides = {k: getattr(cfg, k) for k in ("label_mask", "finetune_steps", "eval_descriptor", "embed_rounds",
                                              "local_epochs")
                 if getattr(cfg, k) is not None}
    taken = {f.name for f in dataclasses.fields(train_cfg)}
    for k in overrides:
        if k not in taken:
            raise ConfigError(f"--{k.replace('_', '-')}: a {train_cfg.algorithm} model has no {k} (its keys: "
                              f"`pflx algorithms {train_cfg.algorithm}`); drop it.")
    if overrides.get("finetune_steps") == 0 and hasattr(train_cfg, "without_finetuning"):
        overrides.update(train_cfg.without_finetuning())  # nor fine-tuning adapters (pfl_cli.fl.finetune)
    train_cfg = dataclasses.replace(train_cfg, **overrides)
    validate_train_config(train_cfg)
    roles = {"holdout": [ROLE_HOLDOUT], "train": [ROLE_TRAIN], "all": [ROLE_TRAIN, ROLE_HOLDOUT]}[cfg.clients]
    clients = np.flatnonzero(np.isin(partition.role, roles))
    if len(clients) == 0:
        raise InputError(f"clients {cfg.clients!r}: the partition has no such clients "
                         f"({int(np.sum(partition.role == ROLE_TRAIN))} train, "
                         f"{int(np.sum(partition.role == ROLE_HOLDOUT))} holdout); re-partition with holdout "
                         "clients (e.g. pflx partition --holdout-clients 10) or pass --clients train|all.")
    device = device if device is not None else resolve_device(cfg.device)
    norm = model["normalization"]
    store = build_store(x, y, num_classes, partition, val_fraction=0.0, rng=None, device=device,
                        normalize=True, stats=(norm["mean"].numpy(), norm["std"].numpy()), labeled=labeled,
                        hidden_labels=cfg.evaluate_hidden_labels, vocab_size=model_vocab(model["arch"]))
    alg = make_algorithm(train_cfg, store, arch=model["arch"])
    restore(alg.load_weights, model["weights"], "model.pt: the weights tree", fix="Re-create it with pflx train.",
            like=alg.weights())
    unlabeled = clients[~store.labeled[clients]]
    if len(unlabeled) and alg.needs_labels_to_predict:
        raise InputError(unlabeled_refusal(alg, partition.client_id[unlabeled], len(clients), unlabeled_servers))
    parts: list[dict] = []

    def keep_predictions(sel, params, personalized, net):
        for code, split in enumerate(("fit", "test")):
            out = predict_samples(net, params, store, sel, split, personalized=personalized,
                                  max_samples=cfg.batch_size * 32)
            parts.append({**out, "split": np.full(len(out["sample"]), code, dtype=np.uint8)})

    done = [0]

    def each_chunk(sel, params, personalized, net):
        if cfg.predictions:
            keep_predictions(sel, params, personalized, net)
        if on_progress is not None:
            done[0] += len(sel)
            on_progress(done[0], len(clients))

    known = np.asarray(alg.has_state(clients), dtype=bool)
    protocol = served_protocols(alg, known)
    with count_optimizer_steps() as torch_steps:
        evals, params, personalized = personalize_and_evaluate(
            alg, clients, ("test",), torch_generator(cfg.seed, NEW_CLIENT_STREAM), keep_params=cfg.save_models,
            max_samples=cfg.batch_size * 32,
            each_chunk=each_chunk if cfg.predictions or on_progress is not None else None)
    predictions = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else None
    return PredictRun(clients=clients, evaluation=evals["test"], params=params, personalized=personalized,
                      optimizer_steps=torch_steps[0] + alg.client_sgd_steps + alg.new_client_steps, algorithm=alg,
                      predictions=predictions, unlabeled=unlabeled, protocol=protocol,
                      served_by=np.where(known, alg.protocol(False)["protocol"], alg.protocol(True)["protocol"]))


def served_protocols(alg, known: np.ndarray) -> dict:
    """How ``alg`` serves clients of which ``known`` (bool, per client) have trained state of their own: each
    client by its own protocol (``alg.protocol(False)`` with state, the paper's new-client protocol
    ``alg.protocol(True)`` without), as :meth:`~pfl_cli.algorithms.base.Algorithm.personalize` serves it.

    ``protocols``: one ``{protocol, rounds, clients}`` per protocol that served a client; ``protocol`` and
    ``rounds``: the one protocol that served every client, or, when train clients never sampled in training (no
    state) stand beside trained ones, both named with their counts and the new-client protocol's rounds;
    ``new_clients``: the clients served without state.
    """
    known = np.asarray(known, dtype=bool)
    new = int(np.sum(~known))
    groups = [(alg.protocol(False), int(np.sum(known))), (alg.protocol(True), new)]
    used = [(p, n) for p, n in groups if n]
    if len(used) == 2 and used[0][0]["protocol"] == used[1][0]["protocol"]:
        used = [(used[1][0], len(known))]
    if len(used) == 2:
        (own, n_own), (fresh, n_new) = used
        summary = {"protocol": f"{own['protocol']} ({n_own} clients with trained state); {fresh['protocol']} "
                               f"({n_new} clients without)", "rounds": fresh["rounds"]}
    else:
        summary = dict(used[0][0] if used else alg.protocol(False))
    return {**summary, "new_clients": new,
            "protocols": [{"protocol": p["protocol"], "rounds": int(p["rounds"]), "clients": n} for p, n in used]}


def unlabeled_refusal(alg, client_ids: np.ndarray, total: int, servers: str = "") -> str:
    """One line: which clients have no labels, why this algorithm cannot serve them, which can (``servers``,
    from the registry the caller holds; the engine does not know the other algorithms)."""
    shown = ", ".join(str(int(c)) for c in client_ids[:5]) + (", ..." if len(client_ids) > 5 else "")
    which = f": {servers}" if servers else " are named by `pflx algorithms`"
    return (f"clients: {len(client_ids)} of the {total} clients to predict have no labels (client ids {shown}), and "
            f"this {alg.name} model needs a client's labels at prediction time; models that serve unlabeled "
            f"clients{which}.")


@contextmanager
def count_optimizer_steps():
    """Count every ``torch.optim`` step taken in the block, by any optimizer (a one-element list).

    A global step hook sees the real thing: an algorithm that built or loaded an optimizer
    and stepped it while predicting is counted whatever it reports about itself. Local SGD
    of cohorts runs without torch optimizers and is counted by ``client_sgd_steps``.
    """
    from torch.optim.optimizer import register_optimizer_step_post_hook

    count = [0]

    def hook(optimizer, args, kwargs):
        count[0] += 1

    handle = register_optimizer_step_post_hook(hook)
    try:
        yield count
    finally:
        handle.remove()
