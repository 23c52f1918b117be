"""What the docs and the recipes show, executed: the one mechanism behind tests/docs/test_executed_docs.py and
tests/recipes/test_executed_recipes.py (issue 34, "Documentation that is executed"; issue 39, "every fence
accounted").

Extraction (``fences``). Every fenced block of a Markdown page, as Python-Markdown's superfences (the site) and
GitHub (the README) render it: backtick and tilde fences of any length, at any indentation (inside list items
and mkdocs-material admonitions, whose body is indented by 4; the indentation is removed from the code), any
info string or none, and its opening fence's line. The ``<!-- pytest.mark.NAME(...) -->`` comment right above a
block (blank lines between allowed, nothing else) is that block's mark; an unknown mark, a mark that marks no
block, a fence that is never closed and a fence in a blockquote or on a list marker's line (``> ```bash``,
``- ```bash``: not read) are errors naming page:line. (pytest-codeblocks' ``extract_from_file``,
used before, sees backtick fences only, and attaches a mark to the next block however much prose lies between.)

Which blocks hold a command (``holds_command``): a block holds pflx's commands when one of its command lines
(``$ `` prompts stripped, continuation lines joined, comments dropped, split at && ; | & ||, the commands inside
``$(...)`` and ``bash -c`` included, and what runs a command dropped: shell keywords (``if``, ``while``, ``do``,
``then``, ``{``, ``(``, ``!``), ``VAR=value``, ``env``, ``time``, ``nice``, ``nohup``, ``timeout``, ``sudo``,
``uv run``, ``bash SCRIPT``: :func:`simple_commands`, tests/docs/test_fence_commands.py lists every form) runs ``pflx``, ``make``, ``python -m pfl_cli`` or a script of ``benchmarks/`` or ``recipes/``, whatever its info
string (bash, sh, shell, console, text, none). Each such block must be run or marked parse-only with a reason
(tests/docs/test_executed_docs.py); an output line such as ``pflx: error: ...`` is not a command.

Running. A page's blocks run in order, in one scratch directory (a later block uses what an earlier one wrote),
whose ``recipes/`` and ``benchmarks/`` are links to the repository's, with the test environment's ``bin/`` first
on PATH (``pflx``, ``python``). A shell block (``bash``, ``sh``, ``shell``) runs under ``bash -e -o pipefail``; a
``console`` block runs its ``$ `` lines the same way and the output it shows (its other lines) must each appear
in what they print; a Python block runs with the page's earlier Python blocks before it (they build one module,
as a reader pastes them). A block with another info string (yaml, text, none) is not run.

Marks (an HTML comment on its own line above the block; the page renders without it):

``<!-- pytest.mark.docs_parse_only("why it cannot run here") -->``
    The block needs what a test cannot have (a GPU, a dataset that is not shipped, a package install, a server
    that runs until stopped). Each of its commands is checked to parse instead, never skipped, on every page
    (pages that are not run have theirs checked in the default tier): ``pflx ...`` and any other program with
    ``--help`` appended (the subcommand and every flag must exist: an unknown option is an error before
    ``--help`` is honoured), ``make ...`` with ``make -n`` from the repository root (the target exists), a
    Python script of ``benchmarks/`` or ``recipes/`` with its own argparse parser run on the arguments as
    written (every flag exists and every value converts; the script does not run), ``python -c CODE`` compiled,
    ``pip install`` of pflx's extras (each extra is one the installed pflx provides), ``source FILE`` (the
    environment's ``bin/activate`` exists). ``.venv/bin/`` is the test environment's ``bin/``; ``nice -n N``,
    ``time`` and ``VAR=value`` before a command are dropped.
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
    (r"\btrials: \d+", "trials: 2", "the same, for a study's trials in a spec file (compare --spec tune:)"),
    (r"^(pflx train\b)(?!.*--rounds)(?!.*--resume)", r"\1 --set rounds=2",
     "a train command whose rounds come from its --config (a recipe's hundreds): 2, as above (--resume: the run's own)"),
    (r"--iterations \d+", "--iterations 20", "attack: 20 optimizer steps exercise the attack, not its PSNR"),
    (r"--images \d+", "--images 2", "attack: two targets exercise the batched optimization"),
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
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>.*?)\s*$")
COMMENT = re.compile(r"^\s*<!--\s*(.*?)\s*-->\s*$")
# A fence this scanner does not read: in a blockquote, or on a list item's marker line. An error, not a blind spot.
HIDDEN = re.compile(r"^\s*(>\s*)+(`{3,}|~{3,})|^\s*([-*+]|\d+[.)])\s+(`{3,}|~{3,})")
RUN = (*SHELL, "shell", "console", "python")  # the info strings whose blocks a page's run executes


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository root
    line: int  # the opening fence's line
    syntax: str  # the info string's first word ("" for an untagged fence)
    code: str
    mark: str | None = None  # "docs_parse_only" | "docs_refusal"
    why: str | None = None  # the mark's argument

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def fences(page: str) -> list[Block]:
    """Every fenced block of the page, in order, with its mark (see the module's docstring)."""
    lines = (ROOT / page).read_text().splitlines()
    out: list[Block] = []
    pending: list[tuple[int, str]] = []  # the mark comments above the next fence: (line, text)
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and not (m["fence"][0] == "`" and "`" in m["info"]):
            close = re.compile(rf"^ *{re.escape(m['fence'][0])}{{{len(m['fence'])},}}\s*$")
            end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])), None)
            if end is None:
                raise ValueError(f"{page}:{i + 1}: a fence that is never closed")
            indent = len(m["indent"])
            body = [ln[min(indent, len(ln) - len(ln.lstrip(" "))):] for ln in lines[i + 1:end]]
            mark = why = None
            for at, text in pending:
                found = MARK.match(text)
                if found is None:
                    raise ValueError(f"{page}:{at}: unknown docs mark {text!r} (docs_parse_only, docs_refusal)")
                mark, why = found.group(1), ast.literal_eval(found.group(2))
            info = m["info"].strip("{}").lstrip(".")
            out.append(Block(page, i + 1, info.split()[0].lower() if info else "",
                             "".join(f"{ln}\n" for ln in body), mark, why))
            pending, i = [], end + 1
            continue
        if HIDDEN.match(lines[i]):
            raise ValueError(f"{page}:{i + 1}: a fence in a blockquote or on a list marker's line, which the docs "
                             "tests do not read: start it on a line of its own, indented under the item")
        comment = COMMENT.match(lines[i])
        if comment and comment.group(1).startswith("pytest"):
            pending.append((i + 1, comment.group(1)))
        elif lines[i].strip() and pending:
            raise ValueError(f"{page}:{pending[0][0]}: a docs mark marks the block right below it; "
                             f"line {i + 1} is not a fence")
        i += 1
    if pending:
        raise ValueError(f"{page}:{pending[0][0]}: a docs mark below the last block marks nothing")
    return out


