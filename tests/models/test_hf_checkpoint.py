"""``--model-arch hf:DIR`` and LoRA adapters exported in peft's format (issue 46), on a tiny BERT built offline.

The checkpoint (2 layers, hidden 32) and its WordPiece tokenizer are written by tests/hf_checkpoints.py with
``save_pretrained``; nothing downloads. The exported adapter of a trained client, loaded with plain transformers +
peft (``PeftModel.from_pretrained``) on the raw texts tokenized by the checkpoint's own tokenizer, gives the
probabilities ``pflx predict`` wrote for that client's samples.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.peft

MAX_LENGTH = 12


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    from hf_checkpoints import text_csv, tiny_bert

    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("hf")
    bert = tiny_bert(root / "bert")
    data = text_csv(root / "text.csv")
    spec = f"csv:{data}?text=text&tokenizer={bert}&client=client&max_length={MAX_LENGTH}"
    assert main(["partition", "--dataset", spec, "--natural-id", "--holdout-clients", "2", "--test-fraction", "0.3",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    code = main(["train", "--partition", str(root / "part"), "--algorithm", "fedsa-lora", "--model-arch", f"hf:{bert}",
                 "--rounds", "2", "--eval-every", "2", "--clients-per-round", "2", "--set", "local_steps=2",
                 "--set", "lr=0.5", "--set", "lora_targets=query,value", "--set", "new_client_epochs=1",
                 "--out", str(root / "model"), "--format", "quiet"])
    assert code == 0
    return root, bert, data


def test_train_records_the_checkpoint_files(text_run):
    import torch

    root, bert, _ = text_run
    arch = torch.load(root / "model" / "model.pt", weights_only=True)["arch"]["client"]
    assert arch["arch"] == "lora" and arch["base"]["arch"] == "hf" and arch["base"]["task"] == "text"
    assert set(arch["base"]["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert all(t.endswith((".query", ".value")) for t in arch["targets"]) and len(arch["targets"]) == 4


def peft_probabilities(bert, data, adapter, samples):
    """Probabilities of plain transformers + peft (``PeftModel.from_pretrained``) with the written ``adapter`` on
    the raw texts ``samples`` index, tokenized by the checkpoint's own tokenizer."""
    import csv

    import torch
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    texts = [row["text"] for row in csv.DictReader(open(data, encoding="utf-8"))]
    tok = AutoTokenizer.from_pretrained(str(bert), local_files_only=True)
    enc = tok([texts[i] for i in samples], padding="max_length", truncation=True, max_length=MAX_LENGTH,
              return_tensors="pt")
    base = AutoModelForSequenceClassification.from_pretrained(str(bert), local_files_only=True, num_labels=2,
                                                              attn_implementation="eager")
    model = PeftModel.from_pretrained(base, str(adapter)).eval()
    with torch.no_grad():
        logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
    return torch.softmax(logits.double(), -1).numpy()


def test_exported_adapter_loads_in_peft_and_gives_predicts_probabilities(text_run, cli):
    root, bert, data = text_run
    out = root / "pred"
    run = cli("predict", "--model", root / "model", "--partition", root / "part", "--clients", "train",
              "--save-models", "--out", out, "--format", "quiet")
    assert run.code == 0, run.err
    pred = np.load(out / "predictions.npz")
    client = int(pred["client_id"][0])
    adapter = out / "adapters" / f"client-{client}"
    assert (adapter / "adapter_config.json").is_file() and (adapter / "adapter_model.safetensors").is_file()
    rows = pred["client_id"] == client
    probs = peft_probabilities(bert, data, adapter, pred["sample"][rows])
    np.testing.assert_allclose(probs, pred["probabilities"][rows], rtol=0, atol=1e-5)
    # the adapters differ between clients (B is personal in FedSA-LoRA)
    others = sorted(p.name for p in (out / "adapters").iterdir())
    assert len(others) == 4


