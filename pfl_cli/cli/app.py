"""The `pflx` root command and the one error boundary of the tool."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import traceback
import warnings
from typing import Annotated, Optional, Sequence

import typer

from pfl_cli import __version__
from pfl_cli.cli import _click, interrupt
from pfl_cli.cli.launch import INVOCATION  # the arguments of the running invocation (train --nproc relaunches them)
from pfl_cli.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, EXIT_USAGE, PflxError, PflxWarning

_TYPER_SUGGESTS = "suggest_commands" in typer.Typer.__init__.__code__.co_varnames  # typer >= 0.16

app = typer.Typer(
    name="pflx",
    help="Personalized federated learning from the command line: partition, fit, simulate, train, predict, "
    "cluster, account for privacy and attack uploads, with stages that chain through artifact directories.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    # one "Did you mean ...?" for a mistyped command: click's when it makes one, else typer's
    **({"suggest_commands": False} if _click.CLICK_SUGGESTS_COMMANDS and _TYPER_SUGGESTS else {}),
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"pflx {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", "-V", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Personalized federated learning from the command line."""


def _register() -> None:
    # One thin module per command; each module imports its core lazily so `pflx -h` stays fast.
    from pfl_cli.cli import partition
    from pfl_cli.cli import privacy_account
    from pfl_cli.cli import cluster
    from pfl_cli.cli import mdm_fit
    from pfl_cli.cli import simulate
    from pfl_cli.cli import train
    from pfl_cli.cli import predict
    from pfl_cli.cli import show
    from pfl_cli.cli import attack
    from pfl_cli.cli import flower
    from pfl_cli.cli import algorithms
    from pfl_cli.cli import tune
    from pfl_cli.cli import compare

    for name, command in (("partition", partition.partition),
                          ("privacy-account", privacy_account.privacy_account),
                          ("cluster", cluster.cluster),
                          ("mdm-fit", mdm_fit.mdm_fit),
                          ("simulate", simulate.simulate),
                          ("train", train.train),
                          ("tune", tune.tune),
                          ("predict", predict.predict),
                          ("show", show.show),
                          ("attack", attack.attack_command),
                          ("compare", compare.compare_command)):
        app.command(name, no_args_is_help=True, short_help=_first_sentence(command))(command)
    app.add_typer(flower.flower_app, name="flower", short_help=_first_sentence(flower.flower_app.info.help))
    app.command("algorithms", short_help=_first_sentence(algorithms.algorithms))(algorithms.algorithms)


def _first_sentence(command) -> str:
    """The docstring's first sentence, whole: `pflx -h` would otherwise cut it at 45 characters with "..."."""
    import inspect

    text = command if isinstance(command, str) else inspect.getdoc(command)  # a docstring, or a group's help
    paragraph = " ".join(text.split("\n\n")[0].split())
    return paragraph.split(". ")[0].rstrip(".") + "."


_register()




def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def _set_wait(ctx, param, value) -> None:
    from pfl_cli.artifacts import set_wait

    set_wait(bool(value))


def _wait_option():
    """A ``--wait`` option built by typer itself, to add to every command that writes ``--out``."""
    helper = typer.Typer()

    @helper.command()
    def _cmd(wait: Annotated[bool, typer.Option(
        "--wait", help="When another pflx process is writing --out, wait for it to finish instead of failing.",
    )] = False) -> None:  # pragma: no cover - never run
        pass

    option = typer.main.get_command(helper).params[0]
    option.expose_value, option.callback = False, _set_wait
    return option


def _typed_flag(param) -> None:
    """Make a flag's parse error the stage schema's message, the same as through a config file or --set.

    Typer parses the flag's text first (``--rounds abc``); when it refuses, the text is read as
    ``--set`` reads it and typed by the stage's schema (:mod:`pfl_cli.schema`), which raises its
    own error, so ``--rounds abc``, ``rounds: abc`` and ``--set rounds=abc`` all read alike.
    """
    original = param.process_value

    def process_value(ctx, value):
        try:
            return original(ctx, value)
        except _click.exceptions.BadParameter:
            from pfl_cli.config import stage_config_class
            from pfl_cli.schema import coerce_field

            cls = stage_config_class(ctx.command.name)
            texts = value if isinstance(value, (list, tuple)) else [value]
            if cls is not None and all(isinstance(t, str) for t in texts):
                for text in texts:  # read as --set reads it, then typed: raises the schema's ConfigError
                    coerce_field(cls, param.name, _as_set_value(text))
            raise

    param.process_value = process_value


