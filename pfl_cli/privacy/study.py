"""A study's best config used to train: what choosing it cost, and whether it may be used under ``--dp``.

Choosing a config is a mechanism on the data the study read (Papernot & Steinke 2022, "Hyperparameter
Tuning with Renyi Differential Privacy", ICLR), and training with it on the same data is a second one:
sequential composition adds their epsilons. A study chosen *without* DP on the private data released
its choice unprotected, so a ``--dp`` run with it on that data promises nothing about the choice.

The facts travel in the file: ``tune`` writes a ``provenance`` mapping at the top of ``best.yaml``
(:func:`provenance_block`), which :func:`pfl_cli.config.load_config_file` sets aside, so a best.yaml
copied out of its study still says what it is:

- ``private`` (the study ran under ``--dp``) and, then, ``ledger``: the study's ``privacy.json`` (public:
  a released ledger);
- ``partition``: the study's partition: ``fingerprint`` (a keyed digest under the partition's own secret key,
  :func:`pfl_cli.manifest.partition_fingerprint`: nothing about the data without the key) and, for a
  non-private study only, ``path`` (absolute, where it was), ``recipe`` (public options and seed) and
  ``sha256`` (its manifest publishes it anyway). A private study's file is a release, checked for private counts
  among its numbers: it holds no path or digest; in its study artifact the manifest names the partition.

:func:`study_prior` decides, for ``train`` / ``tune`` / ``compare --spec`` with ``--config FILE``:

- a private study on this partition (same fingerprint or sha256, the same path, or a copy or re-creation of
  it: :func:`same_partition`): its ledger composes into the run's ``privacy.json``;
- a private study on another partition: a note (pflx cannot tell whether the two hold the same people);
- a file whose header says it is a private study's release but that carries no provenance and lies outside
  its study: refused (its epsilon would be dropped silently);
- a non-private study on this partition, under ``--dp``: refused unless ``allow_nonprivate`` (the user's
  explicit opt-in, ``train --allow-nonprivate-config``); on another partition: a note.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pfl_cli.errors import ConfigError

PROVENANCE_KEY = "provenance"
PRIVATE_HEADER = "# pflx tune --dp:"  # the first line of a private study's best.yaml
ALLOW_NONPRIVATE_FLAG = "--allow-nonprivate-config"


@dataclass(frozen=True)
class StudyPrior:
    """What training with a study's best config must carry: the study's ledger to compose (None: nothing) and a
    note for the user (None: nothing to say)."""

    ledger: Any = None
    note: str | None = None

    def __iter__(self):  # (ledger, note), as the commands unpack it
        return iter((self.ledger, self.note))

    def __getitem__(self, i: int):
        return (self.ledger, self.note)[i]


def partition_block(part_art, *, private: bool) -> dict:
    """The ``partition`` entry of a study's provenance (see the module docstring)."""
    from pfl_cli.manifest import partition_fingerprint
    from pfl_cli.overlap import partition_recipe

    block = {"fingerprint": partition_fingerprint(part_art.manifest, part_art.content_hash)}
    if not private:  # a private study's best.yaml is a release: no path or digest whose digits could collide with
        # a private count (check_release_contract); its study artifact's manifest still names the partition
        block.update({"path": str(Path(part_art.path).resolve()), "recipe": partition_recipe(part_art),
                      "sha256": part_art.content_hash})
    return block


def provenance_block(part_art, *, ledger_doc: Mapping | None) -> str:
    """The YAML text of a study's provenance, for the top of its best.yaml (``ledger_doc``: its privacy.json
    under ``--dp``, None for a non-private study)."""
    import yaml

    private = ledger_doc is not None
    block: dict[str, Any] = {"private": private, "partition": partition_block(part_art, private=private)}
    if private:
        block["ledger"] = dict(ledger_doc)
    return yaml.safe_dump({PROVENANCE_KEY: block}, sort_keys=False)


