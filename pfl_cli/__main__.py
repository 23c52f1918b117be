"""`python -m pfl_cli` is the same as `pflx`."""

from pfl_cli.cli.app import main

if __name__ == "__main__":
    raise SystemExit(main())