def _as_set_value(text: str):
    from pfl_cli import yaml12

    try:
        return yaml12.loads(text) if text.strip() else ""
    except Exception:  # noqa: BLE001 - text that is not YAML stays text
        return text


_COMMANDS: dict = {}


def _command(only: str | None = None):
    """The click command tree of `pflx`, with the parts every command shares added in one place.

    ``only``: a tree holding just that subcommand, which is what running it needs: typer builds a
    command by reading every option's annotations, and the whole tree costs ~45 ms of CPU, half
    of `import numpy`. Built once per process and name: the tree holds no state of a run (``--wait``
    is reset by :func:`main`).
    """
    from pfl_cli.cli.options import COMMAND_PARAMS

    if only in _COMMANDS:
        return _COMMANDS[only]
    command = typer.main.get_command(app if only is None else _app_of(only))
    _plain_help_records(command)
    wait = _wait_option()
    for sub in getattr(command, "commands", {}).values():
        names = {p.name for p in sub.params}
        for param in sub.params:
            if param.name not in COMMAND_PARAMS and param.param_type_name == "option":
                _typed_flag(param)
        if "out" in names and "wait" not in names:
            sub.params.append(wait)
    _COMMANDS[only] = command
    return command


_RICH_ESCAPED_TAIL = re.compile(r"(^|  )\\(\[[^\[\]]*\])$")  # "  \[default: 10]" at the end of a help text


def _plain_help_records(command) -> None:
    """Help records without typer's rich escapes, for every parameter in the tree under ``command``.

    Whenever rich is installed, typer escapes the "[default: 10]" / "[required]" it appends to a
    parameter's help for rich markup, even with ``rich_markup_mode=None``, where nothing renders
    markup: `--help` and the docs' option tables would show "\\[default: 10]".
    """
    for param in command.params:
        original = param.get_help_record

        def get_help_record(ctx, _original=original):
            record = _original(ctx)
            if record is None:
                return None
            flags, text = record
            return flags, _RICH_ESCAPED_TAIL.sub(r"\1\2", text) if text else text

        param.get_help_record = get_help_record
    for sub in getattr(command, "commands", {}).values():
        _plain_help_records(sub)


# Commands that release under DP through a config or a spec rather than a --dp flag: what carries the DP keys.
DP_THROUGH = {
    "flower app": "its --config recipe's dp_* keys (the deployment's DP-FedAvg, client-level)",
    "compare --spec": "each algorithms entry's config / set with dp_epsilon (trained as pflx train --dp)",
}


def dp_entry_points() -> dict[str, str]:
    """Every way pflx releases under DP, for the suites generated over the DP stages (DESIGN.md section 7): each
    command or command of a group (``flower app``) with a ``--dp`` option, ``privacy-account`` (it composes
    ledgers), and the entries of :data:`DP_THROUGH` (a group's command or a spec entry that takes DP keys from a
    file). ``name -> how``."""
    import inspect

    def takes_dp(command) -> bool:
        return "dp" in inspect.signature(command.callback).parameters

    found = {}
    for command in app.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")
        if takes_dp(command) or name == "privacy-account":
            found[name] = "--dp" if name != "privacy-account" else "composes ledgers"
    for group in app.registered_groups:
        for command in group.typer_instance.registered_commands:
            name = f"{group.name} {command.name or command.callback.__name__.replace('_', '-')}"
            if takes_dp(command):
                found[name] = "--dp"
    found.update(DP_THROUGH)
    return found


def _subcommand_names() -> set[str]:
    return {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}


def _app_of(name: str) -> typer.Typer:
    """``app`` (its callback, help and settings) with only the subcommand ``name`` registered."""
    import copy

    one = copy.copy(app)
    one.registered_commands = [c for c in app.registered_commands if c.name == name]
    one.registered_groups = [g for g in app.registered_groups if g.name == name]
    return one