def blocks(page: str) -> list[Block]:
    """The page's blocks that a run executes (shell, console and python), in order, with their marks."""
    return [b for b in fences(page) if b.syntax in RUN]


def shell_code(b: Block) -> str:
    """What a shell block runs: a console block's ``$ `` lines (with their continuation lines), else all."""
    if b.syntax != "console" and not any(ln.startswith("$ ") for ln in b.code.splitlines()):
        return b.code
    out, cont = [], False
    for ln in b.code.splitlines():
        if ln.startswith("$ ") or cont:
            out.append(ln[2:] if ln.startswith("$ ") and not cont else ln)
            cont = ln.rstrip().endswith("\\")
    return "".join(f"{ln}\n" for ln in out)


def shown_output(b: Block) -> list[str]:
    """A console block's output lines: what it shows that is not a command."""
    commands_ = set(shell_code(b).splitlines())
    return [ln for ln in b.code.splitlines() if ln.strip() and ln not in commands_ and not ln.startswith("$ ")]


PREFIX = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S*")
# Words that start a shell construct or run the command after them: dropped before the command (issue 49, 7).
KEYWORDS = {"if", "then", "else", "elif", "while", "until", "do", "!", "{", "}", "(", ")", "time", "exec", "nohup", "command",
            "builtin", "fi", "done", "esac"}
# Options of the runners that take a value (the value is not the command).
TIMEOUT_VALUED, SUDO_VALUED = {"-s", "--signal", "-k", "--kill-after"}, {"-u", "-g", "-C", "-h", "-p", "-r", "-t", "-U"}
UV_VALUED = {"--with", "--extra", "-p", "--python", "--project", "--directory", "--package", "--group", "--env-file",
             "--with-requirements", "--index", "--index-url", "-w"}


def _skip_options(argv: list[str], valued: set[str]) -> list[str]:
    """``argv`` after a runner's options (``--`` ends them)."""
    while argv and argv[0].startswith("-"):
        if argv[0] == "--":
            return argv[1:]
        argv = argv[2:] if argv[0] in valued else argv[1:]
    return argv


