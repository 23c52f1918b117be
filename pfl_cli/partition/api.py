"""The validated public entry point of the ``partition`` stage."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from pfl_cli.errors import ConfigError, DatasetError, InfeasibleError, PflxWarning, check_memory
from pfl_cli.partition.base import Partition, csr_from_assignment
from pfl_cli.partition.continuous import check_strictness, continuous_owners
from pfl_cli.partition.dirichlet import dirichlet_owners
from pfl_cli.partition.explicit import check_sizes, distribution_owners, read_distribution, read_sizes, size_owners
from pfl_cli.partition.grouped import GROUP_MODES, check_grouping, group_owners
from pfl_cli.partition.dominant import dominant_owners
from pfl_cli.partition.iid import iid_owners
from pfl_cli.partition.natural import natural_owners
from pfl_cli.partition.prevalence import check_prevalence, labeled_clients
from pfl_cli.partition.rotation import check_rotations, draw_rotations
from pfl_cli.partition.pathological import ASSIGN_MODES, SHARE_MODES, pathological_owners
from pfl_cli.partition.quantity import client_sizes, parse_quantity, sized_owners
from pfl_cli.partition.shards import shard_owners
from pfl_cli.partition.split import holdout_count, mark_holdout, match_test_pool, split_fraction
from pfl_cli.partition.stats import label_histograms
from pfl_cli.schema import register_choices

SCHEMES = ("iid", "dirichlet", "pathological", "shards", "quantity", "natural", "sizes", "distribution", "continuous",
           "dominant")
DEFAULT_TEST_FRACTION = 0.2


@dataclass(frozen=True)
class PartitionConfig:
    """Options of ``pflx partition``; each field is the flag of the same name."""

    dataset: str = "builtin:digits"
    scheme: str | None = None
    num_clients: int = 10
    alpha: float | list[float] | None = None
    min_size: int = 1
    self_balancing: bool = False
    classes_per_client: int | None = None
    assign: str = "random"
    class_shares: str = "uniform"
    shards_per_client: int | None = None
    quantity: str | None = None
    natural_id: bool = False
    dominant_classes: int | None = None   # HyperFL / FedPAC split: D dominant classes per client group
    uniform_share: float = 0.2            # ... and this share of each client spread over all classes
    test_fraction: float | None = None
    holdout_clients: float = 0
    plot: bool = False
    seed: int = 0
    # -- clients without labels, rotated clients (issue 15) --
    label_prevalence: float | None = None   # fraction of train clients that keep labels; the rest and holdout: none
    rotations: list[int] | None = None      # one of these angles (degrees) per client, applied when data load
    # Flower's partitioners (explicit.py, grouped.py, continuous.py; per-partition alpha in dirichlet.py).
    sizes: list[int] | str | None = None
    distribution: list[list[float]] | str | None = None
    group_size: int | None = None
    group_mode: str = "allow-smaller"
    continuous: str | int | None = None
    strictness: float | None = None
    client_alpha: list[float] | str | None = None


register_choices(PartitionConfig, scheme=SCHEMES, assign=ASSIGN_MODES, class_shares=SHARE_MODES)


def resolve_scheme(cfg: PartitionConfig) -> str:
    """The scheme, given explicitly or implied by the scheme-specific options."""
    implied = [
        name
        for name, on in (
            ("dirichlet", cfg.alpha is not None or cfg.client_alpha is not None),
            ("pathological", cfg.classes_per_client is not None),
            ("shards", cfg.shards_per_client is not None),
            ("natural", cfg.natural_id),
            ("distribution", cfg.distribution is not None),
            ("continuous", cfg.continuous is not None),
            ("dominant", cfg.dominant_classes is not None),
        )
        if on
    ]
    if cfg.scheme is not None:
        if cfg.scheme not in SCHEMES:
            raise ConfigError(f"scheme must be one of {', '.join(SCHEMES)}; got {cfg.scheme!r}.")
        stray = [s for s in implied if s != cfg.scheme]
        if stray:
            raise ConfigError(f"scheme {cfg.scheme!r} conflicts with the options of scheme {stray[0]!r}; give one scheme.")
        return cfg.scheme
    if len(implied) > 1:
        raise ConfigError(f"options of several schemes were given ({', '.join(implied)}); choose one.")
    if implied:
        return implied[0]
    if cfg.sizes is not None:
        return "sizes"
    return "quantity" if cfg.quantity is not None else "iid"


def _alpha_vector(alpha: Any, num_classes: int) -> np.ndarray:
    if isinstance(alpha, str):
        try:
            alpha = [float(a) for a in alpha.split(",")]
        except ValueError:
            raise ConfigError(f"alpha must be a float or one float per class, comma-separated; got {alpha!r}.") from None
    values = np.atleast_1d(np.asarray(alpha, dtype=np.float64))
    if values.size == 1:
        values = np.full(num_classes, values[0])
    if values.size != num_classes:
        raise ConfigError(f"alpha must be one float or {num_classes} floats (one per class); got {values.size} values.")
    if not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise ConfigError(f"--dirichlet / --alpha: alpha must be > 0 (and finite); got {alpha!r}.")
    return values


def _client_alphas(value: Any) -> list[float]:
    """``--client-alpha A1,...,AJ``: one concentration per client, each > 0."""
    try:
        values = [float(a) for a in (value.split(",") if isinstance(value, str) else np.atleast_1d(value))]
    except (TypeError, ValueError):
        values = []
    if not values or not all(np.isfinite(a) and a > 0 for a in values):
        raise ConfigError(f"client-alpha must list one alpha > 0 per client, comma-separated; got {value!r}.")
    return values


def _alpha_of(cfg: PartitionConfig, num_classes: int, num_clients: int) -> np.ndarray:
    """pflx's per-class alpha vector (C,), or Flower's per-client list as the (C, J) matrix it means."""
    if cfg.client_alpha is None:
        return _alpha_vector(cfg.alpha, num_classes)
    per_client = np.asarray(cfg.client_alpha, dtype=np.float64)
    return np.broadcast_to(per_client[None, :], (num_classes, num_clients))


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"{name.replace('_', '-')} must be an integer >= {low}; got {value!r}.")
    return int(value)


def validate_config(cfg: PartitionConfig, *, num_samples: int, num_classes: int, has_labels: bool,
                    has_clients: bool, has_test_pool: bool, input_shape: tuple[int, ...] | None = None,
                    clients: np.ndarray | None = None) -> PartitionConfig:
    """Check every option against the data before any random draw; return the resolved config.

    ``clients``: every sample's natural client id (the dataset's client column), where it has one; under scheme
    ``natural`` the resolved ``num_clients`` is the number of clients they make (after ``--group-size``), so that the
    manifest records the partition's real client count.

    Raises
    ------
    ConfigError
        Unknown scheme, out-of-range values, options of two schemes at once.
    InfeasibleError
        A request no partition can meet (e.g. ``min_size * num_clients`` above the samples).
    """
    scheme = resolve_scheme(cfg)
    if has_labels and num_classes < 2:  # every model pflx trains is a classifier: refused here, not at train
        raise DatasetError(f"--dataset {cfg.dataset}: its labels must name at least 2 classes (pflx trains "
                           f"classifiers); got {num_classes} class in {num_samples} samples.")
    cfg = _resolve_explicit(cfg, scheme, num_samples=num_samples, num_classes=num_classes)
    if scheme != "natural":
        _check_int("num_clients", cfg.num_clients, 1)
        # Label histograms, shares and stats hold a few float64 values per client and class.
        check_memory(f"--num-clients {cfg.num_clients} x {num_classes} classes",
                     8.0 * 4 * cfg.num_clients * (num_classes + 4), fix="Lower --num-clients.")
    _check_int("min_size", cfg.min_size, 0)
    if scheme in ("dirichlet", "pathological", "shards", "dominant") and not has_labels:
        raise ConfigError(f"scheme {scheme} needs every sample's label, and the dataset {cfg.dataset} has none or "
                          "some unknown (-1); use --iid, --quantity or --natural-id.")
    if scheme == "natural" and not has_clients:
        raise ConfigError(
            f"--natural-id needs a client column, and {cfg.dataset} has none (npz: array 'client'; csv: ?client=COL; leaf: users)."
        )
    if scheme == "natural" and clients is not None:
        cfg = _natural_count(cfg, clients)
    if cfg.test_fraction is not None and not (0 <= cfg.test_fraction < 1):
        raise ConfigError(f"test-fraction must be in [0, 1); got {cfg.test_fraction!r}.")
    h = cfg.holdout_clients
    if isinstance(h, bool) or not isinstance(h, (int, float)) or h < 0 or (h >= 1 and float(h) != int(h)):
        raise ConfigError(f"holdout-clients must be a fraction in [0, 1) or a whole number of clients; got {h!r}.")
    if cfg.label_prevalence is not None:
        check_prevalence(cfg.label_prevalence)
    if cfg.rotations is not None:
        cfg = dataclasses.replace(cfg, rotations=check_rotations(cfg.rotations, input_shape))
    if cfg.assign not in ASSIGN_MODES:
        raise ConfigError(f"assign must be one of {', '.join(ASSIGN_MODES)}; got {cfg.assign!r}.")
    if cfg.class_shares not in SHARE_MODES:
        raise ConfigError(f"class-shares must be one of {', '.join(SHARE_MODES)}; got {cfg.class_shares!r}.")
    if cfg.quantity is not None:
        parse_quantity(cfg.quantity)
        if scheme not in ("quantity", "dirichlet", "pathological", "iid"):
            raise ConfigError(f"--quantity combines with --dirichlet or --classes-per-client, not with scheme {scheme}.")
    if scheme == "dirichlet" and cfg.client_alpha is None:
        _alpha_vector(cfg.alpha, num_classes)
    if scheme == "pathological":
        k = _check_int("classes_per_client", cfg.classes_per_client, 1)
        if k > num_classes:
            raise ConfigError(f"classes-per-client must be <= the number of classes ({num_classes}); got {k}.")
    if scheme == "dominant":
        d = _check_int("dominant_classes", cfg.dominant_classes, 1)
        if d > num_classes:
            raise ConfigError(f"dominant-classes must be <= the number of classes ({num_classes}); got {d}.")
        share = cfg.uniform_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise ConfigError(f"uniform-share must be a number in [0, 1]; got {share!r}.")
        if cfg.quantity is not None:
            raise ConfigError("--quantity does not combine with --dominant-classes (its clients all have one size).")
    if scheme == "shards":
        s = _check_int("shards_per_client", cfg.shards_per_client, 1)
        if s * cfg.num_clients > num_samples:
            raise InfeasibleError(
                f"{cfg.num_clients} clients x {s} shards need at least {s * cfg.num_clients} samples; the train pool has "
                f"{num_samples}. Lower --num-clients or --shards-per-client."
            )
    if scheme != "natural":
        if cfg.num_clients > num_samples:
            raise InfeasibleError(
                f"num-clients {cfg.num_clients} is more than the {num_samples} samples of the train pool; every client "
                "needs at least one sample. Lower --num-clients."
            )
        if cfg.min_size * cfg.num_clients > num_samples:
            raise InfeasibleError(
                f"min-size {cfg.min_size} x num-clients {cfg.num_clients} = {cfg.min_size * cfg.num_clients} samples, but the "
                f"train pool has only {num_samples}: no partition can meet it. Use --min-size <= "
                f"{num_samples // cfg.num_clients} or --num-clients <= {num_samples // max(cfg.min_size, 1)}."
            )
    return dataclasses.replace(cfg, scheme=scheme)


DEFAULT_NUM_CLIENTS = PartitionConfig.num_clients


def _natural_count(cfg: PartitionConfig, clients: np.ndarray) -> PartitionConfig:
    """Scheme natural: ``num_clients`` is the count of the data's natural ids (groups of ``group_size`` of them); a
    different ``--num-clients`` is refused (the data decide it; the default stands for "not given")."""
    count = len(np.unique(np.asarray(clients)))
    if cfg.group_size is not None:
        count = check_grouping(count, cfg.group_size, cfg.group_mode)
    if cfg.num_clients not in (count, DEFAULT_NUM_CLIENTS):
        raise ConfigError(f"num-clients {cfg.num_clients} disagrees with the {count} natural clients of "
                          f"{cfg.dataset}; leave --num-clients out (scheme natural takes its clients from the data).")
    return dataclasses.replace(cfg, num_clients=count)


def _resolve_explicit(cfg: PartitionConfig, scheme: str, *, num_samples: int, num_classes: int) -> PartitionConfig:
    """Check the Flower-style options and put the numbers of their files into the config.

    The client count of ``--sizes``, ``--distribution`` and ``--client-alpha`` is the length of the
    list; ``--num-clients`` may be left out, and a different one is refused.
    """
    changes: dict[str, Any] = {}
    lengths: list[tuple[str, int]] = []
    if cfg.sizes is not None:
        if cfg.quantity is not None:
            raise ConfigError("--sizes and --quantity both set the client sizes; give one.")
        if scheme not in ("sizes", "dirichlet", "pathological", "distribution"):
            raise ConfigError(f"--sizes combines with --dirichlet, --classes-per-client or --distribution, not with scheme {scheme}.")
        changes["sizes"] = read_sizes(cfg.sizes)
        check_sizes(changes["sizes"], num_samples, cfg.min_size)
        lengths.append(("sizes", len(changes["sizes"])))
    if cfg.distribution is not None:
        changes["distribution"] = read_distribution(cfg.distribution, num_classes)
        lengths.append(("distribution rows", len(changes["distribution"])))
    if cfg.client_alpha is not None:
        if cfg.alpha is not None:
            raise ConfigError("--dirichlet/--alpha (per class) and --client-alpha (per client, Flower's form) conflict; give one.")
        if cfg.quantity is not None or cfg.sizes is not None:
            raise ConfigError("--client-alpha does not combine with --quantity or --sizes; use --dirichlet A for per-client label draws.")
        values = _client_alphas(cfg.client_alpha)
        changes["client_alpha"] = values
        lengths.append(("client-alpha", len(values)))
    if lengths:
        name, count = lengths[0]
        for other, n in lengths[1:]:
            if n != count:
                raise ConfigError(f"{name} gives {count} clients but {other} gives {n}; they must agree.")
        if cfg.num_clients not in (count, DEFAULT_NUM_CLIENTS):
            raise ConfigError(f"num-clients {cfg.num_clients} disagrees with the {count} clients of {name}; leave --num-clients out.")
        changes["num_clients"] = count
    if cfg.group_size is not None:
        if scheme != "natural":
            raise ConfigError("--group-size groups natural ids; it needs --natural-id.")
        _check_int("group_size", cfg.group_size, 1)
    if cfg.group_mode not in GROUP_MODES:
        raise ConfigError(f"group-mode must be one of {', '.join(GROUP_MODES)}; got {cfg.group_mode!r}.")
    if scheme == "continuous":
        if cfg.strictness is None:
            raise ConfigError("--continuous needs --strictness S in [0, 1] (0 = IID, 1 = sorted by the column).")
        check_strictness(cfg.strictness)
    elif cfg.strictness is not None:
        raise ConfigError("--strictness belongs to --continuous COL; give both or neither.")
    return dataclasses.replace(cfg, **changes)


def partition_labels(
    labels: np.ndarray | None,
    cfg: PartitionConfig,
    *,
    num_classes: int,
    rng: np.random.Generator,
    pool: np.ndarray | None = None,
    client: np.ndarray | None = None,
    feature: np.ndarray | None = None,
) -> Partition:
    """Split a dataset's samples into clients with train/test data and holdout clients.

    Parameters
    ----------
    labels : ndarray of shape (n,) or None
        Class labels in ``[0, num_classes)``; None for unlabelled data (IID, quantity
        and natural schemes only).
    cfg : PartitionConfig
        Already validated by :func:`validate_config`.
    num_classes : int
    rng : numpy.random.Generator
        The only source of randomness.
    pool : ndarray of shape (n,), optional
        0 for the train pool, 1 for the official test pool. Clients are built from the
        train pool; test data come from the test pool matched to each client's labels,
        unless ``cfg.test_fraction`` is set.
    client : ndarray of shape (n,), optional
        Natural client ids, for ``scheme="natural"``.
    feature : ndarray of shape (n,), optional
        The ``--continuous`` column's values, for ``scheme="continuous"``.

    Returns
    -------
    Partition
    """
    n = len(labels) if labels is not None else len(client) if client is not None else len(pool)
    lab = np.asarray(labels, dtype=np.int64) if labels is not None else np.zeros(n, dtype=np.int64)
    ncls = num_classes if labels is not None else 1
    pool = np.zeros(n, dtype=np.uint8) if pool is None else np.asarray(pool)
    train_pool = np.flatnonzero(pool == 0)
    test_pool = np.flatnonzero(pool == 1)
    r_assign, r_test, r_roles = rng.spawn(3)
    info: dict[str, Any] = {"scheme": cfg.scheme}
    owner, owner_all, names, num_clients = _owners(cfg, lab, ncls, train_pool, client, feature, r_assign, info)
    train = csr_from_assignment(owner, num_clients, train_pool)
    train, test = _test_split(cfg, train, lab, ncls, test_pool, owner_all, num_clients, r_test, info)
    n_hold = holdout_count(cfg.holdout_clients, num_clients)
    if n_hold >= num_clients:
        raise InfeasibleError(
            f"holdout-clients {cfg.holdout_clients} leaves no train client out of {num_clients}; use fewer holdout clients."
        )
    role = mark_holdout(num_clients, n_hold, rng=r_roles)
    # Later draws spawn after the original three, so partitions without them stay byte-identical.
    r_labels, r_rotate = rng.spawn(2)
    labeled = rotation = None
    if cfg.label_prevalence is not None:
        labeled, info["labels"] = labeled_clients(role, check_prevalence(cfg.label_prevalence), r_labels)
    if cfg.rotations is not None:
        rotation = draw_rotations(num_clients, check_rotations(cfg.rotations, None), r_rotate)
        info["rotations"] = {str(r): int(np.sum(rotation == r)) for r in cfg.rotations}
    part = Partition(
        client_id=np.arange(num_clients, dtype=np.int64),
        role=role,
        train_offsets=train[0],
        train_indices=train[1],
        test_offsets=test[0],
        test_indices=test[1],
        client_name=names,
        info=info,
        labeled=None if labeled is None else labeled.astype(np.uint8),
        rotation=rotation,
    )
    part.check(n)
    _warn_if_repaired(info, cfg.min_size)
    return part


def _owners(cfg: PartitionConfig, lab: np.ndarray, ncls: int, train_pool: np.ndarray, client, feature, rng, info):
    """``(owner, owner_all, names, num_clients)``: the client of each train-pool sample under ``cfg.scheme``.

    ``owner_all`` (every sample's natural client) and ``names`` only for ``natural``; ``info``
    gains the scheme's details.
    """
    if cfg.scheme == "natural":
        owner_all, names = natural_owners(np.asarray(client))
        if cfg.group_size is not None:
            owner_all, names = group_owners(owner_all, names, cfg.group_size, cfg.group_mode)
            info["grouping"] = {"group_size": cfg.group_size, "mode": cfg.group_mode}
        return owner_all[train_pool], owner_all, names, len(names)
    if cfg.scheme == "continuous":
        if feature is None:
            raise ConfigError("scheme continuous needs the column's values (feature=...).")
        owner, extra = continuous_owners(np.asarray(feature, dtype=np.float64)[train_pool], num_clients=cfg.num_clients,
                                         strictness=float(cfg.strictness), rng=rng)
        info.update(extra)
        return owner, None, None, cfg.num_clients
    return _assign(cfg.scheme, lab[train_pool], cfg, cfg.num_clients, ncls, rng, info), None, None, cfg.num_clients


def _test_split(cfg: PartitionConfig, train, lab: np.ndarray, ncls: int, test_pool: np.ndarray, owner_all,
                num_clients: int, rng, info) -> tuple:
    """``(train, test)`` CSRs: test data from the official test pool (the natural clients', or matched to
    each client's train labels), or a fraction of each client's samples split off its train data."""
    if cfg.test_fraction is None and len(test_pool) > 0:
        if cfg.scheme == "natural":
            info["test_split"] = "official test pool, same natural clients"
            return train, csr_from_assignment(owner_all[test_pool], num_clients, test_pool)
        hist = label_histograms(train[0], train[1], lab, ncls)
        info["test_split"] = "official test pool, matched to each client's train labels"
        return train, match_test_pool(hist, lab[test_pool], test_pool, rng)
    fraction = DEFAULT_TEST_FRACTION if cfg.test_fraction is None else cfg.test_fraction
    info["test_split"] = f"fraction {fraction} of each client's samples"
    if fraction == 0:  # nothing to split off: the train CSR stands (split_fraction would rebuild it as is)
        return train, (np.zeros(num_clients + 1, np.int64), np.zeros(0, np.int64))
    owner_tr = np.repeat(np.arange(num_clients), np.diff(train[0]))
    return split_fraction(owner_tr, train[1], num_clients, fraction, rng)


def _assign(scheme: str, labels: np.ndarray, cfg: PartitionConfig, num_clients: int, num_classes: int, rng, info) -> np.ndarray:
    """Owner of each train-pool sample under ``scheme`` (quantity skew applied on top)."""
    if scheme == "sizes":
        return size_owners(len(labels), np.asarray(cfg.sizes, dtype=np.int64), rng)
    if scheme == "distribution":
        sizes = None if cfg.sizes is None else np.asarray(cfg.sizes, dtype=np.int64)
        owner, extra = distribution_owners(labels, np.asarray(cfg.distribution), sizes, num_classes, rng, cfg.min_size)
        info.update(extra)
        return owner
    if cfg.quantity is not None or cfg.sizes is not None:
        if cfg.sizes is not None:  # given sizes, then each client's own label draw (Flower's InnerDirichlet)
            sizes = np.asarray(cfg.sizes, dtype=np.int64)
            info["quantity"] = {"law": "given sizes", "repaired": False}
        else:
            law, param = parse_quantity(cfg.quantity)
            sizes, size_info = client_sizes(law, param, num_clients=num_clients, total=len(labels), min_size=cfg.min_size, rng=rng)
            info["quantity"] = {"law": law, "param": param, **size_info}
        if scheme == "dirichlet":
            q = rng.dirichlet(_alpha_vector(cfg.alpha, num_classes), size=num_clients)
        elif scheme == "pathological":
            _, path_info, q = pathological_owners(
                labels, num_clients=num_clients, num_classes=num_classes, classes_per_client=cfg.classes_per_client,
                assign=cfg.assign, shares=cfg.class_shares, rng=rng,
            )
            info.update(path_info)
        else:  # IID labels: each client draws from the global label distribution
            q = np.broadcast_to(np.bincount(labels, minlength=num_classes) / len(labels), (num_clients, num_classes))
        return sized_owners(labels, sizes, q, num_classes, rng)
    if scheme == "iid":
        owner, extra = iid_owners(len(labels), num_clients=num_clients, rng=rng)
    elif scheme == "dirichlet":
        owner, extra = dirichlet_owners(
            labels, num_clients=num_clients, num_classes=num_classes, alpha=_alpha_of(cfg, num_classes, num_clients),
            min_size=cfg.min_size, self_balancing=cfg.self_balancing, rng=rng,
        )
    elif scheme == "pathological":
        owner, extra, _ = pathological_owners(
            labels, num_clients=num_clients, num_classes=num_classes, classes_per_client=cfg.classes_per_client,
            assign=cfg.assign, shares=cfg.class_shares, rng=rng,
        )
    elif scheme == "dominant":
        owner, extra = dominant_owners(labels, num_clients=num_clients, num_classes=num_classes,
                                       dominant=cfg.dominant_classes, uniform_share=float(cfg.uniform_share), rng=rng)
    else:  # shards
        owner, extra = shard_owners(labels, num_clients=num_clients, shards_per_client=cfg.shards_per_client, rng=rng)
    info.update(extra)
    return owner


def _warn_if_repaired(info: dict, min_size: int) -> None:
    import warnings

    rep = info if info.get("repaired") else info.get("quantity", {})
    if rep.get("repaired"):
        warnings.warn(
            f"the random draw left {_count(rep['clients_below_min_size'], 'client')} below --min-size {min_size}; "
            f"moved {_count(rep['samples_moved'], 'sample')} from the largest clients (recorded in stats.json).",
            PflxWarning,
            stacklevel=3,
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
