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
PAGES = [*REQUIRED, "docs/robustness.md", "docs/commands/compare.md", "docs/commands/tune.md", "docs/commands/algorithms.md",
         "docs/commands/cluster.md", "docs/commands/mdm-fit.md", "docs/algorithms/pefll.md",
         "docs/algorithms/pfedhn.md", "docs/algorithms/hyperfl.md", "docs/algorithms/fedavg.md",
         # issue 39, item 7: every command page and every algorithm page with a command block
         "docs/commands/train.md", "docs/commands/predict.md", "docs/commands/attack.md", "docs/commands/show.md",
         "docs/commands/simulate.md", "docs/commands/privacy-account.md", "docs/commands/flower.md",
         "docs/algorithms/index.md", "docs/algorithms/flowdup.md", "docs/reference/config.md",
         "docs/algorithms/fedopt-fedexp.md", "docs/algorithms/scaffold-feddyn.md",
         "docs/algorithms/fedfomo-apple.md", "docs/algorithms/fedlc-fedamp.md",
         "docs/algorithms/fedproto-fednh.md", "docs/algorithms/fednova-centralized.md",
         "docs/algorithms/moon-fedsam.md",
         # issue 47: federation conditions
         "docs/federation-conditions.md",
         "docs/models.md",
         "docs/algorithms/clustered-fair.md",
         "docs/algorithms/lora.md",
         "docs/privacy/secure-aggregation.md",
         # issue 47, item 2: asynchronous aggregation
         "docs/algorithms/async.md"]
# Pages whose blocks need a marker of an optional extra (deselected with a notice where it is absent).
EXTRA = {"docs/tutorials/deploy-flower.md": pytest.mark.flower, "docs/commands/flower.md": pytest.mark.flower,
         "docs/models.md": pytest.mark.models}
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


def _commands(page: str, contains: str, *starts: str) -> str:
    """The commands (with their continuation lines) of the page's block holding ``contains`` that start with
    one of ``starts``, in order, but a ``--resume``: what another page's prose points at."""
    code = next(b.code for b in executed.blocks(page) if contains in b.code)
    commands, cur = [], []
    for ln in code.splitlines():
        cur.append(ln)
        if not ln.rstrip().endswith("\\"):
            commands.append("\n".join(cur))
            cur = []
    out = [c for c in commands if c.startswith(starts) and "--resume" not in c]
    assert out, (page, contains, starts)
    return "\n".join(out)


def _header(recipe: str, start: str) -> str:
    return next(ln for ln in executed.header_lines(ROOT / recipe) if ln.startswith(start))


_TRAIN_MD = lambda: _commands("docs/commands/train.md", "--algorithm pefll --rounds", "pflx partition",  # noqa: E731
                              "pflx train", "pflx predict")
# the README's partition, mdm-fit.md's fit of it and its simulated clients
_MDM_MD = lambda: _first_pipeline_partition() + "\n" + _commands("docs/commands/mdm-fit.md", "pflx mdm-fit", "pflx")  # noqa: E731
# What a page reads that another page or a recipe makes (the page's prose names it): the commands, taken from
# where they are shown, and the paths under runs/ the page reads (None: all). They run once a session at
# smoke size in a directory of their own, shared by the pages that need the same, and the paths are linked
# into the page's runs/ (a page never writes into them: it writes its own --out).
PREREQUISITES = {
    "docs/commands/mdm-fit.md": (_MDM_MD, ("runs/part",)),  # it fits runs/part, the README's partition
    "docs/commands/simulate.md": (_MDM_MD, ("runs/mdm",)),
    "docs/commands/train.md": (_MDM_MD, ("runs/sim",)),  # its DP block; the page makes its own runs/part
    "docs/commands/predict.md": (_TRAIN_MD, ("runs/part", "runs/pefll")),  # the page makes runs/pred
    "docs/commands/show.md": (_TRAIN_MD, None),
    "docs/commands/privacy-account.md": (lambda: _commands("docs/tutorials/dp-pipeline.md", "--out runs/dp/fedavg",
                                                           "pflx partition", "pflx mdm-fit", "pflx train"), None),
    "docs/algorithms/index.md": (lambda: _header("recipes/quickstart/digits-pfedhn.yaml", "pflx partition"), None),
    "docs/algorithms/flowdup.md": (lambda: _header("recipes/flowdup/rotated-digits.yaml", "pflx partition"), None),
}
_MADE: dict[str, Path] = {}  # the prerequisites' commands -> where they ran (this session)


