"""Write a Flower app directory that runs a pflx recipe on Flower's deployment engine.

The app is three small files: ``pyproject.toml`` (``[tool.flwr.app]``: the components and the run
config, which holds the resolved pflx train config as JSON, the partition the server reads its
public facts from and the ``--out`` directory of the train artifact) and the modules defining the
ServerApp and the ClientApp, which only register pflx's handlers. Run config keys can be
overridden per run: ``flwr run APPDIR --run-config "out='runs/other' round-timeout=60"``.
"""

from __future__ import annotations

import json
from pathlib import Path

PACKAGE = "pflx_flower_app"

SERVER_APP = '''"""ServerApp: pflx's server side (pfl_cli.interop.flower_app.server), writing a train artifact."""

from flwr.serverapp import ServerApp

from pfl_cli.cli.flower import server_main

app = ServerApp()
app.main()(server_main)
'''

CLIENT_APP = '''"""ClientApp: pflx's client side on the SuperNode's own client (pfl_cli.interop.flower_app.node)."""

from flwr.clientapp import ClientApp

from flwr.client.mod import secaggplus_mod

from pfl_cli.interop.flower_app import averaging, node, pefll, pfedhn, secure

app = ClientApp()
app.query("pflx_hello")(node.hello)
# FedAvg, FedProx: one exchange per round, one to evaluate.
app.train("pflx_round")(averaging.train_round)
app.evaluate("pflx_final")(averaging.evaluate_node)
# FedAvg, FedProx under --secagg: Flower's SecAgg+ (its four stages are "train" messages; the mod masks the row).
app.train(mods=[secaggplus_mod])(secure.train_node)
# PeFLL (thesis Alg. 8): three exchanges per round; Alg. 7 (two) to evaluate.
app.train("pflx_pefll_describe")(pefll.describe)
app.train("pflx_pefll_local")(pefll.local_train)
app.train("pflx_pefll_backprop")(pefll.backprop)
app.query("pflx_pefll_describe")(pefll.evaluate_describe)
app.evaluate("pflx_pefll_model")(node.evaluate_model)
# pFedHN (Alg. 1): one exchange per round (also each step of a new client's embedding fit); its model to evaluate.
app.train("pflx_pfedhn_local")(pfedhn.local_train)
app.evaluate("pflx_pfedhn_model")(node.evaluate_model)
'''


def _toml_string(value: str) -> str:
    """A TOML basic string (JSON's escaping is TOML's for these characters)."""
    return json.dumps(value)


def app_files(config: dict, *, partition: Path, out: Path, round_timeout: float, connect_timeout: float,
              min_clients: int) -> dict[str, str]:
    """``{relative path: text}`` of the app for a resolved train ``config`` (see the module docstring)."""
    from pfl_cli import __version__

    run_config = {
        "pflx-config": json.dumps(config, sort_keys=True),
        "partition": str(Path(partition).resolve()),
        "out": str(Path(out).resolve()),
    }
    lines = [f"{k} = {_toml_string(v)}" for k, v in run_config.items()]
    lines += [f"round-timeout = {float(round_timeout)}", f"connect-timeout = {float(connect_timeout)}",
              f"min-clients = {int(min_clients)}", "force = false"]
    pyproject = f'''# A Flower app written by `pflx flower app` (pflx {__version__}): {config["algorithm"]} on Flower.
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "pflx-flower-app"
version = "1.0.0"
description = "pflx {config["algorithm"]} on Flower's deployment engine"
license = "Apache-2.0"
dependencies = ["pflx[flower]"]

[tool.hatch.build.targets.wheel]
packages = ["{PACKAGE}"]

[tool.flwr.app]
publisher = "pflx"

[tool.flwr.app.components]
serverapp = "{PACKAGE}.server_app:app"
clientapp = "{PACKAGE}.client_app:app"

[tool.flwr.app.config]
{chr(10).join(lines)}
'''
    return {"pyproject.toml": pyproject, f"{PACKAGE}/__init__.py": '"""A pflx app for Flower."""\n',
            f"{PACKAGE}/server_app.py": SERVER_APP, f"{PACKAGE}/client_app.py": CLIENT_APP}
