"""What the docs and the recipes show, executed: the one mechanism behind tests/docs/test_executed_docs.py and
tests/recipes/test_executed_recipes.py (issue 34, "Documentation that is executed").

Extraction. The code blocks of a Markdown page come from pytest-codeblocks' ``extract_from_file`` (a maintained
extractor: fences of any length, indented blocks in lists and admonitions, line numbers, and the
``<!-- pytest.mark.NAME(...) -->`` comment right above a block as that block's mark). Its own runner is not used:
it runs a block in pytest's working directory (a page writes ``runs/``), with ``shell=True`` and no ``-e``
(a failing command in the middle of a block goes unseen), without a timeout and without the smoke-size overrides
below. mktestdocs' ``grab_code_blocks`` drops a block's info string and whatever precedes the fence, so a block
cannot carry a mark; pytest-markdown-docs and pytest-examples run Python blocks only.

Running. A page's blocks run in order, in one scratch directory (a later block uses what an earlier one wrote),
whose ``recipes/`` and ``benchmarks/`` are links to the repository's, with the test environment's ``bin/`` first
on PATH (``pflx``, ``python``). A shell block runs under ``bash -e -o pipefail``; a Python block runs with the
page's earlier Python blocks before it (they build one module, as a reader pastes them).

Marks (an HTML comment on its own line above the block; the page renders without it):

``<!-- pytest.mark.docs_parse_only("why it cannot run here") -->``
    The block needs what a test cannot have (a GPU, a dataset that is not shipped, a package install, a server
    that runs until stopped). Each of its commands is checked to parse instead, never skipped: ``pflx ...`` and
    any other program with ``--help`` appended (the subcommand and every flag must exist: an unknown option is
    an error before ``--help`` is honoured), ``make ...`` with ``make -n`` from the repository root (the
    target exists), ``pip install`` of pflx's extras (each extra is one the installed pflx provides), ``source FILE``
    (the environment's ``bin/activate`` exists).
``<!-- pytest.mark.docs_refusal("message") -->``
    The block runs and must end in pflx's one-line refusal (exit 2) containing ``message`` (e.g. a database
    server that is not there): its flags parse and the refusal is the documented one.

Smoke size: the commands run as written apart from the substitutions of ``SMOKE`` (each with its reason).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pytest_codeblocks import extract_from_file

ROOT = Path(__file__).resolve().parents[2]
SHELL = ("bash", "sh")
BIN = Path(sys.executable).parent

# (pattern, replacement, why): the only changes made to a documented command before it runs.
SMOKE: list[tuple[str, str, str]] = [
    (r"--rounds \d+", "--rounds 2", "training length: the test checks the command, not the accuracy"),
    (r"--trials \d+", "--trials 2", "tune: two trials exercise the study, the best config and best.yaml"),
    (r"--eval-every \d+", "--eval-every 1", "with 2 rounds, an evaluation every round gives a curve"),
    (r"--local-epochs \d+", "--local-epochs 1", "one local epoch: training length"),
    (r"--embed-rounds \d+", "--embed-rounds 1", "one embedding round: training length (new clients)"),
    (r"--finetune-steps \d+", "--finetune-steps 2", "two fine-tuning steps: training length (new clients)"),
    (r"\brounds: \d+", "rounds: 2", "the same, for rounds written in a spec file (compare --spec)"),
    (r"\beval_every: \d+", "eval_every: 1", "the same, for eval_every in a spec file"),
    (r"\blocal_epochs: \d+", "local_epochs: 1", "the same, for local_epochs in a spec file"),
    (r"^(make -C recipes/compare\b(?!.*ROUNDS=).*?)(\s*(#.*)?)$", r"\1 ROUNDS=2\2",
     "the comparison Makefile's own smoke size (ROUNDS=2, its header) where the command gives none"),
    (r"^(make -C recipes/compare\b(?!.*SEEDS=).*?)(\s*(#.*)?)$", r"\1 SEEDS=0\2",
     "one seed where the command gives none: the loop over seeds is the Makefile's, run with 3 and 4 seeds in "
     "tests/recipes/test_executed_recipes.py"),
    (r"^(make -f recipes/Makefile\b.*?)\s+ROUNDS=\d+", r"\1", "the quickstart Makefile's ROUNDS (below) instead"),
    (r"^(make -f recipes/Makefile\b(?!.*ROUNDS=).*?)(\s*(#.*)?)$", r"\1 ROUNDS=2\2",
     "the quickstart Makefile at 2 rounds (its ROUNDS variable)"),
]
# Pages that run at the size they show: their text explains the numbers these commands print.
FULL_SIZE = {"docs/tutorials/dp-pipeline.md": "the text explains the epsilon that its 50 DP rounds print (~10 s)"}

MARK = re.compile(r"^pytest\.mark\.(docs_parse_only|docs_refusal)\((.*)\)$", re.S)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # the opening fence's line
    syntax: str
    code: str
    mark: str | None = None  # "docs_parse_only" | "docs_refusal"
    why: str | None = None  # the mark's argument

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    """The page's bash/sh and python blocks, in order, with their marks."""
    out = []
    for b in extract_from_file(ROOT / page):
        syntax = (b.syntax or "").split()[0] if b.syntax else ""
        if syntax not in (*SHELL, "python"):
            continue
        mark = why = None
        for m in b.marks:
            found = MARK.match(m.strip())
            if found is None:
                raise ValueError(f"{page}:{b.lineno}: unknown docs mark {m!r} (docs_parse_only, docs_refusal)")
            mark, why = found.group(1), ast.literal_eval(found.group(2))
        out.append(Block(page, b.lineno, syntax, b.code, mark, why))
    return out


