"""benchmarks/conformance.py's pflx side: every run has the settings the table claims to match with PFLlib."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import conformance
    import conformance_fluke
finally:
    sys.path.pop(0)


@pytest.mark.parametrize("algorithm", sorted(conformance._algorithms(100)))
def test_every_pflx_run_trains_every_client_every_round_with_the_matched_optimizer(algorithm):
    """PFLlib runs ``-jr 1`` (every client every round); pflx once dropped the benchmark's
    ``clients_per_round=None`` with the method rows' Nones and trained its default 5 of 20 clients."""
    cfg = conformance._pflx_config(algorithm, 7, 3)
    assert cfg.planned_cohort(20) in (None, 20)
    assert (cfg.rounds, cfg.seed, cfg.eval_every, cfg.batch_size, cfg.lr) == (7, 3, 7, conformance.BATCH,
                                                                               conformance.LR)
    inert = getattr(cfg.algorithm_class, "inert_keys", {})  # keys the method refuses as without effect
    row = conformance._algorithms(7)[algorithm]["pflx"]
    for k, v in dict(momentum=0.0, client_clip=0.0, lambda_theta=0.0, val_fraction=0.0, normalize=False).items():
        assert k in inert or k in row or getattr(cfg, k) == v, k  # a row's own value (FedFomo's holdout): below
    assert cfg.mlp_hidden == (conformance.HIDDEN,)
    for k, v in row.items():  # the method's constants, and its Nones left at the method's default
        assert getattr(cfg, k, None) == (v if v is not None else getattr(type(cfg)(), k, None)), k
    if "local_epochs" not in row:
        assert cfg.local_epochs == 1


def test_shared_init_gives_pfllib_the_model_pflx_starts_from(tmp_path):
    """``--shared-init``: the file the PFLlib driver loads holds pflx's initial model of the seed (its
    ``init-client`` draw) under the peer MLP's names, and the peer MLP then computes pflx's logits."""
    import torch

    from pfl_cli.algorithms.base import seeded
    from pfl_cli.models.client import MLP

    conformance._export(tmp_path, conformance.DEFAULT_DATASET, 20, 0)
    written = conformance._write_initial_model(tmp_path, "fedbabu", 3, 1)
    loaded = torch.load(tmp_path / conformance._initial_model_file("fedbabu", 1))
    assert sorted(loaded) == ["fc.bias", "fc.weight", "fc1.bias", "fc1.weight"]
    ours = seeded(1, "init-client", lambda: MLP(64, 10, (conformance.HIDDEN,)))
    peer = conformance._peer_mlp_class()(64, False)
    peer.load_state_dict(loaded)  # strict: every layer of the peer's MLP comes from the file
    x = torch.randn(7, 64)
    torch.testing.assert_close(peer(x), ours(x), rtol=0, atol=0)
    other = conformance._write_initial_model(tmp_path, "fedbabu", 3, 2)
    assert not torch.equal(other["fc.weight"], written["fc.weight"])  # each seed its own draw, as unshared


def test_shared_init_refuses_a_method_whose_model_is_more_than_the_mlp(tmp_path):
    conformance._export(tmp_path, conformance.DEFAULT_DATASET, 20, 0)
    with pytest.raises(ValueError, match=r"--shared-init: gpfl's pflx model is not the benchmark's MLP alone"):
        conformance._write_initial_model(tmp_path, "gpfl", 3, 0)
    assert not (tmp_path / conformance._initial_model_file("gpfl", 0)).exists()


def test_auto_init_shares_where_the_model_is_the_mlp_and_lets_the_rest_draw_their_own(tmp_path):
    """The default ``--init auto``: FedBABU starts PFLlib from pflx's draw (a file per seed), GPFL keeps
    each tool's own draw (no file); ``shared`` refuses GPFL; ``own`` writes nothing."""
    conformance._export(tmp_path, conformance.DEFAULT_DATASET, 20, 0)
    assert conformance._share_initial_models(tmp_path, ["fedbabu", "gpfl"], 3, [0, 1], "auto") == {"fedbabu"}
    # FedRoD's generic predictor is the MLP inside its two-head wrapper: it shares, under the MLP's names
    assert conformance._share_initial_models(tmp_path, ["fedrod"], 3, [0], "auto") == {"fedrod"}
    assert sorted(__import__("torch").load(tmp_path / conformance._initial_model_file("fedrod", 0))) == [
        "fc.bias", "fc.weight", "fc1.bias", "fc1.weight"]
    for seed in (0, 1):
        assert (tmp_path / conformance._initial_model_file("fedbabu", seed)).is_file()
        assert not (tmp_path / conformance._initial_model_file("gpfl", seed)).exists()
    with pytest.raises(ValueError, match="gpfl's pflx model is not the benchmark's MLP alone"):
        conformance._share_initial_models(tmp_path, ["fedbabu", "gpfl"], 3, [0, 1], "shared")
    assert conformance._share_initial_models(tmp_path / "x", ["fedbabu"], 3, [0, 1], "own") == set()
    assert conformance._init_words("auto", {"fedbabu"}, ["fedbabu", "gpfl"]) == (
        "shared (pflx draws it); each tool its own draw for gpfl (more than the MLP)")


