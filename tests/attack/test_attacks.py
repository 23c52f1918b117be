"""Attacks on real uploads: the shared SGD path, batching over targets, T-P1 and T-P3 (spec D.3)."""

import numpy as np
import pytest
import torch

from pfl_cli.artifacts import load_partition
from pfl_cli.attack import AttackConfig, attack_model
from pfl_cli.attack.analytic import recover_affine_input
from pfl_cli.attack.invert import invert_gradients
from pfl_cli.cli.app import main
from pfl_cli.data import load_dataset
from pfl_cli.fl.cohort import local_sgd, unrolled_sgd
from pflx_testing import replace, small_config

PART = ["--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal", "--num-clients", "20",
        "--test-fraction", "0.3", "--holdout-clients", "4", "--format", "quiet"]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """A digits partition and a FedAvg model on the spec's T-P1 MLP 64-32-32-10."""
    import json

    root = tmp_path_factory.mktemp("attack-lib")
    assert main(["partition", *PART, "--out", str(root / "part")]) == 0
    assert main(["train", "--partition", str(root / "part"), "--algorithm", "fedavg", "--out", str(root / "fedavg"),
                 "--rounds", "10", "--eval-every", "10", "--local-steps", "5", "--set", "mlp_hidden=[32,32]",
                 "--format", "quiet"]) == 0
    model = torch.load(root / "fedavg" / "model.pt", weights_only=True)
    cfg = small_config(**json.loads((root / "fedavg" / "manifest.json").read_text())["config"])
    part, info, _ = load_partition(root / "part")
    return model, cfg, part, load_dataset(info["spec"]), root


def run(digits, **kw):
    model, cfg, part, ds, _ = digits
    train_cfg = kw.pop("train_cfg", cfg)
    return attack_model(model, train_cfg, ds.x, ds.y, ds.num_classes, part, AttackConfig(**kw))


def test_unrolled_sgd_is_the_clients_local_sgd():
    """The attack's differentiable client update equals the trainer's (clip, momentum, weight decay)."""
    from types import SimpleNamespace

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    params = {k: v.detach().unsqueeze(0).repeat(2, *[1] * v.dim()) + 0.1 * torch.randn(2, *v.shape)
              for k, v in net.named_parameters()}
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    store = SimpleNamespace(inputs=lambda i: x[i], y=y)
    batch = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]])
    index = batch[:, None, :].expand(2, 3, 4)  # the same full batch at each of 3 steps
    opts = dict(lr=0.3, momentum=0.9, weight_decay=0.01, clip=0.5)
    want, _ = local_sgd(net, params, store, index, torch.ones(2, 3, 4), **opts)
    got = unrolled_sgd(net, params, x[batch], y[batch], 3, **opts)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-6, atol=1e-7)


def test_recover_affine_input_is_exact():
    torch.manual_seed(1)
    lin = torch.nn.Linear(20, 7)
    x = torch.randn(3, 20)
    gw, gb = [], []
    for i in range(3):
        loss = torch.nn.functional.cross_entropy(torch.tanh(lin(x[i:i + 1])) @ torch.randn(7, 4), torch.tensor([1]))
        g = torch.autograd.grad(loss, [lin.weight, lin.bias])
        gw.append(g[0])
        gb.append(g[1])
    rec = recover_affine_input(torch.stack(gw), torch.stack(gb))
    assert float((rec - x).abs().max()) < 1e-5


def test_tp3_analytic_leak_from_a_fedavg_gradient_is_exact(digits):
    """T-P3: the input through the biased first layer, from the uploaded gradient alone (< 1e-5)."""
    r = run(digits, attack="analytic", images=8, infer_labels=True)
    err = np.abs(r.reconstruction["analytic"] - r.original).max()
    assert err < 1e-5, err
    assert r.label_accuracy == 1.0  # iDLG on the last bias
    assert np.all(r.psnr["analytic"] > 80)


