import subprocess
import sys

from pfl_cli import __version__


def test_version_and_help(cli):
    assert cli("-V").out.strip() == f"pflx {__version__}"
    assert cli("--version").code == 0
    res = cli("-h")
    assert res.code == 0 and "partition" in res.out
    assert "Split a dataset" in cli("partition", "-h").out


def test_no_args_prints_help(cli):
    res = cli()
    assert res.code == 0 and "Usage: pflx" in res.out


def test_usage_errors_are_one_line_exit_2(cli):
    import re

    # typer < 0.21 (the flower extra's flwr pins it) words the unknown option "No such option '--bogus'".
    for args, text in [(["nosuch"], "No such command 'nosuch'"), (["partition", "--bogus"], r"No such option:? '?--bogus")]:
        res = cli(*args)
        assert res.code == 2 and res.err.count("\n") == 1 and re.search(text, res.err) and res.err.startswith("pflx: error:")


def test_a_mistyped_command_is_suggested_once(cli):
    res = cli("trian")
    assert res.code == 2 and res.err.count("Did you mean 'train'?") == 1, res.err


def test_help_shows_brackets_and_bars_without_backslashes(cli):
    # typer escapes "[default: 10]" for rich markup even though pflx renders no markup (issue 34, item 11)
    from pfl_cli.cli.app import _subcommand_names

    names = [[n] for n in sorted(_subcommand_names() - {"flower"})] + [["flower", "app"]]
    for name in names:
        res = cli(*name, "-h")
        assert res.code == 0 and "\\" not in res.out, (name, [ln for ln in res.out.splitlines() if "\\" in ln])
    text = cli("train", "-h").out
    assert "[required]" in text and "[default: human]" in text and "[human|json|quiet]" in text


def test_python_dash_m_entry_points():
    for module in ("pfl_cli", "pfl_cli.cli.app"):  # both run pflx, not just import it
        proc = subprocess.run([sys.executable, "-m", module, "-V"], capture_output=True, text=True, check=True)
        assert proc.stdout.strip() == f"pflx {__version__}"
        bad = subprocess.run([sys.executable, "-m", module, "nosuch"], capture_output=True, text=True)
        assert bad.returncode == 2 and "No such command 'nosuch'" in bad.stderr


def test_core_packages_never_import_the_cli_layer():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "pfl_cli"
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "cli" not in p.relative_to(root).parts[:1] and p.name != "__main__.py"
        and any(f"import {m}" in p.read_text() or f"from {m}" in p.read_text() for m in ("typer", "rich", "pfl_cli.cli"))
    ]
    assert offenders == []
