"""Shared fixtures: run the real CLI in-process and capture what it prints."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@dataclass
class Run:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """``cli("partition", "--out", d)`` -> Run(code, stdout, stderr) through pflx's error boundary."""
    from pfl_cli.cli.app import main

    def run(*args) -> Run:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run
