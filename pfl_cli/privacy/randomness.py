"""Where every DP mechanism's randomness comes from: OS entropy (``noise=secure``) or the seed (``noise=seeded``).

Threat model (``docs/privacy/threat-model.md``): the machine that runs pflx is trusted; anyone who
receives the artifact is not, and the artifact publishes ``seed`` in ``config.yaml`` and
``manifest.json``. A mechanism whose noise or sampling is drawn from ``seed`` is therefore no
mechanism at all for that reader: they rebuild the noise and subtract it. So under ``--dp``:

- ``noise=secure`` (the default): every draw a guarantee depends on (Gaussian and Laplace noise,
  Poisson sampling of clients and records) comes from the operating system's CSPRNG
  (``os.urandom``, i.e. ``getrandom(2)``), read fresh for each draw and written nowhere.
- ``noise=seeded``: today's named streams of ``seed`` (:mod:`pfl_cli.rng`), bit-for-bit repeatable,
  for simulation studies only; ``privacy.json`` and the output say so.

The seed keeps deciding what is public (model initialization, public data splits).

Samplers (what a secure draw is):

- uniform: 53 random bits from the CSPRNG per float64, ``(k + 1/2) 2^-53`` for k uniform on
  [0, 2^53): never 0 or 1.
- Gaussian: Box-Muller on CSPRNG uniforms, and Opacus's ``secure_mode`` defence against the
  floating-point attacks on Gaussian samplers (Jin et al. 2022, "Are we there yet? Timing and
  floating-point attacks on differential privacy systems", arXiv:2112.05307, after Mironov 2012):
  following Holohan & Braghin 2021 ("Secure random sampling in differential privacy",
  arXiv:2107.10138) a draw of N(0, s^2) is the sum of 2n = 4 independent N(0, s^2) draws divided
  by sqrt(2n) = 2, so the set of floats a draw can land on no longer reveals the value it was
  added to.
- Laplace: the difference of two exponentials ``-ln U`` on CSPRNG uniforms. This is a
  floating-point sampler: it does not implement Mironov's snapping mechanism, so the
  porous-float attack on the Laplace mechanism (Mironov 2012) is not defended against;
  ``privacy.json``'s statement says so.

Neither sampler is constant-time; timing side channels on the machine that runs pflx are out of
scope (that machine is trusted).

Two entry points take a generator and dispatch on what it is: :class:`SecureNumpyGenerator` (a
``numpy.random.Generator`` whose noise and uniform methods are CSPRNG draws; its other methods use
a PCG64 seeded from fresh OS entropy) and :class:`SecureTorchGenerator` (a ``torch.Generator``
seeded from fresh OS entropy, whose mechanism draws go through :func:`uniform` and
:func:`standard_normal`). A mechanism never needs to know which mode it runs in.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from pfl_cli.errors import ConfigError

NOISE_MODES = ("secure", "seeded")
DEFAULT_NOISE = "secure"

SEEDED_STATEMENT = ("simulation only: the noise can be rebuilt from the published seed; no guarantee against anyone "
                    "who holds config.yaml")
SECURE_STATEMENT = ("noise and Poisson sampling drawn from the operating system's CSPRNG (os.urandom), never from "
                    "the seed, and written nowhere: the guarantee holds against anyone who holds the artifact. "
                    "Gaussian noise: Box-Muller on 53-bit CSPRNG uniforms, each draw the sum of 4 divided by 2 "
                    "(Holohan & Braghin 2021, as Opacus secure_mode) against floating-point attacks. Not defended: "
                    "Laplace noise is a floating-point sampler without snapping (Mironov 2012), and no sampler is "
                    "constant-time (timing side channels on the trusted machine are out of scope)")

_BITS = 53
_GAUSSIAN_SUMMANDS = 4  # Holohan & Braghin 2021 / Opacus secure_mode: sum of 4 N(0, s^2), divided by 2


def check_noise(mode: object, *, param: str = "--dp noise") -> str:
    """``mode`` if it is ``secure`` or ``seeded``; else one ConfigError line naming ``param``."""
    if mode not in NOISE_MODES:
        raise ConfigError(f"{param} must be one of {', '.join(NOISE_MODES)} (secure: OS entropy, the default; seeded: "
                          f"repeatable, simulation only); got {mode!r}.")
    return str(mode)


def statement(mode: str) -> dict[str, str]:
    """The ``privacy.json`` keys that say where the mechanisms' randomness came from."""
    check_noise(mode)
    return {"noise": mode, "noise_statement": SEEDED_STATEMENT if mode == "seeded" else SECURE_STATEMENT}


