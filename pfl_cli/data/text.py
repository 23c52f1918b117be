"""Text columns tokenized with a transformers checkpoint's own tokenizer (``csv:PATH?text=COL&tokenizer=DIR``, and
``hf:PATH?text=COL&tokenizer=DIR`` for a ``datasets`` ``save_to_disk`` folder, :mod:`pfl_cli.data.hf`).

The tokenizer is read from ``DIR`` with ``AutoTokenizer.from_pretrained(DIR, local_files_only=True)`` (nothing is
downloaded): the directory of the checkpoint that ``--model-arch hf:DIR`` trains. Every text becomes
``max_length`` token ids, truncated or padded with the tokenizer's pad id; the dataset records ``vocab_size``
(``train`` then reads the ids as codes, never standardizes them) and the pad id, from which the net derives the
attention mask (:class:`pfl_cli.models.hf_checkpoint.HFClassifier`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pfl_cli.errors import DatasetError

DEFAULT_MAX_LENGTH = 64
EXTRA = "pip install 'pflx[peft]'"


def text_options(options: dict[str, str], spec: str) -> tuple[str, str, int]:
    """``(text column, tokenizer directory, max_length)`` of a text dataset's options, refused in one line unless
    both ``text=`` and ``tokenizer=`` are given and ``max_length`` is an integer >= 2."""
    if not options.get("text") or not options.get("tokenizer"):
        raise DatasetError(f"{spec}: text data needs both text=COL and tokenizer=DIR (the checkpoint directory).")
    raw = options.get("max_length", str(DEFAULT_MAX_LENGTH))
    if not raw.isdigit() or int(raw) < 2:
        raise DatasetError(f"{spec}: max_length must be an integer >= 2; got {raw!r}.")
    return options["text"], options["tokenizer"], int(raw)


def tokenize(texts, directory: str, max_length: int, spec: str) -> tuple[np.ndarray, dict]:
    """``(ids int64 (n, max_length), extra)`` for ``texts`` with the tokenizer in ``directory``."""
    path = Path(directory).expanduser()
    if not path.is_dir():
        raise DatasetError(f"{spec}: tokenizer directory {path} does not exist; give the transformers checkpoint "
                           "directory whose tokenizer the text is read with (tokenizer=DIR).")
    try:
        from pfl_cli.torchvision_compat import declare_torchvision_ops

        declare_torchvision_ops()  # transformers imports torchvision where it is installed
        from transformers import AutoTokenizer
        from transformers.utils import logging
    except ImportError:
        raise DatasetError(f"{spec}: tokenizing text needs transformers: {EXTRA}.") from None
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise DatasetError(f"{spec}: no tokenizer readable in {path} ({type(err).__name__}: "
                           f"{str(err).splitlines()[0]}).") from None
    finally:
        logging.set_verbosity(verbosity)
    if tok.pad_token_id is None:
        raise DatasetError(f"{spec}: the tokenizer in {path} has no pad token; pflx pads every text to max_length.")
    enc = tok([str(t) for t in texts], padding="max_length", truncation=True, max_length=int(max_length),
              return_attention_mask=False, return_token_type_ids=False)
    ids = np.asarray(enc["input_ids"], dtype=np.int64)
    return ids, {"vocab_size": int(len(tok)), "pad_id": int(tok.pad_token_id), "tokenizer": str(path.resolve())}
