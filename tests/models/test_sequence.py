"""models.sequence: LEAF's Shakespeare LSTM (client net and PeFLL embedding) against torch.nn.LSTM, under vmap,
and the text / image refusals of model_arch and embedding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from pfl_cli.errors import InputError
from pfl_cli.models import build, client_spec, describe, embedding_spec
from pfl_cli.models.client import client_model, resolve_arch
from pfl_cli.models.embedding import resolve_embedding
from pfl_cli.models.sequence import CharLSTM, LSTMEmbedding


def reference_logits(net: CharLSTM, x: torch.Tensor) -> torch.Tensor:
    """The same weights in torch's own modules: nn.Embedding -> nn.LSTM (fused, batch_first) -> last step -> fc."""
    lstm = torch.nn.LSTM(net.embed.embedding_dim, net.hidden[0], num_layers=len(net.hidden), batch_first=True)
    lstm.load_state_dict({k[len("lstm."):]: v for k, v in net.state_dict().items() if k.startswith("lstm.")})
    out, _ = lstm(F.embedding(x, net.embed.weight))
    return F.linear(out[:, -1], net.fc.weight, net.fc.bias)


def test_leaf_sizes_and_parameter_names():
    net = CharLSTM(80, 80)
    # LEAF's model: 80 x 8 embedding, LSTM 8 -> 256 -> 256 (4 gates, two biases each), 256 x 80 + 80
    expected = 80 * 8 + (4 * 256 * (8 + 256) + 8 * 256) + (4 * 256 * (256 + 256) + 8 * 256) + 256 * 80 + 80
    assert sum(p.numel() for p in net.parameters()) == expected == 819_920
    assert [k for k, _ in net.named_parameters()] == [
        "embed.weight", "lstm.weight_ih_l0", "lstm.weight_hh_l0", "lstm.bias_ih_l0", "lstm.bias_hh_l0",
        "lstm.weight_ih_l1", "lstm.weight_hh_l1", "lstm.bias_ih_l1", "lstm.bias_hh_l1", "fc.weight", "fc.bias"]
    assert list(net.buffers()) == [] and net.classifier == "fc"
    spec = client_spec("auto", (80,), 80, vocab=80)
    assert describe(spec) == "client lstm, input (80,), 80 classes: 819,920 parameters"


def test_forward_equals_torch_lstm_fused_and_written_out():
    torch.manual_seed(0)
    net = CharLSTM(80, 80, (12, 12))
    x = torch.randint(0, 80, (5, 20))
    ref = reference_logits(net, x)
    torch.testing.assert_close(net(x), ref, rtol=0, atol=1e-6)  # fused path
    # the written-out recurrence (what vmap runs) on a cohort of 3 perturbed copies, gradients included
    params = {k: torch.stack([v.detach() + 0.05 * i for i in range(3)]).requires_grad_(True)
              for k, v in net.named_parameters()}
    xs = torch.randint(0, 80, (3, 4, 20))
    batched = vmap(lambda p, xb: functional_call(net, p, (xb,)))(params, xs)
    looped = torch.stack([functional_call(net, {k: v[i] for k, v in params.items()}, (xs[i],)) for i in range(3)])
    torch.testing.assert_close(batched, looped, rtol=0, atol=1e-5)
    g_batched = torch.autograd.grad(batched.square().sum(), list(params.values()))
    g_looped = torch.autograd.grad(looped.square().sum(), list(params.values()))
    for a, b in zip(g_batched, g_looped):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_embedding_reads_the_label_as_the_next_character():
    torch.manual_seed(1)
    emb = LSTMEmbedding(80, 80, 5, (8, 8))
    x = torch.randint(0, 80, (4, 10))
    y = torch.tensor([3, 3, 70, 70])
    out = emb(x, F.one_hot(y, 80).float())
    assert out.shape == (4, 5)
    # the label is the sequence's next step: the same as the encoder on the 11-character sequence
    torch.testing.assert_close(out, emb.fc(emb.encode(torch.cat((x, y[:, None]), 1))), rtol=0, atol=0)
    blind = LSTMEmbedding(80, 80, 5, (8, 8), use_labels=False)
    a = blind(x, F.one_hot(y, 80).float())
    torch.testing.assert_close(a, blind(x, torch.zeros(4, 80)), rtol=0, atol=0)  # lstm-x ignores labels
    with pytest.raises(InputError, match="^embedding 'lstm' reads the label as the next token"):
        LSTMEmbedding(10, 20, 5, (8, 8))


def test_auto_picks_the_lstm_for_text_and_refuses_image_models_of_text():
    assert resolve_arch("auto", (80,), vocab=80) == "lstm"
    assert resolve_arch("auto", (80,)) == "mlp"  # numbers stay numbers
    for arch in ("mlp", "lenet", "hyperfl-cnn", "mlp-bn", "lenet-bn"):
        with pytest.raises(InputError, match=rf"^model_arch '{arch}' reads numeric inputs; this data is text"):
            resolve_arch(arch, (80,), vocab=80)
    with pytest.raises(InputError, match=r"^model_arch 'lstm' reads text .* this data is numeric \(input shape "
                                         r"\(3, 32, 32\)\)"):
        client_model("lstm", (3, 32, 32), 10)
    assert resolve_embedding("auto", (80,), vocab=80) == "lstm"
    assert resolve_embedding("linear", (80,), vocab=80) == "linear"
    for kind in ("mlp", "mlp-x", "cnn"):
        with pytest.raises(InputError, match=rf"^embedding '{kind}' reads numeric inputs"):
            resolve_embedding(kind, (80,), vocab=80)
    with pytest.raises(InputError, match=r"^embedding 'lstm-x' reads text"):
        resolve_embedding("lstm-x", (64,))


def test_specs_rebuild_the_same_nets():
    client = client_spec("auto", (80,), 80, vocab=80, lstm_hidden=16)
    assert client == {"kind": "client", "arch": "lstm", "input_shape": [80], "num_classes": 80,
                      "hidden": [16, 16], "vocab": 80}
    net = build(client)
    assert isinstance(net, CharLSTM) and net.hidden == (16, 16)
    emb = embedding_spec("auto", (80,), 80, 7, vocab=80, lstm_hidden=16)
    assert emb["arch"] == "lstm" and emb["hidden"] == [16, 16] and emb["vocab"] == 80
    e = build(emb)
    assert isinstance(e, LSTMEmbedding) and e.uses_labels and e.fc.out_features == 7
    # a hypernetwork generates every tensor of the LSTM (pFedHN, PeFLL)
    from pfl_cli.models import hyper_spec, num_parameters

    h = hyper_spec(7, client, "M", 10)
    shapes = {k: tuple(v.shape) for k, v in build(h)(torch.zeros(7)).items()}
    assert shapes == {k: tuple(p.shape) for k, p in net.named_parameters()}
    assert num_parameters(h) == sum(p.numel() for p in build(h).parameters())
