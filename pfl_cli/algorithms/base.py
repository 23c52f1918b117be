"""What every algorithm plugs into the round loop (``pfl_cli.fl.loop``).

An algorithm owns its server state and answers the round hooks: ``run_round`` (one round on a
cohort), ``personalize`` (models for any clients, seen or not), ``state`` /
``load_state`` (everything a resumed run needs) and ``weights`` (what ``model.pt`` keeps).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from pfl_cli.errors import InputError, RunError
from pfl_cli.fl.communication import Traffic
from pfl_cli.fl.params import broadcast
from pfl_cli.fl.params import cpu_state_dict, cpu_tree, merge_rows, stack, weighted_mean  # noqa: F401 - public here too
from pfl_cli.rng import seed_sequence


def model_arch_spec(cfg, store) -> dict:
    """The spec of ``model_arch``'s client net: a model kind's (``KIND:NAME``, :mod:`pfl_cli.models.kinds`) or a
    built-in's, sized by ``mlp_hidden`` (LEAF's LSTM for text)."""
    from pfl_cli.fl.config import hidden_sizes, model_kind
    from pfl_cli.models import client_spec

    if model_kind(cfg.model_arch) is not None:
        from pfl_cli.models.kinds import kind_spec

        return kind_spec(cfg.model_arch, store.input_shape, store.num_classes, kwargs=cfg.model_kwargs,
                         weights=cfg.model_weights, head=cfg.model_head)
    return client_spec(cfg.model_arch, store.input_shape, store.num_classes, hidden_sizes(cfg.mlp_hidden),
                       vocab=getattr(store, "vocab_size", None), lstm_hidden=cfg.lstm_hidden)


def seeded(seed: int, name: str, build):
    """Run ``build()`` with torch's global RNG seeded from a named stream, restoring it afterwards.

    Module constructors draw their default initialization from the global generator;
    forking keeps the caller's global state untouched.
    """
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed_sequence(seed, name).generate_state(1)[0]))
        return build()


class Algorithm(ABC):
    """Base class: shared client-side training helpers."""

    name = ""
    paper = ""                # the paper (and its section) it implements, for `pflx algorithms`
    new_client_protocol = ""  # how a client unseen in training gets its model, for `pflx algorithms`
    federated = True          # False: no rounds (Local), evaluation trains per client
    personalized = True       # whether personalize() returns one model per client
    serves_unlabeled = ""     # how it serves clients without labels ("" = it cannot), for error messages
    # Differential privacy (issue 10): the privacy unit --dp protects ("client" or "example"),
    # None when the algorithm has no DP variant; dp_required for algorithms that exist only
    # as DP mechanisms. ``dp`` is the calibrated mechanism, set by the engine before training.
    dp_unit: str | None = None
    dp_required = False
    dp_contribution = "update"  # what one client contributes, named in the ledger
    dp_refused = ""  # why --dp is refused, where an algorithm without a DP variant says more (declared per class)
    dp = None
    # Secure aggregation (issue 48, pfl_cli.fl.secagg): what the server step reads one client at a time, which
    # secure aggregation would hide ("" = nothing: the algorithm runs under --secagg through its
    # ``aggregate_secure``). Declared by each algorithm in its own class body (read from the class's own
    # __dict__, never inherited); undeclared (a plugin) is refused under --secagg.
    individual_reads: str | None = None
    config: type | None = None  # the frozen config dataclass of this algorithm (declared, never inherited)
    # Whether it runs client nets with batch-norm layers (model_arch mlp-bn / lenet-bn), keeping each
    # client's normalization statistics itself (FedBN); every other algorithm refuses those nets.
    local_normalization = False
    # Why the algorithm cannot run split across ranks (torchrun, --nproc), named in the error that
    # refuses it up front; "" when its N-rank run equals its 1-process run (tests/cli/test_train_distributed.py).
    not_distributed = ""
    # Federation conditions (issue 47, pfl_cli.fl.conditions). conditions_refused: why it cannot run under
    # availability, dropout, deadlines or over-selection ("" when it can: a client that does not answer is left out
    # of the round and keeps whatever state it had). partial_work: a straggler's steps finished by the deadline are
    # kept (FedProx, FedNova) instead of the straggler dropped (FedAvg). compressible_upload: its upload is FedAvg's
    # round's model delta, which topk / qsgd / sign compress. The last two are declared per class, never inherited.
    conditions_refused = ""
    partial_work = False
    compressible_upload = False
    # Asynchronous aggregation (issue 47, item 2; pfl_cli.fl.asynchronous). asynchronous: its server aggregates
    # client updates as they arrive on the simulated clock (FedBuff, FedAsync), a round being clients_per_round
    # arrivals. async_ready: how the method's round could run asynchronously (said by `pflx algorithms NAME`; "" when
    # no one has said). Both declared per class, never inherited.
    asynchronous = False
    async_ready = ""
    round_budget = None   # (c,) local steps each cohort client finishes this round, set by the conditions' round
    upload_codec = None   # the upload compressor (pfl_cli.fl.compression), set by the conditions
    # Hyperparameter search (`pflx tune`): key -> spec ("log:LOW:HIGH", "float:LOW:HIGH", "int:LOW:HIGH",
    # "choice:A,B,..."), from the paper's own tuning protocol, cited in ``search_space_source``;
    # declared by each algorithm (an undeclared one gets the client lr only, see pfl_cli.tune.space).
    search_space: dict[str, str] = {}
    search_space_source = ""
    # The clients the method is for, which `pflx tune` scores on validation data: "train" (its
    # training clients' validation split) or "new" (validation clients carved out of the train clients).
    tune_group = "train"
    # Keys its config takes (from a config it shares) that change nothing it computes: key -> why, completing
    # "KEY has no effect on NAME because ...". Refused in a config file, a flag, --set and a tune space
    # (pfl_cli.fl.config.check_inert); every other key changes what it trains (tests/algorithms/test_no_ignored_key.py).
    inert_keys: dict[str, str] = {}
    # Byzantine clients (issue 48): ``byzantine`` is the run's threat (pfl_cli.fl.byzantine.threat), set by the
    # engine before training (None: every client honest). ``averages_updates``: the server averages the cohort's
    # models in FedAvg.aggregate, where an update attack and a robust aggregator act; declared by each class
    # itself, never inherited (pfl_cli.fl.robust.averages_updates).
    byzantine = None
    averages_updates = False

    def __init_subclass__(cls, **kwargs) -> None:
        """DP support and the config are declared by each algorithm, never inherited from its parent:
        a subclass that says nothing has no DP variant (``--dp`` is refused) and no config of its own."""
        super().__init_subclass__(**kwargs)
        if "dp_unit" not in cls.__dict__:
            cls.dp_unit = None
        for capability in ("partial_work", "compressible_upload", "asynchronous", "async_ready"):
            if capability not in cls.__dict__:
                setattr(cls, capability, "" if capability == "async_ready" else False)
        own = cls.__dict__.get("config")
        if own is not None:
            own.algorithm_class = cls  # the engine builds the algorithm its config names (pfl_cli.fl.api)
        elif "config" not in cls.__dict__:
            cls.config = None

    def __init__(self, cfg, store, *, arch: dict | None = None) -> None:
        self.cfg = cfg
        self.store = store
        self.device = store.device
        if arch is None:  # a training run: its keys against the data they would act on
            check_keys_on_data(cfg, store)
        self.arch = arch if arch is not None else self.resolve_arch(cfg, store)
        net = self.arch.get("client") if isinstance(self.arch, dict) else None
        if isinstance(net, dict) and str(net.get("arch", "")).endswith("-bn") and not self.local_normalization:
            raise InputError(f"model_arch {net['arch']!r} has batch-norm layers, whose per-client statistics only "
                             f"an algorithm that keeps them runs (fedbn); {self.name} does not. Use --set "
                             f"model_arch={net['arch'][:-3]}.")
        self.client_sgd_steps = 0  # local SGD steps taken by personalize() (fine-tuning, Local)
        self.new_client_steps = 0  # server-side steps of a new-client protocol (pFedHN embeddings)
        self.traffic = Traffic()   # the tensors run_round exchanges (pfl_cli.fl.communication)
        self.build()

    # ------------------------------------------------------------------ hooks
    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        if getattr(cfg, "backbone", ""):  # HyperFL Table 2's baselines: the pre-trained backbone net
            from pfl_cli.models.pretrained import backbone_spec

            if getattr(store, "vocab_size", None) is not None:
                raise InputError(f"backbone {cfg.backbone!r} reads images; this data is text (token codes). Drop "
                                 "--set backbone= (the LSTM is the text client net).")

            return {"client": backbone_spec(cfg.backbone, store.input_shape, store.num_classes,
                                            tune=cfg.backbone_tune, weights=cfg.backbone_weights or None)}
        if cfg.model_arch.startswith("hf:"):  # a transformers checkpoint directory (issue 46)
            from pfl_cli.models.hf_checkpoint import hf_spec

            return {"client": hf_spec(cfg.model_arch, store.input_shape, store.num_classes,
                                      vocab=getattr(store, "vocab_size", None))}
        return {"client": model_arch_spec(cfg, store)}

    @abstractmethod
    def build(self) -> None:
        """Create the networks and the server optimizer."""

    @staticmethod
    def check_dp_config(cfg) -> None:
        """Reject options that would release private data outside the DP mechanism (none by default)."""

    @classmethod
    def plan_dp(cls, cfg, store):
        """The calibrated mechanism under --dp: client-level DP-FedAvg unless an algorithm says otherwise.

        From public inputs only (``cfg``); ``store`` is not read for the calibration.
        """
        from pfl_cli.fl.dp import calibrate_client_dp

        if cfg.dp_mechanism == "ddg":  # each client adds its noise share before secure aggregation
            from pfl_cli.models import num_parameters
            from pfl_cli.privacy.distributed import calibrate_distributed_dp

            dim = num_parameters(cls.resolve_arch(cfg, store)["client"])  # public: the architecture's size
            return calibrate_distributed_dp(cfg, dim, contribution=cls.dp_contribution)
        return calibrate_client_dp(cfg, contribution=cls.dp_contribution)

    def run_round(self, t: int, cohort, gen):
        """One round on ``cohort`` (LongTensor of client positions); returns each client's mean loss."""
        raise RunError(f"algorithm {self.name!r} trains no federated rounds; its clients train in personalize().")

    def diagnostics(self) -> dict[str, dict[str, float]]:
        """Extra metrics logged at every evaluation, ``{group: {metric: value}}`` (none by default)."""
        return {}

    @property
    def needs_labels_to_predict(self) -> bool:
        """Whether ``personalize`` reads a client's labels (fine-tuning, local training, labeled descriptors)."""
        return True

    def sample_cohort(self, train_clients, count: int, gen):
        """A round's cohort: ``count`` train clients with labels, uniformly without replacement
        (under DP, the mechanism's own sampler over them).

        Clients without labels have nothing to train on here; algorithms that learn from
        unlabeled clients (FLowDUP) draw their own cohorts.
        """
        import torch

        pool = train_clients[torch.as_tensor(self.store.labeled, device=train_clients.device)[train_clients]]
        if self.dp is not None:
            return self.dp.sample_cohort(pool, count, gen)
        return pool[torch.randperm(len(pool), generator=gen)[:count].to(pool.device)]

    def check_trainable(self, train_clients) -> None:
        """Refuse a run whose cohorts would be empty (no train client with a label)."""
        if not self.store.labeled[train_clients.cpu().numpy()].any():
            raise InputError(f"{self.name}: training needs train clients with labels; none of the "
                             f"{len(train_clients)} has any. Give the dataset labels, or raise --label-prevalence.")
    def cohort_size(self, t: int, total: int, available: int) -> int:
        """Clients in round ``t`` (0-based) of ``total``: ``clients_per_round`` unless the paper says otherwise."""
        c = self.cfg.planned_cohort(self.store.num_clients)
        return available if c is None else min(c, available)

    def exchanged(self) -> dict[str, dict[str, float]]:
        """``{"down": {message: floats}, "up": {...}}`` per client and round, from the tensors recorded
        in :attr:`traffic` by ``run_round`` (empty for an algorithm that communicates nothing)."""
        return self.traffic.per_client_round()

    def model_groups(self, clients: np.ndarray) -> list:
        """``[(clients, net)]``: the clients grouped by the architecture of their models (one group here)."""
        return [(np.asarray(clients, dtype=np.int64), self.predict_net)]

    def has_state(self, clients: np.ndarray) -> np.ndarray:
        """Which of ``clients`` have per-client trained state (embedding rows, private heads)."""
        return np.zeros(len(clients), dtype=bool)

    def protocol(self, new: bool) -> dict:
        """How ``personalize`` serves clients with (``new=False``) or without trained state: ``protocol``, ``rounds``."""
        return {"protocol": "as in training", "rounds": 0}

    @abstractmethod
    def personalize(self, clients: np.ndarray, gen):
        """``(params, personalized)``: one model per client (stacked), or one global model."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """Copies of everything a resumed run needs (weights, optimizer state)."""

    @abstractmethod
    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`."""

    @abstractmethod
    def weights(self) -> dict[str, Any]:
        """The CPU state dicts ``model.pt`` keeps."""

    @abstractmethod
    def load_weights(self, weights: dict[str, Any]) -> None:
        """Restore :meth:`weights` (prediction)."""

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """Floats a cohort client exchanges with the server per round: theta down and delta up."""
        from pfl_cli.models import num_parameters

        return 2 * num_parameters(arch["client"])

    @property
    def predict_net(self):
        """The module that evaluates personalize()'s parameters (kNN-Per wraps the client net)."""
        return self.net

    def global_model(self):
        """``(net, params)``: the one complete model the server holds for every client, which train scores on
        the pooled test splits (``global_accuracy``), or None for a method whose models are per-client only.

        Detected here: ``global_params`` holding every parameter of ``net``, none of which a client keeps
        for itself alone (FedAvg and the methods built on its server model: Ditto's and APFL's w, whose
        clients keep a whole model of their own beside it; FedBABU's body with its fixed head). A method
        whose clients keep part of the model privately (FedPer's heads, LG-FedAvg's bodies: the server's
        copy of that part is never trained) or whose server holds no client net (a hypernetwork) has none;
        one whose global model is not ``global_params`` overrides this. Only personalized runs ask: a
        method serving one model to every client is scored with that model.
        """
        params, net = getattr(self, "global_params", None), getattr(self, "net", None)
        if not isinstance(params, dict) or net is None:
            return None
        names = {k for k, _ in net.named_parameters()}
        private = getattr(getattr(self, "private", None), "values", None)
        if isinstance(private, dict) and names & set(private) and not names <= set(private):
            return None  # a client's own part of the model: the server's copy of it is not a trained model
        return (net, params) if set(params) == names else None

    # ------------------------------------------------------------------ shared helpers
    def client_net(self):
        from pfl_cli.models import build

        return seeded(self.cfg.seed, "init-client", lambda: build(self.arch["client"])).to(self.device)

    def sgd_update_options(self) -> dict:
        """The client optimizer's settings (:func:`pfl_cli.fl.cohort.sgd_update_`)."""
        c = self.cfg
        return {"lr": c.lr, "momentum": c.momentum, "weight_decay": 2.0 * c.lambda_theta, "clip": c.client_clip}

    def sgd_options(self) -> dict:
        """:meth:`sgd_update_options` plus how a cohort runs (:func:`pfl_cli.fl.cohort.local_sgd`)."""
        return {**self.sgd_update_options(), "cohort_exec": self.cfg.cohort_exec}

    def epoch_steps(self, clients, epochs: int):
        """Per-client step counts for ``epochs`` passes over the fit data, and the active-step mask.

        The table form of :func:`pfl_cli.fl.batches.draw_batches` with ``epochs`` (which
        the engine itself uses: it never builds this (c, steps) table).
        """
        import torch

        n = self.store.fit.length[clients]
        b = min(self.cfg.batch_size, max(int(n.max()) if len(n) else 1, 1))
        steps = epochs * torch.ceil(n.to(torch.float64) / b).to(torch.int64).clamp_min(1)
        total = int(steps.max()) if len(steps) else 0
        active = torch.arange(total, device=n.device)[None, :] < steps[:, None]
        return total, active

    def local_batches(self, clients, gen, *, steps: int | None = None, epochs: int | None = None):
        """Lazy batches for local SGD: ``steps`` per client, or ``epochs`` passes over each client's data."""
        from pfl_cli.fl.batches import draw_batches

        return draw_batches(self.store.fit, clients, None if epochs else steps, self.cfg.batch_size, gen,
                            epochs=epochs or None)

    def step_batches(self, clients, gen, *, lazy: bool):
        """``cfg.local_steps`` batches per client: (c, k, b) tables, or the same batches lazily (``lazy``: a
        Flower node's ``local_sgd_held``, or a server advancing ``gen`` past the draw its nodes make)."""
        from pfl_cli.fl.batches import draw_batches, sample_batches

        draw = draw_batches if lazy else sample_batches
        return draw(self.store.fit, clients, self.cfg.local_steps, self.cfg.batch_size, gen)

    def train_clients(self, start: dict, clients: np.ndarray, gen, *, steps: int | None = None,
                      epochs: int | None = None, chunk: int = 64, stacked: bool = False, **objective) -> dict:
        """Local SGD from ``start`` on each client's fit data, ``chunk`` clients at a time.

        ``start`` is one model, or one per entry of ``clients`` when ``stacked``; ``objective``
        (``trainable``, ``prox_mu``, ``prox_anchor`` as one model) goes to :func:`local_sgd`.
        The steps are counted in ``client_sgd_steps`` (what ``predict`` reports).
        """
        import torch

        out: dict[str, list] = {k: [] for k in start}
        for lo in range(0, len(clients), chunk):
            sel = torch.as_tensor(clients[lo:lo + chunk], device=self.device)
            begin = {k: v[lo:lo + chunk] for k, v in start.items()} if stacked else stack(start, len(sel))
            theta, _, taken = self.cohort_sgd(begin, sel, gen, steps=steps, epochs=epochs, **objective)
            self.client_sgd_steps += taken
            for k, v in theta.items():
                out[k].append(v)
        empty = (lambda v: v[:0]) if stacked else (lambda v: v.unsqueeze(0)[:0])
        return {k: torch.cat(v) if v else empty(start[k]) for k, v in out.items()}

    def finetune(self, start: dict, clients: np.ndarray, gen, steps: int) -> dict:
        """Each of ``clients``' model (stacked): the served model ``start`` fine-tuned ``steps`` local steps, all its
        weights, or LoRA adapters and the classifier over it frozen (``finetune_adapters=lora``:
        :mod:`pfl_cli.fl.finetune`)."""
        from pfl_cli.fl.finetune import finetune

        return finetune(self, start, clients, gen, steps)

    def finetune_protocol(self, steps: int, served: str = "global model") -> str:
        """How :meth:`finetune` serves: ``served``, or it fine-tuned ``steps`` steps (which part, with adapters)."""
        from pfl_cli.fl.finetune import finetune_protocol

        return finetune_protocol(self.cfg, steps, served)

    def check_finetune(self) -> None:
        """Refuse, before any round, fine-tuning adapters the client net cannot take (:mod:`pfl_cli.fl.finetune`)."""
        from pfl_cli.fl.finetune import check_finetune

        check_finetune(self)

    def record_exchange(self, sent: dict, received: dict, cohort_size: int) -> None:
        """The server sends ``sent`` (one model) to every cohort client and receives ``received`` (stacked)."""
        for k, g in sent.items():
            self.traffic.send(k, g, copies=cohort_size)                     # the global model to each client
        for k, v in received.items():
            self.traffic.receive(k, v)                                      # each client's model (its delta)

    def round_schedule(self) -> dict:
        """A round's local work: ``local_steps`` SGD steps, or ``local_epochs`` epochs when set."""
        cfg = self.cfg
        epochs = getattr(cfg, "local_epochs", None)
        return {"epochs": epochs} if epochs else {"steps": cfg.local_steps}

    def cohort_sgd(self, start: dict, clients, gen, *, steps: int | None = None, epochs: int | None = None,
                   trainable=None, prox_mu: float = 0.0, prox_anchor: dict | None = None,
                   prox_anchors: dict | None = None, sgd: dict | None = None):
        """One batched local-SGD run of ``clients`` (LongTensor) from stacked ``start``.

        ``steps`` SGD steps each, or ``epochs`` passes over each client's fit data; ``sgd`` overrides
        settings of :meth:`sgd_options` (Ditto's plain personal steps). ``prox_mu`` adds the proximal term
        ``prox_mu / 2 ||w - anchor||^2`` around one model ``prox_anchor`` (FedProx) or around each client's own
        row of the stacked ``prox_anchors`` (FedAsync: the model each job downloaded). Returns the parameters,
        each client's mean loss and the number of steps taken in all.
        """
        from pfl_cli.fl.cohort import local_sgd

        batches = self.local_batches(clients, gen, steps=steps, epochs=epochs)
        if self.round_budget is not None:  # a straggler's partial work (federation conditions)
            from pfl_cli.fl.conditions.rounds import cap_steps

            cap_steps(batches, self.round_budget)
        anchor = prox_anchors if prox_anchors is not None else \
            None if prox_anchor is None else broadcast(prox_anchor, len(clients))
        moving = {k: v for k, v in start.items() if trainable is None or k in trainable}
        fixed = {k: v for k, v in start.items() if k not in moving}
        theta, loss = local_sgd(self.net, moving, self.store, batches, fixed=fixed,
                                prox_mu=prox_mu, prox_anchor=anchor, **{**self.sgd_options(), **(sgd or {})})
        return {**fixed, **theta}, loss, batches.active_steps()

    def draw_batches(self, clients, gen, *, steps: int | None = None, epochs: int | None = None,
                     per_step: int = 1):
        """Lazy batches for ``steps`` local steps (or ``epochs`` epochs) of ``clients``, ``per_step`` per step.

        Returns the :class:`~pfl_cli.fl.batches.LocalSteps` (memory O(c * per_step * b) per step,
        whatever the number of steps) and the number of steps taken in all. With ``epochs``,
        client i takes ``epochs * ceil(n_i / b)`` steps and sits out the rest (``active``).
        """
        from pfl_cli.fl.batches import CohortBatches, LocalSteps

        if epochs is not None:
            total, active = self.epoch_steps(clients, epochs)
        else:
            total, active = steps, None
        batches = CohortBatches(self.store.fit, clients, total * per_step, self.cfg.batch_size, gen)
        taken = int(active.sum()) if active is not None else total * len(clients)
        return LocalSteps(batches, per_step, active), taken

    def chunked(self, clients: np.ndarray, build, chunk: int = 64) -> dict:
        """``build(LongTensor of clients)`` -> stacked models, ``chunk`` clients at a time, concatenated."""
        import torch

        out = [build(torch.as_tensor(clients[lo:lo + chunk], device=self.device))
               for lo in range(0, len(clients), chunk)]
        return {k: torch.cat([o[k] for o in out]) for k in out[0]}


