"""A plain install: no crash without matplotlib, and start-up that imports only what a command uses.

Everything here runs the real ``pflx`` in a fresh interpreter (``python -m pfl_cli``), since what a
command imports is only observable in a process that has imported nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
# pydantic: typer >= 0.21 imports it to coerce every flag value (~0.1 s, as much as numpy); pflx requires
# typer < 0.21 (pyproject.toml), whose coercion is click's.
# numpy.ma: np.unique imports it (~25 ms); `show` reads a partition without it.
HEAVY = ("torch", "sklearn", "matplotlib", "pydantic", "numpy.ma")

# Runs pflx, then reports which heavy packages the process imported (also after a usage error).
PROBE = textwrap.dedent("""
    import json, sys
    from pfl_cli.cli.app import main
    code = main(sys.argv[1:])
    print("PROBE " + json.dumps({"code": code, "loaded": sorted(m for m in %r if m in sys.modules)}), file=sys.stderr)
""") % (HEAVY,)


def _env(extra_path: Path | None = None) -> dict:
    env = dict(os.environ, PFLX_DEBUG="", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg")
    env["PYTHONPATH"] = os.pathsep.join([*([str(extra_path)] if extra_path else []), str(ROOT)])
    return env


def _probe(*args, cwd: Path) -> tuple[int, list[str], str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=120)
    line = [ln for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
    assert line, proc.stderr
    doc = json.loads(line[-1][len("PROBE "):])
    return doc["code"], doc["loaded"], proc.stderr


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A small npz dataset, a partition of it and an MDM fitted on that partition (in-process)."""
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("plain")
    rng = np.random.default_rng(0)
    np.savez(root / "d.npz", x=rng.normal(size=(240, 4)).astype(np.float32), y=rng.integers(0, 3, 240))
    assert main(["partition", "--dataset", f"npz:{root / 'd.npz'}", "--dirichlet", "0.5", "-n", "8",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    assert main(["mdm-fit", "--partition", str(root / "part"), "--components", "1", "--out", str(root / "mdm"),
                 "--format", "quiet"]) == 0
    return root


def test_help_account_show_and_file_only_stages_never_import_torch(files):
    cases = {
        "--help": ["--help"],
        "train --help": ["train", "--help"],
        "privacy-account": ["privacy-account", "--noise-multiplier", "1.1", "--sampling-rate", "0.01",
                            "--steps", "1000", "--delta", "1e-5"],
        "show": ["show", files / "part"],
        "partition npz": ["partition", "--dataset", f"npz:{files / 'd.npz'}", "--dirichlet", "0.3", "-n", "6",
                          "--out", files / "p2"],
        "partition digits": ["partition", "--dataset", "builtin:digits", "--dirichlet", "0.3", "-n", "6",
                             "--out", files / "p3"],
        "mdm-fit": ["mdm-fit", "--partition", files / "part", "--components", "1", "--out", files / "m2"],
        "simulate": ["simulate", "--model", files / "mdm", "--dataset", f"npz:{files / 'd.npz'}",
                     "--num-clients", "12", "--out", files / "s2"],
    }
    for name, args in cases.items():
        code, loaded, err = _probe(*args, "--format", "quiet", cwd=files) if "help" not in name else \
            _probe(*args, cwd=files)
        assert code == 0, (name, err)
        # builtin:digits is read from scikit-learn's CSV without importing scikit-learn; stages that
        # compute (partition, mdm-fit, simulate) may use np.unique, the start-up commands do not.
        computes = name.split()[0] in ("partition", "mdm-fit", "simulate", "privacy-account")
        assert [m for m in loaded if not (computes and m == "numpy.ma")] == [], f"{name} imported {loaded}"


def test_digits_read_without_sklearn_equals_load_digits():
    from sklearn.datasets import load_digits

    from pfl_cli.data import load_dataset

    ds, ref = load_dataset("builtin:digits"), load_digits()
    assert ds.x.dtype == np.float32 and ds.y.dtype == np.int64
    np.testing.assert_array_equal(ds.x, ref.data.astype(np.float32))
    np.testing.assert_array_equal(ds.y, ref.target)


# --------------------------------------------------------------------------- matplotlib absent

@pytest.fixture(scope="module")
def no_matplotlib(tmp_path_factory):
    """A directory whose sitecustomize makes ``import matplotlib`` fail, as on a plain install."""
    d = tmp_path_factory.mktemp("hide-mpl")
    (d / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    return d


@pytest.fixture(scope="module")
def trained(files):
    """A one-round fedavg model on the npz partition (in-process)."""
    from pfl_cli.cli.app import main

    assert main(["train", "--partition", str(files / "part"), "--algorithm", "fedavg", "--rounds", "1",
                 "--local-steps", "1", "--out", str(files / "fedavg"), "--format", "quiet"]) == 0
    return files / "fedavg"


def test_every_drawing_command_refuses_before_any_work_without_matplotlib(files, trained, no_matplotlib):
    npz = f"npz:{files / 'd.npz'}"
    cases = {
        "attack": ["attack", "--model", trained, "--partition", files / "part", "--images", "1",
                   "--iterations", "1"],
        "partition --plot": ["partition", "--dataset", npz, "-n", "4", "--plot"],
        "partition plot from --set": ["partition", "--dataset", npz, "-n", "4", "--set", "plot=true"],
        "mdm-fit --plot": ["mdm-fit", "--partition", files / "part", "--components", "1", "--plot"],
        "simulate --plot": ["simulate", "--model", files / "mdm", "--dataset", npz, "--num-clients", "4", "--plot"],
        "train --plot": ["train", "--partition", files / "part", "--algorithm", "fedavg", "--rounds", "1", "--plot"],
        "predict --plot": ["predict", "--model", trained, "--partition", files / "part", "--plot"],
        "cluster --k-candidates": ["cluster", "--partition", files / "part", "--server-data", npz, "--k", "2",
                                   "--k-candidates", "2,3", "--no-dp"],
    }
    for name, args in cases.items():
        out = files / f"refused-{name.split()[0]}"
        proc = subprocess.run([sys.executable, "-m", "pfl_cli", *map(str, args), "--out", str(out)], cwd=files,
                              env=_env(no_matplotlib), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (name, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "matplotlib" in lines[0] and "pip install 'pflx[plot]'" in lines[0], (name, lines)
        assert "Traceback" not in proc.stderr and not out.exists(), name
    # show --plot refuses too, and writes no figure.
    proc = subprocess.run([sys.executable, "-m", "pfl_cli", "show", str(trained), "--plot", "--plot-dir",
                           str(files / "figs")], cwd=files, env=_env(no_matplotlib), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "pflx[plot]" in proc.stderr and not (files / "figs").exists(), proc.stderr
    # Without --plot the same commands still run on a plain install.
    proc = subprocess.run([sys.executable, "-m", "pfl_cli", "show", str(trained), "--format", "quiet"], cwd=files,
                          env=_env(no_matplotlib), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_predict_builds_no_optimizer_it_does_not_step(tmp_path, digits_clients):
    """pefll and pfedhn serve new clients without torch.optim: constructing one fails the run here."""
    from pfl_cli.cli.app import main

    root = tmp_path
    assert main(["partition", "--dirichlet", "0.5", "-n", "8", "--holdout-clients", "2", "--out", str(root / "part"),
                 "--format", "quiet"]) == 0
    guard = textwrap.dedent("""
        import sys, torch.optim
        def refuse(self, *a, **k):
            raise AssertionError("predict built an optimizer: " + type(self).__name__)
        torch.optim.Optimizer.__init__ = refuse
        from pfl_cli.cli.app import main
        sys.exit(main(sys.argv[1:]))
    """)
    for algorithm in ("pefll", "pfedhn"):
        extra = ["--embed-rounds", "1"] if algorithm == "pfedhn" else []
        assert main(["train", "--partition", str(root / "part"), "--algorithm", algorithm, "--rounds", "1",
                     "--out", str(root / algorithm), "--format", "quiet"]) == 0
        proc = subprocess.run([sys.executable, "-c", guard, "predict", "--model", str(root / algorithm), "--partition",
                               str(root / "part"), *extra, "--out", str(root / f"pred-{algorithm}"),
                               "--format", "quiet"], env=_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (algorithm, proc.stderr)


def test_a_subcommand_runs_on_a_tree_of_itself_alone(files, capsys):
    """Typer reads every option's annotations to build a command; a run builds only the one it runs,
    and says the same as through the whole tree (`pflx -h` still lists every command)."""
    from pfl_cli.cli import app

    assert app.main(["show", str(files / "part"), "--format", "json"]) == 0
    alone = capsys.readouterr().out
    assert set(app._COMMANDS["show"].commands) == {"show"}
    full = app._command()
    assert {"show", "train", "privacy-account", "flower", "algorithms"} <= set(full.commands)
    code = full(args=["show", str(files / "part"), "--format", "json"], prog_name="pflx", standalone_mode=False)
    assert code in (None, 0) and capsys.readouterr().out == alone
    assert app.main(["show", "--format", "xml", str(files / "part")]) == 2
    assert "(pflx show -h for help)" in capsys.readouterr().err


# --------------------------------------------------------------------------- refusals and "up to date" without torch

# Runs several pflx commands in one fresh process; after each, which of torch and dp_accounting it had imported.
SEQUENCE_PROBE = textwrap.dedent("""
    import json, sys
    from pfl_cli.cli.app import main
    for args in json.loads(sys.argv[1]):
        code = main(args)
        heavy = [m for m in ("torch", "dp_accounting") if m in sys.modules]
        print("PROBE " + json.dumps({"args": args, "code": code, "torch": heavy}), file=sys.stderr)
""")


def test_refusals_and_up_to_date_answers_never_import_torch(files):
    """`import torch` costs ~3 CPU s: a refused train / tune / predict, or one whose --out is up to date,
    answers without it (issue 49, finding 20)."""
    from pfl_cli.cli.app import main

    part, model, pred = files / "part", files / "torchless-fedavg", files / "torchless-pred"
    train = ["train", "--partition", part, "--algorithm", "fedavg", "--rounds", "1", "--local-steps", "1",
             "--eval-every", "1", "--out", model]
    predict = ["predict", "--model", model, "--partition", part, "--clients", "train", "--out", pred]
    for args in (train, predict):  # in this process: torch is loaded here already
        assert main([*map(str, args), "--format", "quiet"]) == 0
    cases = [
        (["train", "--partition", part, "--algorithm", "fedavgg", "--out", files / "x"], 2),
        (["train", "--partition", files / "nope", "--algorithm", "fedavg", "--out", files / "x"], 2),
        (["train", "--partition", part, "--algorithm", "fedavg", "--lr", "abc", "--out", files / "x"], 2),
        (["train", "--partition", part, "--algorithm", "scaffold", "--set", "local_step=2", "--out", files / "x"], 2),
        (["tune", "--partition", part, "--algorithm", "fedavgg", "--trials", "2", "--out", files / "x"], 2),
        (["predict", "--model", files / "nope", "--partition", part, "--out", files / "x"], 2),
        (train, 0),
        (predict, 0),
    ]
    argv = json.dumps([[str(a) for a in args] + ["--format", "quiet"] for args, _ in cases])
    proc = subprocess.run([sys.executable, "-c", SEQUENCE_PROBE, argv], cwd=files, env=_env(), capture_output=True,
                          text=True, timeout=120)
    done = [json.loads(ln[len("PROBE "):]) for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
    assert len(done) == len(cases), proc.stderr
    for (args, code), doc in zip(cases, done):
        assert (doc["code"], doc["torch"]) == (code, []), (doc["args"], proc.stderr)


# Runs pflx, then reports which of the numeric libraries the process imported by then.
NUMERIC_PROBE = textwrap.dedent("""
    import json, sys
    from pfl_cli.cli.app import main
    code = main(sys.argv[1:])
    loaded = [m for m in ("torch", "scipy", "dp_accounting", "pfl_cli.algorithms.apfl") if m in sys.modules]
    print("PROBE " + json.dumps({"code": code, "loaded": loaded}), file=sys.stderr)
""")


def test_numeric_stages_refuse_and_answer_up_to_date_without_scipy_dp_accounting_or_torch(files):
    """mdm-fit, simulate, cluster and privacy-account check their options (and mdm-fit / cluster their
    --out) before loading scipy or dp_accounting (~0.5-2 CPU s); an unknown --set key is refused without
    loading every algorithm module (issue 49, finding 20). One fresh process each."""
    from pfl_cli.cli.app import main

    part, km, nope = files / "part", files / "numeric-km", files / "nope"
    cluster = ["cluster", "--partition", part, "--server-data", f"npz:{files / 'd.npz'}", "--k", "2", "--no-dp",
               "--out", km]
    assert main([*map(str, cluster), "--format", "quiet"]) == 0  # in this process: the artifact to find up to date
    cases = [
        (["mdm-fit", "--partition", part, "--components", "1", "--out", files / "mdm"], 0),  # up to date
        (["mdm-fit", "--partition", part, "--components", "-1", "--out", files / "x"], 2),
        (["simulate", "--model", nope, "--dataset", f"npz:{files / 'd.npz'}", "--num-clients", "4",
          "--out", files / "x"], 2),
        (["simulate", "--model", files / "mdm", "--dataset", f"npz:{files / 'd.npz'}", "--num-clients", "-4",
          "--out", files / "x"], 2),
        (["cluster", "--partition", nope, "--k", "2", "--out", files / "x"], 2),
        (["cluster", "--partition", part, "--server-data", f"npz:{files / 'd.npz'}", "--k", "0", "--no-dp",
          "--out", files / "x"], 2),
        (cluster, 0),  # up to date
        (["privacy-account", "--noise-multiplier", "1.1", "--sampling-rate", "0.01", "--steps", "10",
          "--delta", "2"], 2),
        (["train", "--partition", part, "--algorithm", "scaffold", "--set", "alpha=2", "--out", files / "x"], 2),
    ]
    for args, code in cases:
        argv = [str(a) for a in args] + ["--format", "quiet"]
        proc = subprocess.run([sys.executable, "-c", NUMERIC_PROBE, *argv], cwd=files, env=_env(),
                              capture_output=True, text=True, timeout=120)
        line = [ln for ln in proc.stderr.splitlines() if ln.startswith("PROBE ")]
        assert line, proc.stderr
        assert json.loads(line[-1][len("PROBE "):]) == {"code": code, "loaded": []}, (argv, proc.stderr)
