"""Torch modules of the FL algorithms: client networks, embedding networks, hypernetworks.

- client (target) nets: :class:`LeNet` (PeFLL Table B.1), :class:`MLP`, :func:`client_model`;
- embedding nets phi(x, y) returning per-sample embeddings (Table B.2): :func:`embedding_net`;
- the hypernetwork h(v) of Table B.3 with one head per target tensor: :func:`hypernetwork`;
- JSON-able specs to rebuild any of them from saved state dicts: :func:`build`;
- parameter helpers for ``torch.func`` cohorts: :func:`stacked_params`, :func:`param_shapes`.
"""

from pfl_cli.models.client import CLIENT_ARCHS, MLP, HyperFLCNN, LeNet, client_model, is_image_shape
from pfl_cli.models.embedding import (
    EMBEDDINGS,
    CNNEmbedding,
    LinearEmbedding,
    MLPEmbedding,
    embedding_net,
)
from pfl_cli.models.hypernetwork import HYPER_SIZES, HyperNetwork, hypernetwork
from pfl_cli.models.spec import (
    SPEC_KINDS,
    build,
    client_spec,
    describe,
    embedding_spec,
    hyper_spec,
    num_parameters,
    table_spec,
)
from pfl_cli.models.util import count_parameters, param_shapes, stacked_params

__all__ = [
    "CLIENT_ARCHS",
    "EMBEDDINGS",
    "HYPER_SIZES",
    "SPEC_KINDS",
    "CNNEmbedding",
    "HyperFLCNN",
    "HyperNetwork",
    "LeNet",
    "LinearEmbedding",
    "MLP",
    "MLPEmbedding",
    "build",
    "client_model",
    "client_spec",
    "count_parameters",
    "describe",
    "embedding_net",
    "embedding_spec",
    "hyper_spec",
    "hypernetwork",
    "is_image_shape",
    "num_parameters",
    "param_shapes",
    "stacked_params",
    "table_spec",
]
