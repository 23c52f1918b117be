"""The hypernetwork family's uploads under attack: pFedHN, pFedHN-PC, HyperFL (spec B.9, D.3 T-P2, T-P3)."""

import json

import numpy as np
import pytest
import torch

from pfl_cli.artifacts import load_partition
from pfl_cli.attack import AttackConfig, attack_model
from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args
from pfl_cli.data import load_dataset
from pfl_cli.fl.api import make_algorithm
from pflx_testing import small_config
from pfl_cli.fl.store import ROLE_TRAIN, build_store


def main(argv):
    """pflx; a train command gets the shared small settings only where its algorithm takes them."""
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)

PART = ["--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal", "--num-clients", "20",
        "--test-fraction", "0.3", "--holdout-clients", "4", "--format", "quiet"]
# The client settings these attacks were calibrated on, pinned: each algorithm's own defaults are its paper's.
TRAIN = ["--rounds", "6", "--eval-every", "6", "--local-steps", "3", "--set", "mlp_hidden=[32,32]", "--format", "quiet",
         "--lr", "0.002", "--batch-size", "32", "--set", "momentum=0.9", "--set", "lambda_theta=0"]
EXTRA = {"fedavg": [], "pfedhn": ["--set", "hyper_hidden=32"], "pfedhn-pc": ["--set", "hyper_hidden=32"],
         "hyperfl": ["--local-epochs", "1", "--set", "hyper_hidden=32"]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("attack-hn")
    assert main(["partition", *PART, "--out", str(root / "part")]) == 0
    for alg, extra in EXTRA.items():
        assert main(["train", "--partition", str(root / "part"), "--algorithm", alg, "--out", str(root / alg),
                     *TRAIN, *extra]) == 0
    part, info, _ = load_partition(root / "part")
    return root, part, load_dataset(info["spec"])


def loaded(trained, alg):
    """The model, its config and the algorithm rebuilt on the partition (as pflx attack does)."""
    root, part, ds = trained
    model = torch.load(root / alg / "model.pt", weights_only=True)
    cfg = small_config(**json.loads((root / alg / "manifest.json").read_text())["config"])
    norm = model["normalization"]
    store = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=None, device="cpu", normalize=True,
                        stats=(norm["mean"].numpy(), norm["std"].numpy()))
    a = make_algorithm(cfg, store, arch=model["arch"])
    a.load_weights(model["weights"])
    return model, cfg, a, store


def client_batch(store, clients, b=2):
    from pfl_cli.fl.batches import sample_batches

    index, _ = sample_batches(store.fit, torch.as_tensor(clients), 1, b, torch.Generator().manual_seed(0))
    idx = index[:, 0]
    return idx, store.inputs(idx), store.y[idx]


@pytest.mark.parametrize("alg", ["pfedhn", "pfedhn-pc"])
def test_pfedhn_upload_is_the_trainers_local_steps(trained, alg):
    """delta theta after K steps from h(v_i) equals the trainer's local SGD from the same start (pFedHN-PC: with
    the client's private head training alongside; only the feature extractor's delta is in the message)."""
    from pfl_cli.fl.cohort import local_sgd

    _, _, a, store = loaded(trained, alg)
    clients = [int(c) for c in store.clients(ROLE_TRAIN)[:3]]
    idx, x, y = client_batch(store, clients)
    msg, start = a.upload(x, y, steps=3, clients=torch.as_tensor(clients))
    heads = a._heads_of(torch.as_tensor(clients))
    with torch.no_grad():
        theta = a.hnet(a.table(a.row_of[torch.as_tensor(clients)]))
    for k, _ in a.generated[""]:
        torch.testing.assert_close(start[k], theta[k])
    want, _ = local_sgd(a.net, {**start, **heads}, store, idx[:, None].expand(3, 3, 2), torch.ones(3, 3, 2),
                        **a.sgd_options())
    assert sorted(msg) == sorted(f"delta/{k}" for k in start)
    assert (alg == "pfedhn-pc") == bool(heads) and not any(k in start for k in heads)
    for k in start:
        torch.testing.assert_close(msg[f"delta/{k}"], want[k] - start[k], rtol=1e-5, atol=1e-6)


