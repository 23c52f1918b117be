"""Hypothesis strategies for command lines: flag values, --set values, config files, corruptions."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from pfl_cli.config import stage_config_class

# Text that breaks parsers in the ways users do: wrong types, non-finite, huge, empty, lists, YAML tricks.
NASTY = ["", " ", "abc", "true", "false", "yes", "no", "perhaps", "null", "~", "nan", ".nan", "inf", "-inf", ".inf",
         "1e309", "-1", "0", "1", "2", "0.5", "1.5", "-0.0", "1e-3", "99999999999999999999", "[1, 2]", "[]", "{a: 1}",
         "{}", "1,2", "1-3", "'x'", '"false"', "eps=1", "eps=-1,delta=2", "a=b=c", "x" * 300, "☃", "0x10", "017",
         "@", "- a", "[", "{", "&a", "*a", "!!python/object:os.system"]

values = st.one_of(
    st.sampled_from(NASTY),
    st.integers(-3, 60).map(str),
    st.integers(-(10**15), 10**15).map(str),
    st.floats(allow_nan=True, allow_infinity=True, width=32).map(repr),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6),
)


def set_items(stage: str):
    """``key=value`` for the stage's real keys (mostly) and a few unknown ones."""
    names = [f.name for f in dataclasses.fields(stage_config_class(stage))]
    keys = st.one_of(st.sampled_from(names), st.sampled_from(["bogus", "num-client", "", " ", "out"]))
    return st.builds(lambda k, v: f"{k}={v}", keys, values)


def config_text(stage: str):
    """A config file's bytes: key: value lines (duplicates possible), a recipe section, or garbage."""
    names = [f.name for f in dataclasses.fields(stage_config_class(stage))]
    line = st.builds(lambda k, v: f"{k}: {v}", st.sampled_from(names + ["bogus"]), values)
    flat = st.lists(line, max_size=5).map(lambda ls: "\n".join(ls) + "\n")
    section = flat.map(lambda t: f"{stage}:\n" + "".join(f"  {x}\n" for x in t.splitlines() if x))
    garbage = st.sampled_from(["- a\n- b\n", "a: [1\n", "\xff\xfe\n", "key: 1\nkey: 2\n", "42\n", "1: 2\n",
                               "!!binary abc\n", "a: &x 1\nb: *x\n"])
    return st.one_of(flat, section, garbage).map(lambda t: t.encode("utf-8", "surrogateescape"))


def flag_args(options: dict[str, object]):
    """A subset of ``options`` (flag -> strategy of its text, or None for a switch) as argv."""
    def build(chosen, draws):
        argv = []
        for flag, text in zip(chosen, draws):
            argv += [flag] if text is None else [flag, text]
        return argv

    return st.lists(st.sampled_from(sorted(options)), unique=True, max_size=4).flatmap(
        lambda chosen: st.tuples(*[options[f] if options[f] is not None else st.none() for f in chosen]).map(
            lambda draws: build(chosen, draws)))


def corruption():
    """How to damage a file: flip a byte, truncate, empty, or replace with other text."""
    return st.one_of(
        st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
        st.tuples(st.just("truncate"), st.floats(0, 1), st.just(0)),
        st.tuples(st.just("replace"), st.sampled_from(['{"a": 1}', "[]", "not json", "\xff", ""]), st.just(0)),
    )


def damage(path, how) -> None:
    kind, where, byte = how
    data = bytearray(path.read_bytes())
    if kind == "flip" and data:
        at = min(int(where * len(data)), len(data) - 1)
        data[at] ^= byte
        path.write_bytes(bytes(data))
    elif kind == "truncate":
        path.write_bytes(bytes(data[: int(where * len(data))]))
    elif kind == "replace":
        path.write_bytes(where.encode("utf-8", "surrogateescape"))
