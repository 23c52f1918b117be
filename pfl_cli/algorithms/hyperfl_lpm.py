"""HyperFL-LPM: HyperFL on a frozen pre-trained backbone (Guo et al., AAAI 2025, §3.3, App. D.1;
App. D.1, Table 2).

The client net is :class:`~pfl_cli.models.pretrained.PretrainedNet` with ``tune=adapters``: the
backbone (ViT-S/16 or ResNet-18, loaded from the user's local file) is frozen and shared, the
hypernetwork generates only the adapters, and the classifier, hypernetwork and client embedding
train. Everything else is HyperFL's round, unchanged (:class:`~pfl_cli.algorithms.hyperfl.HyperFL`):
step 1 (eq. 4) the classifier, step 2 (eq. 5) hypernetwork and embedding through the generated
adapters, upload of the hypernetwork only, weighted average (eq. 6), new clients by HyperFL's
protocol and ``pflx attack``'s model of the upload.

Memory: the backbone's tensors are buffers of the one client net, so a vmapped cohort reads one
copy and forms no gradient for it. Features are *not* computed once per batch for the whole cohort:
each client's generated adapters sit inside every block (after the ViT's MLPs, behind the ResNet's
residual blocks), so from the first block on the activations differ per client; only the patch
embedding / stem before the first adapter is common, and it is cheap next to the blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.hyperfl import DEFAULT_EMBED_DIM, HyperFL, HyperFLConfig
from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.config import key


LPM = "Guo et al., HyperFL (AAAI 2025), App. D.1, Training Settings (HyperFL-LPM)"


@dataclass(frozen=True)
class HyperFLLPMConfig(HyperFLConfig):
    """HyperFL-LPM's keys: HyperFL's on a pre-trained backbone (backbone, backbone_weights), with the
    LPM setting's batch size and step sizes (App. D.1), not the CNN configuration's."""

    algorithm: str = key("hyperfl-lpm", "the algorithm these keys configure")
    batch_size: int = key(16, "client minibatch size", f"{LPM}: \"batch size 16 is adopted for all datasets\"")
    lr: float = key(0.1, "eta_h: step-2 SGD step on the hypernetwork (ViT on EMNIST: 0.02; ResNet: 0.01)",
                    f"{LPM}: eta_h = eta_v = 0.1 for CIFAR-10 and 0.02 for EMNIST with ViT, 0.01 with ResNet")


class HyperFLLPM(HyperFL):
    name = "hyperfl-lpm"
    individual_reads = ""  # under --secagg HyperFL's round: the hypernetwork's mean from sums
    search_space = {"lr": "log:1e-3:1e-1", "head_lr": "log:1e-2:1"}
    search_space_source = ("Guo et al., HyperFL (AAAI 2025), App. B.5: lrs per backbone (0.1, 0.02, 0.01): searched "
                           "on a log range around them")
    tune_group = "train"
    config = HyperFLLPMConfig
    # the backbone keys are its client net (HyperFL's refusal of them is not inherited); model_arch names none
    inert_keys = {"model_arch": "its client net is the backbone (--set backbone=), never model_arch's",
                  "mlp_hidden": "its client net is the backbone (--set backbone=), never an mlp"}
    paper = "HyperFL-LPM: Guo et al., AAAI 2025 §3.3, App. D.1"
    new_client_protocol = "its embedding and classifier trained local_epochs under the global hypernetwork"

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        from pfl_cli.fl.split import split_names
        from pfl_cli.models import build, hyper_spec
        from pfl_cli.models.pretrained import backbone_spec

        check_image_backbone(cfg, store)
        if cfg.backbone_tune != "adapters":
            raise ConfigError(f"hyperfl-lpm generates adapters: backbone_tune must be adapters; got {cfg.backbone_tune!r} "
                              f"(the probe and FPT baselines are --algorithm fedavg / local).")
        client = backbone_spec(cfg.backbone, store.input_shape, store.num_classes, tune="adapters",
                               weights=cfg.backbone_weights or None)
        # the adapter names need no weights: build the net without reading the file
        adapters = split_names(build({k: v for k, v in client.items() if k != "weights"}))[0]
        dim = int(cfg.embed_dim) or DEFAULT_EMBED_DIM
        # App. D.1 / B.4: Linear(64, hidden) -> ReLU -> one linear head per adapter tensor
        return {"client": client,
                "hypernetwork": hyper_spec(dim, client, "M", cfg.hyper_hidden, n_hidden=0, relu_out=True,
                                           generate=adapters)}


def check_image_backbone(cfg, store) -> None:
    """HyperFL-LPM's refusals (and its LoRA variant's): a backbone named, and image data for it."""
    from pfl_cli.models.pretrained import BACKBONES

    if not cfg.backbone:
        raise ConfigError(f"{cfg.algorithm} needs a backbone: --set backbone={'|'.join(BACKBONES)} "
                          f"(and backbone_weights=PATH for pre-trained weights).")
    if getattr(store, "vocab_size", None) is not None:
        raise InputError(f"backbone {cfg.backbone!r} reads images; this data is text (token codes): {cfg.algorithm} "
                         "adapts a pre-trained image backbone and has no text variant.")
