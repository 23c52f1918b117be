"""Every DP stage reads, on a dataset and its add/remove-one neighbour, records that differ in that one unit only.

A ledger's epsilon is the bound of the mechanism its accountant analysed: a function of the private records,
whose neighbour (``docs/privacy/release-contract.md``) lacks one sample (example-level) or one client
(client-level). If the data a stage hands its mechanisms (the fit and validation samples, the validation
clients, the client histograms, the client points) move with a record's *position* under public randomness,
removing one record moves many others and the bound does not apply (issue 39, item 1: 479 of 1437 samples
moved between fit and validation on removing one training sample).

Each case runs a stage's real command in-process on a partition D and on its neighbour D' with the
mechanism's randomness fixed (``noise=seeded``), and *observes* what the stage hands its mechanisms: the
function that receives the private data is wrapped (``build_store`` for training and every tuning trial,
``validation_partition`` for the study's carve, ``fit_feddp_kmeans``, ``run_mdm_fit``), and every sample
the engine reads through ``ClientStore.inputs`` is checked to lie in the store it was handed. Records are
compared by content (a digest of features and label), never by position.

The cases are generated from the stage list (every command that takes ``--dp``) and, for ``train`` and
``tune``, from the registry (every algorithm that declares a DP unit): one algorithm per stage in the
default tier, all of them under ``slow``.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from pfl_cli.cli.app import main

N_CLIENTS, N_HOLDOUT = 12, 2
REMOVED_CLIENT = 4                  # client-level neighbour: this train client is absent from D'
REMOVED_SAMPLE = (3, 5)             # example-level neighbour: client 3's 6th train sample is absent from D'


def _digest(x_row, label) -> str:
    h = hashlib.sha256(np.ascontiguousarray(np.asarray(x_row)).tobytes())
    h.update(str(int(label)).encode())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------ D and its neighbour
def _partition(neighbour: str | None):
    """builtin:digits over 12 clients (2 holdout), ~100 train and ~30 test samples each; ``neighbour``:
    None (D), "example" (one train sample removed) or "client" (one train client removed)."""
    from pfl_cli.partition.base import Partition, csr_from_lists

    rng = np.random.default_rng(7)
    order = rng.permutation(1797)[:N_CLIENTS * 130]
    lists = np.split(order, N_CLIENTS)
    train = [list(a[:100]) for a in lists]
    test = [list(a[100:]) for a in lists]
    ids = np.arange(N_CLIENTS) * 7 + 3            # ids that are not positions
    role = np.r_[np.zeros(N_CLIENTS - N_HOLDOUT), np.ones(N_HOLDOUT)].astype(np.uint8)
    keep = np.ones(N_CLIENTS, bool)
    if neighbour == "example":
        c, i = REMOVED_SAMPLE
        del train[c][i]
    elif neighbour == "client":
        keep[REMOVED_CLIENT] = False
    train = [t for t, k in zip(train, keep) if k]
    test = [t for t, k in zip(test, keep) if k]
    tr_off, tr_idx = csr_from_lists(train)
    te_off, te_idx = csr_from_lists(test)
    return Partition(client_id=ids[keep], role=role[keep], train_offsets=tr_off, train_indices=tr_idx,
                     test_offsets=te_off, test_indices=te_idx)


def _write_partition(out: Path, neighbour: str | None) -> Path:
    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.cli.partition_artifact import write_partition_artifact
    from pfl_cli.data import load_dataset

    ds = load_dataset("builtin:digits")
    writer = ArtifactWriter(out, stage="partition", config={"neighbour": str(neighbour)}, seed=0)
    with writer:
        write_partition_artifact(writer, _partition(neighbour), ds)
    return out


def _removed(unit: str) -> object:
    """The record D has and D' lacks: a sample digest, or a client id."""
    from pfl_cli.data import load_dataset

    part = _partition(None)
    if unit == "client":
        return int(part.client_id[REMOVED_CLIENT])
    ds = load_dataset("builtin:digits")
    c, i = REMOVED_SAMPLE
    j = int(part.train_of(c)[i])
    return _digest(ds.x[j], ds.y[j])