def smoke(code: str) -> str:
    for pattern, repl, _ in SMOKE:
        code = re.sub(pattern, repl, code, flags=re.M)
    return code


def env() -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
            "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}


def scratch(path: Path) -> Path:
    """A working directory like the repository root for the commands: recipes/ and benchmarks/ linked."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("recipes", "benchmarks"):
        if not (path / name).exists():
            (path / name).symlink_to(ROOT / name)
    return path


def _run(argv: list[str], cwd: Path, timeout: float, extra_env: dict | None) -> subprocess.CompletedProcess:
    """Output to files, not pipes (a server a block started and left running would hold a pipe open); in its
    own process group, which is stopped on a timeout, so nothing it started outlives it."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env={**env(), **(extra_env or {})}, stdout=out, stderr=err,
                                text=True, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, code, out.read(), err.read())


def run_shell(code: str, cwd: Path, timeout: float = 900, extra_env: dict | None = None):
    return _run(["bash", "-e", "-o", "pipefail", "-c", code], cwd, timeout, extra_env)


def run_python(code: str, cwd: Path, timeout: float = 300, extra_env: dict | None = None):
    return _run([sys.executable, "-c", code], cwd, timeout, extra_env)


def commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments dropped, split at && ; |."""
    out, joined = [], ""
    for line in code.splitlines():
        joined += line[:-1] + " " if line.rstrip().endswith("\\") else line
        if line.rstrip().endswith("\\"):
            continue
        words, joined = shlex.split(joined, comments=True), ""
        cur: list[str] = []
        for w in [*words, ";"]:
            if w in ("&&", ";", "|", "||"):
                if cur:
                    out.append(cur)
                cur = []
            else:
                cur.append(w)
    return out


def _extras() -> set[str]:
    from importlib.metadata import metadata

    return set(metadata("pflx").get_all("Provides-Extra") or ())


def check_parses(argv: list[str], cwd: Path) -> str | None:
    """None when the command would be accepted as written, else why not (see the module's docstring)."""
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # VAR=value before the command
        argv = argv[1:]
    name = argv[0]
    if name == "make":
        r = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, env=env(), capture_output=True, text=True)
        return None if r.returncode == 0 else f"make -n: {r.stderr.strip()}"
    if name == "pip" and argv[1:2] == ["install"]:
        reqs = [a for a in argv[2:] if not a.startswith("-")]
        for req in reqs:
            m = re.fullmatch(r"(?:\.|pflx)\[([\w,-]+)\]", req)
            if m is None:
                return f"pip install {req}: only pflx's extras are checked"
            unknown = set(m.group(1).split(",")) - _extras()
            if unknown:
                return f"pip install {req}: pflx provides no extra {sorted(unknown)}"
        return None if reqs else "pip install of nothing"
    if name == "source":
        return None if (BIN / "activate").is_file() else f"no {BIN / 'activate'}"
    r = subprocess.run([*argv, "--help"], cwd=cwd, env=env(), capture_output=True, text=True, timeout=120)
    return None if r.returncode == 0 else f"{' '.join(argv)} --help: exit {r.returncode}: {r.stderr.strip()[-800:]}"


def run_page(page: str, cwd: Path, extra_env: dict | None = None) -> list[tuple[Block, str]]:
    """Run every block of the page in order in ``cwd``; returns (block, stdout). Raises AssertionError naming
    the block (page:line), the command as run and the end of its output."""
    found = blocks(page)
    assert found, f"{page} has no shell or python block"
    outputs, python = [], []
    for b in found:
        code = b.code if page in FULL_SIZE else smoke(b.code)
        if b.syntax == "python":
            python.append(code)
            r = run_python("\n".join(python), cwd, extra_env=extra_env)
            assert r.returncode == 0, (b.where, code, r.stderr[-3000:])
        elif b.mark == "docs_parse_only":
            cmds = commands(code)
            assert cmds, (b.where, "a parse-only block with no command")
            for argv in cmds:
                why = check_parses(argv, cwd)
                assert why is None, (b.where, why)
            outputs.append((b, ""))
            continue
        else:
            r = run_shell(code, cwd, extra_env=extra_env)
            if b.mark == "docs_refusal":
                assert r.returncode == 2 and b.why in r.stderr, (b.where, code, r.returncode, r.stderr[-3000:])
            else:
                assert r.returncode == 0, (b.where, code, r.stdout[-2000:], r.stderr[-3000:])
        outputs.append((b, r.stdout))
    return outputs


# --- recipes -----------------------------------------------------------------------------------------------

def header_lines(path: Path) -> list[str]:
    """The commands of a recipe's header comment, as shell lines (continuations joined, trailing comments kept
    out): every indented line that starts with a program (pflx, python, make, a script of recipes/, VAR=...)."""
    lines, cur = [], None
    for raw in path.read_text().splitlines():
        if not raw.startswith("#"):
            break
        text = raw[1:].strip()
        if cur is not None:
            cur += " " + text
        elif re.match(r"^(pflx|python|make|recipes/\S+\.sh|[A-Z_]+=\S+ (python|pflx)) ", text) and raw.startswith("#   "):
            cur = text
        else:
            continue
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
        else:
            lines.append(cur)
            cur = None
    return lines


def header_commands(path: Path) -> list[list[str]]:
    """The header's ``pflx ...`` commands as argv lists without ``pflx``."""
    return [c[1:] for line in header_lines(path) for c in commands(line) if c[0] == "pflx"]
