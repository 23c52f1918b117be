"""Text from a Hugging Face ``save_to_disk`` folder tokenized with the checkpoint's own tokenizer (issue 46).

The folder is built here from the csv fixture's rows (tests/hf_checkpoints.py) with ``datasets``; the ``hf:`` spec
must give the token ids, labels and clients the ``csv:`` text path gives for the same rows.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest

from pfl_cli.data import load_dataset
from pfl_cli.errors import DatasetError

pytestmark = [pytest.mark.hf, pytest.mark.peft]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import datasets
    from hf_checkpoints import text_csv, tiny_bert

    root = tmp_path_factory.mktemp("hf-text")
    bert = tiny_bert(root / "bert")
    data = text_csv(root / "text.csv", clients=3, per_client=6)
    with open(data, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    table = {"text": [r["text"] for r in rows], "label": [int(r["label"]) for r in rows],
             "client": [r["client"] for r in rows], "idx": list(range(len(rows)))}
    datasets.Dataset.from_dict(table).save_to_disk(str(root / "saved"))
    return root, bert, data


def test_saved_text_tokenizes_as_the_csv_text_path(saved):
    root, bert, data = saved
    ds = load_dataset(f"hf:{root / 'saved'}?text=text&tokenizer={bert}&client=client&max_length=10")
    ref = load_dataset(f"csv:{data}?text=text&tokenizer={bert}&client=client&max_length=10")
    assert ds.x.dtype == np.int64 and ds.x.shape == (18, 10)
    np.testing.assert_array_equal(ds.x, ref.x)
    np.testing.assert_array_equal(ds.y, ref.y)
    np.testing.assert_array_equal(ds.client, ref.client)
    assert ds.extra["vocab_size"] == ref.extra["vocab_size"] and ds.extra["pad_id"] == 0
    assert (ds.x[:, 0] == 2).all()  # [CLS] first: the checkpoint's own tokenizer


@pytest.mark.parametrize("query, match", [
    ("text=text", "needs both text=COL and tokenizer=DIR"),
    ("text=nope&tokenizer={bert}", "text column 'nope' is not in the dataset"),
    ("text=idx&tokenizer={bert}", "text column 'idx' must hold strings"),
    ("text=text&tokenizer={bert}&max_length=1", "max_length must be an integer >= 2"),
    ("text=text&tokenizer={bert}&features=idx", "the text is the only feature; drop features="),
])
def test_bad_text_options_are_refused(saved, query, match):
    root, bert, _ = saved
    with pytest.raises(DatasetError, match=match):
        load_dataset(f"hf:{root / 'saved'}?" + query.format(bert=bert))


def test_partition_of_saved_text_end_to_end(saved, cli):
    root, bert, _ = saved
    out = root / "part"
    run = cli("partition", "--dataset", f"hf:{root / 'saved'}?text=text&tokenizer={bert}&client=client&max_length=8",
              "--natural-id", "--holdout-clients", "1", "--out", out, "--format", "quiet")
    assert run.code == 0, run.err
    import json

    info = json.loads((out / "dataset.json").read_text())
    assert info["num_samples"] == 18 and info["input_shape"] == [8]
