"""The data a study may read: validation samples and validation clients carved from the train clients.

`pflx tune` never sees a partition's test split or its holdout clients: those are the final report's
(pFL-Bench, Chen et al. 2022, §4.1: "the hyperparameters are searched on the validation sets and the
test sets are only used for the final evaluation"). From the train clients (role 0) it builds a new
partition in which

- every kept client's train samples are split into fit samples (its train split here) and
  validation samples (its test split here), a share ``val_fraction`` of each client drawn at random;
- a share ``val_clients`` of the labeled train clients become *validation clients* (role 1 here):
  clients the trial never trains on, for methods whose headline is clients unseen in training
  (PeFLL, FLowDUP); they are split half and half (or by ``val_fraction`` when larger): the fit half is
  what a new-client protocol may read (PeFLL's descriptor, a fine-tune), the other half scores them.

A trial then trains on this partition as ``pflx train`` trains on the real one and is scored on
its "test" split, which is validation data only. The original test indices and holdout clients
appear nowhere in it, so what the study selects cannot depend on them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pfl_cli.errors import InputError

ROLE_TRAIN, ROLE_VALIDATION = 0, 1
VALIDATION_CLIENT_SHARE = 0.5


def validation_partition(part, *, val_fraction: float, val_clients: float, rng: np.random.Generator,
                         unlabeled_validation_clients: bool = False):
    """The tuning partition of ``part`` (see the module docstring).

    Parameters
    ----------
    part : pfl_cli.partition.Partition
    val_fraction : float in (0, 1)
        Share of each kept client's train samples that become its validation samples (at least one
        sample of any client with two or more).
    val_clients : float in [0, 1)
        Share of the labeled train clients that become validation clients (0: none; at least one
        otherwise, and at least one train client is kept).
    rng : numpy.random.Generator
    unlabeled_validation_clients : bool
        Mark the validation clients unlabeled (their labels still score them), for studies whose
        new clients have no labels (FLowDUP): the trial then sees them as the partition's real new
        clients are seen.
    """
    if not 0.0 < val_fraction < 1.0:
        raise InputError(f"val_fraction must be in (0, 1); got {val_fraction!r}.")
    if not 0.0 <= val_clients < 1.0:
        raise InputError(f"val_clients must be in [0, 1); got {val_clients!r}.")
    train = np.flatnonzero(np.asarray(part.role) == ROLE_TRAIN)
    if len(train) == 0:
        raise InputError("--partition: tuning needs train clients (role 0); the partition has none.")
    labeled = np.ones(part.num_clients, bool) if part.labeled is None else np.asarray(part.labeled, bool)
    chosen = np.zeros(part.num_clients, bool)
    if val_clients > 0:
        pool = train[labeled[train]]
        count = max(1, int(round(val_clients * len(train))))
        if len(train) - count < 1 or len(pool) < count:
            raise InputError(f"--val-clients {val_clients:g}: {count} validation clients cannot be carved from "
                             f"{len(train)} train clients ({len(pool)} with labels) leaving one to train; lower "
                             "--val-clients or partition into more clients.")
        chosen[rng.choice(pool, size=count, replace=False)] = True
    sizes = np.diff(part.train_offsets)[train]
    owner = np.repeat(np.arange(len(train)), sizes)
    samples = np.concatenate([part.train_of(j) for j in train]) if len(train) else np.zeros(0, np.int64)
    # A random rank of each sample within its client: the first n_val of each client validate.
    order = np.lexsort((rng.random(len(samples)), owner))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty(len(samples), np.int64)
    rank[order] = np.arange(len(samples)) - np.repeat(starts, sizes)
    # A validation client is scored on the samples its new-client protocol does not read: half of them, so
    # that its score rests on more than a couple of samples where clients are small.
    share = np.where(chosen[train], max(val_fraction, VALIDATION_CLIENT_SHARE), val_fraction)
    n_val = np.where(sizes >= 2, np.maximum(1, np.round(share * sizes).astype(np.int64)), 0)
    n_val = np.minimum(n_val, sizes - 1)
    is_val = rank < n_val[owner]
    fit_sizes, val_sizes = sizes - n_val, n_val
    # owner-major, sample order kept inside each client (the partition's own order)
    fit = samples[~is_val]
    val = samples[is_val]
    role = np.where(chosen[train], ROLE_VALIDATION, ROLE_TRAIN).astype(np.uint8)
    new_labeled = None
    if part.labeled is not None or unlabeled_validation_clients:
        new_labeled = labeled[train].astype(np.uint8)
        if unlabeled_validation_clients:
            new_labeled[role == ROLE_VALIDATION] = 0
    return dataclasses.replace(
        part,
        client_id=np.asarray(part.client_id)[train],
        role=role,
        train_offsets=np.concatenate([[0], np.cumsum(fit_sizes)]).astype(np.int64),
        train_indices=fit.astype(np.int64),
        test_offsets=np.concatenate([[0], np.cumsum(val_sizes)]).astype(np.int64),
        test_indices=val.astype(np.int64),
        client_name=None if part.client_name is None else np.asarray(part.client_name)[train],
        labeled=new_labeled,
        rotation=None if part.rotation is None else np.asarray(part.rotation)[train],
        info={"tuning": {"val_fraction": val_fraction, "val_clients": int(chosen.sum())}},
    )