class PrivateState:
    """Mixin for algorithms with per-client private state ``self.private`` (a ClientState).

    The state joins ``state()`` and ``weights()`` (so checkpoints and ``model.pt`` keep it),
    and :meth:`personalize` serves a client from its own state (:meth:`own_models`) when it
    has one on this partition, else with the algorithm's new-client protocol (:meth:`new_clients`).
    """

    def new_private_state(self, template: dict):
        """A ClientState for every client of the store, each row starting at ``template``."""
        from pfl_cli.fl.client_state import ClientState

        return ClientState(template, self.store.num_clients, self.store.partition_sha)

    @abstractmethod
    def own_models(self, rows) -> dict:
        """Models of train clients ``rows`` (LongTensor) from their private state."""

    @abstractmethod
    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """Models for clients without private state (the paper's protocol for new clients)."""

    def has_state(self, clients: np.ndarray) -> np.ndarray:
        """Train clients of this partition have private state; every other client is new."""
        return self.private.known(np.asarray(clients, dtype=np.int64), self.store.partition_sha)

    def personalize(self, clients: np.ndarray, gen):
        import torch

        clients = np.asarray(clients, dtype=np.int64)
        known = self.has_state(clients)
        parts = []
        if known.any():
            parts.append((known, self.own_models(torch.as_tensor(clients[known], device=self.device))))
        if (~known).any():
            parts.append((~known, self.new_clients(clients[~known], gen)))
        return merge_rows(len(clients), parts), True

    def state(self):
        return {**super().state(), "private": self.private.state()}

    def load_state(self, state):
        super().load_state(state)
        self.private.load_state(state["private"], self.device)

    def weights(self):
        return {**super().weights(), "private": cpu_tree(self.private.state())}

    def load_weights(self, weights):
        super().load_weights(weights)
        self.private.load_state(weights["private"], self.device)


