"""Closed-form leaks from one client's one-step upload (Phong et al. 2017; iDLG, Zhao et al. 2020).

For one sample and a first layer z = W x + b, dL/dW = (dL/db) x^T, so any row j with
dL/db_j != 0 gives x = (dL/dW)[j, :] / (dL/db)[j] exactly (Phong et al. 2017).
For cross-entropy the last layer's bias gradient is softmax(z) - onehot(y): its only
negative entry is the label (iDLG, Zhao, Mopuri & Bilen 2020).

A one-step SGD upload is delta = -lr (s g + wd theta) with an unknown clip factor s > 0;
:func:`scaled_gradient` undoes the known parts, leaving s g, and both rules are invariant to s.
"""

from __future__ import annotations

from pfl_cli.fl.cohort import scaled_gradient  # noqa: F401 - the attack's inversion of one SGD step


def recover_affine_input(grad_w, grad_b):
    """x from the gradients of a biased affine layer: grad_w (n, out, in), grad_b (n, out) -> (n, in).

    Uses, per target, the row with the largest |dL/db_j| (the best-conditioned division).
    """
    import torch

    j = grad_b.abs().argmax(1)
    rows = torch.arange(grad_b.shape[0], device=grad_b.device)
    return grad_w[rows, j] / grad_b[rows, j][:, None]


def infer_labels(grad_last_bias):
    """iDLG: the label of each single-sample target from its last-layer bias gradient (n, C) -> (n,)."""
    return grad_last_bias.argmin(1)


def first_affine(names: list[str], shapes: dict) -> tuple[str, str] | None:
    """Names of the model's first layer weight and bias when it is fully connected with a bias."""
    if len(names) < 2:
        return None
    w, b = names[0], names[1]
    if w.endswith("weight") and b.endswith("bias") and len(shapes[w]) == 2 and len(shapes[b]) == 1:
        return w, b
    return None


def last_bias(names: list[str]) -> str | None:
    """Name of the output layer's bias (the last parameter, when it is a bias)."""
    return names[-1] if names and names[-1].endswith("bias") else None


def recover_generated_weights(hnet, grads: dict) -> tuple[object, dict]:
    """The hypernetwork features z and the generated weights theta from one sample's hypernetwork gradient.

    The heads are affine, theta_k = A_k z + b_k, so dL/dA_k = (dL/dtheta_k) z^T and
    dL/db_k = dL/dtheta_k: z follows from any head by :func:`recover_affine_input`, and then
    theta = h's heads at z, without the client's embedding v or its classifier (Phong et al. 2017,
    the leak through HyperFL's upload of phi when it is one gradient step).

    Parameters
    ----------
    hnet : pfl_cli.models.hypernetwork.HyperNetwork (weights known to the server)
    grads : dict name -> Tensor, the gradient for ``hnet.named_parameters()`` names.

    Returns
    -------
    z : Tensor (hidden,), theta : dict target name -> Tensor
    """
    import torch

    heads = [(f"heads.{i}.weight", f"heads.{i}.bias") for i in range(len(hnet.heads))]
    best = max(heads, key=lambda h: float(grads[h[1]].abs().max()))  # the best-conditioned head
    z = recover_affine_input(grads[best[0]][None], grads[best[1]][None])[0]
    with torch.no_grad():
        theta = {name: head(z).reshape(hnet.target_shapes[name]) for name, head in zip(hnet.target_names, hnet.heads)}
    return z, theta
