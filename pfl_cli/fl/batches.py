"""Random minibatches for a whole cohort at once.

Every step of every client draws a fresh batch of ``batch_size`` distinct samples of the
client's own data (``specs/pefll.md`` §1.6: "each step uses a fresh random batch of 32");
a client with fewer samples uses all of them, marked by a mask so its loss is the mean
over its real samples. All draws come from one ``torch.Generator`` on the CPU, so a
round's batches depend only on the seed and the round number.
"""

from __future__ import annotations


def sample_batches(padded, clients, steps: int, batch_size: int, gen):
    """Sample indices for ``steps`` batches of each of ``clients``.

    Parameters
    ----------
    padded : pfl_cli.fl.store.Padded
        The split to draw from (usually ``store.fit``).
    clients : LongTensor (c,)
    steps, batch_size : int
    gen : torch.Generator on the CPU

    Returns
    -------
    index : LongTensor (c, steps, b), b = min(batch_size, longest client list)
        Dataset sample indices.
    mask : FloatTensor (c, steps, b)
        1 for real samples, 0 where a client has fewer than ``b`` samples.
    """
    import torch

    rows, length = padded.rows(clients)
    c, width = rows.shape
    b = min(batch_size, width)
    keys = torch.rand((c, steps, width), generator=gen).to(rows.device)
    keys = keys.masked_fill(torch.arange(width, device=rows.device) >= length[:, None, None], 2.0)
    # The b smallest keys of each (client, step) row: a uniform sample without replacement;
    # padding keys (2.0) sort last, so a short client's real samples come first.
    pos = torch.argsort(keys, dim=-1, stable=True)[..., :b]
    index = torch.gather(rows[:, None, :].expand(c, steps, width), 2, pos)
    mask = (torch.arange(b, device=rows.device) < length[:, None, None]).to(torch.float32).expand(c, steps, b)
    return index, mask
