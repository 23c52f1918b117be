"""pfl_cli.privacy.randomness: the secure samplers against their distributions, seeded streams, dispatch, modes."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from pfl_cli.errors import ConfigError
from pfl_cli.privacy import randomness as R
from pfl_cli.privacy.release import parse_dp_spec
from pfl_cli.rng import make_rng, torch_generator

N = 200_000


def test_secure_uniform_is_uniform_on_the_open_interval():
    u = R.secure_uniform(N)
    assert u.dtype == np.float64 and 0.0 < u.min() and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-4
    # 53 random bits each: all values distinct in a sample this size (2^53 >> N^2)
    assert len(np.unique(u)) == N


def test_secure_standard_normal_is_standard_normal():
    x = R.secure_standard_normal((N // 2, 2))
    assert x.shape == (N // 2, 2)
    assert stats.kstest(x.ravel(), "norm").pvalue > 1e-4
    assert abs(x.std() - 1) < 5 / math.sqrt(2 * N)  # chi-square: 5 std


def test_secure_laplace_is_laplace():
    assert stats.kstest(R.secure_laplace(N), "laplace").pvalue > 1e-4


def test_secure_numpy_generator_draws_from_the_csprng_and_spawns_secure_children():
    g = R.SecureNumpyGenerator()
    assert isinstance(g, np.random.Generator)
    assert all(isinstance(c, R.SecureNumpyGenerator) for c in g.spawn(3))
    x = g.normal(2.0, 3.0, size=N)
    assert stats.kstest((x - 2.0) / 3.0, "norm").pvalue > 1e-4
    assert stats.kstest(g.laplace(0.0, 2.0, size=N) / 2.0, "laplace").pvalue > 1e-4
    assert isinstance(g.random(), float) and g.random((3, 2)).shape == (3, 2)
    # two secure generators never agree (no seed decides them)
    assert not np.array_equal(R.SecureNumpyGenerator().random(8), R.SecureNumpyGenerator().random(8))


def test_seeded_streams_are_the_named_streams_of_the_seed():
    src = R.MechanismRandomness("seeded", 5)
    assert np.array_equal(src.numpy("cluster").random(4), make_rng(5, "cluster").random(4))
    draw = R.standard_normal(src.torch("dp-noise-3"), (6,))
    assert torch.equal(draw, torch.randn(6, generator=torch_generator(5, "dp-noise-3")))
    assert torch.equal(R.uniform(src.torch("round-1"), (6,)), torch.rand(6, generator=torch_generator(5, "round-1")))


def test_secure_torch_draws_do_not_depend_on_the_seed_and_are_calibrated():
    src = R.MechanismRandomness("secure", 5)
    gen = src.torch("dp-noise-0")
    assert isinstance(gen, torch.Generator) and R._is_secure_torch(gen)
    a, b = R.standard_normal(gen, (N,), dtype=torch.float64), R.standard_normal(src.torch("dp-noise-0"), (N,))
    assert a.dtype == torch.float64 and b.dtype == torch.get_default_dtype()
    assert not torch.equal(a[:8].float(), b[:8])
    assert stats.kstest(a.numpy(), "norm").pvalue > 1e-4
    u = R.uniform(gen, (1000,))
    assert u.dtype == torch.float64 and 0 < float(u.min()) and float(u.max()) < 1


def test_train_randomness_is_seeded_without_dp():
    from pfl_cli.fl.config import TrainConfig

    assert R.train_randomness(TrainConfig()).mode == "seeded"
    assert R.train_randomness(TrainConfig(dp_epsilon=1.0)).mode == "secure"
    assert R.train_randomness(TrainConfig(dp_epsilon=1.0, dp_noise="seeded")).mode == "seeded"


def test_noise_key_of_dp_spec():
    assert parse_dp_spec("eps=1").noise == "secure"
    assert parse_dp_spec("eps=1,noise=seeded").noise == "seeded"
    with pytest.raises(ConfigError, match=r"^--dp noise must be one of secure, seeded .*got 'fast'\.$"):
        parse_dp_spec("eps=1,noise=fast")


def test_statement_says_which():
    assert R.statement("seeded")["noise_statement"].startswith("simulation only: the noise can be rebuilt")
    assert "not defended" in R.statement("secure")["noise_statement"].lower()
    with pytest.raises(ConfigError):
        R.statement("maybe")


def _draw_on_rank(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        gen = R.secure_torch_generator()
        draws = torch.cat([R.standard_normal(gen, (4,), dtype=torch.float64), R.uniform(gen, (3,)),
                           torch.randperm(5, generator=gen).double()])  # its own state too: rank 0's seed
        torch.save(draws, f"{out}-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_secure_draws_are_rank_0s_on_every_rank(tmp_path):
    """Distributed ranks split one cohort, so they must share its OS-entropy draws (seeded ones agree by seed)."""
    import torch.multiprocessing as mp

    mp.spawn(_draw_on_rank, args=(f"file://{tmp_path / 'store'}", str(tmp_path / "draw")), nprocs=2, join=True)
    a, b = (torch.load(tmp_path / f"draw-{r}.pt") for r in (0, 1))
    assert torch.equal(a, b) and a.std() > 0
