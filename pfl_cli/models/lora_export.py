"""Each client's LoRA adapter in peft's on-disk format (issue 46): ``adapter_config.json`` and
``adapter_model.safetensors``.

``PeftModel.from_pretrained(base, DIR)`` in plain transformers + peft loads a written directory: ``base`` is the
checkpoint of ``hf:DIR`` (``AutoModelForSequenceClassification.from_pretrained`` with the data's number of
labels) or, for a built-in base net, that net (``pfl_cli.models.build`` of the spec's ``base``, with its
weights), and gives the logits ``pflx predict`` scores (tests/models/test_lora_export.py). The keys are peft's:
``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight`` for the adapters and
``base_model.model.<classifier>.weight`` / ``.bias`` for the classifier, which the config lists in
``modules_to_save`` (peft's layout for a classifier trained in full). An IA3 net (``adapter=ia3``) writes peft's
``IA3Config`` (``peft_type`` IA3, ``target_modules``, ``feedforward_modules``) and its vectors as
``base_model.model.<module>.ia3_l``. Only ``safetensors`` is needed to write.

A dual net (FedDPA: a global and a local adapter in every targeted layer) is written as two adapters per client,
``client-<id>/global/`` and ``client-<id>/local/``, each with the shared classifier, which peft loads as two named
adapters of one model (``PeftModel.from_pretrained(base, DIR/global, adapter_name="global")`` then
``load_adapter(DIR/local, adapter_name="local")``); ``client-<id>/feddpa.json`` holds the client's reference
direction and the weight scale w, from which an instance's weights ``lam(x) = w * clamp(cos(h(x), reference), 0,
1)`` (local) and ``1 - lam(x)`` (global) follow (:mod:`pfl_cli.algorithms.feddpa_net`); no single peft adapter
computes that per-instance mixture.
"""

from __future__ import annotations

import json
from pathlib import Path

PEFT_PREFIX = "base_model.model."


def _inner(spec: dict) -> str:
    """The prefix of the base model's module names inside a LoRA net: ``model.`` (+ ``net.`` for an hf checkpoint)."""
    return "model.net." if spec["base"].get("arch") == "hf" else "model."


def adapter_config(spec: dict) -> dict:
    """peft's ``LoraConfig`` (``IA3Config`` for an IA3 net) of a LoRA client spec, as ``save_pretrained`` writes it
    (the keys pflx sets)."""
    from pfl_cli.models import build

    base = spec["base"]
    hf = base.get("arch") == "hf"
    net = build(base)
    head = net.classifier.removeprefix("net.") if hf else net.classifier
    targets = [t.removeprefix("net.") if hf else t for t in spec["targets"]]
    common = {"task_type": "SEQ_CLS" if hf and base.get("task") == "text" else None,
              "base_model_name_or_path": base["path"] if hf else None, "target_modules": targets,
              "modules_to_save": [head], "fan_in_fan_out": False, "inference_mode": True}
    if spec.get("adapter") == "ia3":
        # peft matches a feed-forward module by the end of its name: the full names select exactly these layers
        return {**common, "peft_type": "IA3", "init_ia3_weights": True,
                "feedforward_modules": [t.removeprefix("net.") if hf else t for t in spec["feedforward"]]}
    return {"peft_type": "LORA", "task_type": "SEQ_CLS" if hf and base.get("task") == "text" else None,
            "base_model_name_or_path": base["path"] if hf else None, "r": int(spec["rank"]),
            "lora_alpha": spec["alpha"], "lora_dropout": float(spec["dropout"]), "target_modules": targets,
            "modules_to_save": [head], "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True,
            "use_rslora": False, "use_dora": False, "inference_mode": True}


def adapter_tensors(spec: dict, params: dict) -> dict:
    """One client's parameters (no client axis) under peft's saved names."""
    inner = _inner(spec)
    out = {}
    for k, v in params.items():
        if not k.startswith(inner):
            raise ValueError(f"LoRA parameter {k!r} is not under {inner!r}")
        out[PEFT_PREFIX + k[len(inner):]] = v.detach().to("cpu").contiguous()
    return out


def write_adapter(directory: Path, spec: dict, params: dict) -> None:
    """``adapter_config.json`` and ``adapter_model.safetensors`` of one client into ``directory``."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config(spec), indent=2, sort_keys=True) + "\n",
                                                   encoding="utf-8")
    save_file(adapter_tensors(spec, params), str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})


def dual_adapters(params: dict) -> tuple[dict, dict]:
    """The global and the local adapter of one client of a dual net (FedDPA: ``net.``-prefixed parameters), each
    with the shared classifier, named as a plain LoRA net's (the local adapter's ``local_A`` / ``local_B`` as
    ``lora_A`` / ``lora_B``)."""
    net = {k.removeprefix("net."): v for k, v in params.items() if k.startswith("net.")}
    is_local = lambda k: ".local_A." in k or ".local_B." in k  # noqa: E731
    glob = {k: v for k, v in net.items() if not is_local(k)}
    local = {k.replace(".local_A.", ".lora_A.").replace(".local_B.", ".lora_B."): v for k, v in net.items()
             if is_local(k) or (".lora_A." not in k and ".lora_B." not in k)}
    return glob, local


def write_adapters(directory: Path, spec: dict, params: dict, client_ids, personalized: bool) -> list[str]:
    """Every client's adapter (``client-<id>/``), or the one global adapter (``global/``) of a method that serves
    one model; returns the written folders' names."""
    if spec.get("dual"):
        plain = {k: v for k, v in spec.items() if k != "dual"}
        names = []
        for i, cid in enumerate(client_ids):
            name = f"client-{int(cid)}"
            glob, local = dual_adapters({k: v[i] for k, v in params.items()})
            write_adapter(directory / name / "global", plain, glob)
            write_adapter(directory / name / "local", plain, local)
            info = {"reference": [float(v) for v in params["reference"][i].detach().cpu().reshape(-1)],
                    "max_weight": float(params["max_weight"][i]),
                    "rule": "local weight lam(x) = max_weight * clamp(cos(h(x), reference), 0, 1), global 1 - "
                            "lam(x); h(x): the classifier's input with the local adapter alone"}
            (directory / name / "feddpa.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
            names.append(name)
        return names
    if not personalized:
        write_adapter(directory / "global", spec, params)
        return ["global"]
    names = []
    for i, cid in enumerate(client_ids):
        name = f"client-{int(cid)}"
        write_adapter(directory / name, spec, {k: v[i] for k, v in params.items()})
        names.append(name)
    return names
