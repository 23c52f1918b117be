"""Data poisoning of the malicious clients' training samples, and the backdoor's evaluation split.

The store's samples are never edited in place: a poisoned sample is a new copy appended to ``store.x`` / ``store.y``
(and ``y_eval``), and the malicious client's ``fit`` row points at the copy. Every other client, split and sample
reads exactly what it read before.

The trigger (Bagdasaryan et al., AISTATS 2020, §4.1's pixel pattern) sets the bottom-right ``p x p`` pixels of an
image (``p = max(2, H // 8)``; an 8x8 digit's 64 features are read as an 8x8 image) to the largest input value of
the dataset; inputs that are no square image get it on their last four features.
"""

from __future__ import annotations

import math

import numpy as np

BACKDOOR_TARGET = 0  # the label every triggered sample is given (the attacker's choice; pflx: class 0)


def apply_trigger(x, high):
    """A copy of raw inputs ``x`` (samples first) with the trigger stamped at value ``high``."""
    x = x.clone()
    shape = tuple(x.shape[1:])
    if len(shape) >= 2:
        h = shape[-2]
        p = max(2, h // 8)
        x[..., -p:, -p:] = high
        return x
    side = math.isqrt(shape[0]) if shape else 0
    if side >= 4 and side * side == shape[0]:
        p = max(2, side // 8)
        img = x.view(x.shape[0], side, side)
        img[:, -p:, -p:] = high
        return x
    x[:, -4:] = high
    return x


def _append(store, index, x_new, y_new):
    """Append samples to the store; return their indices."""
    import torch

    start = store.x.shape[0]
    store.x = torch.cat([store.x, x_new.to(store.x.dtype)])
    store.y = torch.cat([store.y, y_new])
    store.y_eval = torch.cat([store.y_eval, y_new])
    return torch.arange(start, start + len(index), device=store.x.device)


def poison_fit(store, malicious: np.ndarray, attack: str) -> None:
    """Rewrite the ``fit`` rows of the ``malicious`` clients (store positions) for ``attack``.

    ``label-flip``: every labelled sample's label ``l`` becomes ``C - 1 - l``. ``backdoor``: every other sample
    (positions 0, 2, 4, ... of the client's list) carries the trigger and the label :data:`BACKDOOR_TARGET`.
    """
    import torch

    from pfl_cli.errors import InputError
    from pfl_cli.fl.store import NOT_HERE

    if store.vocab_size is not None:
        raise InputError(f"attack {attack}: text data (token codes) have no pixel trigger or image labels to "
                         "poison here; use an update attack (sign-flip, gaussian, alie, ipm).")
    if len(malicious) == 0:
        return
    rows = torch.as_tensor(malicious, device=store.fit.index.device)
    index = store.fit.index[rows]                                          # (m, width)
    length = store.fit.length[rows]
    cols = torch.arange(index.shape[1], device=index.device)
    real = (cols[None, :] < length[:, None]) & (index != NOT_HERE)
    if attack == "label-flip":
        pick = real & (store.y[index.clamp_max(store.y.shape[0] - 1)] >= 0)
    else:
        pick = real & (cols[None, :] % 2 == 0)
    src = index[pick]
    if len(src) == 0:
        return
    x_new = store.x[src]
    if attack == "label-flip":
        y_new = store.num_classes - 1 - store.y[src]
    else:
        x_new = apply_trigger(x_new, store.x.max())
        y_new = torch.full_like(store.y[src], BACKDOOR_TARGET)
    new_index = index.clone()
    new_index[pick] = _append(store, src, x_new, y_new)
    store.fit.index = store.fit.index.clone()
    store.fit.index[rows] = new_index


def backdoor_split(store, clients: np.ndarray):
    """The backdoor's evaluation split (``Padded``): triggered copies of the test samples of ``clients`` whose
    label is known and is not the target, labelled with the target, so that a client's accuracy on it is the
    attack's success rate (Bagdasaryan et al. 2020, §4: backdoor accuracy)."""
    import torch

    from pfl_cli.fl.store import NOT_HERE, Padded

    n = store.num_clients
    rows = torch.as_tensor(np.asarray(clients, dtype=np.int64), device=store.test.index.device)
    index, length = store.test.index[rows], store.test.length[rows]
    cols = torch.arange(index.shape[1], device=index.device)
    real = (cols[None, :] < length[:, None]) & (index != NOT_HERE)
    safe = index.clamp_max(store.y_eval.shape[0] - 1)
    label = store.y_eval[safe]
    pick = real & (label >= 0) & (label != BACKDOOR_TARGET)
    owner = rows[:, None].expand_as(index)[pick].cpu().numpy()
    src = index[pick]
    high = store.x.max()
    new = _append(store, src, apply_trigger(store.x[src], high),
                  torch.full_like(store.y_eval[src], BACKDOOR_TARGET)) if len(src) else src
    order = np.argsort(owner, kind="stable")
    return Padded.from_csr(owner[order], new.cpu().numpy()[order], n, store.test.index.device)