# ------------------------------------------------------------------------------ observing the stages
class Observed:
    """What one run handed its mechanisms: a list of record sets, one per call of the observed function;
    each set holds (client key, side, digest) triples."""

    def __init__(self) -> None:
        self.calls: list[list[tuple]] = []
        self.stray_reads = 0


def _store_records(store) -> list[tuple]:
    """The store's records; a store that holds some clients only (a Flower node, a distributed rank): theirs."""
    x = store.x.cpu().numpy()
    y = store.y_eval.cpu().numpy()
    out = []
    for side in ("fit", "val", "test"):
        padded = getattr(store, side)
        for j in range(store.num_clients):
            if store.held is not None and not store.held[j]:
                continue
            n = int(padded.length[j])
            for i in padded.index[j, :n].tolist():
                out.append((int(store.client_id[j]), f"{side}:{int(store.role[j])}", _digest(x[i], y[i])))
    return out


def _observe_engine(monkeypatch, seen: Observed, unit: str) -> None:
    """Wrap ``build_store`` (every training run and tuning trial) and ``validation_partition`` (the study's carve),
    and check that every sample the engine reads lies in the store it was handed."""
    import pfl_cli.fl.store as store_mod
    import pfl_cli.tune.split as split_mod

    real_build, real_inputs, real_carve = store_mod.build_store, store_mod.ClientStore.inputs, \
        split_mod.validation_partition

    def build_store(*args, **kwargs):
        store = real_build(*args, **kwargs)
        seen.calls.append(_store_records(store))
        rows = [getattr(store, s).index[j, :int(getattr(store, s).length[j])]
                for s in ("fit", "val", "test") for j in range(store.num_clients)
                if store.held is None or store.held[j]]
        import torch

        store._observed_allowed = set(torch.cat(rows).tolist()) if rows else set()
        return store

    def inputs(self, index):
        allowed = getattr(self, "_observed_allowed", None)
        if allowed is not None:
            read = set(np.asarray(index.detach().cpu() if hasattr(index, "detach") else index).reshape(-1).tolist())
            seen.stray_reads += len(read - allowed)
        return real_inputs(self, index)

    def validation_partition(part, **kwargs):
        vpart = real_carve(part, **kwargs)
        if kwargs.get("x") is not None:
            x, y = kwargs["x"], kwargs["y"]
        else:  # a carve that is not handed the data (pflx before issue 39): the cases' dataset
            from pfl_cli.data import load_dataset

            ds = load_dataset("builtin:digits")
            x, y = ds.x, ds.y
        recs = []
        for j in range(vpart.num_clients):
            for side, idx in (("fit", vpart.train_of(j)), ("val", vpart.test_of(j))):
                recs += [(int(vpart.client_id[j]), f"{side}:{int(vpart.role[j])}", _digest(x[i], y[i])) for i in idx]
        seen.calls.append(recs)
        return vpart

    monkeypatch.setattr(store_mod, "build_store", build_store)
    monkeypatch.setattr(store_mod.ClientStore, "inputs", inputs)
    monkeypatch.setattr(split_mod, "validation_partition", validation_partition)


def _observe_cluster(monkeypatch, seen: Observed, unit: str) -> None:
    """Client keys: their position (example-level: no client moves) or their content (client-level: no ids here)."""
    import pfl_cli.cluster as cluster_mod

    real = cluster_mod.fit_feddp_kmeans

    def fit_feddp_kmeans(points, offsets, server, **kwargs):
        recs = []
        for c in range(len(offsets) - 1):
            rows = points[offsets[c]:offsets[c + 1]]
            content = np.sort(np.asarray([_digest(r, 0) for r in rows])).astype("S16")
            key = c if unit == "example" else _digest(content, 0)
            recs += [(key, "points", _digest(r, 0)) for r in rows]
        seen.calls.append(recs)
        return real(points, offsets, server, **kwargs)

    monkeypatch.setattr(cluster_mod, "fit_feddp_kmeans", fit_feddp_kmeans)