def program(argv: list[str]) -> list[str]:
    """The command without what runs it: shell keywords (``if``, ``then``, ``do``, ``{``, ``!``, ...), ``VAR=value``,
    ``time``, ``exec``, ``nohup``, ``env [-i] [VAR=value]``, ``nice [-n N]``, ``timeout [options] DURATION``,
    ``sudo [options]``, ``uv run [options]``, ``bash|sh [options] SCRIPT`` (the script is the command); a loop
    header (``for x in ...``) is no command."""
    while argv:
        head = argv[0]
        if argv[:1] == ["for"] or argv[:1] == ["case"]:
            return []
        if PREFIX.fullmatch(head) or head in KEYWORDS:
            argv = argv[1:]
        elif head == "env":
            argv = _skip_options(argv[1:], {"-u", "--unset", "-C", "--chdir"})
        elif head == "nice":
            argv = argv[3:] if argv[1:2] == ["-n"] else argv[1:]
        elif head == "timeout":
            rest = _skip_options(argv[1:], TIMEOUT_VALUED)
            argv = rest[1:]  # the duration
        elif head == "sudo":
            argv = _skip_options(argv[1:], SUDO_VALUED)
        elif head == "uv" and argv[1:2] == ["run"]:
            argv = _skip_options(argv[2:], UV_VALUED)
        elif head in ("bash", "sh") and len(argv) > 1 and argv[1] != "-c":
            argv = _skip_options(argv[1:], {"-o", "-O", "--rcfile", "--init-file"})
        else:
            break
    return argv


def _substitutions(line: str) -> tuple[str, list[str]]:
    """``line`` with each command substitution ``$(...)`` (not inside single quotes) replaced by a placeholder word,
    and the substituted command texts. Backticks are left alone: the pages' output lines and prose quote commands
    in Markdown's backticks (``Re-create it with `pflx partition```), which are not commands."""
    out, inner, i, quote = [], [], 0, None
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = None if c == "'" else quote
        elif c == "'" and quote is None:
            quote = "'"
        elif c == '"':
            quote = None if quote == '"' else '"'
        elif line.startswith("$(", i) and not line.startswith("$((", i):
            depth, j = 1, i + 2
            while j < len(line) and depth:
                depth += {"(": 1, ")": -1}.get(line[j], 0)
                j += 1
            inner.append(line[i + 2:j - 1])
            out.append("__substituted__")
            i = j
            continue
        out.append(c)
        i += 1
    return "".join(out), inner


def simple_commands(text: str) -> list[list[str]]:
    """The simple commands of shell ``text`` (continuation lines joined, comments dropped), each without what runs
    it (:func:`program`): split at ``;`` ``&`` ``|`` ``&&`` ``||``, subshell parentheses and group braces (words)
    dropped, redirections dropped, the
    commands inside ``$(...)`` and ``bash -c '...'`` included. A line shlex cannot split (an output
    line) holds none."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line, inner = _substitutions(line)
        for sub in inner:
            out += simple_commands(sub)
        # a subshell's parentheses count as words (``( cd runs && pflx show p )``), so that prose such as
        # ``Setup (recipes/x.py does all of it)`` splits no command out of a parenthesis
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lex.whitespace_split, lex.commenters = True, "#"
        try:
            words = list(lex)
        except ValueError:
            continue
        cur: list[str] = []
        skip = False
        for w in [*words, ";"]:
            if skip:
                skip = False
                continue
            if set(w) <= set("<>&") and ("<" in w or ">" in w):  # a redirection and its target
                if cur and cur[-1].isdigit():
                    cur.pop()
                skip = True
                continue
            if set(w) <= set(";&|"):
                while cur and cur[-1] in (")", "}"):  # the end of a subshell or group
                    cur.pop()
                argv = program(cur)
                if argv[:1] and argv[0] in ("bash", "sh") and argv[1:2] == ["-c"] and len(argv) > 2:
                    out += simple_commands(argv[2])
                elif argv:
                    out.append(argv)
                cur = []
            else:
                cur.append(w)
    return out


def command_lines(b: Block) -> list[list[str]]:
    """The simple commands a block shows (:func:`simple_commands` of its shell code)."""
    return simple_commands(shell_code(b))


VENV_BIN = re.compile(r"^(\./)?\.venv[^/]*/bin/")


def is_pflx_command(argv: list[str]) -> bool:
    """pflx's own commands: pflx, make, python -m pfl_cli, a script of benchmarks/ or recipes/ (run by any python,
    python3 or python3.X, or by bash), from any virtual environment's bin/."""
    name = VENV_BIN.sub("", argv[0])
    if name in ("pflx", "make") or re.match(r"(\./)?(benchmarks|recipes)/\S+\.(py|sh)$", name):
        return True
    if re.fullmatch(r"python(3(\.\d+)?)?", name):
        rest = argv[1:]
        return rest[:2] == ["-m", "pfl_cli"] or bool(rest) and bool(re.match(r"(\./)?(benchmarks|recipes)/", rest[0]))
    return False