# What a page needs before its first block that the page itself says in prose, not in a block (with why).
def _setup(page: str, cwd: Path, base: Path) -> dict[str, str]:
    if page in PREREQUISITES:
        commands, names = PREREQUISITES[page]
        code = executed.smoke(commands())
        if code not in _MADE:
            pre = executed.scratch(base / f"pre{len(_MADE)}")
            r = executed.run_shell(code, pre)
            assert r.returncode == 0, (page, "prerequisite", code, r.stderr[-3000:])
            _MADE[code] = pre
        made = _MADE[code] / "runs"
        (cwd / "runs").mkdir(exist_ok=True)
        for path in made.iterdir():
            if names is None or f"runs/{path.name}" in names:
                (cwd / "runs" / path.name).symlink_to(path)
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
        assert (cwd / "runs" / "spec-runs" / "local" / "seed-2-new" / "manifest.json").is_file()
        assert "| local | new | 3 |" in (cwd / "runs" / "table-spec" / "table.md").read_text()
        # the one-spec protocol: each study's tune artifact, then its seeds, then the table
        assert "| fedprox | new | 2 |" in (cwd / "runs" / "table-protocol" / "table.md").read_text()
        assert (cwd / "runs" / "protocol-runs" / "tune-fedprox" / "best.yaml").is_file()
        # the paired tests against the first configuration (fedavg), the baseline among them
        assert "| local | fedavg | train | clients (accuracy) |" in (cwd / "runs" / "table-protocol" / "table.md").read_text()
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
def test_every_block_of_the_page_runs(page, tmp_path, tmp_path_factory):
    cwd = executed.scratch(tmp_path / "work")
    extra = _setup(page, cwd, tmp_path_factory.getbasetemp())
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


# Every page users copy from: README.md, the site's pages and the recipes' Markdown.
MARKDOWN = ["README.md", *sorted(str(p.relative_to(ROOT)) for d in ("docs", "recipes") for p in (ROOT / d).rglob("*.md"))]


def test_every_fence_that_holds_a_command_is_run_or_parse_only():
    """Issue 39, item 7: a block that shows a pflx command (pflx, make, python -m pfl_cli, a script of
    benchmarks/ or recipes/), in any fence (backticks or tildes, indented in a list or an admonition, tagged
    bash/sh/shell/console/text or untagged), is executed (a run-tagged block of a page in PAGES) or marked
    docs_parse_only("why"); none is skipped silently."""
    missing = [where for page in MARKDOWN for where in executed.unaccounted(page, run=page in PAGES)]
    assert not missing, (f"{len(missing)} blocks hold a pflx command and are neither run (their page in PAGES, "
                         "tagged bash/sh/shell/console) nor marked docs_parse_only(\"why\"):\n" + "\n".join(missing))


# The parse-only blocks of the pages that are not run: checked here (on a run page, its run checks them).
PARSE_ONLY = [b for page in MARKDOWN if page not in PAGES for b in executed.fences(page) if b.mark == "docs_parse_only"]


@pytest.mark.parametrize("block", PARSE_ONLY, ids=[b.where for b in PARSE_ONLY])
def test_a_parse_only_block_of_a_page_that_is_not_run_parses(block, tmp_path):
    failed = executed.parse_block(block, executed.scratch(tmp_path))
    assert not failed, failed


