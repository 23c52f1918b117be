"""The data a study may read: validation samples and validation clients carved from the train clients.

`pflx tune` never sees a partition's test split or its holdout clients: those are the final report's
(pFL-Bench, Chen et al. 2022, §4.1: "the hyperparameters are searched on the validation sets and the
test sets are only used for the final evaluation"). From the train clients (role 0) it builds a new
partition in which

- every kept client's train samples are split into fit samples (its train split here) and
  validation samples (its test split here), a share ``val_fraction`` of each client;
- a share ``val_clients`` of the train clients become *validation clients* (role 1 here):
  clients the trial never trains on, for methods whose headline is clients unseen in training
  (PeFLL, FLowDUP); they are split half and half (or by ``val_fraction`` when larger): the fit half is
  what a new-client protocol may read (PeFLL's descriptor, a fine-tune), the other half scores them.

Every draw is keyed by the record itself, never by its position: a sample's draw is a keyed hash of
its content (features and label, :func:`pfl_cli.fl.store.sample_uniforms`), a client's of its
``client_id`` (:func:`pfl_cli.fl.store.client_uniforms`), the key a salt read from ``rng`` (the seed's
stream; under ``--dp`` OS entropy unless ``noise=seeded``). Under ``--dp`` (``stable=True``) a record's
side is its own draw against the share and nothing else, so a dataset and its add/remove-one neighbour
(one sample, or one client with all its samples) are carved into fit and validation sets that differ
in that record only (``docs/privacy/release-contract.md``). Without ``--dp`` the carve also keeps the
exact counts below, which couple records (one more sample can move another) and need no such guarantee.

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
                         unlabeled_validation_clients: bool = False, x: np.ndarray | None = None,
                         y: np.ndarray | None = None, stable: bool = False):
    """The tuning partition of ``part`` (see the module docstring).

    Parameters
    ----------
    part : pfl_cli.partition.Partition
    val_fraction : float in (0, 1)
        Share of each kept client's train samples that become its validation samples.
    val_clients : float in [0, 1)
        Share of the train clients that become validation clients (0: none).
    rng : numpy.random.Generator
        Gives the salt of the keyed draws (:func:`pfl_cli.fl.store.carve_salt`).
    unlabeled_validation_clients : bool
        Mark the validation clients unlabeled (their labels still score them), for studies whose
        new clients have no labels (FLowDUP): the trial then sees them as the partition's real new
        clients are seen, and the partition's unlabeled train clients may validate too.
    x, y : ndarray, optional
        The dataset: a sample's draw is keyed by its content. Without them, by its index in the
        dataset (still not by its position in the partition).
    stable : bool
        The neighbour-stable carve of ``--dp``: every record's side from its own draw alone.

    The carve, without ``stable``:

    - validation clients: drawn from the labeled train clients and, when the validation clients take
      part unlabeled, from the unlabeled ones too, stratified so that the labeled share of the train
      clients left to train is at least the partition's (``c_L = max(1, round(share * L))`` of the L
      labeled, ``ceil(c_L * U / L)`` of the U unlabeled; the smallest draws of each stratum). Where
      the unlabeled clients cannot validate (their validation clients would be scored on labels the
      trial may read) and the partition has some, no labeled client can be carved without lowering the
      share: refused, naming ``--validation-clients``. At least one labeled client is left to train.
    - samples: each kept client validates its ``max(1, round(share * n))`` samples of smallest draw
      (none of a client with one sample), keeping one to train on.

    With ``stable``: a train client validates iff its draw is below ``val_clients`` (labeled ones, and
    unlabeled ones where they may validate: the labeled share is kept in expectation), a sample iff
    its draw is below its client's share; refused only when no validation client or no labeled
    training client results (a refusal, not a release: nothing is written).
    """
    from pfl_cli.fl.store import carve_salt, client_uniforms, sample_uniforms

    if not 0.0 < val_fraction < 1.0:
        raise InputError(f"val_fraction must be in (0, 1); got {val_fraction!r}.")
    if not 0.0 <= val_clients < 1.0:
        raise InputError(f"val_clients must be in [0, 1); got {val_clients!r}.")
    train = np.flatnonzero(np.asarray(part.role) == ROLE_TRAIN)
    if len(train) == 0:
        raise InputError("--partition: tuning needs train clients (role 0); the partition has none.")
    salt = carve_salt(rng)
    labeled = np.ones(part.num_clients, bool) if part.labeled is None else np.asarray(part.labeled, bool)
    chosen = np.zeros(part.num_clients, bool)
    if val_clients > 0:
        u_client = client_uniforms(np.asarray(part.client_id)[train], salt)
        chosen[train] = _validation_clients(train, labeled[train], u_client, val_clients, unlabeled_validation_clients,
                                            stable)
    sizes = np.diff(part.train_offsets)[train]
    owner = np.repeat(np.arange(len(train)), sizes)
    samples = np.concatenate([part.train_of(j) for j in train]) if len(train) else np.zeros(0, np.int64)
    if x is not None:
        u = sample_uniforms(x, y, samples, salt)
    else:  # keyed by the dataset index
        u = sample_uniforms(np.asarray(samples, np.int64)[:, None], None, np.arange(len(samples)), salt)
    # A validation client is scored on the samples its new-client protocol does not read: half of them, so
    # that its score rests on more than a couple of samples where clients are small.
    share = np.where(chosen[train], max(val_fraction, VALIDATION_CLIENT_SHARE), val_fraction)
    if stable:
        is_val = u < share[owner]
        n_val = np.bincount(owner[is_val], minlength=len(train))
    else:
        order = np.lexsort((u, owner))  # each client's samples by their own draw
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        rank = np.empty(len(samples), np.int64)
        rank[order] = np.arange(len(samples)) - np.repeat(starts, sizes)
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


def _validation_clients(train: np.ndarray, labeled: np.ndarray, u: np.ndarray, share: float, unlabeled_may: bool,
                        stable: bool) -> np.ndarray:
    """Which of the train clients validate (bool per train client); see :func:`validation_partition`."""
    n_lab, n_unl = int(labeled.sum()), int((~labeled).sum())
    if stable:
        chosen = (u < share) & (labeled | unlabeled_may)
        if not chosen.any() or not (labeled & ~chosen).any():
            # no count in the message: the numbers of clients are private under --dp (release-contract.md)
            raise InputError(f"--validation-clients {share:g} under --dp: each train client validates on its own "
                             "draw, and this draw left no validation client or no labeled client to train (how many "
                             "there are is private and not shown); raise or lower --validation-clients, or partition "
                             "into more clients.")
        return chosen
    if n_unl and not unlabeled_may:
        raise InputError(f"--validation-clients {share:g}: only labeled clients can validate here, and carving any of "
                         f"the {n_lab} labeled of {len(train)} train clients would leave the training clients below "
                         f"the partition's labeled share ({n_lab / len(train):.0%}); use --validation-clients 0.")
    c_lab = max(1, int(round(share * n_lab)))
    c_unl = int(np.ceil(c_lab * n_unl / n_lab)) if n_lab else 0
    if n_lab - c_lab < 1 or n_unl - c_unl < 0 or len(train) - c_lab - c_unl < 1:
        raise InputError(f"--validation-clients {share:g}: {c_lab + c_unl} validation clients cannot be carved from "
                         f"{len(train)} train clients ({n_lab} with labels) leaving a labeled one to train and the "
                         "labeled share of the train clients; lower --validation-clients or partition into more "
                         "(or more labeled) clients.")
    chosen = np.zeros(len(train), bool)
    for stratum, count in ((labeled, c_lab), (~labeled, c_unl)):
        members = np.flatnonzero(stratum)
        chosen[members[np.argsort(u[members], kind="stable")[:count]]] = True
    return chosen
