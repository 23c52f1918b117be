"""Minibatches for a whole cohort, drawn lazily one step at a time from per-epoch permutations.

Semantics (those of a shuffled ``torch.utils.data.DataLoader`` with ``drop_last=False``, one
per client): each client walks through a fresh uniform permutation of its own samples in
batches of ``b = min(batch_size, longest client list)``; one epoch is ``ceil(n_i / b)``
steps and shows every sample exactly once, the last batch of an epoch holding the
``n_i - (ceil(n_i / b) - 1) * b`` samples left (a mask marks the real ones, so the loss is
the mean over them). A client with fewer than ``b`` samples uses all of them every step.

"k local steps" (PeFLL, FedAvg ``--local-steps``) are k consecutive batches of this stream:
steps go on across epoch boundaries, drawing the next permutation when one is used up,
so a client with 100 samples and b = 32 takes steps of 32, 32, 32, 4, 32, ... samples.
``epochs`` (Local, FedAvg ``--local-epochs``) give client i exactly ``epochs * ceil(n_i / b)``
steps; a client with fewer steps than the cohort's longest sits out the remaining ones.

Memory: the cohort's current permutations, ``(c, width)`` integers like the index rows
themselves, plus ``(c, b)`` per step; no table grows with the number of steps. All draws
come from one private CPU ``torch.Generator`` seeded from the caller's ``gen`` when the
batches are created, so a round's batches depend only on the seed and the round number,
and iterating the same :class:`CohortBatches` twice gives the same batches.
"""

from __future__ import annotations

_SEED_HIGH = 2**63 - 1


class CohortBatches:
    """The batches of ``clients``, one step at a time (iterate it, or :meth:`materialize` it).

    Parameters
    ----------
    padded : pfl_cli.fl.store.Padded
        The split to draw from (usually ``store.fit``).
    clients : LongTensor (c,)
    steps : int, optional
        Steps every client takes (PeFLL's and FedAvg's k); exclusive with ``epochs``.
    batch_size : int
    gen : torch.Generator on the CPU
        Consumed once, here: one seed for the private generator.
    epochs : int or LongTensor (c,), optional
        Full passes over each client's data (Local, FedAvg ``--local-epochs``); a tensor gives each
        client its own count (FedNova's ``local_epochs_range``, drawn per client and round).

    Iterating yields ``(index, mask, active)`` per step: ``index`` LongTensor (c, b) of
    dataset sample indices, ``mask`` FloatTensor (c, b) with 1 for real samples, ``active``
    BoolTensor (c,) of the clients taking this step, or None when all of them do.
    """

    def __init__(self, padded, clients, steps: int | None, batch_size: int, gen, *, epochs: int | None = None):
        import torch

        if (steps is None) == (epochs is None):
            raise ValueError(f"CohortBatches needs exactly one of steps and epochs; got steps={steps}, epochs={epochs}.")
        self.rows, self.length = padded.rows(clients)
        self.device = self.rows.device
        c, width = self.rows.shape
        self.batch = min(int(batch_size), width)
        # Steps in one epoch of each client: ceil(n_i / b), at least 1 (an empty client idles on padding).
        self.per_epoch = torch.div(self.length + self.batch - 1, self.batch, rounding_mode="floor").clamp_min(1)
        if epochs is not None:
            per_client = torch.is_tensor(epochs)
            self.client_steps = (epochs.to(self.per_epoch) if per_client else int(epochs)) * self.per_epoch
            self.steps = int(self.client_steps.max()) if c else 0
        else:
            self.client_steps = None
            self.steps = int(steps)
        self.seed = int(torch.randint(0, _SEED_HIGH, (1,), generator=gen))

    @property
    def num_clients(self) -> int:
        return int(self.rows.shape[0])

    def __len__(self) -> int:
        return self.steps

    def active_steps(self) -> int:
        """Steps taken, summed over clients (counts optimizer steps)."""
        if self.client_steps is None:
            return self.steps * self.num_clients
        return int(self.client_steps.sum())

    def __iter__(self):
        import torch

        gen = torch.Generator().manual_seed(self.seed)
        c, width = self.rows.shape
        b, device = self.batch, self.device
        offsets = torch.arange(b, device=device)
        columns = torch.arange(width, device=device)
        perm = torch.zeros((c, width), dtype=torch.long, device=device)
        for s in range(self.steps):
            j = s % self.per_epoch                                   # step inside each client's epoch
            active = None if self.client_steps is None else s < self.client_steps
            fresh = j == 0 if active is None else (j == 0) & active
            if bool(fresh.any()):
                # A new epoch for these clients: a uniform permutation of their real positions
                # (the b smallest of iid keys per slot; padding keys 2.0 sort last).
                keys = torch.rand((int(fresh.sum()), width), generator=gen).to(device)
                keys = keys.masked_fill(columns >= self.length[fresh, None], 2.0)
                perm[fresh] = torch.argsort(keys, dim=1, stable=True)
            pos = j[:, None] * b + offsets                           # (c, b) slots of this step
            mask = pos < self.length[:, None]
            index = self.rows.gather(1, perm.gather(1, pos.clamp_max(width - 1)))
            yield index, mask.to(torch.float32), active

    def materialize(self):
        """``(index, mask)`` of shape (c, steps, b) and ``active`` (c, steps) or None: the whole table."""
        import torch

        parts = list(self)
        c, b = self.num_clients, self.batch
        if not parts:
            empty = torch.zeros((c, 0, b), dtype=torch.long, device=self.device)
            return empty, empty.to(torch.float32), None
        index = torch.stack([p[0] for p in parts], 1)
        mask = torch.stack([p[1] for p in parts], 1)
        active = None if self.client_steps is None else torch.stack([p[2] for p in parts], 1)
        return index, mask, active