FORMS = """~~~
pflx train --partition runs/part --out runs/a
~~~

!!! note
    In an admonition:

    ```console
    $ pflx show runs/a \\
        --format json
    {"stage": "train"}
    ```

1. In a list item:

    ````text
    make demo
    ````

```bash
for s in 0 1; do NAME=x nice -n 5 pflx train --seed $s; done
```

```
pflx: error: --partition runs/part: not a partition
```

<!-- pytest.mark.docs_parse_only("needs a PFLlib checkout, which tests do not have") -->

```sh
.venv/bin/python benchmarks/conformance.py --rounds 3
```

```yaml
train: {rounds: 3}
```
"""


def test_every_form_of_fence_is_found_and_accounted(tmp_path, monkeypatch):
    (tmp_path / "p.md").write_text(FORMS)
    monkeypatch.setattr(executed, "ROOT", tmp_path)
    found = executed.fences("p.md")
    assert [(b.line, b.syntax, b.mark) for b in found] == [
        (1, "", None), (8, "console", None), (16, "text", None), (20, "bash", None), (24, "", None),
        (30, "sh", "docs_parse_only"), (34, "yaml", None)]
    console = found[1]
    assert console.code.startswith("$ pflx show")  # the admonition's indentation removed
    assert executed.command_lines(console) == [["pflx", "show", "runs/a", "--format", "json"]]
    assert executed.shown_output(console) == ['{"stage": "train"}']
    assert ["pflx", "train", "--seed", "$s"] in executed.command_lines(found[3])
    assert [executed.holds_command(b) for b in found] == [True, True, True, True, False, True, False]
    # a page that is not run: every block holding a command but the marked one; a run page: the untagged
    # and text blocks still (a run executes shell, console and python blocks only)
    assert [w.split()[0] for w in executed.unaccounted("p.md", run=False)] == ["p.md:1", "p.md:8", "p.md:16",
                                                                              "p.md:20"]
    assert [w.split()[0] for w in executed.unaccounted("p.md", run=True)] == ["p.md:1", "p.md:16"]
    assert [b.line for b in executed.blocks("p.md")] == [8, 20, 30]


@pytest.mark.parametrize("text,error", [
    ("<!-- pytest.mark.docs_parse_only(\"a reason that is long\") -->\nprose\n```bash\npflx x\n```\n",
     "p.md:1: a docs mark marks the block right below it"),
    ("```bash\npflx x\n```\n<!-- pytest.mark.docs_parse_only(\"a reason that is long\") -->\n",
     "p.md:4: a docs mark below the last block marks nothing"),
    ("text\n~~~~\npflx x\n~~~\n", "p.md:2: a fence that is never closed"),
    ("<!-- pytest.mark.docs_parse_olny(\"typo\") -->\n```bash\npflx x\n```\n", "p.md:1: unknown docs mark"),
    ("text\n\n> ```bash\n> pflx x\n> ```\n", "p.md:3: a fence in a blockquote"),
    ("1. ```bash\n   pflx x\n   ```\n", "p.md:1: a fence in a blockquote or on a list marker's line"),
])
def test_a_misplaced_mark_or_an_open_fence_is_an_error(text, error, tmp_path, monkeypatch):
    (tmp_path / "p.md").write_text(text)
    monkeypatch.setattr(executed, "ROOT", tmp_path)
    with pytest.raises(ValueError, match=re.escape(error)):
        executed.fences("p.md")


def test_a_console_blocks_shown_output_is_checked(tmp_path, monkeypatch):
    (tmp_path / "p.md").write_text("```console\n$ echo printed\nprinted\n```\n")
    monkeypatch.setattr(executed, "ROOT", tmp_path)
    executed.run_page("p.md", tmp_path)
    (tmp_path / "p.md").write_text("```console\n$ echo printed\nnot printed\n```\n")
    with pytest.raises(AssertionError, match="shown but not printed"):
        executed.run_page("p.md", tmp_path)


