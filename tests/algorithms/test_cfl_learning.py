"""CFL's split criterion on a task no other test holds (slow tier, two seeds): label-swapped client groups
(docs/algorithms/clustered-fair.md, "CFL on label-swapped groups").

Sattler et al. (IEEE TNNLS 2020, §III, Alg. 1) split a cluster when its joint objective is near a stationary point
(the norm of the mean update below eps1) that is not stationary for some client (a client's update norm above
eps2), and §V builds such federations by giving groups of clients conflicting labels. Here: builtin:digits, every
image twice, group A with its labels and group B with y -> 9 - y, each group's copy split IID over 10 clients (70 %
train), 20 clients in all, every client every round (Alg. 1), an MLP 64-32-10, 10 local steps at lr 0.05, 40 rounds,
the warm-up of the authors' code (20 rounds), eps2 = 1.6 (theirs) and eps1 = 1.0: §V sets both per experiment from
the observed update norms, and here the mean update's norm settles at 0.9 on one seed (0.27 on the other), above the
authors' eps1 = 0.4, while a client's update exceeds 1.7 on both (docs/algorithms/clustered-fair.md has the
numbers). FedAvg with the same settings, and a control: the same clients without the swap, where no split may
happen. No single model can fit both groups: the criterion fires once the warm-up is over, and the split separates
them.
"""

from __future__ import annotations

import numpy as np
import pytest

KEYS = dict(rounds=40, eval_every=20, clients_per_round=None, local_steps=10, lr=0.05, mlp_hidden=(32,),
            val_fraction=0.0)
CFL_KEYS = dict(cfl_eps1=1.0)  # eps2 and the warm-up: the defaults (the authors' 1.6 and 20 rounds)
MARGIN = 0.30
# measured 2026-11-29 (seed 0 / 1): one split each, at round 20 (mean update norm 0.265 / 0.845, largest client
# update 1.70 / 2.10), into exactly the two groups; CFL train accuracy 96.6 / 97.3, FedAvg 48.5 / 48.4; no split in
# the control


def swapped_groups(seed: int, swap: bool = True):
    """(x, y, partition): every digit twice, the second copy relabelled 9 - y (``swap``); clients 0-9 hold the first
    copy, 10-19 the second, each copy split IID (70 % train, 30 % test)."""
    from pfl_cli.data import load_dataset
    from pfl_cli.partition.base import Partition, csr_from_lists

    ds = load_dataset("builtin:digits")
    n = len(ds.y)
    x, y = np.concatenate([ds.x, ds.x]), np.concatenate([ds.y, 9 - ds.y if swap else ds.y])
    chunks = np.array_split(np.random.default_rng(seed).permutation(n), 10)
    train, test = [], []
    for group in range(2):
        for chunk in chunks:
            idx = chunk + group * n
            cut = int(0.7 * len(idx))
            train.append(idx[:cut])
            test.append(idx[cut:])
    (to, ti), (so, si) = csr_from_lists(train), csr_from_lists(test)
    part = Partition(client_id=np.arange(20, dtype=np.int64), role=np.zeros(20, dtype=np.uint8), train_offsets=to,
                     train_indices=ti, test_offsets=so, test_indices=si)
    return x, y, part


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_cfl_splits_the_label_swapped_groups_apart(seed, monkeypatch):
    import pfl_cli.algorithms.cfl as cfl
    from pfl_cli.fl import train_federated
    from pfl_cli.registry import train_config

    fired, real = [], cfl.split_wanted

    def watched(t, members, mean_norm, max_norm, cfg):
        wanted = real(t, members, mean_norm, max_norm, cfg)
        if wanted:
            fired.append((t, members, mean_norm, max_norm))
        return wanted

    monkeypatch.setattr(cfl, "split_wanted", watched)
    x, y, part = swapped_groups(seed, swap=False)
    train_federated(x, y, 10, part, train_config("cfl", seed=seed, **KEYS, **CFL_KEYS), device="cpu")
    assert fired == []  # the control: one model fits every client, no split
    x, y, part = swapped_groups(seed)
    runs = {name: train_federated(x, y, 10, part, train_config(name, seed=seed, **KEYS,
                                                               **(CFL_KEYS if name == "cfl" else {})), device="cpu")
            for name in ("cfl", "fedavg")}
    alg = runs["cfl"].algorithm
    node = alg.member.values["node"].cpu().numpy()
    acc = {n: r.outcome.best.summaries()["train"]["mean_accuracy"] for n, r in runs.items()}
    print(f"seed {seed}: splits {fired}; clusters {node.tolist()}; cfl {acc['cfl']:.3f}, fedavg {acc['fedavg']:.3f}")
    assert [f[:2] for f in fired] == [(alg.cfg.cfl_warmup_rounds, 20)]  # once, as soon as the warm-up allows
    assert len(set(node[:10])) == 1 and len(set(node[10:])) == 1 and node[0] != node[10]  # exactly the groups
    assert acc["cfl"] >= acc["fedavg"] + MARGIN