# ----------------------------------------------------------------------------- the paired verdict (issue 39, defect 6)
T975 = {2: 4.302653, 3: 3.182446, 4: 2.776445}  # Student t 0.975 quantiles by degrees of freedom (tables)


def _reference_interval(diffs):
    """The 95 % t-interval of the mean, written out: mean +- t(0.975, n - 1) * sd / sqrt(n)."""
    n = len(diffs)
    mean = sum(diffs) / n
    sd = (sum((d - mean) ** 2 for d in diffs) / (n - 1)) ** 0.5
    return mean - T975[n - 1] * sd / n ** 0.5, mean + T975[n - 1] * sd / n ** 0.5


def _old_rule_ok(pflx, peer):
    """The verdict before issue 39: |mean gap| within max(2 points, the larger seed spread)."""
    diff = sum(pflx) / len(pflx) - sum(peer) / len(peer)
    return abs(diff) <= max(2.0, max(pflx) - min(pflx), max(peer) - min(peer))


@pytest.mark.parametrize("pflx,peer", [
    ([79.20, 80.09, 79.65], [77.43, 78.32, 77.88]),   # +1.77 on every seed: the gap the old bound passed
    ([79.20, 80.31, 79.65], [77.65, 78.32, 77.88]),   # +1.55, +1.99, +1.77
    ([50.0, 60.0, 70.0, 80.0], [48.9, 58.8, 68.7, 78.8]),  # +1.1 to +1.3 under seed spreads of 30 points
])
def test_a_systematic_same_sign_gap_under_two_points_fails(pflx, peer):
    assert _old_rule_ok(pflx, peer)  # the old verdict passed these
    v = conformance.paired_verdict(pflx, peer)
    assert v["verdict"] == "gap", v
    low, high = _reference_interval([a - b for a, b in zip(pflx, peer)])
    assert v["low"] == pytest.approx(low, abs=1e-4) and v["high"] == pytest.approx(high, abs=1e-4)
    assert v["low"] > 0 and v["mean"] == pytest.approx(sum(pflx) / len(pflx) - sum(peer) / len(peer))


@pytest.mark.parametrize("pflx,peer,verdict", [
    ([78.0, 79.5, 77.2], [76.5, 80.7, 76.9], "ok"),      # +1.5, -1.2, +0.3: noise around 0
    ([80.0, 80.0, 80.0], [79.78, 79.78, 79.78], "ok"),   # +0.22 on every seed (one test sample): under tolerance
    ([85.0, 79.0, 83.0], [80.0, 80.0, 80.0], "miss"),    # +5, -1, +3: mean 2.33 > 2, interval spans 0
    ([70.0, 71.0, 72.0], [72.5, 73.6, 74.4], "gap"),     # -2.5, -2.6, -2.4 is "miss": checked below
])
def test_the_verdict_on_noise_on_a_negligible_gap_and_on_a_large_one(pflx, peer, verdict):
    if verdict == "gap":
        verdict = "miss"  # |mean| > 2 is a miss whatever the interval says
    v = conformance.paired_verdict(pflx, peer)
    assert v["verdict"] == verdict, v
    low, high = _reference_interval([a - b for a, b in zip(pflx, peer)])
    assert (v["low"], v["high"]) == pytest.approx((low, high), abs=1e-4)


def test_the_tolerance_and_bound_are_the_callers():
    pflx, peer = [80.0, 80.1, 79.9], [79.6, 79.7, 79.5]  # +0.4 on every seed
    assert conformance.paired_verdict(pflx, peer)["verdict"] == "ok"
    assert conformance.paired_verdict(pflx, peer, tolerance=0.3)["verdict"] == "gap"
    assert conformance.paired_verdict(pflx, peer, bound=0.3, tolerance=0.1)["verdict"] == "miss"


