"""Every shell and Python block of the pages users copy from runs as written (issue 34), at smoke size.

The mechanism (extraction, the smoke-size table, the marks for blocks that cannot run here) is
tests/docs/executed.py. A page's blocks run in order in one scratch directory; a block marked
``docs_parse_only`` has each of its commands checked to parse; ``docs_refusal`` must end in the named refusal.
Learning runs are in the ``docs`` tier (``make test-docs``; ``make test`` runs it after the default tier).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import executed  # noqa: E402

ROOT = executed.ROOT
REQUIRED = ["README.md", "docs/getting-started.md", "docs/index.md",
            *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "tutorials").glob("*.md"))]
PAGES = [*REQUIRED, "docs/commands/compare.md", "docs/commands/tune.md", "docs/commands/algorithms.md",
         "docs/commands/cluster.md", "docs/commands/mdm-fit.md", "docs/algorithms/pefll.md",
         "docs/algorithms/pfedhn.md", "docs/algorithms/hyperfl.md", "docs/algorithms/fedavg.md"]
# Pages whose blocks need a marker of an optional extra (deselected with a notice where it is absent).
EXTRA = {"docs/tutorials/deploy-flower.md": pytest.mark.flower}
PLUGIN = ROOT / "tests" / "plugins" / "pflx_fedavgm"


def _first_pipeline_partition() -> str:
    """The README's first pipeline's partition command: what a page that reads runs/part ran first."""
    block = next(b for b in executed.blocks("README.md") if "pflx partition" in b.code)
    return next(ln for ln in block.code.splitlines() if ln.startswith("pflx partition"))


def _install_plugin(cwd: Path) -> dict[str, str]:
    """`pip install ./pflx_fedavgm`, done the way tests/cli/test_plugins.py does it: the package of
    tests/plugins/pflx_fedavgm (the page's code, kept there) and a *.dist-info naming its entry point, on
    PYTHONPATH."""
    site = cwd / "site"
    info = site / "pflx_fedavgm-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pflx-fedavgm\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[pflx.algorithms]\nfedavgm = pflx_fedavgm:FedAvgM\n")
    return {"PYTHONPATH": f"{site}:{PLUGIN}"}


# What a page needs before its first block that the page itself says in prose, not in a block (with why).
def _setup(page: str, cwd: Path) -> dict[str, str]:
    if page == "docs/commands/mdm-fit.md":  # it fits the clients of runs/part, the README's partition
        r = executed.run_shell(_first_pipeline_partition(), cwd)
        assert r.returncode == 0, r.stderr
    if page == "docs/tutorials/write-your-own-algorithm.md":
        # "Install it (`pip install ./pflx_fedavgm`)"; its commands read runs/part, the README's partition.
        r = executed.run_shell(_first_pipeline_partition(), cwd)
        assert r.returncode == 0, r.stderr
        return _install_plugin(cwd)
    return {}


def _epsilon(text: str) -> float:
    return float(re.search(r"epsilon = ([0-9.]+)", text).group(1))


# What a page's text says its commands produce, checked on what they produced.
def _after(page: str, cwd: Path, outputs) -> None:
    if page == "README.md":
        assert (cwd / "runs" / "table" / "table.md").is_file()
    elif page == "docs/commands/compare.md":
        assert "± " in (cwd / "runs" / "table" / "table.md").read_text()
        assert (cwd / "runs" / "table-fig" / "clients.png").is_file()
        assert (cwd / "runs" / "spec-runs" / "local" / "s2-new" / "manifest.json").is_file()
        assert "| local | new | 3 |" in (cwd / "runs" / "table-spec" / "table.md").read_text()
    elif page == "docs/tutorials/dp-pipeline.md":
        # issue 34 item 15: q = 8 / 1000, eps 3.13 (PLD) for the two ledgers composed, 3.03 (PLD) for the train
        # ledger alone, its own RDP calibration 4, and 4.11 by RDP for the two.
        text = (ROOT / page).read_text()
        # the page's composition of the two ledgers, as its block ran it (its output is among the block's)
        composed = executed.run_shell("pflx privacy-account runs/dp/mdm runs/dp/fedavg --delta 1e-5", cwd).stdout
        assert composed in outputs[0][1]
        assert "q = 0.008" in composed and "8 / 1000 = 0.008" in text
        both_pld = _epsilon(composed)
        alone = executed.run_shell("pflx privacy-account runs/dp/fedavg --accountant pld", cwd).stdout
        own = executed.run_shell("pflx privacy-account runs/dp/fedavg", cwd).stdout
        both_rdp = executed.run_shell("pflx privacy-account runs/dp/mdm runs/dp/fedavg --delta 1e-5 "
                                      "--accountant rdp", cwd).stdout
        assert _epsilon(own) == pytest.approx(4.0, abs=1e-3)
        for value, stated in ((both_pld, "3.13"), (_epsilon(alone), "3.03"), (_epsilon(both_rdp), "4.11")):
            assert f"{value:.2f}" == stated and stated in text, (value, stated)
    elif page == "docs/tutorials/write-your-own-algorithm.md":
        config = (cwd / "runs" / "fedavgm" / "config.yaml").read_text()
        assert "algorithm: fedavgm" in config and "server_momentum" in config
    elif page == "docs/tutorials/paper-table.md":
        table = json.loads((cwd / "runs" / "cmp-smoke" / "table" / "table.json").read_text())
        assert {r["label"] for r in table["rows"]} == {"fedavg", "pefll"}


def _params():
    for page in PAGES:
        marks = [pytest.mark.docs]
        if page in EXTRA:
            marks.append(EXTRA[page])
        yield pytest.param(page, marks=marks, id=page)


@pytest.mark.parametrize("page", list(_params()))
def test_every_block_of_the_page_runs(page, tmp_path):
    cwd = executed.scratch(tmp_path / "work")
    extra = _setup(page, cwd)
    outputs = executed.run_page(page, cwd, extra_env=extra)
    _after(page, cwd, outputs)


# --- default tier: the mechanism itself, and what every page must satisfy -----------------------------------

@pytest.mark.parametrize("page", PAGES)
def test_every_block_is_run_or_marked_with_a_reason(page):
    found = executed.blocks(page)
    assert found, page
    for b in found:
        if b.mark is not None:
            assert b.why and len(b.why) > 10, (b.where, "a mark says why the block cannot run here")


def test_the_required_pages_are_all_run():
    assert {"README.md", "docs/getting-started.md", "docs/index.md", "docs/tutorials/dp-pipeline.md",
            "docs/tutorials/deploy-flower.md", "docs/tutorials/write-your-own-algorithm.md"} <= set(PAGES)
    assert set(REQUIRED) <= set(PAGES)


def test_smoke_substitutions_only_shrink_sizes():
    code = ("pflx tune --partition runs/part --trials 12 --rounds 60 --eval-every 10 --out x\n"
            "make -C recipes/compare OUT=$PWD/runs/c   # all\n"
            "make -C recipes/compare ROUNDS=3 OUT=$PWD/runs/c\n"
            "make -f recipes/Makefile ROOT=runs/mk ROUNDS=400\n")
    assert executed.smoke(code).splitlines() == [
        "pflx tune --partition runs/part --trials 2 --rounds 2 --eval-every 1 --out x",
        "make -C recipes/compare OUT=$PWD/runs/c ROUNDS=2 SEEDS=0   # all",
        "make -C recipes/compare ROUNDS=3 OUT=$PWD/runs/c SEEDS=0",
        "make -f recipes/Makefile ROOT=runs/mk ROUNDS=2"]
    assert all(len(why) > 20 for _, _, why in executed.SMOKE)


def test_commands_split_continuations_comments_and_lists():
    code = 'pip install -e ".[docs]" && mkdocs serve     # then open\nflwr run app local \\\n    --stream  # x\n'
    assert executed.commands(code) == [["pip", "install", "-e", ".[docs]"], ["mkdocs", "serve"],
                                       ["flwr", "run", "app", "local", "--stream"]]


def test_a_parse_only_check_can_fail(tmp_path):
    assert executed.check_parses(["pflx", "train", "--rounds", "2"], tmp_path) is None
    assert "no-such-flag" in executed.check_parses(["pflx", "train", "--no-such-flag", "2"], tmp_path)
    assert executed.check_parses(["pflx", "trian"], tmp_path) is not None
    assert executed.check_parses(["make", "demo"], tmp_path) is None
    assert executed.check_parses(["make", "no-such-target"], tmp_path) is not None
    assert executed.check_parses(["pip", "install", "pflx[flower]"], tmp_path) is None
    assert "nosuch" in executed.check_parses(["pip", "install", ".[nosuch]"], tmp_path)


def test_an_unknown_mark_is_an_error(tmp_path, monkeypatch):
    page = tmp_path / "p.md"
    page.write_text("<!-- pytest.mark.skip -->\n```bash\nfalse\n```\n")
    monkeypatch.setattr(executed, "ROOT", tmp_path)
    with pytest.raises(ValueError, match="unknown docs mark"):
        executed.blocks("p.md")


def test_a_failing_command_mid_block_fails_the_page(tmp_path, monkeypatch):
    page = tmp_path / "p.md"
    page.write_text("```bash\nfalse\ntrue\n```\n")
    monkeypatch.setattr(executed, "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="p.md:1"):
        executed.run_page("p.md", tmp_path)


def test_the_home_page_has_the_readmes_first_pipeline():
    first = next(b for b in executed.blocks("README.md") if "pflx partition" in b.code)
    pipeline = [ln for ln in first.code.splitlines() if ln.startswith("pflx ")]
    home = (ROOT / "docs" / "index.md").read_text()
    assert pipeline and all(ln in home for ln in pipeline)
    assert "pip install" in home or "make demo" in home


@pytest.mark.parametrize("page", ["docs/algorithms/pefll.md", "docs/algorithms/pfedhn.md",
                                  "docs/algorithms/hyperfl.md", "docs/algorithms/fedavg.md"])
def test_an_algorithm_page_says_how_new_clients_get_a_model_and_what_is_exchanged(page):
    text = (ROOT / page).read_text()
    assert "## New clients" in text or "a new client gets" in text
    assert "## What a client exchanges" in text and "## Defaults" in text
    assert "bibliography.md" in text
