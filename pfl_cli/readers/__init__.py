"""One reader per artifact file kind: what a payload file must hold before any command uses it.

A manifest's hashes prove a file is the one the writer wrote; they say nothing about a file
someone edited and re-hashed, or one an older or foreign tool wrote. So every command reads a
payload file through the reader of its kind, which checks types, shapes, dtypes, ranges and
consistency with the other files of the artifact (and with the manifest's config), and refuses
anything else with one line naming the artifact, the file and the rule (ArtifactError, exit 2).

- the directory and its ``manifest.json``: :func:`read_artifact` (:mod:`.artifact`, with
  :func:`pfl_cli.manifest.check_manifest`), :func:`load_partition` for a whole partition, and
  :func:`input_location` for where an input artifact a manifest names is now;
- ``dataset.json``, ``stats.json``, ``metrics.json``, ``mdm.json``: :mod:`.documents`;
- ``clients.npz`` (and the partition's files together), a train artifact's ``train_samples.npz``: :mod:`.clients`;
- ``model.pt``: :mod:`.model` (imports torch when called);
- ``privacy.json``: :mod:`.ledger`;
- the checkpoint: its location and its state's fields, :mod:`.checkpoint`.

``docs/reference/artifact-checks.md`` lists each rule. Nothing here imports torch at module
level: ``show`` and ``privacy-account`` use these readers and never import torch.

Layers: the readers import :mod:`pfl_cli.manifest` and :mod:`pfl_cli.formats` (and, inside the
functions that build one, the object they read into: a Partition, MDM parameters, a privacy
ledger), never the writer (:mod:`pfl_cli.artifacts`) or the engine (:mod:`pfl_cli.fl`), which
both import the readers.
"""

from pfl_cli.readers.artifact import input_location, load_partition, read_artifact
from pfl_cli.readers.checkpoint import check_checkpoint_location, check_checkpoint_state
from pfl_cli.readers.clients import read_clients, read_partition_files, read_train_samples
from pfl_cli.readers.documents import read_dataset_info, read_mdm, read_metrics, read_stats
from pfl_cli.readers.ledger import read_ledger

__all__ = ["check_checkpoint_location", "check_checkpoint_state", "input_location", "load_partition", "read_artifact",
           "read_clients", "read_dataset_info", "read_ledger", "read_mdm", "read_metrics", "read_model_payload", "read_partition_files",
           "read_stats", "read_train_samples"]


def read_model_payload(*args, **kwargs):
    """:func:`pfl_cli.readers.model.read_model_payload` (imported on use: it needs torch)."""
    from pfl_cli.readers.model import read_model_payload as read

    return read(*args, **kwargs)
