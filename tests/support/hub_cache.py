"""A Hugging Face hub cache written on disk, in the layout `huggingface_hub` reads offline.

    HF_HUB_CACHE/models--ORG--NAME/blobs/<sha256>                  file contents
    HF_HUB_CACHE/models--ORG--NAME/snapshots/<commit>/<file>       symlinks to the blobs
    HF_HUB_CACHE/models--ORG--NAME/refs/<branch or tag>            the commit it points at
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def add_snapshot(cache: Path, repo_id: str, source: Path, commit: str, refs: tuple[str, ...] = ("main",),
                 skip: tuple[str, ...] = ()) -> Path:
    """Put the files of `source` into the cache as `repo_id` at `commit`; returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in sorted(source.iterdir()):
        if not f.is_file() or f.name in skip:
            continue
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / f.name)
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot
