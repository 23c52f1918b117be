"""A real Flower federation on loopback: 1 SuperLink + 3 SuperNodes (recipes/flower/run-local.sh), FedAvg.

The script starts Flower's own ``flower-superlink`` and ``flower-supernode`` processes on 127.0.0.1
(insecure mode), runs the app with ``flwr run`` and stops them; this test bounds it in time and
kills, by pid, every process the script started that is still alive, whatever happens. The
deployed model must equal ``pflx train``'s on the same partition (max |difference| <= 1e-6; we
measured 0: each node's client trains on the simulation's batches and the server aggregates with
the simulation's code). Several minutes on a loaded 2-core machine: every message starts a
ClientApp process that imports torch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess

import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.flower, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "flower" / "fedavg-digits.yaml"
LIMIT_S = 540


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first found through /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_fedavg_on_a_loopback_federation_equals_pflx_train(tmp_path, cli):
    superlink = shutil.which("flower-superlink")
    assert superlink, "the flower extra installs flower-superlink on PATH"
    assert cli("partition", "--config", RECIPE, "--out", tmp_path / "part", "--format", "quiet").code == 0
    r = cli("flower", "app", "--config", RECIPE, "--partition", tmp_path / "part", "--out", tmp_path / "app",
            "--round-timeout", "300", "--format", "quiet")
    assert r.code == 0, r.err
    env = {**os.environ, "FLWR_BIN": str(Path(superlink).parent), "RUN_TIMEOUT": str(LIMIT_S - 30)}
    script = subprocess.Popen(["bash", str(REPO / "recipes" / "flower" / "run-local.sh"), str(tmp_path / "app"),
                               str(tmp_path / "part"), "3", str(_free_port())], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + LIMIT_S
        while script.poll() is None and time.monotonic() < deadline:
            seen.update(_descendants(script.pid))
            time.sleep(1)
        seen.update(_descendants(script.pid))
        log = script.communicate(timeout=5)[0] if script.poll() is not None else ""
    finally:
        _kill([script.pid, *seen, *_descendants(script.pid)])
        script.wait()
    assert script.returncode == 0, log
    assert seen, "the script started the Flower processes"
    time.sleep(1)
    alive = [pid for pid in seen if Path(f"/proc/{pid}").exists()
             and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    assert alive == [], "the script stopped every process it started"
    assert "pflx: round 3/3: 2 clients" in log and "pflx: wrote the train artifact" in log

    deployed = tmp_path / "app-train"
    assert cli("train", "--config", RECIPE, "--partition", tmp_path / "part", "--out", tmp_path / "sim",
               "--format", "quiet").code == 0
    got = torch.load(deployed / "model.pt", weights_only=True)["weights"]["client"]
    want = torch.load(tmp_path / "sim" / "model.pt", weights_only=True)["weights"]["client"]
    assert got.keys() == want.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=0, atol=1e-6), k
    m = json.loads((deployed / "metrics.json").read_text())
    sim = json.loads((tmp_path / "sim" / "metrics.json").read_text())
    assert m["train"]["pooled_accuracy"] == pytest.approx(sim["train"]["pooled_accuracy"], abs=1e-12)
    assert m["communication"] == sim["communication"]
    assert m["wire"]["train_round_bytes"] > m["communication"]["total_bytes"]
    assert m["deployment"]["engine"] == "flower" and len(m["deployment"]["nodes"]) == 3
    rows = (deployed / "participation.csv").read_text().splitlines()[1:]
    assert len(rows) == 3 * 2 and all(r.endswith(",trained") for r in rows)
    r = cli("predict", "--model", deployed, "--partition", tmp_path / "part", "--clients", "train",
            "--out", tmp_path / "pred", "--format", "json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["mean_accuracy"] == pytest.approx(sim["train"]["mean_accuracy"], abs=1e-12)