def test_hyperfl_upload_is_the_hypernetwork_gradient_and_step_2(trained):
    """steps 0: grad_phi of the client's loss through h(v_i; phi) and its private classifier (reference: autograd
    one client at a time); steps k: phi_i - phi after k of the trainer's step-2 SGD steps (local_sgd)."""
    from torch.func import functional_call

    from pfl_cli.fl.cohort import local_sgd

    _, _, a, store = loaded(trained, "hyperfl")
    clients = [int(c) for c in store.clients(ROLE_TRAIN)[1:3]]
    idx, x, y = client_batch(store, clients)
    msg, start = a.upload(x, y, steps=0, clients=torch.as_tensor(clients))
    private = a.private.gather(torch.as_tensor(clients))
    assert sorted(msg) == sorted(f"grad/{k}" for k in a.hn_names)
    for i in range(2):
        theta = a.hnet(private["embedding"][i])
        logits = functional_call(a.net, {**theta, **{k: private[k][i] for k in a.head_names}}, (x[i],))
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, y[i]), list(a.hnet.parameters()))
        for k, g in zip(a.hn_names, grads):
            torch.testing.assert_close(msg[f"grad/{k}"][i], g, rtol=1e-5, atol=1e-7)
    msg, start = a.upload(x, y, steps=3, clients=torch.as_tensor(clients))
    params, lrs, groups = a._generator_step(start, private["embedding"])
    want, _ = local_sgd(a.generated, params, store, idx[:, None].expand(2, 3, 2), torch.ones(2, 3, 2), lr=lrs,
                        fixed={f"net.{k}": private[k] for k in a.head_names}, clip_groups=groups, **a._options())
    for k in a.hn_names:
        torch.testing.assert_close(msg[f"delta/{k}"], want[f"hnet.{k}"] - start[k], rtol=1e-5, atol=1e-6)


def test_hyperfl_generated_weights_leak_from_its_upload(trained):
    """T-P3 on a trained HyperFL client's real upload: the generated feature extractor h(v_i; phi) from the
    hypernetwork gradient alone (the embedding and classifier unknown)."""
    from pfl_cli.attack.analytic import recover_generated_weights

    _, _, a, store = loaded(trained, "hyperfl")
    c = [int(store.clients(ROLE_TRAIN)[0])]
    _, x, y = client_batch(store, c, b=1)
    msg, _ = a.upload(x, y, steps=0, clients=torch.as_tensor(c))
    _, theta = recover_generated_weights(a.hnet, {k: msg[f"grad/{k}"][0].detach() for k in a.hn_names})
    with torch.no_grad():
        want = a.hnet(a.private.gather(torch.as_tensor(c))["embedding"][0])
    for k in a.names:
        assert float((theta[k] - want[k]).abs().max()) < 1e-4 * max(1.0, float(want[k].abs().max()))


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_tp2_hyperfl_joint_attack_does_worse_than_on_fedavg(trained):
    """T-P2 (spec D.3): IG on HyperFL's hypernetwork gradient, the embedding and classifier optimized with the
    image, gives a lower median PSNR than IG on FedAvg's gradient, same images, same budget; with the paper's
    one Adam step for everything (lr 0.1) and with a step of 1e-2 for the unknowns, which gets much further."""
    root, part, ds = trained
    median = {}
    for alg, unknowns_lr in (("fedavg", None), ("hyperfl", None), ("hyperfl", 1e-2)):
        model, train_cfg, _, _ = loaded(trained, alg)
        cfg = AttackConfig(attack="ig", images=8, iterations=400, tv=1e-4, unknowns_lr=unknowns_lr)
        r = attack_model(model, train_cfg, ds.x, ds.y, ds.num_classes, part, cfg)
        median[alg, unknowns_lr] = float(np.median(r.psnr["ig"]))
    assert median["hyperfl", None] < median["hyperfl", 1e-2] < median["fedavg", None], median
    assert median["fedavg", None] >= 20, median


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_joint_attack_at_the_papers_step_saturates_the_guessed_classifier(trained):
    """Why the joint attack stalls on standardized digits at lr 0.1: Adam moves every classifier weight by ~0.1
    per step (about their own size), the weights grow, the dummy's softmax saturates on the known label and its
    upload vanishes exactly; cosine matching is then 1 with no gradient (the stall), not a detached tensor."""
    from pfl_cli.attack.api import select_targets
    from pfl_cli.attack.invert import invert_gradients, match_loss
    from pfl_cli.rng import make_rng

    _, part, ds = trained
    _, _, a, store = loaded(trained, "hyperfl")
    a.hnet.requires_grad_(False)
    a.net.requires_grad_(False)
    clients, index = select_targets(part, "holdout", 8, 1, make_rng(0, "attack-targets"))
    idx = torch.as_tensor(index)
    x, y = store.inputs(idx), store.y[idx]
    msg, start = a.upload(x, y, steps=0, clients=torch.as_tensor(clients))
    msg = {k: v.detach() for k, v in msg.items()}
    last = {}

    def upload(xd, yd, unknowns):
        m = a.upload(xd, yd, steps=0, start=start, private=unknowns)[0]
        with torch.no_grad():
            last["norm"] = torch.sqrt(sum(v.pow(2).flatten(1).sum(1) for v in m.values()))
            last["objective"] = match_loss(m, msg, "cosine")
            last["head"] = float(unknowns[a.head_names[0]].abs().max())
        return m

    guess = a.attack_private(8)
    box = ((float(ds.x.min()) - store.mean) / store.std, (float(ds.x.max()) - store.mean) / store.std)
    invert_gradients(upload, msg, y, x.shape[2:], loss="cosine", iterations=400, lr=0.1, tv=1e-4, box=box,
                     image_shape=(1, 8, 8), gen=torch.Generator().manual_seed(1), unknowns=guess)  # as attack_model
    # Which dummies saturate within 400 steps is chaotic in the trained model: issue 26's in-place SGD step
    # moves the trained HyperFL weights by ~1e-8 (float rounding) and the count went from 4+ of 8 to 2 of 8
    # (the rest still grow the classifier); the mechanism is what is asserted, on the dummies it reached.
    dead = last["norm"] == 0
    assert int(dead.sum()) >= 1, last["norm"]                        # dummies that upload exactly nothing
    assert torch.all(last["objective"][dead] == 1.0)                 # cosine 0: the flat objective of the stall
    assert last["head"] > 10 * float(guess[a.head_names[0]].abs().max())  # the classifier grew 10x and more


