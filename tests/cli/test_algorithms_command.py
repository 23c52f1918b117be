"""`pflx algorithms`: the list, one algorithm's keys, markdown, and docs/algorithms/reference.md generated from it."""

import json
import pathlib

from pfl_cli import registry
from pfl_cli.cli.algorithms import reference_markdown

REFERENCE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "algorithms" / "reference.md"


def test_the_committed_reference_is_the_generated_one():
    assert REFERENCE.read_text() == reference_markdown(), (
        "regenerate: pflx algorithms --all --format markdown > docs/algorithms/reference.md")


def test_the_committed_key_owners_table_is_the_generated_one():
    """An unknown key's refusal names its owners from this table, not by loading every algorithm (issue 49)."""
    path = REFERENCE.parents[2] / "pfl_cli" / "algorithms" / "key_owners.py"
    assert path.read_text() == registry.key_owners_source(), (
        "regenerate: python -c \"from pfl_cli.registry import key_owners_source as s; print(s(), end='')\" > "
        "pfl_cli/algorithms/key_owners.py")


def test_one_line_per_algorithm(cli):
    rows = json.loads(cli("algorithms", "--format", "json").out)["algorithms"]
    assert [r["algorithm"] for r in rows] == list(registry.names())
    by_name = {r["algorithm"]: r for r in rows}
    assert by_name["fedavg"]["dp"] == "client-level" and by_name["fedrep"]["dp"] == "none"
    assert by_name["ppsgd"]["dp"] == "example-level (required)"
    assert by_name["flowdup"]["unlabeled_clients"] == "yes" and by_name["local"]["unlabeled_clients"] == "no"
    assert "20 rounds" in by_name["pfedhn"]["new_clients"] or "embed_rounds" in by_name["pfedhn"]["new_clients"]
    assert all(r["paper"] and r["new_clients"] for r in rows)


def test_one_algorithm_lists_its_keys_defaults_and_sources(cli):
    doc = json.loads(cli("algorithms", "hyperfl", "--format", "json").out)
    keys = {r["key"]: r for r in doc["keys"]}
    assert list(keys) == registry.get("hyperfl").keys and "hyper_size" not in keys
    assert keys["momentum"]["default"] == 0.5 and "App. D.1" in keys["momentum"]["source"]
    assert keys["seed"]["source"] == "pflx"
    md = cli("algorithms", "pfedhn", "--format", "markdown").out
    assert md.startswith("### pfedhn") and "| `server_lr` | `0.01` | pFedHN official code: outer lr 1e-2" in md
    human = cli("algorithms", "pefll").out
    assert "lambda_h" in human and "thesis App. B.1.2" in human


def test_an_unknown_algorithm_is_refused(cli):
    run = cli("algorithms", "hyperlf")
    assert run.code == 2 and "did you mean 'hyperfl'" in run.err and run.err.count("\n") == 1