class LocalSteps:
    """A round's local steps for algorithms with their own step loop, lazily: ``per_step`` batches a step.

    Iterating yields ``(index, mask, active, *extras)`` per local step: ``index`` and ``mask``
    (c, b), or (c, per_step, b) when ``per_step > 1`` (Per-FedAvg's D, D', D''); ``active``
    (c,) BoolTensor or None; ``extras`` the tensors each ``draw`` of :meth:`with_draws` made
    of the whole cohort's mask. The batches are those of ``CohortBatches(steps=len(active) * per_step)``
    grouped ``per_step`` at a time (the same numbers as ``sample_batches`` of that many steps).

    :meth:`take` gives a view of some of the clients (a distributed rank's): the batches and
    every draw are still made for the whole cohort and then sliced, so each client's numbers
    do not depend on who else is in the view.
    """

    def __init__(self, batches: CohortBatches, per_step: int, active, *, draws=(), rows=None,
                 placeholder: bool = False):
        self.batches, self.per_step, self.active = batches, int(per_step), active
        self.draws, self._rows, self._placeholder = tuple(draws), rows, placeholder

    @property
    def rows(self):
        """The clients' padded sample rows (c, width): what says whose data they are."""
        return self.batches.rows if self._rows is None else self.batches.rows[self._rows]

    @property
    def num_clients(self) -> int:
        return int(self.rows.shape[0])

    def __len__(self) -> int:
        return len(self.batches) // self.per_step

    def with_draws(self, *draws) -> "LocalSteps":
        """Add per-step random draws: ``draw(mask, gen)`` on the whole cohort's mask, ``gen`` private.

        Each draw gets its own CPU generator seeded now from the one it is given, so the draws
        depend only on that seed: ``with_draws((split_halves, gen))``.
        """
        import torch

        seeded = tuple((fn, int(torch.randint(0, _SEED_HIGH, (1,), generator=gen))) for fn, gen in draws)
        return LocalSteps(self.batches, self.per_step, self.active, draws=self.draws + seeded, rows=self._rows,
                          placeholder=self._placeholder)

    def take(self, rows, *, placeholder: bool = False) -> "LocalSteps":
        """The steps of the cohort's ``rows`` only (a slice or a bool mask); ``placeholder``: indices of
        samples this process does not hold point at its first sample instead (a stand-in client)."""
        return LocalSteps(self.batches, self.per_step, self.active, draws=self.draws, rows=rows,
                          placeholder=placeholder)

    def materialize(self):
        """``(index, mask)`` (c, steps, [per_step,] b) and ``active`` (c, steps) or None: the whole table
        (for references and tests)."""
        import torch

        parts = list(self)
        if not parts:
            index, mask, _ = self.batches.materialize()
            return index, mask, self.active
        index = torch.stack([p[0] for p in parts], 1)
        mask = torch.stack([p[1] for p in parts], 1)
        return index, mask, None if parts[0][2] is None else torch.stack([p[2] for p in parts], 1)

    def __iter__(self):
        import torch

        from pfl_cli.fl.store import NOT_HERE

        stream = iter(self.batches)
        gens = [(fn, torch.Generator().manual_seed(seed)) for fn, seed in self.draws]
        rows = slice(None) if self._rows is None else self._rows
        for s in range(len(self)):
            group = [next(stream) for _ in range(self.per_step)]
            if self.per_step == 1:
                index, mask = group[0][0], group[0][1]
            else:
                index, mask = torch.stack([g[0] for g in group], 1), torch.stack([g[1] for g in group], 1)
            active = None if self.active is None else self.active[:, s]
            extras = []  # the whole cohort's draws (a tensor or a tuple of them each), then this view's rows
            for fn, gen in gens:
                drawn = fn(mask, gen)
                extras.extend(drawn if isinstance(drawn, tuple) else (drawn,))
            index = index[rows]
            if self._placeholder:
                index = index.masked_fill(index == NOT_HERE, 0)
            yield (index, mask[rows], None if active is None else active[rows], *(e[rows] for e in extras))


class ActiveMean:
    """Each of ``c`` clients' mean of a per-step value (its loss) over the steps it took.

    ``add(value, active)``: ``active`` (c,) bool or None (every client took the step).
    """

    def __init__(self, c: int, device):
        import torch

        self.total = torch.zeros(c, device=device)
        self.taken = torch.zeros(c, device=device)

    def add(self, value, active) -> None:
        import torch

        w = torch.ones_like(self.taken) if active is None else active.to(self.taken.dtype)
        self.total += value.detach() * w
        self.taken += w

    def mean(self):
        return self.total / self.taken.clamp_min(1.0)


def draw_batches(padded, clients, steps: int | None, batch_size: int, gen, *, epochs: int | None = None):
    """A lazy :class:`CohortBatches`: what :func:`pfl_cli.fl.cohort.local_sgd` consumes step by step."""
    return CohortBatches(padded, clients, steps, batch_size, gen, epochs=epochs)


def sample_batches(padded, clients, steps: int, batch_size: int, gen):
    """The same batches as ``draw_batches(padded, clients, steps, batch_size, gen)``, as whole tables.

    For callers that index batches by step or client (descriptor batches, references);
    memory is ``c * steps * b``, so long local training should pass :func:`draw_batches`'
    lazy object to ``local_sgd`` instead.

    Returns
    -------
    index : LongTensor (c, steps, b), b = min(batch_size, longest client list)
        Dataset sample indices.
    mask : FloatTensor (c, steps, b)
        1 for real samples, 0 for padding (short clients, the last batch of an epoch).
    """
    index, mask, _ = CohortBatches(padded, clients, steps, batch_size, gen).materialize()
    return index, mask