def _observe_mdm(monkeypatch, seen: Observed, unit: str) -> None:
    import pfl_cli.mdm.api as mdm_mod

    real = mdm_mod.run_mdm_fit

    def run_mdm_fit(counts, cfg, **kwargs):
        seen.calls.append([(_digest(row, 0), "histogram", _digest(row, 0)) for row in np.asarray(counts)])
        return real(counts, cfg, **kwargs)

    monkeypatch.setattr(mdm_mod, "run_mdm_fit", run_mdm_fit)


# ------------------------------------------------------------------------------ comparing neighbours
def differing(a: list[tuple], b: list[tuple], unit: str) -> set:
    """The units (sample digests, or client keys) whose records differ between two observations."""
    if unit == "client":
        ca, cb = {}, {}
        for recs, into in ((a, ca), (b, cb)):
            for client, side, digest in recs:
                into.setdefault(client, Counter())[(side, digest)] += 1
        return {c for c in ca.keys() | cb.keys() if ca.get(c) != cb.get(c)}
    diff = (Counter(a) - Counter(b)) + (Counter(b) - Counter(a))
    return {digest for _client, _side, digest in diff}


# ------------------------------------------------------------------------------ the cases
@dataclass(frozen=True)
class Case:
    stage: str
    unit: str
    observe: Callable
    run: Callable[[Path, Path], list]       # (tmp dir, D or D' input) -> argv
    prepare: Callable[[Path, str | None], Path]
    removed: Callable[[], object]


DP_EXAMPLE = "eps=2,delta=1e-5,clip=0.5,population=10000,noise=seeded"
DP_CLIENT = "eps=2,delta=1e-6,clip=0.5,population=1000,noise=seeded"
SMALL = ["--rounds", "2", "--eval-every", "2", "--local-steps", "2", "--clients-per-round", "400", "--batch-size", "8",
         "--set", "normalize=false", "--set", "mlp_hidden=[8]", "--set", "dp_sampling_rate=0.3"]
EXTRA = {"pefll": ["--set", "standardize_descriptor=false", "--set", "embed_dim=4", "--set", "hyper_hidden=8"]}


def _small(unit: str) -> list[str]:
    """SMALL; at client level (the rate and the population given: cohorts drawn, a cohort size refused) without
    --clients-per-round."""
    if unit == "example":
        return SMALL
    at = SMALL.index("--clients-per-round")
    return SMALL[:at] + SMALL[at + 2:]


def _dp_algorithms() -> list[tuple[str, str]]:
    from pfl_cli import registry

    return [(n, registry.get(n).algorithm.dp_unit) for n in registry.names() if registry.get(n).algorithm.dp_unit]


def _train_case(algorithm: str, unit: str) -> Case:
    dp = DP_EXAMPLE if unit == "example" else DP_CLIENT

    def run(d: Path, part: Path) -> list:
        return ["train", "--partition", part, "--algorithm", algorithm, "--dp", dp, *_small(unit), "--set",
                "val_fraction=0.3",
                *EXTRA.get(algorithm, []), "--out", d / "out"]

    return Case(f"train-{algorithm}", unit, _observe_engine, run, _points, lambda: _removed(unit))


def _secure_dp_algorithms() -> list[str]:
    """The client-level DP algorithms that run under secure aggregation: each takes distributed DP (ddg)."""
    from pfl_cli import registry
    from pfl_cli.fl.secagg import individual_reads

    return [n for n in registry.names() if registry.get(n).algorithm.dp_unit == "client"
            and individual_reads(registry.get(n).algorithm) == ""]