@pytest.mark.parametrize("pflx,peer", [([1.0, 2.0], [1.0, 2.0]), ([1.0, 2.0, 3.0], [1.0, 2.0])])
def test_the_verdict_needs_three_paired_seeds(pflx, peer):
    with pytest.raises(ValueError, match="needs the same three or more seeds in both tools"):
        conformance.paired_verdict(pflx, peer)


@pytest.mark.parametrize("argv,message", [
    (["--seeds", "0,1"], "--seeds must list three or more distinct integers"),
    (["--seeds", "0,1,1"], "--seeds must list three or more distinct integers"),
    (["--participation", "0"], "--participation must list distinct join ratios in (0, 1]"),
    (["--participation", "1,1.5"], "--participation must list distinct join ratios in (0, 1]"),
    (["--participation", "half"], "--participation must list distinct join ratios in (0, 1]"),
    (["--tolerance", "3"], "--tolerance must be >= 0 and <= --bound"),
])
def test_bad_settings_are_refused_in_one_line_before_anything_runs(argv, message, capsys, tmp_path):
    json_out = tmp_path / "rows.json"
    assert conformance.main([*argv, "--pfllib", str(tmp_path / "absent"), "--json", str(json_out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"conformance.py: {message}") and "\n" not in err
    assert not json_out.exists()


def test_a_quarter_cohort_trains_five_of_twenty_clients_in_both_tools():
    """pflx's clients_per_round and PFLlib's int(num_clients * join_ratio) agree; join 1 is every client."""
    assert conformance.cohort_size(0.25, 20) == 5 == int(20 * 0.25)
    assert conformance.cohort_size(1.0, 20) is None
    assert conformance.parse_participation("1,0.25") == [1.0, 0.25]
    for algorithm in conformance._algorithms(7):
        cfg = conformance._pflx_config(algorithm, 7, 3, conformance.cohort_size(0.25, 20))
        assert cfg.planned_cohort(20) == 5 and cfg.rounds == 7, algorithm
    # FedALA runs as the authors' code does: ALA on every client each round
    assert conformance._pflx_config("fedala", 7, 3).ala_every_client is True


def test_the_peer_cache_is_keyed_by_setting_cohort_seed_and_initial_model(tmp_path):
    init = tmp_path / "init.pt"
    init.write_bytes(b"one draw")
    cache = conformance.PeerCache(str(tmp_path / "cache.json"), "v|ring|20|50")
    keys = {cache.key("fedavg", 1.0, 0, init), cache.key("fedavg", 0.25, 0, init), cache.key("fedavg", 1.0, 1, init),
            cache.key("fedavg", 1.0, 0, tmp_path / "absent.pt")}
    assert len(keys) == 4
    cache.add(cache.key("fedavg", 1.0, 0, init), {"accuracy": 0.5, "seconds": 1.0})
    init.write_bytes(b"another draw")  # another initial model: not the cached run
    again = conformance.PeerCache(str(tmp_path / "cache.json"), "v|ring|20|50")
    assert cache.key("fedavg", 1.0, 0, init) not in again and len(again) == 1
    assert conformance.PeerCache(str(tmp_path / "cache.json"), "v|ring|20|100").key(
        "fedavg", 1.0, 0, init) not in again


def test_a_rows_peer_constants_are_part_of_the_cache_key(tmp_path):
    """FedAMP's fluke row moved from sigma 1 to 100: the cached sigma-1 runs must not answer for it. The pflx side
    and the unmatched note are not the peer's run and leave the key as it was."""
    import copy

    init = tmp_path / "init.pt"
    init.write_bytes(b"one draw")
    cache = conformance.PeerCache(None, "v|ring|20|50")
    row = conformance_fluke.fluke_algorithms(50, conformance.LR)["fedamp"]
    other = copy.deepcopy(row)
    other["server"]["sigma"] = 1.0
    assert cache.key("fedamp", 1.0, 0, init, row) != cache.key("fedamp", 1.0, 0, init, other)
    same = {**copy.deepcopy(row), "pflx": {}, "unmatched": "another note"}
    assert cache.key("fedamp", 1.0, 0, init, row) == cache.key("fedamp", 1.0, 0, init, same)
    pfllib = conformance._algorithms(50)["fedlc"]
    assert cache.key("fedlc", 1.0, 0, init, pfllib) != cache.key(
        "fedlc", 1.0, 0, init, {**pfllib, "flags": ["-tau", "0.5"]})


# ----------------------------------------------------------------------------- fluke-fl, the second peer (issue 40)
@pytest.mark.parametrize("algorithm", sorted(conformance_fluke.fluke_algorithms(100, conformance.LR)))
def test_every_pflx_run_against_fluke_has_the_matched_settings_and_its_rows_keys(algorithm):
    """The pflx side of a fluke row: the benchmark's matched settings, then the row's own pflx keys (APFL's
    alpha fixed, as fluke's is), every client every round unless a cohort is given."""
    row = conformance_fluke.fluke_algorithms(7, conformance.LR)[algorithm]
    cfg = conformance._pflx_config(algorithm, 7, 3, None, "fluke")
    assert cfg.algorithm == algorithm and cfg.planned_cohort(20) in (None, 20)
    assert (cfg.rounds, cfg.seed, cfg.batch_size, cfg.lr) == (7, 3, conformance.BATCH, conformance.LR)
    inert = getattr(cfg.algorithm_class, "inert_keys", {})
    for k, v in dict(momentum=0.0, client_clip=0.0, val_fraction=0.0, normalize=False).items():
        assert k in inert or getattr(cfg, k) == v, k
    for k, v in row["pflx"].items():
        assert getattr(cfg, k, None) == (v if v is not None else getattr(type(cfg)(), k, None)), k
    assert conformance._pflx_config(algorithm, 7, 3, 5, "fluke").planned_cohort(20) == 5
    assert set(row) >= {"peer", "pflx", "client", "server"} and row["peer"].count(".") == 1


def test_fluke_rows_match_what_fluke_cannot_vary():
    """APFL: fluke has no alpha update, so pflx's alpha is fixed at fluke's lam and fluke averages every round;
    the body/head methods give fluke the encoder as its global model."""
    rows = conformance_fluke.fluke_algorithms(50, conformance.LR)
    assert rows["apfl"]["pflx"] == {"alpha": 0.5, "alpha_lr": 0.0} and rows["apfl"]["client"] == {"lam": 0.5}
    assert rows["apfl"]["server"] == {"tau": 1}
    assert {a for a, r in rows.items() if r.get("body_only")} == {"fedper", "fedrep", "fedbabu", "fednh"}
    assert rows["fedrep"]["client"] == {"local_epochs": 5, "tau": 1}  # fluke: head epochs, then body epochs
    assert conformance._pflx_config("fedrep", 50, 0, None, "fluke").head_epochs == 5
    # the pflx side of a PFLlib row is untouched: PFLlib's APFL row keeps the adaptive alpha
    assert conformance._pflx_config("apfl", 50, 0).alpha_lr is None


def test_the_fluke_child_reads_the_clients_pflx_exported_in_client_order(tmp_path):
    """fluke's clients are built from the files conformance.py exports: client i's train and test rows are
    exactly pflx's partition rows of client i, standardized the same."""
    import numpy as np

    conformance._export(tmp_path, conformance.DEFAULT_DATASET, 20, 0)
    x, y, part = conformance.load_export(tmp_path)
    for split, offsets, indices in (("train", part.train_offsets, part.train_indices),
                                    ("test", part.test_offsets, part.test_indices)):
        clients = conformance_fluke.read_clients(tmp_path / "dataset" / conformance.DATASET / split)
        assert len(clients) == part.num_clients == 20
        for i, (cx, cy) in enumerate(clients):
            rows = indices[offsets[i]:offsets[i + 1]]
            np.testing.assert_array_equal(cx, x[rows])
            np.testing.assert_array_equal(cy, y[rows])
    assert all(len(cy) % conformance.BATCH == 0 for _, cy in
               conformance_fluke.read_clients(tmp_path / "dataset" / conformance.DATASET / "train"))


def test_without_fluke_the_benchmark_says_so_and_exits_0(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLUKE_PYTHON", raising=False)
    json_out = tmp_path / "rows.json"
    assert conformance.main(["--peer", "fluke", "--python", str(tmp_path / "absent"), "--json", str(json_out)]) == 0
    assert "conformance.py: skipped: fluke's Python not found" in capsys.readouterr().out
    not_fluke = tmp_path / "python"
    not_fluke.write_text("#!/bin/sh\nexit 1\n")
    not_fluke.chmod(0o755)
    assert conformance.main(["--peer", "fluke", "--python", str(not_fluke), "--json", str(json_out)]) == 0
    assert f"skipped: {not_fluke} does not import fluke" in capsys.readouterr().out
    assert not json_out.exists()


@pytest.mark.parametrize("argv,message", [
    (["--seeds", "0,1"], "--seeds must list three or more distinct integers"),
    (["--algorithms", "fedala"], "--algorithms must be among fedavg,"),  # PFLlib's row, not fluke's
])
def test_bad_settings_against_fluke_are_refused_in_one_line(argv, message, capsys, tmp_path):
    assert conformance.main(["--peer", "fluke", *argv, "--python", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"conformance.py: {message}") and "\n" not in err


def test_the_fluke_table_is_paired_by_seed_with_fluke_named_in_its_columns(tmp_path, capsys, monkeypatch):
    """The driver's plumbing with a fake peer (a stand-in Python that says it is fluke; its runs canned): the
    rows pair each seed's pflx and fluke accuracies, the verdict is :func:`paired_verdict`'s, a gap fails."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho '0.8.1 (torch fake)'\n")
    fake.chmod(0o755)
    acc = {("pflx", "fedavg"): [0.50, 0.52, 0.51], ("fluke", "fedavg"): [0.505, 0.515, 0.51],
           ("pflx", "apfl"): [0.80, 0.81, 0.82], ("fluke", "apfl"): [0.70, 0.71, 0.72]}
    calls = []

    def canned(framework, alg, join, seed, args, work, pfllib, python):
        calls.append((framework, alg, join, seed, python))
        assert (work / "dataset" / conformance.DATASET / "train" / "19.npz").is_file()
        return {"accuracy": acc[(framework, alg)][seed], "seconds": 1.0}

    monkeypatch.setattr(conformance, "_run", canned)
    json_out = tmp_path / "rows.json"
    code = conformance.main(["--peer", "fluke", "--python", str(fake), "--algorithms", "fedavg,apfl",
                             "--rounds", "2", "--participation", "1", "--json", str(json_out)])
    out = capsys.readouterr().out
    assert code == 1 and "fluke-fl 0.8.1 (torch fake) at" in out and "fluke %" in out
    assert "1 row(s) fail the paired verdict" in out and "apfl (cohort 1: miss)" in out
    assert {c[0] for c in calls} == {"pflx", "fluke"} and {c[4] for c in calls} == {str(fake)}
    import json

    rows = {r["algorithm"]: r for r in json.loads(json_out.read_text())["rows"]}
    assert rows["apfl"]["fluke"] == pytest.approx([70.0, 71.0, 72.0])
    assert rows["apfl"]["mean"] == pytest.approx(10.0) and rows["apfl"]["verdict"] == "miss"
    assert rows["fedavg"]["verdict"] == "ok"
    assert rows["apfl"]["initial_model"] == "shared"


def test_fluke_gets_the_matched_optimizer_and_each_rows_keys_over_it():
    """The hyperparameters the child hands fluke: plain SGD at the benchmark's lr and batch, one epoch, unless
    the row says otherwise (FedRep's head epochs once collided with the default ``local_epochs`` and failed)."""
    rows = conformance_fluke.fluke_algorithms(50, conformance.LR)
    for name, row in rows.items():
        hp = conformance_fluke.hyperparameters(row, conformance.BATCH, conformance.LR)
        assert hp["client"]["optimizer"] == dict(name="SGD", lr=conformance.LR, momentum=0.0, weight_decay=0.0)
        assert hp["client"]["batch_size"] == conformance.BATCH and hp["server"]["weighted"] is True
        assert hp["client"]["local_epochs"] == row["client"].get("local_epochs", 1), name
        assert all(hp["client"][k] == v for k, v in row["client"].items())
        assert all(hp["server"][k] == v for k, v in row["server"].items())
        assert hp["model"].endswith("FlukeEncoder" if row.get("body_only") else "FlukeMLP")
    assert conformance_fluke.hyperparameters(rows["fedrep"], 10, 0.05)["client"]["local_epochs"] == 5
    assert conformance_fluke.hyperparameters(rows["feddyn"], 10, 0.05)["client"]["clipping"] == 0


def _flags(row: dict) -> dict:
    return dict(zip(row["flags"][::2], row["flags"][1::2]))


def test_the_prototype_rows_weigh_the_alignment_as_the_peers_mean_squared_error_does():
    """PFLlib's and fluke's FedProto add lam * nn.MSELoss()(prototype, representation) (the mean over the batch and
    the d features: clientproto.py, fluke's fedproto.py fit); pflx adds fedproto_lambda times the squared distance,
    averaged over the batch (Eq. 7-8). The rows' constants give the same term on a batch."""
    import torch

    rep, proto = torch.randn(10, conformance.HIDDEN), torch.randn(10, conformance.HIDDEN)
    pfllib = conformance._algorithms(50)["fedproto"]
    fluke = conformance_fluke.fluke_algorithms(50, conformance.LR)["fedproto"]
    for peer_lam, pflx_lam in ((float(_flags(pfllib)["-lam"]), pfllib["pflx"]["fedproto_lambda"]),
                               (fluke["client"]["lam"], fluke["pflx"]["fedproto_lambda"])):
        peer_term = peer_lam * torch.nn.MSELoss()(proto, rep)
        pflx_term = pflx_lam * ((rep - proto) ** 2).sum(1).mean()
        torch.testing.assert_close(peer_term, pflx_term)
    assert conformance._pflx_config("fedproto", 50, 0).fedproto_lambda == pytest.approx(0.01)
    # the same inference on both sides: PFLlib's nearest global prototype, fluke's client model's head (the model the
    # fluke row scores)
    assert conformance._pflx_config("fedproto", 50, 0).inference == "prototype" and pfllib["split"]
    assert conformance._pflx_config("fedproto", 50, 0, None, "fluke").inference == "head" and fluke["score"] == "model"


def test_the_fedamp_rows_give_the_peers_pflxs_attention_and_proximal_weight():
    """FedAMP: PFLlib's -alk, -sg, -lam are pflx's alpha_k, sigma, lam; fluke's client proximal term is
    lam / (2 lr) ||w - u||^2 (fedamp.py _proximal_loss: its alpha is the optimizer's lr) and its server alpha is
    the attention's alpha_k, so fluke's lam is lr * lam / alpha_k to give pflx's lam / (2 alpha_k) ||w - u||^2."""
    import torch

    from pfl_cli.algorithms.fedamp import FedAMP

    pfllib = conformance._algorithms(50)["fedamp"]
    cfg = conformance._pflx_config("fedamp", 50, 0)
    assert {k: float(v) for k, v in _flags(pfllib).items()} == {"-alk": cfg.alpha_k, "-sg": cfg.sigma, "-lam": cfg.lam}
    fluke = conformance_fluke.fluke_algorithms(50, conformance.LR)["fedamp"]
    cfg = conformance._pflx_config("fedamp", 50, 0, None, "fluke")
    assert (fluke["server"]["alpha"], fluke["server"]["sigma"]) == (cfg.alpha_k, cfg.sigma)
    w, u = torch.randn(50), torch.randn(50)
    fluke_term = fluke["client"]["lam"] / (2 * conformance.LR) * torch.norm(w - u) ** 2
    mu = FedAMP.prox_weight(type("Run", (), {"cfg": cfg})())  # pflx's proximal gradient mu (w - u)
    torch.testing.assert_close(fluke_term, mu / 2 * ((w - u) ** 2).sum())


def test_the_fedfomo_and_fedlc_rows_hold_out_and_calibrate_as_pfllib_does():
    """FedFomo: PFLlib weighs the received models on the last 20 % of each client's train split
    (clientfomo.py val_ratio 0.2) and sends the top M by affinity (no exploration): pflx's val_fraction 0.2,
    epsilon 0, M = -M. FedLC: the same tau. FedNH against fluke: its rho is the old prototypes' weight, as
    pflx's fednh_rho, and neither clips."""
    fomo = conformance._algorithms(50)["fedfomo"]
    cfg = conformance._pflx_config("fedfomo", 50, 0)
    assert (cfg.val_fraction, cfg.fomo_epsilon, cfg.fomo_epsilon_decay) == (0.2, 0.0, 0.0)
    assert cfg.fomo_models == int(_flags(fomo)["-M"]) and cfg.local_epochs == 1
    lc = conformance._algorithms(50)["fedlc"]
    assert conformance._pflx_config("fedlc", 50, 0).tau == float(_flags(lc)["-tau"])
    nh = conformance_fluke.fluke_algorithms(50, conformance.LR)["fednh"]
    cfg = conformance._pflx_config("fednh", 50, 0, None, "fluke")
    assert (cfg.fednh_rho, cfg.client_clip, cfg.lambda_theta, cfg.momentum) == (nh["server"]["rho"], 0.0, 0.0, 0.0)
    assert nh["client"]["clipping"] == 0 and nh["client"]["model"].endswith("FlukeEncoder")


def test_a_row_that_scores_another_model_scores_the_clients_own_one():
    """fluke's ``score: "model"`` rows: the client's model as its last round left it; FedNH's with the prototypes it
    trained against (fluke writes the client's class means over them after fit), whose logits are its second
    output. Checked against the argmax computed by hand."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    x, y = torch.randn(12, 4), torch.randint(0, 3, (12,))
    loader = [(x[:5], y[:5]), (x[5:], y[5:])]
    linear = nn.Linear(4, 3)
    client = type("Client", (), {"model": linear})()
    assert conformance_fluke._scored_model(client) is linear
    assert conformance_fluke._counts(linear, loader) == (int((linear(x).argmax(1) == y).sum()), 12)

    class ProtoNet(nn.Module):  # fluke's FedNH net: (unit embeddings, scale * cosine logits)
        def __init__(self):
            super().__init__()
            self.encoder = nn.Linear(4, 5)
            self.prototypes = nn.Parameter(torch.randn(3, 5), requires_grad=False)

        def forward(self, z):
            e = nn.functional.normalize(self.encoder(z), dim=1)
            return e, e @ self.prototypes.T

    net, trained = ProtoNet(), torch.randn(3, 5)
    client = type("Client", (), {"model": net, "trained_prototypes": trained})()
    scored = conformance_fluke._scored_model(client)
    expected = nn.functional.normalize(net.encoder(x), dim=1) @ trained.T
    torch.testing.assert_close(scored(x), expected)
    assert not torch.equal(net.prototypes.data, trained)  # the client's own model is left as fluke has it
    assert conformance_fluke._counts(scored, loader) == (int((expected.argmax(1) == y).sum()), 12)


def test_the_peers_own_figure_of_another_model_goes_into_the_rows(tmp_path, capsys, monkeypatch):
    """A run whose peer also reports its own figure (``peer_own``: fluke's FedProto inference) puts it
    in the JSON row beside the paired figures; the verdict pairs the scored models only."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho '0.8.1 (torch fake)'\n")
    fake.chmod(0o755)

    def canned(framework, alg, join, seed, args, work, pfllib, python):
        return ({"accuracy": 0.70 + seed / 100, "seconds": 1.0} if framework == "pflx" else
                {"accuracy": 0.70 + seed / 100, "seconds": 1.0, "peer_own": 0.90})

    monkeypatch.setattr(conformance, "_run", canned)
    json_out = tmp_path / "rows.json"
    assert conformance.main(["--peer", "fluke", "--python", str(fake), "--algorithms", "fedproto", "--rounds", "2",
                             "--participation", "1", "--json", str(json_out)]) == 0
    import json

    row = json.loads(json_out.read_text())["rows"][0]
    assert row["fluke_own"] == pytest.approx([90.0] * 3) and row["verdict"] == "ok"
    assert row["mean"] == pytest.approx(0.0)


# ----------------------------------------------------------------------------- FL-bench's pFedLA (conformance_flbench)

sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import conformance_flbench
finally:
    while str(ROOT / "benchmarks") in sys.path:  # conformance_flbench puts it there for its child too
        sys.path.remove(str(ROOT / "benchmarks"))


def _fake_flbench(path):
    """The parts of an FL-bench checkout the layout links to (no peer in CI)."""
    for d in ("config", "src/server", "data/utils"):
        (path / d).mkdir(parents=True)
    for f in ("main.py", "src/server/pfedla.py", "data/utils/datasets.py"):
        (path / f).write_text("")
    return path


def test_flbench_gets_each_clients_own_samples_in_its_layout(tmp_path):
    """FL-bench's partition.pkl indexes the pooled data.npy / targets.npy: each client's train and test rows there
    are the samples pflx trains and tests that client on (compared by content, client by client), every client
    trains and tests (FL-bench's ``split == "sample"``), and the checkout's code is linked, not copied."""
    import json
    import pickle

    import numpy as np

    work = tmp_path / "work"
    work.mkdir()
    conformance._export(work, conformance.DEFAULT_DATASET, 20, 0)
    checkout = _fake_flbench(tmp_path / "FL-bench")
    root = conformance_flbench.write_flbench_layout(work, checkout)
    folder = root / "data" / conformance_flbench.NAME
    data, targets = np.load(folder / "data.npy"), np.load(folder / "targets.npy")
    with open(folder / "partition.pkl", "rb") as f:
        flb = pickle.load(f)
    x, y, part = conformance.load_export(work)
    assert flb["separation"] == {"train": list(range(20)), "val": list(range(20)), "test": list(range(20)),
                                 "total": 20}
    assert json.loads((folder / "args.json").read_text())["split"] == "sample"
    for i in range(part.num_clients):
        for split, idx, off in (("train", part.train_indices, part.train_offsets),
                                ("test", part.test_indices, part.test_offsets)):
            rows = flb["data_indices"][i][split]
            assert len(rows) == off[i + 1] - off[i] > 0
            np.testing.assert_array_equal(data[rows], x[idx[off[i]:off[i + 1]]])
            np.testing.assert_array_equal(targets[rows], y[idx[off[i]:off[i + 1]]])
        assert flb["data_indices"][i]["val"] == []
        assert len(flb["data_indices"][i]["train"]) % conformance.BATCH == 0  # whole batches: the same steps
        assert len(set(targets[flb["data_indices"][i]["train"]].tolist())) == 2  # two classes a client
    assert data.dtype == np.float32 and abs(float(data[part.train_indices].mean())) < 1e-3  # standardized
    for name in ("main.py", "config", "src", "data/utils"):
        assert (root / name).is_symlink() and (root / name).resolve() == (checkout / name).resolve()


def test_flbench_runs_with_the_matched_settings_and_the_step_size_given():
    overrides = dict(o.lstrip("+").split("=", 1) for o in conformance_flbench.flbench_overrides(4, 50, 100.0))
    assert overrides["method"] == "pfedla" and overrides["pfedla.hn_lr"] == "100.0"
    assert float(overrides["optimizer.lr"]) == conformance.LR and overrides["optimizer.name"] == "sgd"
    assert int(overrides["common.batch_size"]) == conformance.BATCH
    assert (overrides["optimizer.momentum"], overrides["optimizer.weight_decay"]) == ("0", "0")
    assert (overrides["common.global_epoch"], overrides["common.local_epoch"], overrides["common.join_ratio"],
            overrides["common.seed"]) == ("50", "1", "1", "4")
    assert overrides["common.test.client.interval"] == "50"  # scored after the last round, as pflx's figure


def test_flbench_rows_pair_each_step_size_by_seed_and_the_defaults():
    seeds, lrs = [0, 1, 2], [conformance_flbench.FLBENCH_HN_LR, conformance_flbench.PFLX_HN_LR]
    acc = {("pflx", 0.005, s): 35.0 + s for s in seeds} | {("flbench", 0.005, s): 72.0 + s for s in seeds}
    acc |= {("pflx", 100.0, s): 76.0 + 0.1 * s for s in seeds} | {("flbench", 100.0, s): 76.0 - 0.1 * s
                                                                   for s in seeds}
    rows = conformance_flbench.rows(acc, seeds, lrs, bound=2.0, tolerance=0.5)
    assert [(r["pflx_hn_lr"], r["flbench_hn_lr"]) for r in rows] == [(0.005, 0.005), (100.0, 100.0),
                                                                       (100.0, 0.005)]
    assert rows[0]["diffs"] == [-37.0, -37.0, -37.0] and rows[0]["verdict"] == "miss"
    assert rows[1]["verdict"] == "ok" and rows[1]["pflx"] == [76.0, 76.1, 76.2]
    assert rows[2]["flbench"] == [72.0, 73.0, 74.0] and rows[2]["mean"] == pytest.approx(3.1)


def test_without_flbench_the_benchmark_says_so_and_exits_0(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLBENCH_DIR", raising=False)
    monkeypatch.delenv("FLBENCH_PYTHON", raising=False)
    json_out = tmp_path / "rows.json"
    assert conformance_flbench.main(["--flbench", str(tmp_path / "absent"), "--json", str(json_out)]) == 0
    assert "skipped: " in capsys.readouterr().out and not json_out.exists()
    checkout = _fake_flbench(tmp_path / "FL-bench")
    assert conformance_flbench.main(["--flbench", str(checkout), "--python", str(tmp_path / "absent"),
                                     "--json", str(json_out)]) == 0
    out = capsys.readouterr().out
    assert "skipped: " in out and not json_out.exists()


def test_bad_flbench_settings_are_refused_in_one_line(capsys):
    assert conformance_flbench.main(["--seeds", "0,1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("conformance_flbench.py: --seeds must list three or more") and "\n" not in err


def test_conformance_peer_flbench_hands_over_to_the_flbench_benchmark(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FLBENCH_DIR", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the hand-over puts benchmarks/ on it
    assert conformance.main(["--peer", "flbench", "--seeds", "0,1"]) == 2
    assert capsys.readouterr().err.startswith("conformance_flbench.py: --seeds must list three or more")
    assert conformance.main(["--peer=flbench", "--flbench", str(tmp_path / "absent")]) == 0
    assert "conformance_flbench.py: skipped: " in capsys.readouterr().out
