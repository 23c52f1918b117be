"""``model_arch=hf:DIR``: a Hugging Face ``transformers`` classification checkpoint on disk as the client net.

``DIR`` is what ``save_pretrained`` writes (``config.json``, the weights, and for text the tokenizer's files):
a sequence-classification model for text (``...ForSequenceClassification``) or an image-classification model for
images (``...ForImageClassification``), loaded with the library's own ``from_pretrained`` with
``local_files_only=True``: nothing is downloaded. Its classifier is sized to the data's classes (a checkpoint with
another number of labels gets a fresh classifier, seeded like every pflx net). The spec records the sha256 of
every file of ``DIR``, so ``predict`` and ``--resume`` rebuild the same model and refuse a missing or changed
file in one line (exit 2).

Text: the dataset's token ids come from the checkpoint's own tokenizer (``csv:PATH?text=COL&tokenizer=DIR``,
:mod:`pfl_cli.data.text`), padded to one length with the tokenizer's pad id; the net derives the attention mask
from them (an additive 4-D mask on the pad positions), so the cohort path needs nothing but the ids. Attention runs
transformers' eager implementation: the SDPA path branches on the mask's values, which ``vmap`` over a cohort
refuses.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from pfl_cli.errors import ConfigError, InputError

PREFIX = "hf:"
EXTRA = "pip install 'pflx[peft]'"
TASKS = {"text": "ForSequenceClassification", "image": "ForImageClassification"}


def is_hf(arch: str) -> bool:
    return isinstance(arch, str) and arch.startswith(PREFIX)


def checkpoint_files(directory: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file below ``directory`` (sorted)."""
    from pfl_cli.models.pretrained import file_sha256

    return {str(p.relative_to(directory)): file_sha256(p)
            for p in sorted(directory.rglob("*")) if p.is_file() and not p.name.startswith(".")}


def hf_spec(arch: str, input_shape, num_classes: int, *, vocab: int | None = None) -> dict:
    """The JSON-able client spec of ``hf:DIR`` for data of ``input_shape`` (token codes when ``vocab`` is given)."""
    directory = Path(arch[len(PREFIX):]).expanduser()
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ConfigError(f"model_arch {arch}: no transformers checkpoint there (no {config_file}); give a directory "
                          "written by save_pretrained.")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"model_arch {arch}: config.json is not readable JSON ({err}).") from None
    task = "text" if vocab is not None else "image"
    archs = config.get("architectures") or []
    if archs and not any(str(a).endswith(TASKS[task]) for a in archs):
        raise InputError(f"model_arch {arch}: {task} data needs a ...{TASKS[task]} checkpoint; its config.json names "
                         f"{', '.join(map(str, archs))}.")
    spec = {"kind": "client", "arch": "hf", "path": str(directory.resolve()), "task": task,
            "files": checkpoint_files(directory), "input_shape": [int(s) for s in input_shape],
            "num_classes": int(num_classes)}
    if task == "text":
        size = int(config.get("vocab_size", 0))
        if size and vocab > size:
            raise InputError(f"model_arch {arch}: the data's token codes run to {vocab - 1}, past the checkpoint's "
                             f"vocabulary of {size}; tokenize the text with the checkpoint's own tokenizer "
                             f"(csv:PATH?text=COL&tokenizer={directory}).")
        spec["vocab"] = int(vocab)
        spec["pad_id"] = int(config.get("pad_token_id") or 0)
    return spec


class HFClassifier(nn.Module):
    """A transformers classification model on pflx's inputs: token ids (B, L) or images / square vectors."""

    def __init__(self, model: nn.Module, task: str, input_shape, pad_id: int = 0) -> None:
        super().__init__()
        self.net = model
        self.task, self.pad_id, self.input_shape = task, int(pad_id), tuple(input_shape)
        head = "classifier" if isinstance(getattr(model, "classifier", None), nn.Module) else "score"
        if not isinstance(getattr(model, head, None), nn.Module):
            raise InputError(f"hf checkpoint {type(model).__name__}: no classifier module (classifier or score) to "
                             "size to the data's classes.")
        self.classifier = f"net.{head}"

    def forward(self, x):
        if self.task == "text":
            ids = x.long()
            # The additive (B, 1, 1, L) mask, built here: transformers takes a 4-D mask as given, where from a 2-D one
            # its mask utilities test padding_mask.all() to skip the mask, a branch on data that vmap refuses.
            dtype = next(iter(self.net.parameters()), None)
            dtype = dtype.dtype if dtype is not None else x.new_zeros((), dtype=torch.float32).dtype
            mask = (ids == self.pad_id).to(dtype)[:, None, None, :] * torch.finfo(dtype).min
            return self.net(input_ids=ids, attention_mask=mask).logits
        if x.dim() == 2:  # square vectors (8 x 8 digits) as 1-channel images
            side = math.isqrt(x.shape[1])
            x = x.reshape(x.shape[0], 1, side, side)
        return self.net(pixel_values=x).logits


def build_hf(spec: dict) -> HFClassifier:
    """The net of an :func:`hf_spec`, after checking every recorded file is there unchanged."""
    directory = Path(spec["path"])
    recorded = spec.get("files", {})
    if not directory.is_dir():
        raise InputError(f"model_arch hf:{directory}: the checkpoint directory is missing; give the directory the "
                         "model was trained on.")
    found = checkpoint_files(directory)
    for name, digest in recorded.items():
        if found.get(name) != digest:
            what = "missing" if name not in found else "changed (sha256 differs)"
            raise InputError(f"model_arch hf:{directory}: {name} is {what} since the model was built; restore the "
                             "checkpoint the model was trained on.")
    try:
        from pfl_cli.torchvision_compat import declare_torchvision_ops

        declare_torchvision_ops()  # transformers imports torchvision where it is installed
        import transformers
    except ImportError:
        raise ConfigError(f"model_arch hf:{directory}: reading a transformers checkpoint needs transformers: "
                          f"{EXTRA}.") from None
    auto = (transformers.AutoModelForSequenceClassification if spec["task"] == "text"
            else transformers.AutoModelForImageClassification)
    verbosity, bars = transformers.logging.get_verbosity(), transformers.logging.is_progress_bar_enabled()
    transformers.logging.set_verbosity_error()  # "newly initialized classifier" is expected: the data's classes
    transformers.logging.disable_progress_bar()  # pflx's stderr carries its own progress only
    try:
        model = auto.from_pretrained(str(directory), local_files_only=True, num_labels=int(spec["num_classes"]),
                                     ignore_mismatched_sizes=True, attn_implementation="eager")
    except (OSError, ValueError) as err:
        raise InputError(f"model_arch hf:{directory}: transformers could not load it ({type(err).__name__}: "
                         f"{str(err).splitlines()[0]}).") from None
    finally:
        transformers.logging.set_verbosity(verbosity)
        if bars:
            transformers.logging.enable_progress_bar()
    model.eval()  # transformers' own dropout off: local steps and evaluation are deterministic
    return HFClassifier(model, spec["task"], spec["input_shape"], spec.get("pad_id", 0))