def _ddg_case(algorithm: str) -> Case:
    """Distributed DP (pfl_cli.privacy.distributed): fixed cohorts the server picks, each client's noise share."""
    assert SMALL[-2:] == ["--set", "dp_sampling_rate=0.3"]  # the central mechanism's Poisson rate: not ddg's
    small = list(SMALL[:-2])
    small[small.index("--clients-per-round") + 1] = "6"

    def run(d: Path, part: Path) -> list:
        return ["train", "--partition", part, "--algorithm", algorithm, "--secagg", "--dp",
                "eps=2,delta=1e-6,clip=0.5,noise=seeded", "--set", "dp_mechanism=ddg", *small,
                "--set", "val_fraction=0.3", "--out", d / "out"]

    return Case(f"train-{algorithm}-ddg", "client", _observe_engine, run, _points, lambda: _removed("client"))


def _tune_case(algorithm: str, unit: str) -> Case:
    dp = DP_EXAMPLE if unit == "example" else DP_CLIENT

    def run(d: Path, part: Path) -> list:
        return ["tune", "--partition", part, "--algorithm", algorithm, "--trials", "2", "--dp", dp, *_small(unit),
                "--validation-fraction", "0.3", *EXTRA.get(algorithm, []), "--out", d / "out"]

    return Case(f"tune-{algorithm}", unit, _observe_engine, run, _points, lambda: _removed(unit))


def _points(d: Path, neighbour: str | None) -> Path:
    return _write_partition(d / "part", neighbour)


def _server(d: Path) -> str:
    from pfl_cli.data import load_dataset

    x = load_dataset("builtin:digits").x[-150:]  # public: samples the partition does not use
    np.savez(d / "server.npz", x=np.asarray(x, np.float64))
    return f"npz:{d / 'server.npz'}"


def _cluster_case(unit: str) -> Case:
    def run(d: Path, part: Path) -> list:
        return ["cluster", "--partition", part, "--server-data", _server(d), "--k", "3", "--privacy-unit", unit,
                "--dp", "eps=1,delta=1e-6,noise=seeded", "--out", d / "out"]

    def removed():
        from pfl_cli.data import load_dataset

        if unit == "example":
            ds = load_dataset("builtin:digits")
            c, i = REMOVED_SAMPLE
            j = int(_partition(None).train_of(c)[i])
            return _digest(ds.features(np.array([j]))[0], 0)
        return None  # the client's content key: any one client may differ

    return Case(f"cluster-{unit}", unit, _observe_cluster, run, _points, removed)


def _histograms(d: Path, neighbour: str | None) -> Path:
    rng = np.random.default_rng(11)
    counts = np.stack([rng.multinomial(int(m), np.full(4, 0.25)) for m in 20 + np.arange(25) % 9])
    if neighbour == "client":
        counts = np.delete(counts, REMOVED_CLIENT, axis=0)
    np.save(d / "counts.npy", counts)
    return d / "counts.npy"


def _mdm_case() -> Case:
    def run(d: Path, counts: Path) -> list:
        return ["mdm-fit", "--counts", counts, "--components", "2", "--rounds", "3", "--max-samples", "30",
                "--dp", "eps=2,delta=1e-6,noise=seeded", "--out", d / "out"]

    return Case("mdm-fit", "client", _observe_mdm, run, _histograms, lambda: None)


def _compare_spec_case(algorithm: str = "fedavg", unit: str = "client") -> Case:
    """compare --spec trains an algorithm entry under DP (its set: dp_epsilon, ...) as train --dp does."""
    def run(d: Path, part: Path) -> list:
        keys = {"dp_epsilon": 2, "dp_delta": 1e-6, "dp_clip": 0.5, "dp_population": 1000, "dp_noise": "seeded",
                "write_nonprivate": True, "rounds": 2, "eval_every": 2, "local_steps": 2, "batch_size": 8,
                "normalize": False, "mlp_hidden": [8], "dp_sampling_rate": 0.3, "val_fraction": 0.3}
        import json

        (d / "spec.yaml").write_text(json.dumps({"partition": str(part), "seeds": [0], "new_clients": False,
                                                 "runs": str(d / "runs"), "algorithms": {algorithm: {"set": keys}}}))
        return ["compare", "--spec", d / "spec.yaml", "--nonprivate", "--out", d / "out"]

    return Case("compare --spec", unit, _observe_engine, run, _points, lambda: _removed(unit))