def test_exported_ia3_adapters_load_in_peft_and_give_predicts_probabilities(text_run, cli, tmp_path):
    """FedIT with adapter=ia3 on peft's BERT targets (keys, values, the feed-forward output.dense, its input scaled)
    and finetune_steps: each client's personalized IA3 vectors, written as peft's IA3 adapter, give in peft the
    probabilities pflx predict wrote for that client."""
    import torch
    from safetensors.torch import load_file

    root, bert, data = text_run
    model, out = tmp_path / "model", tmp_path / "pred"
    assert cli("train", "--partition", root / "part", "--algorithm", "fedit", "--model-arch", f"hf:{bert}",
               "--rounds", "1", "--clients-per-round", "2", "--set", "local_steps=2", "--set", "lr=0.5",
               "--set", "adapter=ia3", "--set", "lora_targets=key,value,output.dense",
               "--set", "ia3_feedforward=output.dense", "--set", "finetune_steps=1",
               "--out", model, "--format", "quiet").code == 0
    run = cli("predict", "--model", model, "--partition", root / "part", "--clients", "train", "--save-models",
              "--out", out, "--format", "quiet")
    assert run.code == 0, run.err
    pred = np.load(out / "predictions.npz")
    config = json.loads((out / "adapters" / f"client-{int(pred['client_id'][0])}" / "adapter_config.json").read_text())
    assert config["peft_type"] == "IA3" and len(config["target_modules"]) == 8
    assert len(config["feedforward_modules"]) == 4  # each layer's attention.output.dense and output.dense
    tensors = {}
    for client in np.unique(pred["client_id"])[:2]:
        adapter = out / "adapters" / f"client-{int(client)}"
        rows = pred["client_id"] == client
        probs = peft_probabilities(bert, data, adapter, pred["sample"][rows])
        np.testing.assert_allclose(probs, pred["probabilities"][rows], rtol=0, atol=1e-5)
        tensors[int(client)] = load_file(str(adapter / "adapter_model.safetensors"))
    a, b = tensors.values()
    vectors = [k for k in a if k.endswith(".ia3_l")]
    assert len(vectors) == 8 and not all(torch.equal(a[k], b[k]) for k in vectors)  # fine-tuned: personal
    # The vectors move little in a few steps on the tiny random BERT: the same net with vectors drawn far from one,
    # written by the exporter, gives peft's logits (names, shapes and feed-forward flags all act).
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    from pfl_cli.models import build
    from pfl_cli.models.lora_export import write_adapter

    spec = torch.load(model / "model.pt", weights_only=True)["arch"]["client"]
    assert spec["adapter"] == "ia3" and len(spec["feedforward"]) == 4
    net = build(spec).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for k, p in net.named_parameters():
            p.normal_(1.0 if k.endswith(".ia3_l") else 0.0, 0.5)
    write_adapter(tmp_path / "drawn", spec, dict(net.named_parameters()))
    ids = torch.tensor([[2, 10, 11, 5, 3, 0, 0], [2, 7, 12, 13, 9, 6, 3]])
    base = AutoModelForSequenceClassification.from_pretrained(str(bert), local_files_only=True, num_labels=2,
                                                              attn_implementation="eager")
    theirs = PeftModel.from_pretrained(base, str(tmp_path / "drawn")).eval()
    with torch.no_grad():
        torch.testing.assert_close(net(ids), theirs(input_ids=ids, attention_mask=(ids != 0).long()).logits,
                                   rtol=0, atol=1e-5)


def test_a_changed_checkpoint_file_is_refused(text_run, cli, tmp_path):
    import shutil

    root, bert, _ = text_run
    copy = tmp_path / "bert"
    shutil.copytree(bert, copy)
    part = root / "part"
    model = tmp_path / "model"
    assert cli("train", "--partition", part, "--algorithm", "fedit", "--model-arch", f"hf:{copy}", "--rounds", "1",
               "--clients-per-round", "2", "--set", "local_steps=1", "--set", "lora_targets=query", "--out", model,
               "--format", "quiet").code == 0
    config = copy / "config.json"
    config.write_text(config.read_text() + "\n")
    run = cli("predict", "--model", model, "--partition", part, "--out", tmp_path / "pred", "--format", "quiet")
    assert run.code == 2 and "config.json is changed" in run.err and len(run.err.strip().splitlines()) == 1
    assert not (tmp_path / "pred").exists()
    run = cli("train", "--partition", part, "--algorithm", "fedit", "--model-arch", f"hf:{tmp_path / 'none'}",
              "--rounds", "1", "--out", tmp_path / "bad", "--format", "quiet")
    assert run.code == 2 and "no transformers checkpoint there" in run.err


@pytest.mark.slow
def test_an_image_checkpoint_trains_lora_on_digits(tmp_path, cli):
    """An image classifier (a tiny ViT, ...ForImageClassification) adapts to digits' 8 x 8 images."""
    import torch
    from hf_checkpoints import tiny_vit

    vit = tiny_vit(tmp_path / "vit")
    part = tmp_path / "part"
    assert cli("partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "6",
               "--holdout-clients", "2", "--out", part, "--format", "quiet").code == 0
    run = cli("train", "--partition", part, "--algorithm", "ffa-lora", "--model-arch", f"hf:{vit}", "--rounds", "2",
              "--clients-per-round", "2", "--set", "local_steps=2", "--set", "lora_targets=q_proj,v_proj,projection",
              "--out", tmp_path / "model", "--format", "quiet")
    assert run.code == 0, run.err
    arch = torch.load(tmp_path / "model" / "model.pt", weights_only=True)["arch"]["client"]
    assert arch["base"]["task"] == "image" and len(arch["targets"]) >= 3
    pred = cli("predict", "--model", tmp_path / "model", "--partition", part, "--out", tmp_path / "pred",
               "--format", "quiet")
    assert pred.code == 0, pred.err


def test_text_csv_needs_its_tokenizer_and_only_text(tmp_path, text_run):
    from pfl_cli.data import load_dataset
    from pfl_cli.errors import DatasetError

    _, bert, data = text_run
    with pytest.raises(DatasetError, match="needs both text=COL and tokenizer=DIR"):
        load_dataset(f"csv:{data}?text=text&client=client")
    with pytest.raises(DatasetError, match="tokenizer directory .* does not exist"):
        load_dataset(f"csv:{data}?text=text&tokenizer={tmp_path / 'none'}&client=client")
    with pytest.raises(DatasetError, match=r"the text is the only feature; got other columns \['client'\]"):
        load_dataset(f"csv:{data}?text=text&tokenizer={bert}")
    ds = load_dataset(f"csv:{data}?text=text&tokenizer={bert}&client=client&max_length=8")
    assert ds.x.shape[1] == 8 and ds.x.dtype.kind == "i" and ds.extra["pad_id"] == 0
    assert (ds.x[:, 0] == 2).all()  # [CLS] first: the checkpoint's own tokenizer