def test_a_scripts_arguments_are_parsed_without_running_it(tmp_path):
    cwd = executed.scratch(tmp_path)
    ok = ["nice", "-n", "10", ".venv/bin/python", "benchmarks/conformance.py", "--rounds", "100", "--seeds", "0,1"]
    assert executed.check_parses(ok, cwd) is None
    assert "--no-such" in executed.check_parses([*ok, "--no-such"], cwd)
    assert "invalid int" in executed.check_parses(["python", "benchmarks/conformance.py", "--rounds", "x"], cwd)
    assert executed.check_parses(["python", "-c", "import os; os.getcwd()"], cwd) is None
    assert "python -c" in executed.check_parses(["python", "-c", "import (("], cwd)


def _header_commands_shown(path: Path) -> list[tuple[int, str]]:
    """Each line of a recipe's header comment that holds a pflx command, continuation lines joined."""
    out, joined, start = [], "", 0
    for i, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.startswith("#"):
            break
        text = raw[1:].strip()
        joined, start = (f"{joined} {text}", start) if joined else (text, i)
        if joined.endswith("\\"):
            joined = joined[:-1].rstrip()
            continue
        if executed.holds_command(executed.Block(str(path), start, "bash", joined + "\n")):
            out.append((start, joined))
        joined = ""
    return out


def test_every_command_of_a_recipe_header_is_one_the_recipe_tests_run_or_parse():
    """tests/recipes/test_executed_recipes.py runs or parses the header lines executed.header_lines returns
    (indented by three spaces, starting with a program): a command written another way would be skipped."""
    missing = []
    for path in sorted((ROOT / "recipes").rglob("*.yaml")):
        taken = [" ".join(line.split()) for line in executed.header_lines(path)]
        missing += [f"{path.relative_to(ROOT)}:{at}: {text[:80]}" for at, text in _header_commands_shown(path)
                    if not any(" ".join(text.split()).startswith(t) or t in " ".join(text.split()) for t in taken)]
    assert not missing, "\n".join(missing)


def test_a_header_command_written_another_way_is_found(tmp_path, monkeypatch):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text("# A recipe.\n#   pflx partition --out runs/p\n"
                                                 "#  nice -n 5 pflx train --partition runs/p \\\n#     --out runs/t\n"
                                                 "# pflx: error: a refusal is not a command\ntrain: {}\n")
    monkeypatch.setattr(executed, "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="recipes/r.yaml:3: nice -n 5 pflx train --partition runs/p --out runs/t"):
        test_every_command_of_a_recipe_header_is_one_the_recipe_tests_run_or_parse()


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
    code = ("pflx train --config recipes/quickstart/digits-pfedhn.yaml --partition runs/d --out runs/p\n"
            "pflx train --partition runs/part --rounds 400 --out runs/a\npflx train --config c.yaml --out runs/a --resume\n"
            "pflx attack --model runs/a --partition runs/part --images 8 --iterations 1500 --out runs/att\n")
    assert executed.smoke(code).splitlines() == [
        "pflx train --set rounds=2 --config recipes/quickstart/digits-pfedhn.yaml --partition runs/d --out runs/p",
        "pflx train --partition runs/part --rounds 2 --out runs/a",
        "pflx train --config c.yaml --out runs/a --resume",  # a resume is its run's own command
        "pflx attack --model runs/a --partition runs/part --images 2 --iterations 20 --out runs/att"]
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
                                  "docs/algorithms/hyperfl.md", "docs/algorithms/fedavg.md",
                                  "docs/algorithms/scaffold-feddyn.md", "docs/algorithms/fednova-centralized.md"])
def test_an_algorithm_page_says_how_new_clients_get_a_model_and_what_is_exchanged(page):
    text = (ROOT / page).read_text()
    assert "## New clients" in text or "a new client gets" in text
    assert "## What a client exchanges" in text and "## Defaults" in text
    assert "bibliography.md" in text
