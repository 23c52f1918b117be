"""The layers of pfl_cli hold: no import cycle, readers below the writer, the engine above the readers only.

The artifact layers, bottom up: ``pfl_cli.formats`` (file formats, digests) < ``pfl_cli.manifest``
(the contract: schema, stage names, checks) < ``pfl_cli.readers`` < ``pfl_cli.artifacts`` (the
writer and the ``--out`` locks). The engine (``pfl_cli.fl``) reads artifacts through the readers
and writes none. Imports are read from the source (``tests/import_graph.py``); function-level
imports count, since they run whenever the function does.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from import_graph import cycles, graph, imports

WRITER = "pfl_cli.artifacts"
READERS = "pfl_cli.readers"
ENGINE = "pfl_cli.fl"
# A cycle that predates the layering rules, through function-level imports only: models.client's
# net factory imports the LSTM and the batch-norm nets, which import client's helpers at top level.
KNOWN_CYCLES = [{"pfl_cli.models.client", "pfl_cli.models.normalized", "pfl_cli.models.sequence"}]


@pytest.fixture(scope="module")
def parsed():
    return imports()


@pytest.fixture(scope="module")
def edges(parsed):
    return graph(("top", "function"), parsed=parsed)


def reachable(edges, start: str) -> dict[str, str]:
    """Every module ``start`` loads, directly or not: module -> the module that imports it on the way."""
    via, todo = {}, [start]
    while todo:
        here = todo.pop()
        for there in sorted(edges[here]):
            if there not in via and there != start:
                via[there] = here
                todo.append(there)
    return via


def chain(via: dict[str, str], start: str, end: str) -> str:
    path = [end]
    while path[-1] != start:
        path.append(via[path[-1]])
    return " -> ".join(reversed(path))


def inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_top_level_imports_have_no_cycle(parsed):
    assert cycles(graph(("top",), parsed=parsed)) == []


def test_no_import_cycle_but_the_known_one(edges):
    found = cycles(edges)
    assert [c for c in found if set(c) not in KNOWN_CYCLES] == []
    layered = ("pfl_cli.formats", "pfl_cli.manifest", READERS, WRITER, ENGINE)
    assert not [c for c in found if any(inside(m, p) for m in c for p in layered)]


@pytest.mark.parametrize("layer, forbidden", [
    ("pfl_cli.formats", ("pfl_cli.manifest", READERS, WRITER, ENGINE, "pfl_cli.cli")),
    ("pfl_cli.manifest", (READERS, WRITER, ENGINE, "pfl_cli.cli")),
    (READERS, (WRITER, ENGINE, "pfl_cli.cli", "pfl_cli.algorithms")),
    (ENGINE, (WRITER, "pfl_cli.cli")),
    # The study logic (trials, stacks, workers, the private study) is core: the command writes and prints.
    ("pfl_cli.tune", ("pfl_cli.cli",)),
    # The train stage's core (checks, checkpoints, the artifact, the DP artifact, the metrics, the stacks) is core
    # too (issue 49): the command parses, calls it and prints.
    ("pfl_cli.train", ("pfl_cli.cli",)),
    # The rules a Python user must meet as the CLI does (issue 49): no sample scored twice, and what a study's
    # best config carries into a run (its ledger, the non-private refusal) are core, the commands call them.
    ("pfl_cli.overlap", ("pfl_cli.cli", WRITER)),
    ("pfl_cli.privacy", ("pfl_cli.cli", WRITER)),
])
def test_each_layer_imports_only_below_it(edges, layer, forbidden):
    """Every module of ``layer`` -- directly, through another module, or in a function -- loads none of ``forbidden``."""
    members = sorted(m for m in edges if inside(m, layer))
    assert members, f"no module {layer}"
    bad = []
    for module in members:
        via = reachable(edges, module)
        bad += [chain(via, module, m) for m in sorted(via) if any(inside(m, f) for f in forbidden)]
    assert bad == []


def test_the_overlap_rule_and_the_study_composition_stay_in_the_core(parsed, edges):
    """The commands call the rules; none defines them again (issue 49: they lived in cli/unseen.py and
    cli/privacy_account.py, where a Python user bypassed them)."""
    import pfl_cli.overlap as overlap
    import pfl_cli.privacy.study as study

    assert "pfl_cli.cli.unseen" not in edges
    for name in ("check_unseen", "check_unseen_samples", "partition_input", "SCORING_STAGES"):
        assert hasattr(overlap, name)
    for name in ("study_prior", "read_provenance", "same_partition"):
        assert hasattr(study, name)
    from import_graph import defined_functions

    in_cli = {f for m, fs in defined_functions().items() if m.startswith("pfl_cli.cli") for f in fs}
    assert not in_cli & {"study_prior", "check_unseen_samples", "same_partition", "_same_partition",
                         "partition_recipe", "read_provenance"}


# What the train command did itself before its core moved to pfl_cli.train (issue 49): none of it in cli/ again.
TRAIN_CORE = {"_run_train", "write_train_files", "write_dp_artifact", "train_metrics", "client_rows",
              "has_global_model", "with_model_files", "portable_model", "check_seeds", "_continue", "_resume",
              "_warn_clamped", "_diverged_message", "_kept_note", "clean"}


def test_the_train_core_stays_in_the_core():
    """The train command's module defines printing and its reporter's answers; the core defines the run."""
    from import_graph import defined_functions

    defined = defined_functions()
    in_core = {f for m, fs in defined.items() if m.startswith("pfl_cli.train.") for f in fs}
    assert TRAIN_CORE <= in_core
    in_cli = {f for m, fs in defined.items() if m.startswith("pfl_cli.cli") for f in fs}
    assert not in_cli & TRAIN_CORE
    # the command's run_train / run_train_seeds / train_stack call the core's (each one line of work)
    import ast
    from pathlib import Path

    import pfl_cli.cli.train_run as command

    tree = ast.parse(Path(command.__file__).read_text())
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in
               ("run_train", "run_train_seeds", "train_stack")):
        imported = {a.name for n in ast.walk(fn) if isinstance(n, ast.ImportFrom) and n.module.startswith(
            "pfl_cli.train.") for a in n.names}
        assert fn.name in imported, fn.name


def test_the_bottom_layers_import_what_they_say(edges):
    assert edges["pfl_cli.formats"] == {"pfl_cli.errors"}
    assert edges["pfl_cli.manifest"] == {"pfl_cli.errors", "pfl_cli.formats"}
    # The writer stands on all three.
    assert {"pfl_cli.formats", "pfl_cli.manifest", READERS} <= edges[WRITER]


def test_importing_the_readers_and_the_engine_loads_no_writer():
    """At run time too: nothing the readers or the round loop import pulls in the writer or the commands."""
    code = textwrap.dedent("""
        import sys
        import pfl_cli.readers, pfl_cli.readers.model, pfl_cli.fl.api, pfl_cli.fl.checkpoint, pfl_cli.fl.loop
        print(sorted(m for m in sys.modules if m == "pfl_cli.artifacts" or m.startswith("pfl_cli.cli")))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_graph_sees_a_cycle_through_a_function_and_a_package(tmp_path):
    """The checker itself: a cycle closed by a function-level import into a package's __init__ is found."""
    pkg = tmp_path / "pfl_cli"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("from pfl_cli.low.leaf import f\n")
    (pkg / "low" / "leaf.py").write_text("def f():\n    from pfl_cli.high import g\n")
    (pkg / "high.py").write_text("from pfl_cli.low import leaf\n\ndef g():\n    pass\n")
    (pkg / "typed.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pfl_cli import high\n")
    assert cycles(graph(("top",), root=tmp_path)) == []
    found = cycles(graph(("top", "function"), root=tmp_path))
    assert found == [["pfl_cli.high", "pfl_cli.low", "pfl_cli.low.leaf"]]
    assert graph(("top", "function"), root=tmp_path)["pfl_cli.typed"] == set()
    assert graph(("typing",), root=tmp_path)["pfl_cli.typed"] == {"pfl_cli.high"}
