"""An in-process stand-in for Flower's ``Grid``: messages go straight to the generated ClientApp.

Each node is a ``Context`` with its own node config, as a SuperNode would pass it; the ClientApp
is the one ``pflx flower app`` wrote (imported from the app directory), so these tests run the
shipped handlers with Flower's own ``Message`` / ``RecordDict`` types, without processes. A node
in ``dead`` never replies (a killed SuperNode); ``send_and_receive`` then returns without it, as
Flower's does when its timeout passes.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path


def load_client_app(app_dir: Path):
    path = app_dir / "pflx_flower_app" / "client_app.py"
    spec = importlib.util.spec_from_file_location("pflx_test_client_app", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.app


def run_config(app_dir: Path) -> dict:
    import tomllib

    return dict(tomllib.loads((app_dir / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])


class FakeGrid:
    def __init__(self, app_dir: Path, node_configs: dict[int, dict], *, run_config_overrides: dict | None = None):
        from flwr.app import Context, RecordDict
        from flwr.supercore.task_identity import TaskIdentity

        # What the flwr-serverapp process sets before the ServerApp creates messages.
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        self.client_app = load_client_app(app_dir)
        self.run_config = {**run_config(app_dir), **(run_config_overrides or {})}
        self.contexts = {node: Context(run_id=1, node_id=node, node_config=cfg, state=RecordDict(),
                                       run_config=self.run_config) for node, cfg in node_configs.items()}
        self.dead: set[int] = set()
        self.sent: list[str] = []

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app import Error, Message

        replies = []
        for message in messages:
            node = message.metadata.dst_node_id
            self.sent.append(message.metadata.message_type)
            if node in self.dead:
                continue
            try:  # a copy, as the wire delivers one: a node must not change the server's message (Flower's
                # SecAgg+ workflow sends one content object to every node, and its client mod pops from it)
                replies.append(self.client_app(copy.deepcopy(message), self.contexts[node]))
            except Exception as err:  # Flower turns a failing ClientApp into an error reply
                replies.append(Message(Error(code=0, reason=f"{type(err).__name__}: {err}"), reply_to=message))
        return replies

    def server_context(self):
        from flwr.app import Context, RecordDict

        return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=self.run_config)