def read_provenance(config_file: Path) -> dict | None:
    """The provenance a config file carries (None: none), or the one its study artifact records when the file is
    a study's best.yaml written before provenance travelled in it; refused when the file's header says it is a
    private study's release and neither is found."""
    from pfl_cli import yaml12
    from pfl_cli.formats import read_utf8

    text = read_utf8(Path(config_file), "--config", ConfigError)
    try:
        data = yaml12.loads(text)
    except Exception:  # noqa: BLE001 - load_config_file reports a malformed file with its own message
        return None
    block = data.get(PROVENANCE_KEY) if isinstance(data, dict) else None
    found = _from_study_artifact(Path(config_file))
    if isinstance(block, dict):
        block = _checked(block, config_file)
        if found is not None:  # in its study: the study's manifest names the partition's path too
            block = {**block, "study": found["study"],
                     "partition": {**found["partition"], **{k: v for k, v in block["partition"].items() if v}}}
        return block
    if found is None and text.startswith(PRIVATE_HEADER):
        raise ConfigError(f"--config {config_file}: its header says it is the release of a private study (pflx tune "
                          "--dp), but it carries no provenance and lies outside its study, so the study's epsilon "
                          "cannot be composed with this run's. Use the study's own best.yaml (OUT/best.yaml), or one "
                          "copied from it by a pflx that writes provenance (re-run the study).")
    return found


def _checked(block: dict, config_file: Path) -> dict:
    private = block.get("private")
    part = block.get("partition")
    if not isinstance(private, bool) or not isinstance(part, dict) or (private and not isinstance(block.get("ledger"),
                                                                                                  dict)):
        raise ConfigError(f"--config {config_file}: provenance must hold private (true or false), partition (a "
                          "mapping) and, for a private study, ledger (its privacy.json); the file was edited. Use the "
                          "study's best.yaml as written.")
    return block


def _from_study_artifact(config_file: Path) -> dict | None:
    """The provenance of a best.yaml inside its (older) tune artifact, from the artifact's manifest and ledger."""
    import json

    from pfl_cli.errors import ArtifactError
    from pfl_cli.readers import read_artifact

    here = config_file.resolve().parent
    if not (here / "manifest.json").is_file():
        return None
    try:
        art = read_artifact(here, ["tune"], flag="--config")
    except ArtifactError:
        return None
    if config_file.name not in {o.get("path") for o in art.manifest.get("outputs", [])}:
        return None
    private = art.has("privacy.json")
    studied = next((i for i in art.manifest.get("inputs", []) if i.get("stage") == "partition"), {})
    # the recorded relative path read by its letters from the study as typed (with runs -> /scratch/runs,
    # runs/study's ../../part is the tree's part; from the resolved study it would be /scratch's)
    where = Path(studied["path"]) if studied.get("path") else None
    if studied.get("relative_path"):
        folded = Path(os.path.normpath(Path(os.path.abspath(config_file)).parent / studied["relative_path"]))
        where = folded if folded.exists() else here / studied["relative_path"]
    block: dict[str, Any] = {"private": private,
                             "partition": {"path": None if where is None else str(where.resolve()),
                                           "sha256": studied.get("sha256"), "fingerprint": studied.get("fingerprint")}}
    if private:
        block["ledger"] = json.loads(art.file("privacy.json").read_text())
    block["study"] = str(here)
    return block


def same_partition(recorded: Mapping, part_art) -> bool:
    """Whether ``part_art`` hands out the records of the study's partition ``recorded`` (its provenance entry):
    the same fingerprint or sha256; or, where the study's partition is still found at its path, that one itself,
    a byte-identical copy, or the same recipe (stage, version, options, seed) over a dataset of the same content
    digest (a partition is a deterministic function of the two; DESIGN.md section 5). Both are read on this
    machine, which holds the private data: nothing is published."""
    import json

    from pfl_cli.errors import ArtifactError
    from pfl_cli.manifest import partition_fingerprint
    from pfl_cli.overlap import partition_recipe
    from pfl_cli.readers import read_artifact

    if recorded.get("sha256") and recorded["sha256"] == part_art.content_hash:
        return True
    mine = partition_fingerprint(part_art.manifest, part_art.content_hash)
    if recorded.get("fingerprint") and recorded["fingerprint"] == mine:
        return True
    path = recorded.get("path")
    if not path or not (Path(path) / "manifest.json").is_file():
        return False
    if Path(path).resolve() == Path(part_art.path).resolve():
        return True
    try:
        theirs = read_artifact(path, ["partition"], flag="--config's study partition", verify=False)
        if theirs.content_hash == part_art.content_hash:
            return True
        data = [(json.loads(x.file("dataset.json").read_text()).get("source") or {}).get("content_sha256")
                for x in (theirs, part_art)]
    except (ArtifactError, OSError, ValueError):
        return False
    return partition_recipe(theirs) == partition_recipe(part_art) and data[0] is not None and data[0] == data[1]