def test_analytic_leak_from_a_one_step_delta(digits):
    """A clipped, weight-decayed one-step delta: the clip factor and the known decay cancel; what is
    left is float32 rounding of theta_new - theta (~1e-4 relative), not the attack."""
    import dataclasses

    model, cfg, part, ds, _ = digits
    clipped = replace(cfg, client_clip=0.5, lambda_theta=0.05)
    r = run(digits, attack="analytic", images=8, local_steps=1, train_cfg=clipped)
    assert np.abs(r.reconstruction["analytic"] - r.original).max() < 1e-3
    assert np.all(r.psnr["analytic"] > 60)


def test_batched_attack_equals_each_target_alone(digits):
    """One optimization over n targets is n independent attacks (vmap-style batching is exact)."""
    model, cfg, part, ds, _ = digits
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.fl.store import build_store

    norm = model["normalization"]
    store = build_store(ds.x, ds.y, 10, part, val_fraction=0.0, rng=None, device=torch.device("cpu"),
                        stats=(norm["mean"].numpy(), norm["std"].numpy()))
    alg = make_algorithm(cfg, store, arch=model["arch"])
    alg.load_weights(model["weights"])
    idx = torch.tensor([[3], [40], [77]])
    xt, yt = store.inputs(idx), store.y[idx]
    target = {k: v.detach() for k, v in alg.upload(xt, yt, steps=1)[0].items()}

    def upload(x, y):
        return alg.upload(x, y, steps=1)[0]

    init = torch.randn(3, 1, 64, generator=torch.Generator().manual_seed(0))
    kw = dict(loss="cosine", iterations=40, lr=0.1, tv=1e-4, image_shape=(1, 8, 8))
    together = invert_gradients(upload, target, yt, (64,), init=init, **kw)
    for i in range(3):
        alone = invert_gradients(upload, {k: v[i:i + 1] for k, v in target.items()}, yt[i:i + 1], (64,),
                                 init=init[i:i + 1], **kw)
        torch.testing.assert_close(together[i:i + 1], alone, rtol=1e-4, atol=1e-5)


def test_tp1_ig_positive_control(digits):
    """T-P1: IG (cosine + 1e-4 TV, Adam 0.1) on a FedAvg MLP gradient rebuilds most of 8 digits (>= 20 dB)."""
    r = run(digits, attack="ig", images=8, iterations=600, tv=1e-4)
    psnr = r.psnr["ig"]
    assert np.sum(psnr >= 20) >= 6, psnr
    assert np.all(r.ssim["ig"][psnr >= 20] > 0.9)


def test_pefll_upload_is_attacked(digits, tmp_path):
    """PeFLL's message pair (v, and the gradient at theta = h(v)): the analytic leak applies to it too."""
    root = tmp_path
    assert main(["train", "--partition", str(digits[4] / "part"), "--algorithm", "pefll", "--out",
                 str(root / "pefll"), "--rounds", "4", "--eval-every", "4", "--local-steps", "2", "--set",
                 "hyper_hidden=16", "--set", "mlp_hidden=[16]", "--format", "quiet"]) == 0
    import json

    model = torch.load(root / "pefll" / "model.pt", weights_only=True)
    cfg = small_config(**json.loads((root / "pefll" / "manifest.json").read_text())["config"])
    _, _, part, ds, _ = digits
    r = attack_model(model, cfg, ds.x, ds.y, ds.num_classes, part, AttackConfig(attack="analytic", images=4))
    assert r.upload[0] == "v" and all(k.startswith("grad/") for k in r.upload[1:])
    assert np.abs(r.reconstruction["analytic"] - r.original).max() < 1e-5
    # IG through the descriptor and the gradient at the (known) generated model
    ig = attack_model(model, cfg, ds.x, ds.y, ds.num_classes, part,
                      AttackConfig(attack="ig", images=4, iterations=600, tv=1e-4))
    assert np.median(ig.psnr["ig"]) >= 20, ig.psnr["ig"]