# Stages that take --dp but read no private record: privacy-account composes ledgers (public documents).
READS_NO_RECORDS = {"privacy-account"}


def _cases(every_algorithm: bool) -> list[Case]:
    """Every case (``every_algorithm``), or the default tier's: one per stage (fedavg for train and tune), and the
    first example-level algorithm's train (the sample-level carve)."""
    algorithms = _dp_algorithms()
    if every_algorithm:
        return [*(_train_case(a, u) for a, u in algorithms), *(_tune_case(a, u) for a, u in algorithms),
                *(_ddg_case(a) for a in _secure_dp_algorithms()),
                _cluster_case("example"), _cluster_case("client"), _mdm_case(), _compare_spec_case()]
    fedavg = [a for a in algorithms if a[0] == "fedavg"]
    example = [a for a in algorithms if a[1] == "example"][:1]
    return [*(_train_case(a, u) for a, u in fedavg + example), *(_tune_case(a, u) for a, u in fedavg),
            _cluster_case("example"), _mdm_case()]


def _params(every_algorithm: bool):
    default = {c.stage for c in _cases(False)}
    for case in _cases(every_algorithm):
        if every_algorithm and case.stage in default:
            continue
        yield pytest.param(case, id=case.stage, marks=[pytest.mark.slow] if every_algorithm else [])


def _check_neighbours(case: Case, tmp_path: Path, monkeypatch) -> None:
    runs = []
    for name, neighbour in (("D", None), ("D-prime", case.unit)):
        d = tmp_path / name
        d.mkdir()
        private = case.prepare(d, neighbour)
        seen = Observed()
        with monkeypatch.context() as m:
            case.observe(m, seen, case.unit)
            code = main([str(a) for a in case.run(d, private)] + ["--format", "quiet"])
        assert code == 0, f"{case.stage} on {name} exited {code}"
        assert seen.calls, f"{case.stage}: the observed function was never called"
        assert seen.stray_reads == 0, f"{case.stage}: the engine read {seen.stray_reads} samples outside its store"
        runs.append(seen)
    a, b = runs
    assert len(a.calls) == len(b.calls), (len(a.calls), len(b.calls))
    removed = case.removed()
    for k, (ra, rb) in enumerate(zip(a.calls, b.calls)):
        moved = differing(ra, rb, case.unit)
        assert len(moved) <= 1, (f"{case.stage}, call {k}: {len(moved)} {case.unit}s differ between the neighbours "
                                 f"(out of {len(ra)} records); at most the removed one may")
        if removed is not None:
            assert moved <= {removed}, (case.stage, k, moved, removed)


@pytest.mark.parametrize("case", list(_params(False)))
def test_dp_stage_reads_neighbours_that_differ_in_one_unit(case, tmp_path, monkeypatch):
    _check_neighbours(case, tmp_path, monkeypatch)


@pytest.mark.parametrize("case", list(_params(True)))
def test_every_dp_algorithm_reads_neighbours_that_differ_in_one_unit(case, tmp_path, monkeypatch):
    _check_neighbours(case, tmp_path, monkeypatch)


# The DP entry points covered elsewhere: where.
COVERED_ELSEWHERE = {"flower app": "test_the_flower_apps_nodes_read_neighbours_that_differ_in_one_client (flower)"}


def _stage_of(case: Case) -> str:
    return case.stage.split("-")[0] if case.stage.startswith(("train", "tune", "cluster")) else case.stage