def study_prior(config_file: Path | None, partition, cfg, *, allow_nonprivate: bool = False) -> StudyPrior:
    """What training ``cfg`` on ``partition`` (a partition artifact directory, or its read
    :class:`~pfl_cli.manifest.Artifact`) with ``--config config_file`` must carry (see the module docstring): the
    study's ledger to compose, a note, or a refusal (ConfigError, exit 2)."""
    from pfl_cli.readers import read_artifact

    if config_file is None:  # the common case, and every refusal that comes after: no dp_accounting (issue 49)
        return StudyPrior()
    from pfl_cli.privacy.ledger import PrivacyLedger

    prov = read_provenance(Path(config_file))
    if prov is None:
        return StudyPrior()
    part_art = (partition if hasattr(partition, "manifest")
                else read_artifact(partition, ["partition"], flag="--partition", verify=False))
    dp = cfg.dp_epsilon is not None
    same = same_partition(prov["partition"], part_art)
    where = prov["partition"].get("path") or "an unrecorded partition"
    if not prov["private"]:
        if not dp:
            return StudyPrior()
        if same and not allow_nonprivate:
            raise ConfigError(
                f"--config {config_file}: chosen by a study without --dp on this --partition ({part_art.path}): its "
                "hyperparameters were selected on the private data with no privacy guarantee, so this --dp run's "
                f"epsilon would not cover them. Tune with pflx tune --dp, or pass {ALLOW_NONPRIVATE_FLAG} to train "
                "with it anyway (the choice of config is then not private).")
        if same:
            return StudyPrior(note=f"{ALLOW_NONPRIVATE_FLAG}: --config was chosen without DP on this partition; the "
                                   "guarantee in privacy.json covers the training, not the choice of config.")
        return StudyPrior(note=f"--config {config_file} was chosen by a study without --dp on {where}; if that "
                               "partition holds any of these people, the choice of config is not covered by "
                               "this run's epsilon.")
    if not dp:
        return StudyPrior()
    if not same:
        study = prov.get("study") or str(Path(config_file).resolve().parent)
        return StudyPrior(note=f"--config {config_file} is the release of a private study on {where}, not on "
                               f"--partition {part_art.path}; if the two hold the same people, their epsilons "
                               f"compose: pflx privacy-account {study} OUT.")
    try:
        ledger = PrivacyLedger.from_dict(prov["ledger"])
    except (ValueError, TypeError, KeyError) as err:
        raise ConfigError(f"--config {config_file}: its provenance ledger is not a privacy.json ({err}); the file "
                          "was edited. Use the study's best.yaml as written.") from None
    unit = cfg.algorithm_class.dp_unit
    if ledger.unit != unit or abs(ledger.delta - cfg.dp_delta) > 1e-12 * max(ledger.delta, cfg.dp_delta):
        raise ConfigError(f"--config {config_file}: the private study that chose it (a {ledger.unit}-level ledger at "
                          f"delta {ledger.delta:g}) ran on this --partition, and its epsilon composes with this run's "
                          f"({unit}-level, delta {cfg.dp_delta:g}) only at the same unit and delta; run with --dp "
                          f"delta={ledger.delta:g} and an algorithm of the same unit, or account both with pflx "
                          "privacy-account.")
    return StudyPrior(ledger, "privacy.json composes the private study that chose --config with this run (both "
                              "read --partition); pflx privacy-account shows the total.")
