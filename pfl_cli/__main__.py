"""`python -m pfl_cli` is the same as `pflx`."""

import sys

from pfl_cli.cli.interrupt import finish


def run() -> None:
    """pflx as a process: Ctrl-C while it starts is its one line and exit 130 too (the command modules are
    imported before the error boundary of :func:`pfl_cli.cli.app.main` exists)."""
    try:
        from pfl_cli.cli.app import main
    except KeyboardInterrupt:
        sys.stderr.write("pflx: error: interrupted; nothing was written to --out.\n")
        finish(130)
    finish(main())


if __name__ == "__main__":
    run()
