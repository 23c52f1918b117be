"""What `pflx partition --export flower` prints: how to serve the artifact to a Flower app.

Kept apart from :mod:`pfl_cli.interop.flower` so printing it needs no Flower install.
"""

from __future__ import annotations

from pathlib import Path


def snippet(artifact: str | Path, spec: str) -> str:
    """The Python lines `pflx partition --export flower` prints for this artifact."""
    from pfl_cli.data import parse_spec

    scheme, arg, options = parse_spec(spec)
    lines = ["# pip install 'pflx[flower]'", "from pfl_cli.interop.flower import ArtifactPartitioner", ""]
    if scheme == "hf":
        split = options.get("split")
        lines += ["import datasets",
                  f"data = datasets.load_from_disk({arg!r})" + (f"[{split!r}]" if split else "['train']  # or the single Dataset saved"),
                  "# a parquet folder instead: datasets.load_dataset('parquet', data_dir=...)['train']"]
    else:
        lines += ["from pfl_cli.interop.flower import hf_dataset",
                  f"data = hf_dataset({spec!r})  # columns x (flattened features), label"]
    lines += [f"partitioner = ArtifactPartitioner({str(artifact)!r}, part='train', clients='train')",
              "partitioner.dataset = data",
              "client_data = partitioner.load_partition(0)  # in client_fn: load_partition(partition_id)"]
    return "\n".join(lines)