@pytest.mark.parametrize("alg, upload", [("pfedhn", "grad/fc1.weight"), ("pfedhn-pc", "grad/fc1.weight"),
                                         ("hyperfl", "grad/heads.0.bias")])
def test_cli_attacks_hypernetwork_artifacts(trained, tmp_path, capsys, alg, upload):
    """End to end: every attack on the hypernetwork family's artifacts; the analytic leak is exact for all three
    (HyperFL's through its affine heads' bias gradients, spec D.3 T-P3)."""
    root, _, _ = trained
    out = tmp_path / "att"
    assert main(["attack", "--model", str(root / alg), "--partition", str(root / "part"), "--attack", "all",
                 "--images", "2", "--iterations", "20", "--out", str(out), "--format", "json"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["algorithm"] == alg and m["attacks"] == ["dlg", "ig", "rog", "analytic"]
    assert upload in m["upload"] and m["results"]["analytic"]["median_psnr"] > 80
    assert (out / "reconstructions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    if alg != "pfedhn":  # the output layer is private: no iDLG rule from the upload
        assert main(["attack", "--model", str(root / alg), "--partition", str(root / "part"), "--infer-labels",
                     "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err
        assert "reveals no gradient of the model's output bias" in err and err.count("\n") == 1
        assert not (tmp_path / "bad").exists()


def test_cli_attacks_uploaded_weights(trained, tmp_path, capsys):
    """--upload weights end to end: HyperFL's phi_i - phi after its round (one classifier epoch, one step-2
    epoch: a single step on phi, so the head-bias leak stays exact); FedAvg's delta after its 3 trained steps."""
    root, _, _ = trained
    base = ["attack", "--partition", str(root / "part"), "--upload", "weights", "--images", "2", "--iterations", "20",
            "--format", "quiet"]
    assert main([*base, "--model", str(root / "hyperfl"), "--attack", "all", "--out", str(tmp_path / "h")]) == 0
    m = json.loads((tmp_path / "h" / "metrics.json").read_text())
    assert m["upload_mode"] == "weights" and m["upload_steps"] == 1 and m["attacks"] == ["dlg", "ig", "rog", "analytic"]
    assert all(k.startswith("delta/") for k in m["upload"])
    # exact up to float32 rounding of phi_i - phi, a small step (lr 2e-3) on large phi: > 40 dB, not the 120 cap
    assert m["results"]["analytic"]["median_psnr"] > 40
    assert main([*base, "--model", str(root / "fedavg"), "--attack", "ig", "--out", str(tmp_path / "f")]) == 0
    m = json.loads((tmp_path / "f" / "metrics.json").read_text())
    assert m["upload_steps"] == 3 and all(k.startswith("delta/") for k in m["upload"])
    capsys.readouterr()
    bad = [(["--model", str(root / "fedavg"), "--attack", "analytic"], "round takes 3 steps"),
           (["--model", str(root / "hyperfl"), "--local-steps", "2"], "--local-steps K is for --upload gradient"),
           (["--model", str(root / "hyperfl"), "--batch-size", "33", "--images", "33"],
            "must not exceed the run's batch_size 32"),
           (["--model", str(root / "hyperfl"), "--upload", "bogus"], "upload must be one of gradient, weights"),
           (["--model", str(root / "hyperfl"), "--unknowns-lr", "0"], "unknowns_lr must be a finite number > 0")]
    for args, text in bad:
        assert main([*base, *args, "--out", str(tmp_path / "bad")]) == 2, args
        err = capsys.readouterr().err
        assert text in err and err.count("\n") == 1, err
        assert not (tmp_path / "bad").exists()