def holds_command(b: Block) -> bool:
    return b.syntax != "python" and any(is_pflx_command(c) for c in command_lines(b))


def unaccounted(page: str, run: bool) -> list[str]:
    """The page's blocks that hold a pflx command and are neither run (``run``: the page's blocks are executed,
    and the block's info string is one a run executes) nor marked parse-only with a reason (over 10
    characters): each as page:line, its info string and its first such command."""
    out = []
    for b in fences(page):
        if not holds_command(b):
            continue
        if b.mark == "docs_parse_only" and len(b.why or "") > 10:
            continue
        if run and b.syntax in RUN and b.mark != "docs_parse_only":
            continue
        first = next(c for c in command_lines(b) if is_pflx_command(c))
        out.append(f"{b.where} [{b.syntax or 'untagged'}{', ' + b.mark if b.mark else ''}] {shlex.join(first)[:80]}")
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


# Run a script's own argparse parser on the arguments as written, and stop before the script does anything.
_PARSE_ARGS = """
import argparse, runpy, sys
class Parsed(Exception):
    pass
def parse_args(self, args=None, namespace=None):
    namespace, extra = self.parse_known_args(args, namespace)
    if extra:
        self.error("unrecognized arguments: " + " ".join(extra))
    raise Parsed
argparse.ArgumentParser.parse_args = parse_args
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except Parsed:
    sys.exit(0)
sys.exit(sys.argv[0] + " has no argparse parser: its arguments cannot be checked without running it")
"""


def check_parses(argv: list[str], cwd: Path) -> str | None:
    """None when the command would be accepted as written, else why not (see the module's docstring)."""
    argv = program(argv)
    argv = [VENV_BIN.sub(f"{BIN}/", argv[0]), *argv[1:]]
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
    if re.fullmatch(r"(.*/)?python(3(\.\d+)?)?", name) and argv[1:2] == ["-c"]:
        try:
            compile(argv[2], "python -c", "exec")
        except SyntaxError as e:
            return f"python -c: {e}"
        return None
    if re.fullmatch(r"(.*/)?python(3(\.\d+)?)?", name) and len(argv) > 1 and argv[1].endswith(".py"):
        r = subprocess.run([sys.executable, "-c", _PARSE_ARGS, *argv[1:]], cwd=cwd, env=env(),
                           capture_output=True, text=True, timeout=120)
        return None if r.returncode == 0 else f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[-800:]}"
    r = subprocess.run([*argv, "--help"], cwd=cwd, env=env(), capture_output=True, text=True, timeout=120)
    return None if r.returncode == 0 else f"{' '.join(argv)} --help: exit {r.returncode}: {r.stderr.strip()[-800:]}"


def parse_block(b: Block, cwd: Path) -> list[str]:
    """A parse-only block's commands checked to parse: why each that does not, as page:line: why."""
    cmds = command_lines(b)
    if not cmds:
        return [f"{b.where}: a parse-only block with no command"]
    return [f"{b.where}: {why}" for why in (check_parses(argv, cwd) for argv in cmds) if why is not None]


def run_page(page: str, cwd: Path, extra_env: dict | None = None) -> list[tuple[Block, str]]:
    """Run every block of the page in order in ``cwd``; returns (block, stdout). Raises AssertionError naming
    the block (page:line), the command as run and the end of its output."""
    found = blocks(page)
    assert found, f"{page} has no shell or python block"
    outputs, python = [], []
    for b in found:
        size = (lambda c: c) if page in FULL_SIZE else smoke
        if b.syntax == "python":
            code = size(b.code)
            python.append(code)
            r = run_python("\n".join(python), cwd, extra_env=extra_env)
            assert r.returncode == 0, (b.where, code, r.stderr[-3000:])
        elif b.mark == "docs_parse_only":
            failed = parse_block(b, cwd)
            assert not failed, failed
            outputs.append((b, ""))
            continue
        else:
            code = size(shell_code(b))
            r = run_shell(code, cwd, extra_env=extra_env)
            if b.mark == "docs_refusal":
                assert r.returncode == 2 and b.why in r.stderr, (b.where, code, r.returncode, r.stderr[-3000:])
            else:
                assert r.returncode == 0, (b.where, code, r.stdout[-2000:], r.stderr[-3000:])
            if b.syntax == "console":  # what the page shows the command printing, it prints
                missing = [ln for ln in shown_output(b) if ln.strip() not in r.stdout + r.stderr]
                assert not missing, (b.where, "shown but not printed", missing, r.stdout[-2000:], r.stderr[-2000:])
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
