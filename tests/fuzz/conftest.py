"""Artifacts the fuzz tests feed to the commands: built once, tiny, copied before any damage."""

from __future__ import annotations

import pytest

from pfl_cli.cli.app import main


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz-inputs")
    runs = {
        "part": ["partition", "--num-clients", "8", "--classes-per-client", "3", "--holdout-clients", "2"],
        "mdm": ["mdm-fit", "--partition", root / "part", "--components", "2", "--rounds", "3"],
        "model": ["train", "--partition", root / "part", "--rounds", "2", "--eval-every", "1", "--local-steps", "2",
                  "--set", "hyper_hidden=8", "--set", "mlp_hidden=[8]"],
        "ledger": ["privacy-account", "-z", "1.1", "-q", "0.01", "--steps", "50", "--delta", "1e-5"],
    }
    for name, args in runs.items():
        assert main([*map(str, args), "--out", str(root / name), "--format", "quiet"]) == 0, name
    return root
