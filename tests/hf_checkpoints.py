"""Tiny transformers checkpoints built offline for the tests (issue 46): nothing downloads.

:func:`tiny_bert` writes a BERT sequence classifier (2 layers, hidden 32) with ``save_pretrained`` and a WordPiece
tokenizer built from a vocabulary list beside it; :func:`text_csv` a csv of short texts whose label is which of two
word groups they draw from, with a client column.
"""

from __future__ import annotations

from pathlib import Path

WORDS = ["good", "great", "fine", "nice", "happy", "bad", "awful", "poor", "sad", "ugly", "the", "movie", "was",
         "a", "day", "very", "food", "and", "it"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def tiny_bert(directory: Path, *, layers: int = 2, hidden: int = 32, num_labels: int = 2, seed: int = 0) -> Path:
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)}).save_pretrained(str(directory))
    config = BertConfig(vocab_size=len(SPECIAL) + len(WORDS), hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=2, intermediate_size=2 * hidden, max_position_embeddings=64,
                        num_labels=num_labels, pad_token_id=0)
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(str(directory))
    return directory


def text_csv(path: Path, *, clients: int = 6, per_client: int = 12, seed: int = 0) -> Path:
    """``text,label,client`` rows: label 1 texts draw their adjectives from the first five words, label 0 from
    the next five; each client's labels are skewed."""
    import csv

    import numpy as np

    rng = np.random.default_rng(seed)
    path = Path(path)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["text", "label", "client"])
        seen = set()  # every text once: a test sample equal to a training sample would not be scored
        for c in range(clients):
            for _ in range(per_client):
                label = int(rng.random() < (0.8 if c % 2 else 0.2))
                adjectives = WORDS[:5] if label else WORDS[5:10]
                text = None
                while text is None or text in seen:
                    words = [*rng.choice(WORDS[10:], size=int(rng.integers(2, 5))),
                             *rng.choice(adjectives, size=int(rng.integers(1, 4)))]
                    text = " ".join(words)
                seen.add(text)
                out.writerow([text, label, f"c{c}"])
    return path


def tiny_vit(directory: Path, *, image: int = 8, channels: int = 1, num_labels: int = 10, seed: int = 0) -> Path:
    """A ViT image classifier (1 layer, hidden 16, 4-pixel patches) for 8 x 8 digits, with ``save_pretrained``."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    directory = Path(directory)
    config = ViTConfig(image_size=image, patch_size=4, num_channels=channels, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=32, num_labels=num_labels)
    torch.manual_seed(seed)
    ViTForImageClassification(config).save_pretrained(str(directory))
    return directory