def stamp(mode: str) -> str:
    """The line the human output prints under ``--dp``."""
    if mode == "seeded":
        return f"noise=seeded: {SEEDED_STATEMENT}"
    return "noise=secure: drawn from OS entropy, not from the seed"


# -- the CSPRNG samplers --------------------------------------------------------------------------

def secure_uniform(size: int | tuple[int, ...] | None = None) -> np.ndarray | float:
    """Uniform (0, 1) float64 draws from the OS CSPRNG (53 bits each)."""
    shape = () if size is None else ((int(size),) if np.isscalar(size) else tuple(int(s) for s in size))
    n = math.prod(shape)
    words = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(64 - _BITS)
    out = (words.astype(np.float64) + 0.5) * 2.0 ** -_BITS
    return float(out[0]) if size is None else out.reshape(shape)


def _box_muller(n: int) -> np.ndarray:
    """n standard normals from CSPRNG uniforms (both outputs of each Box-Muller pair)."""
    pairs = (n + 1) // 2
    u = secure_uniform((2, pairs))
    radius = np.sqrt(-2.0 * np.log(u[0]))
    angle = 2.0 * math.pi * u[1]
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n]


def secure_standard_normal(size: int | tuple[int, ...] | None = None) -> np.ndarray | float:
    """N(0, 1) draws from the OS CSPRNG, each the sum of 4 Box-Muller draws divided by 2 (Holohan & Braghin)."""
    shape = () if size is None else ((int(size),) if np.isscalar(size) else tuple(int(s) for s in size))
    n = math.prod(shape)
    # One CSPRNG read for all summands; summing in a fixed order keeps the result a plain float64 sum.
    out = _box_muller(_GAUSSIAN_SUMMANDS * n).reshape(_GAUSSIAN_SUMMANDS, n).sum(0) / math.sqrt(_GAUSSIAN_SUMMANDS)
    return float(out[0]) if size is None else out.reshape(shape)


def secure_laplace(size: int | tuple[int, ...] | None = None) -> np.ndarray | float:
    """Laplace(0, 1) draws from the OS CSPRNG: ``ln U1 - ln U2`` (floating point, no snapping)."""
    u1, u2 = secure_uniform(size), secure_uniform(size)
    return np.log(u1) - np.log(u2)


class SecureNumpyGenerator(np.random.Generator):
    """A numpy generator for ``noise=secure``: its noise and uniform draws come from the OS CSPRNG.

    ``normal``, ``standard_normal``, ``laplace`` and ``random`` (the draws the mechanisms and
    Poisson sampling make) are CSPRNG samplers; every other method (``choice``, ``integers``,
    k-means++ on public server data, ...) uses a PCG64 seeded from 128 fresh bits of OS entropy,
    never from ``seed``. ``spawn`` hands out secure generators too.
    """

    def __init__(self) -> None:
        super().__init__(np.random.PCG64(np.random.SeedSequence()))  # SeedSequence() reads OS entropy

    def spawn(self, n_children: int) -> list["SecureNumpyGenerator"]:
        return [SecureNumpyGenerator() for _ in range(int(n_children))]

    def random(self, size=None, dtype=np.float64, out=None):
        if out is not None or np.dtype(dtype) != np.float64:
            raise TypeError("SecureNumpyGenerator.random draws float64 without out=.")
        return secure_uniform(size)

    def standard_normal(self, size=None, dtype=np.float64, out=None):
        if out is not None or np.dtype(dtype) != np.float64:
            raise TypeError("SecureNumpyGenerator.standard_normal draws float64 without out=.")
        return secure_standard_normal(size)

    def normal(self, loc=0.0, scale=1.0, size=None):
        if size is None:
            size = np.broadcast(np.asarray(loc), np.asarray(scale)).shape or None
        return loc + np.asarray(scale) * secure_standard_normal(size)

    def laplace(self, loc=0.0, scale=1.0, size=None):
        if size is None:
            size = np.broadcast(np.asarray(loc), np.asarray(scale)).shape or None
        return loc + np.asarray(scale) * secure_laplace(size)


def _torch_generator_class():
    import torch

    global SecureTorchGenerator
    if SecureTorchGenerator is None:
        class _SecureTorchGenerator(torch.Generator):
            """A ``torch.Generator`` for ``noise=secure``: seeded from OS entropy; mechanism draws are CSPRNG."""

        SecureTorchGenerator = _SecureTorchGenerator
    return SecureTorchGenerator


SecureTorchGenerator: Any = None  # defined on first use, so that importing this module never imports torch