def _json_errors(args: Sequence[str]) -> bool:
    for i, arg in enumerate(args):
        if arg == "--format=json" or (arg == "--format" and i + 1 < len(args) and args[i + 1] == "json"):
            return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run pflx; return the exit code (0 ok, 1 run-time failure, 2 bad usage or input, 130 interrupted).

    An error is one line on stderr; with ``--format json`` it is also one JSON object on stdout,
    ``{"error": ..., "exit_code": ..., "stage": ...}``, so a ``jq`` pipeline sees why.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    INVOCATION[:] = args
    # dp_accounting logs, through absl, every RDP order it drops as unstable; dropping an order only
    # loosens the bound, so the result stays valid and one line per order would bury the answer.
    logging.getLogger("absl").setLevel(logging.ERROR)
    debug = os.environ.get("PFLX_DEBUG", "") not in ("", "0")
    stage = args[0] if args and args[0] in _subcommand_names() else None
    try:
        command = _command(stage)  # `pflx -h`, an unknown name, a root option: the whole tree
    except KeyboardInterrupt:  # Ctrl-C while the command is built (its options' types evaluated)
        interrupt.reset()
        _report_error(interrupt.message(), EXIT_INTERRUPTED, stage, as_json=_json_errors(args))
        return EXIT_INTERRUPTED
    error: str | None = None
    if "pfl_cli.artifacts" in sys.modules:  # an earlier in-process run may have set --wait
        sys.modules["pfl_cli.artifacts"].set_wait(False)
    interrupt.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PflxWarning)
        try:
            result = command(args=args, prog_name="pflx", standalone_mode=False)
            code = result if isinstance(result, int) else 0
            if code == EXIT_INTERRUPTED:  # typer turns KeyboardInterrupt into Exit(130), silently
                error = interrupt.message()
        except _click.NoArgsIsHelpError as err:  # bare `pflx partition`: help, not an error
            typer.echo(err.ctx.get_help() if err.ctx else "")
            code = 0
        except _click.UsageError as err:
            where = f" ({err.ctx.command_path} -h for help)" if err.ctx else ""
            error, code = f"{err.format_message()}{where}", EXIT_USAGE
        except _click.Exit as err:
            code = err.exit_code
        except _click.Abort:
            error, code = "aborted.", EXIT_RUNTIME
        except PflxError as err:
            if debug:
                traceback.print_exc()
            error, code = str(err), err.exit_code
        except KeyboardInterrupt:
            error, code = interrupt.message(), EXIT_INTERRUPTED
        except MemoryError:
            error, code = _OUT_OF_MEMORY.format(size="more memory than this machine has"), EXIT_RUNTIME
        except Exception as err:  # a bug in pflx: still one line unless debugging
            if debug:
                raise
            size = _allocation_size(err)  # torch's own out-of-memory errors are RuntimeErrors
            if size is not None:
                error = _OUT_OF_MEMORY.format(size=size)
            else:
                error = f"internal error: {type(err).__name__}: {err} (rerun with PFLX_DEBUG=1 for a traceback)"
            code = EXIT_RUNTIME
        finally:
            _release_locks()
    for w in caught if error is None else ():  # a failed run says one line: why it failed
        if issubclass(w.category, PflxWarning):
            sys.stderr.write(f"pflx: warning: {w.message}\n")
    if error is not None:
        _report_error(_one_line(error), code, stage, as_json=_json_errors(args))
    return code


_OUT_OF_MEMORY = ("out of memory: the run needed {size}; use smaller sizes (widths, clients, classes, bins, "
                  "batch size) or a machine with more memory.")


def _allocation_size(err: Exception) -> str | None:
    """For torch's failed allocations ("... tried to allocate N bytes"), the size in words."""
    import re

    text = str(err)
    if not isinstance(err, RuntimeError) or ("allocate" not in text or "memory" not in text.lower()):
        return None
    match = re.search(r"allocate ([0-9.]+) ?(bytes|[KMGT]i?B)", text)
    if match is None:
        return "more memory than this machine has"
    if match.group(2) == "bytes":
        from pfl_cli.errors import format_bytes

        return format_bytes(float(match.group(1))) + " for one array"
    return f"{match.group(1)} {match.group(2)} for one array"


def _release_locks() -> None:
    artifacts = sys.modules.get("pfl_cli.artifacts")
    if artifacts is not None:
        artifacts.release_all_outs()


def _report_error(message: str, code: int, stage: str | None, *, as_json: bool) -> None:
    sys.stderr.write(f"pflx: error: {message}\n")
    if as_json:
        sys.stdout.write(json.dumps({"error": message, "exit_code": code, "stage": stage}) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()


def run() -> None:  # pragma: no cover - console-script shim
    interrupt.finish(main())


if __name__ == "__main__":  # `python -m pfl_cli.cli.app` runs pflx like `python -m pfl_cli`
    raise SystemExit(main())
