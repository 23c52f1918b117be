"""``protocol()`` of the algorithms whose new clients train ``new_client_epochs`` (``epochs_protocol``)."""

import types

import pytest

from pfl_cli import registry
from pfl_cli.algorithms.base import epochs_protocol

NAMES = ("fedala", "fedas", "fedbn", "fedcp", "feddbe", "fedpac", "fedrod", "gpfl", "pfedla")


def test_epochs_protocol_words_each_case():
    args = ("its own", "trained {e} epochs", "as it starts")
    assert epochs_protocol(False, 3, *args) == {"protocol": "its own", "rounds": 0}
    assert epochs_protocol(True, 3, *args) == {"protocol": "trained 3 epochs", "rounds": 0}
    assert epochs_protocol(True, 0, *args) == {"protocol": "as it starts", "rounds": 0}


@pytest.mark.parametrize("name", NAMES)
def test_a_new_clients_protocol_names_its_epochs_and_a_train_clients_does_not(name):
    protocol = registry.get(name).algorithm.protocol

    def words(new, epochs):
        out = protocol(types.SimpleNamespace(cfg=types.SimpleNamespace(new_client_epochs=epochs)), new)
        assert out["rounds"] == 0 and "{" not in out["protocol"]
        return out["protocol"]

    assert f"trained {17} epochs" in words(True, 17)
    assert "17" not in words(False, 17) and "epochs" not in words(True, 0)
    assert len({words(False, 17), words(True, 17), words(True, 0)}) == 3