class ServerOptimizerState:
    """``state`` / ``load_state`` of an algorithm whose resumable state is ``weights()`` plus ``self.opt``.

    ``self.opt`` is built on first use from ``self.make_optimizer`` (set in ``build``): ``predict``
    takes no server step, and constructing torch's Adam alone costs seconds of ``torch._compile``
    imports on a cold start.
    """

    make_optimizer = None  # () -> torch.optim.Optimizer, set by the algorithm's build
    _optimizer = None

    @property
    def opt(self):
        if self._optimizer is None:
            self._optimizer = self.make_optimizer()
        return self._optimizer

    def state(self):
        import copy

        # Copies: a caller may keep the checkpoint in memory while training goes on.
        return {**self.weights(), "optimizer": copy.deepcopy(self.opt.state_dict())}

    def load_state(self, state):
        self.load_weights(state)
        self.opt.load_state_dict(state["optimizer"])


BACKBONE_KEYS = ("backbone", "backbone_weights", "backbone_tune")
# Why the backbone keys change nothing for an algorithm whose hypernetwork generates the client nets.
GENERATED_NETS = ("its hypernetwork generates model_arch's client net (a pre-trained backbone is a client net of the "
                  "algorithms that train one directly, and of hyperfl-lpm)")
# A hypernetwork generates every parameter of its target net, which holds no buffers (pfl_cli.models.hypernetwork):
# a state dict to start the net from is never read (pFedHN-PC's personal head, not generated, reads it).
GENERATED_WEIGHTS = ("its hypernetwork generates every parameter of model_arch's client net, so a state dict to "
                     "start that net from is never read (model_kwargs and model_head do act)")