def test_rog_reaches_what_its_low_resolution_can_express(digits):
    """ROG optimizes a half-resolution image: on 8x8 digits it can only approach the PSNR of the
    original's own 4x4 average-pooled, bilinearly upsampled version; at full resolution it is exact-ish."""
    half = run(digits, attack="rog", images=4, iterations=300, lr=0.05)
    full = run(digits, attack="rog", images=4, iterations=300, lr=0.05, rog_scale=1)
    x = torch.as_tensor(half.original).view(-1, 1, 8, 8).double()
    up = torch.nn.functional.interpolate(torch.nn.functional.avg_pool2d(x, 2), size=(8, 8), mode="bilinear")
    from pfl_cli.attack.metrics import psnr

    ceiling = psnr(up.flatten(1), x.flatten(1)).numpy()
    assert np.all(half.psnr["rog"] <= ceiling + 1.0) and np.all(half.psnr["rog"] >= ceiling - 3.0)
    assert np.sum(full.psnr["rog"] >= 20) >= 3


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_attack_on_a_local_dp_fedavg_upload_fails(digits, tmp_path, capsys):
    """DP-FedAvg in the ISRL setting (noise on the client, eps 4): IG finds nothing (Table 3: ~7.7 dB),
    while the same attack on the same model's upload with negligible noise (eps 1e7) works."""
    import dataclasses
    import json

    part_dir = digits[4] / "part"
    assert main(["train", "--partition", str(part_dir), "--algorithm", "ldp-fedavg", "--dp", "eps=4,delta=1e-5,clip=1,noise=seeded",
                 "--set", "dp_sampling_rate=0.25", "--set", "normalize=false", "--rounds", "10", "--eval-every", "10",
                 "--local-steps", "5", "--lr", "0.05", "--set", "mlp_hidden=[32,32]", "--out", str(tmp_path / "ldp"),
                 "--format", "quiet"]) == 0
    model = torch.load(tmp_path / "ldp" / "model.pt", weights_only=True)
    cfg = small_config(**json.loads((tmp_path / "ldp" / "manifest.json").read_text())["config"])
    _, _, part, ds, _ = digits
    kw = dict(attack="ig", images=8, iterations=600, lr=1.0, tv=1e-4, local_steps=1)  # lr for raw 0-16 pixels
    private = attack_model(model, cfg, ds.x, ds.y, 10, part, AttackConfig(**kw))
    control = attack_model(model, replace(cfg, dp_epsilon=1e7), ds.x, ds.y, 10, part, AttackConfig(**kw))
    assert np.median(private.psnr["ig"]) < 10 and np.all(private.ssim["ig"] < 0.3), private.psnr["ig"]
    assert np.sum(control.psnr["ig"] >= 20) >= 6, control.psnr["ig"]
    # a --dp client never uploads a raw gradient: attacking one is refused
    capsys.readouterr()
    assert main(["attack", "--model", str(tmp_path / "ldp"), "--partition", str(part_dir), "--local-steps", "0",
                 "--out", str(tmp_path / "att")]) == 2
    assert "never uploads a raw gradient" in capsys.readouterr().err and not (tmp_path / "att").exists()


def test_tp3_generated_weights_leak_from_a_hypernetwork_head_gradient():
    """T-P3, second part: from one sample's gradient of the hypernetwork (what a HyperFL client uploads
    after one step on phi), the server recovers z(v) and every generated weight without v or the classifier."""
    from pfl_cli.attack.analytic import recover_generated_weights
    from pfl_cli.models import build, client_spec, hyper_spec

    torch.manual_seed(3)
    client = client_spec("mlp", (64,), 10, (32,))
    net = build(client)
    hnet = build(hyper_spec(16, client, "S", 64))
    v = torch.randn(16)                       # private embedding: unknown to the attacker
    x, y = torch.randn(1, 64), torch.tensor([4])
    from torch.func import functional_call

    theta = hnet(v)
    loss = torch.nn.functional.cross_entropy(functional_call(net, theta, (x,)), y)
    names = [k for k, _ in hnet.named_parameters()]
    grads = dict(zip(names, torch.autograd.grad(loss, list(hnet.parameters()))))
    z, rec = recover_generated_weights(hnet, grads)
    with torch.no_grad():
        z_true = hnet.body(v)
    assert float((z - z_true).abs().max()) < 1e-5
    for k in theta:
        assert float((rec[k] - theta[k].detach()).abs().max()) < 1e-5
    # and with the generated first layer known, the image follows from the client-net gradient (T-P3 part 1)
    rec = {k: t.requires_grad_(True) for k, t in rec.items()}
    g = torch.autograd.grad(torch.nn.functional.cross_entropy(functional_call(net, rec, (x,)), y),
                            [rec["fc1.weight"], rec["fc1.bias"]])
    assert float((recover_affine_input(g[0][None], g[1][None])[0] - x[0]).abs().max()) < 1e-5