def test_every_stage_that_takes_dp_has_a_neighbour_case():
    # Generated from every command, group and spec entry that releases under DP (pfl_cli.cli.app.dp_entry_points):
    # before (issue 49, finding 8) from the top-level commands' --dp option only, so flower app and compare --spec
    # were never seen.
    from pfl_cli.cli.app import dp_entry_points

    entries = set(dp_entry_points())
    assert {"flower app", "compare --spec", "train", "tune", "cluster", "mdm-fit"} <= entries
    covered = {_stage_of(c) for c in _cases(True)} | set(COVERED_ELSEWHERE)
    assert entries - READS_NO_RECORDS <= covered, entries - READS_NO_RECORDS - covered
    # and the other way: a case whose entry point the generator no longer finds (its registration gone) fails here
    assert covered <= entries, covered - entries
    assert {a for a, _ in _dp_algorithms()} <= {c.stage[len("train-"):] for c in _cases(True)
                                                if c.stage.startswith("train-")}


def test_the_comparison_sees_a_moved_record():
    """The check can fail: one record moved from fit to validation is a second differing unit."""
    a = [(1, "fit:0", "s1"), (1, "val:0", "s2"), (2, "fit:0", "s3")]
    b = [(1, "val:0", "s1"), (1, "val:0", "s2")]                       # s3 removed, s1 moved
    assert differing(a, b, "example") == {"s1", "s3"}
    assert differing(a, b, "client") == {1, 2}
    assert differing(a, [r for r in a if r[2] != "s3"], "example") == {"s3"}


# ------------------------------------------------------------------------------ the carves themselves
def _carve_records(vpart, x, y) -> list[tuple]:
    return [(int(vpart.client_id[j]), f"{side}:{int(vpart.role[j])}", _digest(x[i], y[i]))
            for j in range(vpart.num_clients)
            for side, idx in (("fit", vpart.train_of(j)), ("val", vpart.test_of(j))) for i in idx]


@pytest.mark.parametrize("unit", ["example", "client"])
def test_the_dp_carve_moves_no_record_but_the_removed_one(unit):
    """validation_partition(stable=True) on D and on every one of many neighbours, same salt."""
    from pfl_cli.data import load_dataset
    from pfl_cli.partition.base import Partition
    from pfl_cli.tune.split import validation_partition

    ds = load_dataset("builtin:digits")
    part = _partition(None)

    def carve(p):
        return _carve_records(validation_partition(p, val_fraction=0.3, val_clients=0.3, x=ds.x, y=ds.y, stable=True,
                                                   rng=np.random.default_rng(5)), ds.x, ds.y)

    full = carve(part)
    rng = np.random.default_rng(0)
    train = np.flatnonzero(part.role == 0)
    for _ in range(12 if unit == "example" else len(train)):
        lists = [list(part.train_of(j)) for j in range(part.num_clients)]
        keep = np.ones(part.num_clients, bool)
        if unit == "example":
            c = int(rng.choice(train))
            j = lists[c].pop(int(rng.integers(len(lists[c]))))
            removed = _digest(ds.x[j], ds.y[j])
        else:
            c = int(train[_])
            keep[c] = False
            removed = int(part.client_id[c])
        sizes = np.array([len(a) for a, k in zip(lists, keep) if k])
        flat = np.concatenate([a for a, k in zip(lists, keep) if k]).astype(np.int64)
        test = [part.test_of(j) for j in range(part.num_clients) if keep[j]]
        neighbour = Partition(client_id=part.client_id[keep], role=part.role[keep],
                              train_offsets=np.r_[0, np.cumsum(sizes)], train_indices=flat,
                              test_offsets=np.r_[0, np.cumsum([len(t) for t in test])],
                              test_indices=np.concatenate(test))
        assert differing(full, carve(neighbour), unit) <= {removed}


