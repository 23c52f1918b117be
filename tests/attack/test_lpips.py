"""LPIPS from a local weights file: against a module-built reference, and refused bad files."""

import numpy as np
import pytest
import torch
from torch import nn

from pfl_cli.attack.lpips import expected_shapes, load_lpips_weights, lpips
from pfl_cli.errors import InputError


def random_weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.rand(s, generator=g) * (0.05 if k.startswith("features") else 1.0)
            for k, s in expected_shapes().items()}


def lpips_reference(x, y, w):
    """torchvision's AlexNet layout built from nn modules, per-position channel normalization in numpy."""
    feats = nn.Sequential(nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2), nn.Conv2d(64, 192, 5, padding=2),
                          nn.ReLU(), nn.MaxPool2d(3, 2), nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(), nn.Conv2d(256, 256, 3, padding=1), nn.ReLU())
    feats.load_state_dict({k.removeprefix("features."): v for k, v in w.items() if k.startswith("features")})
    shift = torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1)
    scale = torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1)

    def taps(img):
        h, out = (((2 * img.expand(-1, 3, -1, -1)) - 1) - shift) / scale, []
        for i, layer in enumerate(feats):
            h = layer(h)
            if i in (1, 4, 7, 9, 11):
                out.append(h.detach().numpy().astype(np.float64))
        return out

    d = np.zeros(len(x))
    for j, (a, b) in enumerate(zip(taps(x), taps(y))):
        lin = w[f"lin{j}.model.1.weight"].numpy().reshape(-1)
        for n in range(a.shape[0]):
            acc = []
            for p in range(a.shape[2]):
                for q in range(a.shape[3]):
                    u = a[n, :, p, q] / (np.linalg.norm(a[n, :, p, q]) + 1e-10)
                    v = b[n, :, p, q] / (np.linalg.norm(b[n, :, p, q]) + 1e-10)
                    acc.append(float(lin @ (u - v) ** 2))
            d[n] += np.mean(acc)
    return d


def test_lpips_matches_reference_and_is_zero_on_equal_images():
    w = random_weights()
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(3, 1, 40, 36, generator=g), torch.rand(3, 1, 40, 36, generator=g)
    got = lpips(x, y, w).numpy()
    np.testing.assert_allclose(got, lpips_reference(x, y, w), rtol=1e-4, atol=1e-6)
    assert np.all(got > 0)
    assert float(lpips(x, x, w).abs().max()) == 0.0


def test_bad_weight_files_are_refused(tmp_path):
    torch.save([1, 2, 3], tmp_path / "list.pt")
    (tmp_path / "text.pt").write_text("not a checkpoint")
    bad = random_weights()
    bad["lin2.model.1.weight"] = torch.zeros(1, 10, 1, 1)
    torch.save(bad, tmp_path / "shape.pt")
    for name, message in (("list.pt", "expected a state dict"), ("text.pt", "not a readable torch state dict"),
                          ("shape.pt", "lin2.model.1.weight has shape (1, 10, 1, 1)")):
        with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_lpips_weights(tmp_path / name)
    torch.save(random_weights(), tmp_path / "ok.pt")
    assert set(load_lpips_weights(tmp_path / "ok.pt")) == set(expected_shapes())
    with pytest.raises(InputError, match="at least 32x32"):
        lpips(torch.rand(1, 1, 8, 8), torch.rand(1, 1, 8, 8), random_weights())
