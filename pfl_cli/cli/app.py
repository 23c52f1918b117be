"""The `pflx` root command and the one error boundary of the tool."""

from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings
from typing import Annotated, Optional, Sequence

import typer

from pfl_cli import __version__
from pfl_cli.cli import _click
from pfl_cli.errors import EXIT_RUNTIME, EXIT_USAGE, PflxError, PflxWarning

app = typer.Typer(
    name="pflx",
    help="Personalized federated learning from the command line: partition, fit, simulate, train, predict, "
    "cluster, account for privacy and attack uploads, with stages that chain through artifact directories.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
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
    from pfl_cli.cli import attack

    app.command("partition", no_args_is_help=True)(partition.partition)
    app.command("privacy-account", no_args_is_help=True)(privacy_account.privacy_account)
    app.command("cluster", no_args_is_help=True)(cluster.cluster)
    app.command("mdm-fit", no_args_is_help=True)(mdm_fit.mdm_fit)
    app.command("simulate", no_args_is_help=True)(simulate.simulate)
    app.command("train", no_args_is_help=True)(train.train)
    app.command("predict", no_args_is_help=True)(predict.predict)
    app.command("attack", no_args_is_help=True)(attack.attack_command)


_register()


def _error(message: str) -> None:
    sys.stderr.write(f"pflx: error: {' '.join(str(message).split())}\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run pflx; return the exit code (0 ok, 1 run-time failure, 2 bad usage or input)."""
    args = list(sys.argv[1:] if argv is None else argv)
    # dp_accounting logs, through absl, every RDP order it drops as unstable; dropping an order only
    # loosens the bound, so the result stays valid and one line per order would bury the answer.
    logging.getLogger("absl").setLevel(logging.ERROR)
    debug = os.environ.get("PFLX_DEBUG", "") not in ("", "0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PflxWarning)
        try:
            result = app(args=args, prog_name="pflx", standalone_mode=False)
            code = result if isinstance(result, int) else 0
        except _click.NoArgsIsHelpError as err:  # bare `pflx partition`: help, not an error
            typer.echo(err.ctx.get_help() if err.ctx else "")
            code = 0
        except _click.UsageError as err:
            where = f" ({err.ctx.command_path} -h for help)" if err.ctx else ""
            _error(f"{err.format_message()}{where}")
            code = EXIT_USAGE
        except _click.Exit as err:
            code = err.exit_code
        except _click.Abort:
            _error("aborted.")
            code = EXIT_RUNTIME
        except PflxError as err:
            if debug:
                traceback.print_exc()
            _error(str(err))
            code = err.exit_code
        except KeyboardInterrupt:
            _error("interrupted; no artifact was written.")
            code = 130
        except Exception as err:  # a bug in pflx: still one line unless debugging
            if debug:
                raise
            _error(f"internal error: {type(err).__name__}: {err} (rerun with PFLX_DEBUG=1 for a traceback)")
            code = EXIT_RUNTIME
    for w in caught:
        if issubclass(w.category, PflxWarning):
            sys.stderr.write(f"pflx: warning: {w.message}\n")
    return code


def run() -> None:  # pragma: no cover - console-script shim
    raise SystemExit(main())