def require_features(alg, what: str) -> None:
    """Refuse (one line, exit 2) a client net without ``features()`` (a pre-trained backbone net) for an algorithm
    whose ``what`` reads the net's features."""
    if not callable(getattr(alg.net, "features", None)):
        raise InputError(f"backbone: {what} reads the client net's features (features()); the backbone net "
                         f"{type(alg.net).__name__} has none; got backbone {alg.cfg.backbone!r}. Drop --set backbone= "
                         f"({alg.name} runs on model_arch's net).")


def check_keys_on_data(cfg, store) -> None:
    """Refuse a key set away from its default that this training data leaves without effect (one line, exit 2);
    the keys without effect whatever the data are refused with the config (``pfl_cli.fl.config.check_inert``)."""
    from pfl_cli.fl.config import inert_refusal

    lstm_asked = "lstm" in (getattr(cfg, "model_arch", ""), getattr(cfg, "embedding", "").removesuffix("-x"))
    if cfg.lstm_hidden != type(cfg)().lstm_hidden and getattr(store, "vocab_size", None) is None and not lstm_asked:
        # (an LSTM asked for by name on numbers is refused by the net itself, naming the net)
        raise inert_refusal("lstm_hidden", cfg.algorithm, "this data is not text: no LSTM net reads it (the LSTM is "
                            "the net of token-code data, e.g. LEAF Shakespeare)", cfg.lstm_hidden)
    if cfg.evaluate_hidden_labels and bool(np.all(store.labeled)):
        raise inert_refusal("evaluate_hidden_labels", cfg.algorithm, "every client of this partition has its "
                            "labels (the key scores clients without labels against their hidden ones)", True)
    rate = getattr(cfg, "labeled_rate", None)
    if rate is not None and rate != type(cfg)().labeled_rate:
        from pfl_cli.fl.store import ROLE_TRAIN

        if bool(np.all(np.asarray(store.labeled)[np.asarray(store.clients(ROLE_TRAIN))])):
            raise inert_refusal("labeled_rate", cfg.algorithm, "every train client of this partition has its labels "
                                "(the key sets the labeled share of cohorts that mix labeled and unlabeled clients; "
                                "thesis Alg. 9)", rate)


def epochs_protocol(new: bool, epochs: int, served: str, trained: str, untrained: str) -> dict:
    """``protocol(new)`` of an algorithm that serves a train client ``served`` from its state and starts a new
    client the same way each time, training it ``epochs``: ``trained`` (``{e}``: the epochs), or ``untrained``
    when ``epochs`` is 0."""
    if not new:
        return {"protocol": served, "rounds": 0}
    return {"protocol": trained.format(e=epochs) if epochs else untrained, "rounds": 0}


def descriptor_dim(cfg, num_clients: int) -> int:
    """l = int(1 + n / 4) unless given (pFedHN §5; PeFLL thesis App. B.1.2)."""
    return int(cfg.embed_dim) if cfg.embed_dim else int(1 + num_clients / 4)


def ceil_div(a: int, b: int) -> int:
    return int(math.ceil(a / b))
