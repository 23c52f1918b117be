"""What an algorithm implements to be attacked by ``pflx attack`` (HyperFL §5): the :class:`Attackable` mixin.

``Algorithm`` (``pfl_cli.algorithms.base``) has only the round hooks; an algorithm whose clients'
uploads ``pflx attack`` can model mixes this in and says what a client sends (:meth:`upload`).
This module imports nothing of ``pfl_cli.algorithms`` or the registry, so algorithms import it
without a cycle between the packages.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class Attackable(ABC):
    """Hooks of an honest-but-curious server's model of a client's upload (``pflx attack``)."""

    # Whether upload() is what this algorithm's clients really send (pflx attack refuses the others):
    # a subclass whose round differs from the parent's must say False (FedProx's proximal steps).
    models_upload = True
    upload_under_dp = False   # whether upload() models what a client of a --dp run sends

    @abstractmethod
    def upload(self, x, y, *, steps: int, noise_gen=None, start=None, clients=None, private=None) -> tuple[dict, dict]:
        """What a client holding batch ``(x, y)`` sends the server, differentiably in ``x``.

        x (n, b, *input_shape), y (n, b): one batch per simulated client (attack target);
        ``steps`` as in :meth:`local_update`: 0 the gradient, k the delta after k local SGD steps,
        None (``--upload weights``) the delta of the client's whole local update in a trained
        round with (x, y) as its data, one batch (:meth:`round_upload_steps`). ``noise_gen``: the simulated client's noise where
        the client itself adds noise (local DP); None gives the noise-free message (the
        attacker's model of it). ``start``: the client model the server sent, when the caller
        knows it (the attacker does); None: the algorithm's own. ``clients`` (n,): the
        partition position of each target's client (whose server-side state picks ``start``).
        ``private``: the client's private tensors (:meth:`attack_private`), the attacker's
        guesses; None: the client's own.
        Returns ``(message, start)``: the uploaded tensors by name, each with a leading
        target axis, and the client model ``theta`` the server sent (what an attacker knows).
        """

    def attack_private(self, n: int) -> dict:
        """The attacker's starting guess (n, *shape) per name of the client state it never sees.

        The attack optimizes these jointly with the images (HyperFL's joint attack, §5);
        empty when the server knows every input of the upload but the data.
        """
        return {}

    def leaked_gradients(self, message: dict, start: dict) -> dict:
        """The client net's gradients (up to one positive factor per target) that a one-step upload reveals.

        For the closed-form attacks (Phong et al. 2017; iDLG): ``grad/<name>`` as sent, or
        ``delta/<name>`` of one SGD step with its known learning rate and weight decay undone.
        Names in the client net's order.
        """
        from pfl_cli.fl.cohort import scaled_gradient

        sgd = self.sgd_update_options()
        out = {}
        for k in start:
            if f"grad/{k}" in message:
                out[k] = message[f"grad/{k}"]
            elif f"delta/{k}" in message:
                out[k] = scaled_gradient(message[f"delta/{k}"], start[k], lr=sgd["lr"],
                                         weight_decay=sgd["weight_decay"])
        return out

    def local_update(self, start: dict, x, y, steps: int | None) -> dict:
        """The client's update from ``start`` on (x, y), on the autograd graph, with prefixed names.

        ``steps = 0``: ``grad/<name>``, the gradient of the batch loss at ``start`` (FedSGD, the
        papers' attack setting); ``steps = k``: ``delta/<name>``, theta_new - theta after k of
        this algorithm's local SGD steps (clip, momentum, weight decay as trained); ``None``:
        the :meth:`round_upload_steps` of a trained round.
        """
        from pfl_cli.fl.cohort import batch_gradients, unrolled_sgd

        if steps is None:
            steps = self.round_upload_steps()
        if steps == 0:
            return {f"grad/{k}": g for k, g in batch_gradients(self.net, start, x, y).items()}
        new = unrolled_sgd(self.net, start, x, y, steps, **self.sgd_update_options())
        return {f"delta/{k}": new[k] - start[k] for k in start}

    def round_upload_steps(self) -> int:
        """Local SGD steps behind a client's uploaded weights in a trained round when its data is one
        batch no larger than ``batch_size`` (an epoch is then one step): ``--upload weights``.

        The round's schedule; algorithms whose rounds always take ``local_steps`` (pFedHN, PeFLL,
        DP-FedAvg) or run stages (HyperFL) say so.
        """
        return getattr(self.cfg, "local_epochs", None) or self.cfg.local_steps


def attackable(cls) -> bool:
    """Whether ``pflx attack`` models the uploads of algorithm class ``cls``."""
    return isinstance(cls, type) and issubclass(cls, Attackable) and cls.models_upload