def secure_torch_generator(device: Any = "cpu"):
    """A :class:`SecureTorchGenerator` on ``device``, its own state seeded from 63 fresh bits of OS entropy.

    That state serves the draws that are not a mechanism's (a uniform cohort, the batches of a head
    trained on the client); in a distributed run every rank takes rank 0's seed, so they agree.
    """
    import torch

    seed = torch.tensor([int.from_bytes(os.urandom(8), "little") & 0x7FFF_FFFF_FFFF_FFFF], dtype=torch.int64)
    gen = _torch_generator_class()(device=device)
    gen.manual_seed(int(_same_on_every_rank(seed)[0]))
    return gen


def _is_secure_torch(gen) -> bool:
    return SecureTorchGenerator is not None and isinstance(gen, SecureTorchGenerator)


def uniform(gen, shape, *, device=None):
    """Uniform [0, 1) draws of ``shape`` for a mechanism's sampling (Poisson cohorts and batches).

    A plain ``torch.Generator`` draws as ``torch.rand(shape, generator=gen)`` (``noise=seeded``);
    a :class:`SecureTorchGenerator` draws from the OS CSPRNG.
    """
    import torch

    device = gen.device if device is None else device
    if _is_secure_torch(gen):
        return _same_on_every_rank(torch.from_numpy(secure_uniform(tuple(shape))).to(device=device))  # float64: never 1
    return torch.rand(shape, generator=gen, device=device)


def standard_normal(gen, shape, *, dtype=None):
    """N(0, 1) draws of ``shape`` on ``gen.device`` for a mechanism's noise (see :func:`uniform`)."""
    import torch

    dtype = torch.get_default_dtype() if dtype is None else dtype
    if _is_secure_torch(gen):
        return _same_on_every_rank(torch.from_numpy(secure_standard_normal(tuple(shape))).to(device=gen.device,
                                                                                             dtype=dtype))
    return torch.randn(shape, generator=gen, device=gen.device, dtype=dtype)


def _same_on_every_rank(draw):
    """Rank 0's draw on every rank of a distributed run: the ranks split one cohort, so they must share its draws.

    (Seeded streams agree across ranks by construction; OS entropy does not.)
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return draw
    if dist.get_backend() == "nccl" and draw.device.type != "cuda":
        import torch

        on_gpu = draw.to(torch.device("cuda", torch.cuda.current_device()))
        dist.broadcast(on_gpu, src=0)
        return on_gpu.to(draw.device)
    dist.broadcast(draw, src=0)
    return draw


class MechanismRandomness:
    """The one source of a DP stage's mechanism draws.

    Parameters
    ----------
    mode : {"secure", "seeded"}
    seed : int
        The run's seed; read only under ``noise=seeded``.

    Examples
    --------
    >>> src = MechanismRandomness("seeded", 0)
    >>> float(src.numpy("cluster").random()) == float(MechanismRandomness("seeded", 0).numpy("cluster").random())
    True
    >>> isinstance(MechanismRandomness("secure", 0).numpy("cluster"), SecureNumpyGenerator)
    True
    """

    def __init__(self, mode: str, seed: int) -> None:
        self.mode = check_noise(mode)
        self.seed = seed

    @property
    def seeded(self) -> bool:
        return self.mode == "seeded"

    def numpy(self, name: str) -> np.random.Generator:
        """Stream ``name``: :func:`pfl_cli.rng.make_rng` when seeded, else fresh OS entropy."""
        from pfl_cli.rng import make_rng

        return make_rng(self.seed, name) if self.seeded else SecureNumpyGenerator()

    def torch(self, name: str, device: Any = "cpu"):
        """Stream ``name`` as a torch generator: :func:`pfl_cli.rng.torch_generator` when seeded, else secure."""
        from pfl_cli.rng import torch_generator

        return torch_generator(self.seed, name, device) if self.seeded else secure_torch_generator(device)


def noise_source(mode: str, seed: int) -> MechanismRandomness:
    """The randomness of a DP stage's mechanisms under ``--dp ...,noise=mode``."""
    return MechanismRandomness(mode, seed)


def train_randomness(cfg) -> MechanismRandomness:
    """``train``'s source: seeded without ``--dp`` (nothing to protect), else as ``--dp noise=`` says."""
    return noise_source("seeded" if cfg.dp_epsilon is None else cfg.dp_noise, cfg.seed)


def mechanism_generator(cfg, name: str, device: Any = "cpu"):
    """The torch generator of a training mechanism's stream ``name`` (e.g. ``dp-noise-{t}``) under ``cfg``."""
    return train_randomness(cfg).torch(name, device)