def test_the_non_dp_carve_keeps_the_shares():
    """Without --dp: exact counts, the same carve for the same seed, a share near the one asked for."""
    from pfl_cli.data import load_dataset
    from pfl_cli.tune.split import validation_partition

    ds = load_dataset("builtin:digits")
    part = _partition(None)
    runs = [validation_partition(part, val_fraction=0.2, val_clients=0.2, x=ds.x, y=ds.y,
                                 rng=np.random.default_rng(1)) for _ in range(2)]
    np.testing.assert_array_equal(runs[0].test_indices, runs[1].test_indices)
    v = runs[0]
    assert int((v.role == 1).sum()) == round(0.2 * (N_CLIENTS - N_HOLDOUT))
    train_val = sum(len(v.test_of(j)) for j in range(v.num_clients) if v.role[j] == 0)
    train_all = train_val + sum(len(v.train_of(j)) for j in range(v.num_clients) if v.role[j] == 0)
    assert train_val == 20 * int((v.role == 0).sum())   # round(0.2 * 100) of each 100-sample client
    assert train_val / train_all == pytest.approx(0.2)


# ------------------------------------------------------------------------------ the Flower app
FLOWER_RECIPE = """seed: 0
train:
  algorithm: fedavg
  rounds: 2
  eval_every: 2
  clients_per_round: 3
  local_steps: 2
  batch_size: 8
  lr: 0.05
  val_fraction: 0           # Flower keeps the last round: no validation carve
  model_arch: mlp
  mlp_hidden: [8]
  normalize: false
  dp_epsilon: 4
  dp_clip: 1
  dp_population: 50
  dp_noise: seeded
"""


@pytest.mark.flower
@pytest.mark.slow
def test_the_flower_apps_nodes_read_neighbours_that_differ_in_one_client(tmp_path, monkeypatch):
    """The Flower app releases under a ledger (DP-FedAvg, client-level): every node's store, built on D and on
    D' (one client fewer, every other client on its own node), holds the same records for the same client."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "interop"))
    from flower_fake_grid import FakeGrid

    from pfl_cli.cli.flower import server_main

    (tmp_path / "recipe.yaml").write_text(FLOWER_RECIPE)
    observed = []
    for name, neighbour in (("D", None), ("D-prime", "client")):
        d = tmp_path / name
        d.mkdir()
        part = _write_partition(d / "part", neighbour)
        assert main(["flower", "app", "--config", str(tmp_path / "recipe.yaml"), "--partition", str(part),
                     "--out", str(d / "app"), "--format", "quiet"]) == 0
        n = _partition(neighbour).num_clients
        nodes = {100 + k: {"partition-dir": str(part), "partition-id": k} for k in range(n)}
        seen = Observed()
        with monkeypatch.context() as m:
            _observe_engine(m, seen, "client")
            grid = FakeGrid(d / "app", nodes, run_config_overrides={"out": str(d / "out")})
            server_main(grid, grid.server_context())
        assert (d / "out" / "privacy.json").is_file()
        assert seen.stray_reads == 0
        observed.append([r for call in seen.calls for r in call])   # every node's own client, and the server's
    assert differing(*observed, "client") <= {_removed("client")}
    assert _removed("client") in {c for c, _, _ in observed[0]}       # the nodes' records were observed


def test_a_refused_dp_carve_prints_no_count_of_the_private_clients():
    """Printing is releasing: the refusal of a degenerate --dp draw names the option, not how many clients there
    are or how many the draw chose (review of issue 39, item 1: it printed 'each of the 30 train clients ... left
    0 validation clients and 30 labeled clients')."""
    import re

    from pfl_cli.errors import InputError
    from pfl_cli.tune.split import validation_partition

    part = _partition(None)
    refused = 0
    for seed in range(20):
        try:
            validation_partition(part, val_fraction=0.2, val_clients=0.02, rng=np.random.default_rng(seed),
                                 stable=True)
        except InputError as err:
            refused += 1
            assert set(re.findall(r"\d+(?:\.\d+)?", str(err))) <= {"0.02"}, str(err)
    assert refused  # the reference: with 10 train clients a 2 % draw leaves none to validate on most seeds
