"""Damaged *content* for every artifact file kind, the manifest's hashes recomputed.

A flipped byte is caught by the sha256 check; these damages are what a careful forger, an
older tool or a hand edit produces: well-formed files (valid JSON, a loadable .npz, a
torch file of plain tensors) whose content breaks the artifact's rules. Each strategy draws a
function ``edit(artifact_dir)`` that damages one file in place and re-hashes it.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from pfl_cli.artifacts import save_npz, sha256_file

# Values of the wrong type or range for any field.
JUNK = [None, "x", "", -1, 0, 1.5, -0.5, 10**30, True, [], [1, "a"], {}, {"a": 1}]


def rehash(artifact: Path, name: str) -> None:
    """Record ``name``'s current sha256 and size in ``artifact``'s manifest."""
    manifest = json.loads((artifact / "manifest.json").read_text())
    for out in manifest["outputs"]:
        if out["path"] == name:
            out["sha256"], out["bytes"] = sha256_file(artifact / name), (artifact / name).stat().st_size
    (artifact / "manifest.json").write_text(json.dumps(manifest))


def write_json(artifact: Path, name: str, doc) -> None:
    (artifact / name).write_text(json.dumps(doc))
    rehash(artifact, name)


def _paths(doc, prefix=()):
    """Every key path of a JSON document (objects and list items), shallow first."""
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        yield (*prefix, key)
        yield from _paths(value, (*prefix, key))


def _at(doc, path):
    for key in path:
        doc = doc[key]
    return doc


@st.composite
def json_edits(draw, name: str):
    """Delete a field, give it a junk value, or replace the whole document of ``name``."""
    how = draw(st.sampled_from(["set", "set", "delete", "whole"]))
    pick = draw(st.floats(0, 1, exclude_max=True))
    junk = draw(st.sampled_from(JUNK + [[], "garbage", 3]))

    def edit(artifact: Path) -> None:
        doc = json.loads((artifact / name).read_text())
        paths = list(_paths(doc))
        if how == "whole" or not paths:
            write_json(artifact, name, junk)
            return
        path = paths[int(pick * min(len(paths), 40))]  # the first 40 paths: the top-level fields and their parts
        parent = _at(doc, path[:-1])
        if how == "delete":
            del parent[path[-1]]
        else:
            parent[path[-1]] = junk
        write_json(artifact, name, doc)

    return edit


ARRAY_DAMAGES = ["float", "string", "drop", "shape", "negative", "huge", "shuffle", "duplicate", "empty"]


@st.composite
def npz_edits(draw, name: str = "clients.npz"):
    """Change one array of ``name``: its dtype, shape, values or presence."""
    how = draw(st.sampled_from(ARRAY_DAMAGES))
    pick = draw(st.floats(0, 1, exclude_max=True))

    def edit(artifact: Path) -> None:
        with np.load(artifact / name, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        key = sorted(arrays)[int(pick * len(arrays))]
        a = arrays[key]
        if how == "float":
            arrays[key] = a.astype(np.float64) + 0.5
        elif how == "string":
            arrays[key] = a.astype(str)
        elif how == "drop":
            del arrays[key]
        elif how == "shape":
            arrays[key] = np.stack([a, a]) if a.ndim == 1 else a.ravel()
        elif how == "negative":
            arrays[key] = -np.abs(a.astype(np.int64)) - 1
        elif how == "huge":
            arrays[key] = a.astype(np.int64) + 10**12
        elif how == "shuffle":
            arrays[key] = a[::-1].copy()
        elif how == "duplicate":
            arrays[key] = np.concatenate([a, a[:1]])
        else:
            arrays[key] = a[:0]
        save_npz(artifact / name, **arrays)
        rehash(artifact, name)

    return edit


def _torch_junk(kind: str):
    import torch

    return {"tensor": torch.zeros(3), "list": [torch.zeros(2)], "empty": {}, "string": "model",
            "int": 7}[kind]


@st.composite
def torch_edits(draw, name: str = "model.pt"):
    """Replace ``name`` by another torch payload, or break one field of its dict."""
    how = draw(st.sampled_from(["whole", "delete", "set", "set", "leaf"]))
    whole = draw(st.sampled_from(["tensor", "list", "empty", "string", "int"]))
    leaf = draw(leaf_edits())
    pick = draw(st.floats(0, 1, exclude_max=True))
    junk = draw(st.sampled_from(["x", 3, None, "tensor", "float-classes", "negative-std"]))

    def edit(artifact: Path) -> None:
        import torch

        path = artifact / name
        if how == "whole":
            payload = _torch_junk(whole)
        elif how == "leaf":
            payload = torch.load(path, weights_only=True, map_location="cpu")
            leaf(payload["weights"])
        else:
            payload = torch.load(path, weights_only=True, map_location="cpu")
            key = sorted(payload)[int(pick * len(payload))]
            if how == "delete":
                del payload[key]
            elif junk == "tensor":
                payload[key] = torch.zeros(2)
            elif junk == "float-classes":
                payload["num_classes"] = torch.tensor(2.5)
            elif junk == "negative-std":
                payload["normalization"] = {"mean": torch.zeros(64), "std": -torch.ones(64)}
            else:
                payload[key] = junk
        buf = io.BytesIO()
        torch.save(payload, buf)
        path.write_bytes(buf.getvalue())
        rehash(artifact, name)

    return edit


def _leaves(tree, prefix=()):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*prefix, key))
        else:
            yield (*prefix, key)


@st.composite
def leaf_edits(draw):
    """Damage one tensor of a nested state tree: drop it, change its shape, or empty the tree."""
    how = draw(st.sampled_from(["drop", "reshape", "empty", "rename"]))
    pick = draw(st.floats(0, 1, exclude_max=True))

    def edit(tree: dict) -> None:
        import torch

        leaves = list(_leaves(tree))
        if how == "empty" or not leaves:
            tree.clear()
            return
        path = leaves[int(pick * len(leaves))]
        parent = _at(tree, path[:-1])
        if how == "drop":
            del parent[path[-1]]
        elif how == "rename":
            parent["renamed_" + str(path[-1])] = parent.pop(path[-1])
        else:
            parent[path[-1]] = torch.zeros(3, 1, 2)

    return edit


@st.composite
def checkpoint_edits(draw):
    """Damage a train checkpoint folder: its location's kind, or its content re-sealed with its fingerprint."""
    how = draw(st.sampled_from(["folder-file", "state-dir", "field", "field", "leaf", "leaf"]))
    pick = draw(st.floats(0, 1, exclude_max=True))
    junk = draw(st.sampled_from(JUNK))
    leaf = draw(leaf_edits())

    def edit(folder: Path) -> None:
        import shutil

        import torch

        from pfl_cli.fl.checkpoint import seal_checkpoint, torch_bytes

        state_file = folder / "state.pt"
        if how == "folder-file":
            shutil.rmtree(folder)
            folder.write_text("not a folder")
            return
        if how == "state-dir":
            state_file.unlink()
            state_file.mkdir()
            return
        state = torch.load(state_file, weights_only=True, map_location="cpu")
        fp = state.pop("fingerprint")
        state.pop("sha256")
        if how == "leaf":
            leaf(state["algorithm"])
        else:
            key = sorted(state)[int(pick * len(state))]
            state[key] = junk
        state_file.write_bytes(torch_bytes(seal_checkpoint(state, fp)))  # a valid seal: the content is checked

    return edit


MANIFEST_DAMAGES = [
    ("outputs", [{"sha256": "0" * 64}]), ("outputs", ["clients.npz"]), ("outputs", None), ("outputs", "x"),
    ("outputs", [{"path": 3, "sha256": "0" * 64}]), ("outputs", [{"path": "../x", "sha256": "0" * 64}]),
    ("inputs", "x"), ("inputs", [None]), ("config", []), ("config", "x"), ("seed", "a"), ("stage", 5),
    ("stage", None), ("schema", "1"), ("tool", None),
    # The config says one thing, the files another (the manifest's config is not hashed).
    ("config.num_clients", 99), ("config.dataset", "ring:"), ("config.algorithm", "fedavg"),
]


@st.composite
def manifest_edits(draw):
    """One field of ``manifest.json`` replaced by a value of the wrong shape (nothing to re-hash)."""
    key, value = draw(st.sampled_from(MANIFEST_DAMAGES))

    def edit(artifact: Path) -> None:
        manifest = json.loads((artifact / "manifest.json").read_text())
        if key.startswith("config."):
            manifest["config"][key.split(".", 1)[1]] = value
        else:
            manifest[key] = value
        (artifact / "manifest.json").write_text(json.dumps(manifest))

    return edit
