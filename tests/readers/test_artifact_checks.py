"""Issue 25: every case of the bad-input run, one test each (docs/reference/artifact-checks.md).

Damaged files are re-hashed (``fuzz.damaged.rehash``), so each refusal comes from the content
check of the file's reader, not from the sha256 check. A refusal is one line on stderr naming
the file and the rule, exit 2, nothing written, the input untouched.
"""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

from fuzz.contract import snapshot
from fuzz.damaged import rehash, write_json

TINY = ["--set", "mlp_hidden=[8]", "--local-steps", "1"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A partition (8 clients, 2 holdout) and a 2-round fedavg model on it (small, attackable)."""
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("checks")
    assert main(["partition", "--num-clients", "8", "--classes-per-client", "3", "--holdout-clients", "2",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    assert main(["train", "--partition", str(root / "part"), "--algorithm", "fedavg", "--rounds", "2",
                 "--eval-every", "1", *TINY, "--out", str(root / "model"), "--format", "quiet"]) == 0
    assert main(["privacy-account", "-z", "1.1", "-q", "0.01", "--steps", "50", "--delta", "1e-5",
                 "--out", str(root / "ledger"), "--format", "quiet"]) == 0
    return root


@pytest.fixture
def copy(root, tmp_path):
    """``copy(name)``: a private copy of one of root's artifacts, to damage."""
    def make(name):
        shutil.copytree(root / name, tmp_path / name)
        return tmp_path / name
    return make


def refused(res, *needles, out=None):
    """Exit 2, one line on stderr holding every needle, and no --out."""
    lines = [line for line in res.err.splitlines() if line.strip()]
    assert res.code == 2 and len(lines) == 1 and lines[0].startswith("pflx: error: "), res.err
    for needle in needles:
        assert needle in res.err, (needle, res.err)
    if out is not None:
        assert not out.exists()
    return lines[0]


def _commands(root, part, model):
    return {
        "show": ["show", part],
        "mdm-fit": ["mdm-fit", "--partition", part, "--components", "2", "--rounds", "2"],
        "train": ["train", "--partition", part, "--algorithm", "fedavg", "--rounds", "1", *TINY],
        "predict": ["predict", "--model", model, "--partition", part],
        "attack": ["attack", "--model", model, "--partition", part, "--images", "1", "--iterations", "2"],
        "show-model": ["show", model],
    }


def _run(cli, cmd, tmp_path):
    out = tmp_path / "out"
    args = cmd if cmd[0] == "show" else [*cmd, "--out", out]
    return cli(*args), out


# ---------------------------------------------------------------------------- mishandled: manifest outputs
@pytest.mark.parametrize("outputs,rule", [
    ([{"sha256": "0" * 64}], "'outputs'[0].path must be a non-empty string; got None"),
    ("clients.npz", "'outputs' must be a list of objects; got str"),
    (None, "'outputs' must be a list of objects; got null"),
    (["stats.json"], "'outputs'[0] must be an object with path and sha256; got str"),
])
@pytest.mark.parametrize("command", ["show", "mdm-fit", "train"])
def test_a_malformed_manifest_outputs_list_is_refused(cli, root, copy, tmp_path, outputs, rule, command):
    part = copy("part")
    manifest = json.loads((part / "manifest.json").read_text())
    manifest["outputs"] = outputs
    (part / "manifest.json").write_text(json.dumps(manifest))
    before = snapshot(part)
    res, out = _run(cli, _commands(root, part, root / "model")[command], tmp_path)
    refused(res, f"{part}: manifest.json: {rule}", out=out)
    assert snapshot(part) == before


# ---------------------------------------------------------------------------- mishandled: payload documents
def _dataset_without_spec(a):
    doc = json.loads((a / "dataset.json").read_text())
    del doc["spec"]
    write_json(a, "dataset.json", doc)


def _bare_tensor_model(a):
    import torch

    buf = io.BytesIO()
    torch.save(torch.zeros(3), buf)
    (a / "model.pt").write_bytes(buf.getvalue())
    rehash(a, "model.pt")


DAMAGED_FILES = {  # name -> (artifact, damage, message)
    "dataset-no-spec": ("part", _dataset_without_spec, "dataset.json: missing field 'spec'"),
    "dataset-a-list": ("part", lambda a: write_json(a, "dataset.json", [1, 2]),
                       "dataset.json: must be a JSON object; got 'list'"),
    "stats-garbage": ("part", lambda a: write_json(a, "stats.json", {"num_clients": "many", "heterogeneity": 3}),
                      "stats.json: num_clients must be an integer >= 0; got 'many'"),
    "metrics-a-list": ("model", lambda a: write_json(a, "metrics.json", [0.5]),
                       "metrics.json: must be a JSON object; got 'list'"),
    "model-bare-tensor": ("model", _bare_tensor_model, "model.pt: must hold a model payload (a dict); got 'Tensor'"),
}


READS = {"part": ("train", "predict", "attack", "show"), "model": ("predict", "attack", "show-model")}
# show verifies model.pt's hash only: reading it needs torch, which show never imports.
MATRIX = [(damage, command) for damage, (name, _, _) in DAMAGED_FILES.items() for command in READS[name]
          if not (damage == "model-bare-tensor" and command == "show-model")]


@pytest.mark.parametrize("damage,command", MATRIX)
def test_damaged_documents_are_refused_by_every_reader(cli, root, copy, tmp_path, damage, command):
    name, edit, message = DAMAGED_FILES[damage]
    src = copy(name)
    edit(src)
    before = snapshot(src)
    part, model = (src, root / "model") if name == "part" else (root / "part", src)
    res, out = _run(cli, _commands(root, part, model)[command], tmp_path)
    refused(res, message, out=out)
    assert snapshot(src) == before


# ---------------------------------------------------------------------------- mishandled: clients.npz
def _edit_npz(part, **changes):
    with np.load(part / "clients.npz") as data:
        arrays = {k: data[k] for k in data.files}
    arrays.update(changes)
    from pfl_cli.artifacts import save_npz

    save_npz(part / "clients.npz", **arrays)
    rehash(part, "clients.npz")
    return arrays


@pytest.mark.parametrize("command", ["train", "predict", "attack"])
def test_float_indices_are_refused_not_cast(cli, root, copy, tmp_path, command):
    part = copy("part")
    with np.load(part / "clients.npz") as data:
        idx = data["train_indices"]
    _edit_npz(part, train_indices=idx.astype(np.float64) + 0.4)  # 3.4 would be read as sample 3
    res, out = _run(cli, _commands(root, part, root / "model")[command], tmp_path)
    refused(res, "clients.npz: train_indices must be a 1-D integer array; got 'float64 array", out=out)


def test_a_string_client_id_is_refused(cli, root, copy, tmp_path):
    part = copy("part")
    with np.load(part / "clients.npz") as data:
        ids = data["client_id"]
    _edit_npz(part, client_id=ids.astype(str))
    res, out = _run(cli, _commands(root, part, root / "model")["train"], tmp_path)
    refused(res, "clients.npz: client_id must be a 1-D integer array", out=out)


def test_an_edited_manifest_config_must_agree_with_the_files(cli, root, copy, tmp_path):
    part = copy("part")
    manifest = json.loads((part / "manifest.json").read_text())
    manifest["config"]["num_clients"] = 99  # the config is not hashed: only a cross-check catches this
    (part / "manifest.json").write_text(json.dumps(manifest))
    res, out = _run(cli, _commands(root, part, root / "model")["train"], tmp_path)
    refused(res, "clients.npz: must hold the 99 clients of the manifest's config (num_clients); got '8 clients'",
            out=out)


def test_an_input_still_being_written_says_so_not_no_such_directory(cli, root, tmp_path):
    # A partition whose writer holds its lock has no directory yet: the error says who is writing it
    # and to wait, not "no such directory ... create it" (issue 34, item 13).
    import fcntl
    import os

    from pfl_cli.artifacts import lock_file

    part = tmp_path / "part"
    fd = os.open(lock_file(part), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, b"4242\n", 0)
        res = cli("train", "--partition", part, "--algorithm", "fedavg", "--rounds", "1", *TINY,
                  "--out", tmp_path / "run")
        refused(res, f"--partition {part}", "being written by process 4242", "wait", out=tmp_path / "run")
        assert "no such directory" not in res.err
    finally:
        os.close(fd)
    res = cli("train", "--partition", part, "--algorithm", "fedavg", "--out", tmp_path / "run")  # writer gone
    refused(res, "no such directory")


# ---------------------------------------------------------------------------- mishandled: checkpoint location
@pytest.mark.parametrize("kind", ["folder-is-a-file", "state-is-a-directory"])
@pytest.mark.parametrize("resume", [True, False])
def test_a_checkpoint_location_of_the_wrong_kind_is_refused_up_front(cli, root, tmp_path, kind, resume):
    from pfl_cli.fl.checkpoint import checkpoint_dir

    out = tmp_path / "run"
    folder = checkpoint_dir(out)
    if kind == "folder-is-a-file":
        folder.write_text("not a folder")
        message = f"the checkpoint folder {folder} is a file, not a directory"
    else:
        (folder / "state.pt").mkdir(parents=True)
        message = f"the checkpoint {folder / 'state.pt'} is not a regular file"
    res = cli("train", "--partition", root / "part", "--algorithm", "fedavg", "--rounds", "1", *TINY, "--out", out,
              *(["--resume"] if resume else []))
    refused(res, message, out=out)


# ---------------------------------------------------------------------------- mishandled: one ledger validation
def test_show_and_privacy_account_refuse_the_same_ledger_with_the_same_rule(cli, copy, tmp_path):
    ledger = copy("ledger")
    doc = json.loads((ledger / "privacy.json").read_text())
    doc["events"][0]["event"]["event"]["noise_multiplier"] = -1
    write_json(ledger, "privacy.json", doc)
    shown = refused(cli("show", ledger), "noise_multiplier must be a finite number > 0; got -1")
    composed = refused(cli("privacy-account", ledger), "noise_multiplier must be a finite number > 0; got -1")
    assert shown.split("privacy.json", 1)[1] == composed.split("privacy.json", 1)[1]  # the same rule, word for word
    doc["events"][0]["event"]["event"]["noise_multiplier"] = 1.1
    doc["epsilon"] = -0.83
    write_json(ledger, "privacy.json", doc)
    refused(cli("show", ledger), "privacy.json: epsilon must be a finite number >= 0; got -0.83")


# ---------------------------------------------------------------------------- mishandled: values and sizes
def test_a_non_finite_split_is_refused(cli, root, tmp_path):
    cluster = ["cluster", "--partition", root / "part", "--server-data", "builtin:digits", "--k", "2",
               "--dp", "eps=1", "--out", tmp_path / "km"]
    refused(cli(*cluster, "--split", "nan,1,1,1"), "--split value must be a finite number; got 'nan'",
            out=tmp_path / "km")
    refused(cli(*cluster, "--set", "split=[.inf,1,1,1]"), "split[0] must be a finite number; got inf",
            out=tmp_path / "km")


@pytest.mark.parametrize("args,needle", [
    (["partition", "--dataset", "gmm:clients?num_clients=100000000&client_size=100000000"],
     "num_clients 100000000 x client_size 100000000 points of dimension 100 would need 7247.5 PiB of memory"),
    (["mdm-fit", "--counts", "{counts}", "--bins", "1:1000000000000"],
     "--bins 1:1000000000000: 2 clients x 1000000000000 bins would need 65.5 TiB of memory"),
])
def test_requests_that_cannot_fit_are_refused_with_the_size_they_need(cli, tmp_path, args, needle):
    (tmp_path / "v.csv").write_text("client,value\n1,5\n2,7\n")
    argv = [a.format(counts=tmp_path / "v.csv") for a in args]
    refused(cli(*argv, "--out", tmp_path / "big"), needle, out=tmp_path / "big")


@pytest.mark.parametrize("iterations", ["1000000000000", str(2**70)])
def test_attack_iterations_are_bounded(cli, root, tmp_path, iterations):
    res = cli("attack", "--model", root / "model", "--partition", root / "part", "--iterations", iterations,
              "--out", tmp_path / "atk")
    refused(res, f"iterations must be <= 100000 (ten times the longest attack of the papers", out=tmp_path / "atk")


def test_a_dp_population_bound_below_the_cohort_is_refused(cli, root, tmp_path):
    res = cli("train", "--partition", root / "part", "--algorithm", "fedavg", "--rounds", "1", *TINY,
              "--dp", "eps=1,clip=1,population=1", "--clients-per-round", "2", "--set", "normalize=false",
              "--out", tmp_path / "dp")
    refused(res, "--dp population=1 is a public bound on the enrolled clients, but the cohort is 2 clients per round",
            out=tmp_path / "dp")


# ---------------------------------------------------------------------------- arguable: --out and the inputs
@pytest.mark.parametrize("where", ["is", "is inside", "contains"])
@pytest.mark.parametrize("command", ["predict", "attack"])
def test_out_overlapping_an_input_is_refused_even_with_force(cli, root, tmp_path, where, command):
    model = tmp_path / "models" / "model"
    shutil.copytree(root / "model", model)
    out = {"is": model, "is inside": model / "sub", "contains": tmp_path / "models"}[where]
    before = snapshot(model)
    extra = ["--images", "1", "--iterations", "2"] if command == "attack" else []
    res = cli(command, "--model", model, "--partition", root / "part", *extra, "--out", out, "--force")
    refused(res, f"--out {out}: {where} the input {model}", "refused even with --force")
    assert snapshot(model) == before and not (model / "sub").exists()


def test_out_inside_a_dataset_file_input_is_refused(cli, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    np.savez(data / "d.npz", x=np.ones((12, 2)), y=np.arange(12) % 2)
    res = cli("partition", "--dataset", f"npz:{data / 'd.npz'}", "--num-clients", "2", "--out", data, "--force")
    refused(res, f"--out {data}: contains the input npz:{data / 'd.npz'}")
    assert (data / "d.npz").is_file()


def test_a_generated_dataset_names_no_file_to_protect(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "digits").mkdir()  # "builtin:digits" is no path: a folder of that name is not its input
    assert cli("partition", "--dataset", "builtin:digits", "--num-clients", "3", "--out", "digits/p",
               "--format", "quiet").code == 0


# ---------------------------------------------------------------------------- arguable: degenerate values
def test_zero_rounds_of_a_federated_algorithm_are_refused_local_needs_none(cli, root, tmp_path):
    refused(cli("train", "--partition", root / "part", "--algorithm", "fedavg", "--rounds", "0",
                "--out", tmp_path / "t"), "rounds must be >= 1 for the federated algorithm 'fedavg'", out=tmp_path / "t")
    assert cli("train", "--partition", root / "part", "--algorithm", "local", "--rounds", "0", "--local-epochs", "1",
               "--out", tmp_path / "l", "--format", "quiet").code == 0


def test_fedrep_without_head_epochs_is_refused(cli, root, tmp_path):
    refused(cli("train", "--partition", root / "part", "--algorithm", "fedrep", "--set", "head_epochs=0",
                "--out", tmp_path / "t"), "head_epochs must be >= 1 for fedrep", out=tmp_path / "t")


def test_a_cohort_above_the_clients_is_clamped_with_a_warning(cli, root, tmp_path):
    res = cli("train", "--partition", root / "part", "--algorithm", "fedavg", "--rounds", "1", *TINY,
              "--clients-per-round", "1000", "--out", tmp_path / "t", "--format", "json")
    assert res.code == 0
    assert "--clients-per-round 1000 is more than the 6 train clients; every round uses all 6." in res.err
    res = cli("mdm-fit", "--partition", root / "part", "--components", "1", "--rounds", "2", "--cohort-size", "100000",
              "--out", tmp_path / "m", "--format", "json")
    assert res.code == 0 and "--cohort-size 100000 is more than the 6 clients; every round uses all 6." in res.err
    trace = (tmp_path / "m" / "trace.csv").read_text().splitlines()
    header = trace[0].split(",")
    assert {row.split(",")[header.index("clients")] for row in trace[1:]} == {"6"}


def test_knn_k_above_every_datastore_is_clamped_with_a_warning(cli, root, tmp_path):
    res = cli("train", "--partition", root / "part", "--algorithm", "knnper", "--rounds", "1", *TINY,
              "--set", "knn_k=100000", "--out", tmp_path / "t", "--format", "json")
    assert res.code == 0 and "knn_k 100000 is more than the largest client's" in res.err


def test_an_empty_client_sizes_is_the_default_one_size(cli, root, tmp_path):
    from pflx_testing import replace, small_config

    assert small_config("pfedhn").client_sizes == ""  # client_sizes is pFedHN's key (mixed target widths)
    res = cli("train", "--partition", root / "part", "--algorithm", "pfedhn", "--rounds", "1", *TINY,
              "--set", "embed_rounds=1", "--set", "client_sizes=", "--out", tmp_path / "t", "--format", "quiet")
    assert res.code == 0
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["config"]["client_sizes"] == ""


def test_zero_attack_iterations_score_the_initialization(cli, root, tmp_path):
    res = cli("attack", "--model", root / "model", "--partition", root / "part", "--attack", "dlg", "--images", "1",
              "--iterations", "0", "--out", tmp_path / "a", "--format", "quiet")
    assert res.code == 0
    metrics = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert metrics["iterations"] == 0 and metrics["results"]["dlg"]["mean_psnr"] is not None


# ---------------------------------------------------------------------------- arguable: show validates
def test_show_refuses_rehashed_junk_and_makes_no_plot_dir(cli, root, copy, tmp_path):
    model = copy("model")
    write_json(model, "metrics.json", {"algorithm": 3, "dataset": {"num_classes": 10}})
    figs = tmp_path / "figs"
    refused(cli("show", model, "--plot", "--plot-dir", figs), "metrics.json: algorithm must be a string; got 3")
    assert not figs.exists()
    part = copy("part")
    write_json(part, "stats.json", {"heterogeneity": {"js_divergence_to_global": "high"}})
    refused(cli("show", part), "stats.json: heterogeneity.js_divergence_to_global must be an object with a finite mean")


# ---------------------------------------------------------------------------- content only the algorithm can check
def test_weights_that_do_not_fit_the_model_are_refused(cli, root, copy, tmp_path):
    import torch

    model = copy("model")
    payload = torch.load(model / "model.pt", weights_only=True)
    tree = payload["weights"]
    while isinstance(next(iter(tree.values())), dict):
        tree = next(iter(tree.values()))
    first = next(iter(tree))
    tree[first] = torch.zeros(3, 1, 2)  # right structure, wrong shape
    buf = io.BytesIO()
    torch.save(payload, buf)
    (model / "model.pt").write_bytes(buf.getvalue())
    rehash(model, "model.pt")
    res, out = _run(cli, ["predict", "--model", model, "--partition", root / "part"], tmp_path)
    refused(res, "model.pt: the weights tree does not fit the model it describes (client.fc1.weight must have "
            "shape (8, 64); got (3, 1, 2))", out=out)


def test_a_resealed_checkpoint_whose_state_does_not_fit_is_refused(cli, root, tmp_path):
    import torch

    from pfl_cli.fl.checkpoint import checkpoint_dir, seal_checkpoint, torch_bytes

    args = ["train", "--partition", root / "part", "--algorithm", "fedavg", "--rounds", "2", "--eval-every", "1",
            *TINY]
    out = tmp_path / "run"
    folder = checkpoint_dir(out)
    shutil.copytree(root / "model" / "checkpoint", folder)
    state = torch.load(folder / "state.pt", weights_only=True)
    fp = state.pop("fingerprint")
    state.pop("sha256")
    state["traffic"] = {}  # a valid seal over content the round loop cannot use
    (folder / "state.pt").write_bytes(torch_bytes(seal_checkpoint(state, fp)))
    res = cli(*args, "--out", out, "--resume", "--format", "quiet")  # human format notes "resuming from round 2" first
    refused(res, "--resume: the checkpoint's state does not fit the model it describes (KeyError", out=out)


def test_a_payload_file_the_manifest_does_not_list_is_not_read(cli, root, copy, tmp_path):
    part = copy("part")
    manifest = json.loads((part / "manifest.json").read_text())
    manifest["outputs"] = [o for o in manifest["outputs"] if o["path"] != "clients.npz"]  # its hash goes unchecked
    (part / "manifest.json").write_text(json.dumps(manifest))
    res, out = _run(cli, _commands(root, part, root / "model")["train"], tmp_path)
    refused(res, "clients.npz: missing from manifest.json's outputs, so its content is unverified", out=out)


def test_a_resealed_checkpoint_without_its_selected_model_is_refused(cli, root, tmp_path):
    import torch

    from pfl_cli.fl.checkpoint import checkpoint_dir, seal_checkpoint, torch_bytes

    out = tmp_path / "run"
    folder = checkpoint_dir(out)
    shutil.copytree(root / "model" / "checkpoint", folder)
    state = torch.load(folder / "state.pt", weights_only=True)
    fp = state.pop("fingerprint")
    state.pop("sha256")
    state["best"] = None  # found by the content fuzz: resuming at the last round then had no model to write
    (folder / "state.pt").write_bytes(torch_bytes(seal_checkpoint(state, fp)))
    res = cli("train", "--partition", root / "part", "--algorithm", "fedavg", "--rounds", "2", "--eval-every", "1",
              *TINY, "--out", out, "--resume")
    refused(res, "best must hold the selected model once an evaluation has run", out=out)