def png_panels(path):
    """The image panels of reconstructions.png, read back from its pixels: [(top, left, bottom, right)]
    in reading order. A panel is the region inside a closed axes frame (its black spines): filling the
    holes of the non-white mask makes each frame a solid box; text and tick-free labels stay small."""
    import matplotlib.image as mpimg
    from scipy import ndimage

    img = mpimg.imread(path)[..., :3]
    solid = ndimage.binary_fill_holes((img < 0.98).any(-1))
    labels, _ = ndimage.label(solid)
    boxes = []
    for sl in ndimage.find_objects(labels):
        h, w = sl[0].stop - sl[0].start, sl[1].stop - sl[1].start
        if h > 20 and w > 20:
            boxes.append((sl[0].start, sl[1].start, sl[0].stop, sl[1].stop))
    rows = sorted({b[0] // 10 for b in boxes})  # panels of one row share their top edge (within a few pixels)
    return img, sorted(boxes, key=lambda b: (rows.index(b[0] // 10), b[1]))


def panel_pixels(img, box, side):
    """The side x side picture inside a panel: the gray level at the centre of each image cell."""
    top, left, bottom, right = box
    top, left, bottom, right = top + 1, left + 1, bottom - 1, right - 1  # inside the 1-pixel frame
    rows = top + (np.arange(side) + 0.5) * (bottom - top) / side
    cols = left + (np.arange(side) + 0.5) * (right - left) / side
    return img[rows.astype(int)[:, None], cols.astype(int)[None, :], 0]


def test_reconstructions_png_shows_the_images_metrics_json_scores(digits, tmp_path):
    """The figures of metrics.json and images.csv are those of reconstructions.npz (PSNR recomputed here,
    10 log10(1 / MSE)), and reconstructions.png draws those arrays: every panel, read back from the PNG's
    pixels, is its npz image up to 8-bit rounding, originals in the first row and one row per attack."""
    import csv
    import json

    root = digits[4]
    out = tmp_path / "att"
    assert main(["attack", "--model", str(root / "fedavg"), "--partition", str(root / "part"), "--attack", "all",
                 "--images", "6", "--iterations", "60", "--out", str(out), "--format", "quiet"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    arrays = np.load(out / "reconstructions.npz", allow_pickle=False)
    original = arrays["original"].astype(np.float64)
    rows = list(csv.DictReader((out / "images.csv").open()))
    assert original.shape == (6, 1, 8, 8)
    spread = []
    for a in metrics["attacks"]:
        rec = arrays[f"reconstruction_{a}"].astype(np.float64)
        mse = ((rec - original) ** 2).reshape(6, -1).mean(1)
        psnr = 10 * np.log10(1 / np.maximum(mse, 1e-12))
        np.testing.assert_allclose(psnr.mean(), metrics["results"][a]["mean_psnr"], rtol=1e-4)
        np.testing.assert_allclose(np.median(psnr), metrics["results"][a]["median_psnr"], rtol=1e-4)
        csv_psnr = [float(r["psnr"]) for r in rows if r["attack"] == a]
        np.testing.assert_allclose(psnr, csv_psnr, rtol=1e-4)
        spread.append(psnr)
    assert np.ptp(np.concatenate(spread)) > 10  # some panels differ visibly from their originals (a real check)
    img, boxes = png_panels(out / "reconstructions.png")
    shown = [original] + [arrays[f"reconstruction_{a}"] for a in metrics["attacks"]]
    assert len(boxes) == len(shown) * 6
    far = 0
    for k, box in enumerate(boxes):
        want = shown[k // 6][k % 6, 0]
        got = panel_pixels(img, box, 8)
        # the gray colormap's 256 levels and the PNG's 8 bits: within 2/255
        assert np.abs(got - want).max() <= 2 / 255, (k, np.abs(got - want).max())
        far += int(np.abs(got - original[k % 6, 0]).max() > 0.1)
    assert far >= 3  # panels that do not show their original: a row drawn from the wrong array would fail
