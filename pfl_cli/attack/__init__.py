"""Gradient-inversion attacks on what clients upload (``pflx attack``; HyperFL §5, App. D)."""

# The names load on first use (PEP 562): the algorithms import pfl_cli.attack.protocol, and a train run
# found up to date loads no attack.
_WHERE = {"AttackConfig": "config", "AttackRun": "api", "attack_model": "api", "psnr": "metrics", "ssim": "metrics"}
__all__ = ["AttackConfig", "AttackRun", "attack_model", "psnr", "ssim"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
