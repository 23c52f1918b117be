"""A LoRA cohort folded into one batch (issue 46, item 4): the shared frozen base runs once on every client's rows
and each client's adapters and classifier as one grouped matmul over its own rows. Held equal, logits and
gradients, to one ordinary forward and backward per client with that client's own weights (the loop path, the
obvious reference), on an MLP and on a tiny BERT with padded sequences; the nets it would not be exact for run
under vmap instead.
"""

from __future__ import annotations

import pytest
import torch

from pfl_cli.fl.cohort import _cohort_grads, _folds, cohort_forward
from pfl_cli.models import build, client_spec
from pfl_cli.models.lora import LoRANet, lora_spec, match_targets, set_dropout


def stacked(net, c: int, seed: int = 0) -> dict:
    """Each client's own adapters and classifier: drawn, so that a path that mixed clients up would show."""
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(c, *v.shape, generator=g) * 0.3 for k, v in net.named_parameters()}


def lora_mlp(**keys):
    base = client_spec("mlp", (64,), 10, hidden=[32, 16])
    return build(lora_spec(base, build(base), targets=keys.pop("targets", "*"), rank=4, alpha=8.0, **keys))


def check_equal_to_the_loop(net, x, y):
    params = stacked(net, x.shape[0])
    assert _folds(net, params)
    folded = cohort_forward(net, params, x, "vmap")
    looped = cohort_forward(net, params, x, "loop")
    assert folded.shape == looped.shape
    torch.testing.assert_close(folded, looped, rtol=1e-5, atol=1e-5)
    m = torch.ones(y.shape)
    loss_f, grads_f = _cohort_grads(net, params, x, y, m, "vmap", {}, {})
    loss_l, grads_l = _cohort_grads(net, params, x, y, m, "loop", {}, {})
    torch.testing.assert_close(loss_f, loss_l, rtol=1e-5, atol=1e-6)
    for k in grads_l:
        torch.testing.assert_close(grads_f[k], grads_l[k], rtol=1e-4, atol=1e-6, msg=k)


def test_a_folded_lora_mlp_cohort_equals_one_forward_and_backward_per_client():
    torch.manual_seed(0)
    check_equal_to_the_loop(lora_mlp(dropout=0.0), torch.randn(5, 7, 64), torch.randint(0, 10, (5, 7)))


@pytest.mark.peft
def test_a_folded_bert_cohort_with_padding_equals_the_loop(tmp_path):
    from hf_checkpoints import tiny_bert

    from pfl_cli.models.hf_checkpoint import hf_spec

    bert = tiny_bert(tmp_path / "bert")
    base = hf_spec(f"hf:{bert}", (12,), 2, vocab=24)
    net = build(lora_spec(base, build(base), targets="query,value", rank=4, alpha=4.0, dropout=0.0))
    g = torch.Generator().manual_seed(1)
    x = torch.randint(5, 24, (4, 3, 12), generator=g)
    x[..., 8:] = 0  # padded tails: the attention mask must keep each row's padding its own
    x[1, 2, 4:] = 0
    check_equal_to_the_loop(net, x, torch.randint(0, 2, (4, 3), generator=g))


def test_nets_folding_would_change_run_under_vmap():
    """IA3's vectors, FedDPA's instance-weighted pair, convolution adapters and BatchNorm do not fold; a per-client
    tensor the net did not declare (a base weight passed per client) does not either."""
    base = client_spec("mlp", (64,), 10, hidden=[32])
    ia3 = build(lora_spec(base, build(base), targets="*", adapter="ia3"))
    dual = build(lora_spec(base, build(base), targets="*", rank=2, alpha=2.0, dual=True))
    lenet = client_spec("lenet", (1, 32, 32), 10)
    conv = build(lora_spec(lenet, build(lenet), targets="conv1", rank=2, alpha=2.0))
    bn = build(client_spec("mlp-bn", (64,), 10, hidden=[32]))  # lora_spec refuses it; the net itself must not fold
    batchnorm = LoRANet(bn, match_targets(bn, "*"), rank=2, alpha=2.0)
    for net in (ia3, dual, conv, batchnorm):
        assert not _folds(net, stacked(net, 2))
    net = lora_mlp()
    params = stacked(net, 2)
    assert _folds(net, params)
    assert not _folds(net, {**params, "model.fc1.base_layer.weight": torch.zeros(2, 32, 64)})
    # a linear layer's weight per client with its bias shared would broadcast the bias wrongly: not folded
    assert not _folds(net, {k: v for k, v in params.items() if k != f"{net.classifier}.bias"})
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(cohort_forward(ia3, stacked(ia3, 2), x, "vmap"),
                               cohort_forward(ia3, stacked(ia3, 2), x, "loop"), rtol=1e-5, atol=1e-5)


def test_folded_dropout_draws_each_element_apart_and_only_in_training():
    net = lora_mlp(dropout=0.5)
    params = stacked(net, 3)
    x = torch.randn(3, 4, 64)
    x[1] = x[0]  # two clients with the same inputs and weights: their dropout masks must still differ
    params = {k: torch.stack([v[0], v[0], v[2]]) for k, v in params.items()}
    set_dropout(net, True)
    torch.manual_seed(0)
    out = cohort_forward(net, params, x, "vmap")
    assert not torch.allclose(out[0], out[1])
    set_dropout(net, False)
    out = cohort_forward(net, params, x, "vmap")
    torch.testing.assert_close(out[0], out[1])
