"""Grouped natural ids (Flower's ``GroupedNaturalIdPartitioner``): ``--natural-id --group-size G``.

The natural ids, in order of first appearance, are cut into consecutive groups of G; each group
is one client. What happens to the last ``m = num_ids % G`` ids (``--group-mode``):

- ``allow-smaller`` (default): they form a last, smaller client;
- ``allow-bigger``: they join the last full group;
- ``drop-reminder``: their samples are left out (Flower's spelling of the mode);
- ``strict``: refused unless G divides the number of ids.
"""

from __future__ import annotations

import numpy as np

from pfl_cli.errors import ConfigError, InfeasibleError

GROUP_MODES = ("allow-smaller", "allow-bigger", "drop-reminder", "strict")


def check_grouping(num_ids: int, group_size: int, mode: str) -> int:
    """The number of clients the grouping makes; refuses an impossible one."""
    if mode not in GROUP_MODES:
        raise ConfigError(f"group-mode must be one of {', '.join(GROUP_MODES)}; got {mode!r}.")
    full, rest = divmod(num_ids, group_size)
    if mode == "strict" and rest:
        raise InfeasibleError(
            f"group-mode strict needs group-size {group_size} to divide the {num_ids} natural ids; {rest} are left over."
        )
    clients = full + (1 if rest and mode == "allow-smaller" else 0)
    if clients < 1:
        raise InfeasibleError(f"group-size {group_size} is more than the {num_ids} natural ids; no full group can be made.")
    return clients


def group_owners(owner: np.ndarray, names: np.ndarray, group_size: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Map each sample's natural-id position to its group; -1 for dropped ids.

    Parameters
    ----------
    owner : ndarray of shape (n,)
        Position of each sample's natural id (order of first appearance).
    names : ndarray of shape (num_ids,) of str
    group_size : int
    mode : str
        One of :data:`GROUP_MODES` (already checked by :func:`check_grouping`).

    Returns
    -------
    owner : ndarray of shape (n,), int64
        The group (client) of each sample.
    names : ndarray of shape (num_clients,) of str
        Each client's ids joined with ``+``.
    """
    num_ids = len(names)
    num_clients = check_grouping(num_ids, group_size, mode)
    group = np.arange(num_ids) // group_size
    if mode == "allow-bigger":
        group = np.minimum(group, num_clients - 1)
    elif mode in ("drop-reminder", "strict"):
        group[group >= num_clients] = -1
    kept = group >= 0
    bounds = np.flatnonzero(np.diff(group[kept], prepend=-1))
    joined = np.asarray(["+".join(chunk) for chunk in np.split(np.asarray(names, dtype=str)[kept], bounds[1:])])
    return group[np.asarray(owner)], joined
