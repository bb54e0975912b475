"""Hugging Face hub ids as models: fetched through `huggingface_hub` into its cache.

`org/name` (optionally at a revision: a branch, tag or commit) is downloaded with
`snapshot_download`, only the files an engine reads: config, tokenizer and generation config
always, safetensors weights when the engine runs the model itself. Offline mode is honoured: with
`HF_HUB_OFFLINE=1` (read when the model is resolved, not when the library was imported) only
the local cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`) is read.
Every failure is a ModelError naming the id and the revision.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from oracle.errors import ModelError

# What `huggingface_hub` accepts as a model repo id: `org/name`, letters, digits, `-`, `_`, `.`.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
METADATA_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model")
WEIGHT_PATTERNS = ("*.safetensors", "model.safetensors.index.json")
_TRUE = ("1", "on", "yes", "true")


def is_hub_id(spec: str) -> bool:
    """True for `org/name` that is not a path on disk (a local directory always wins)."""
    return bool(_HUB_ID.match(spec)) and not spec.startswith(".") and not Path(spec).expanduser().exists()


def offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_cache_dir() -> Path | None:
    """The cache set in the environment now (HF_HUB_CACHE, else HF_HOME/hub); None for the library default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return None


def fetch(repo_id: str, revision: str | None = None, *, weights: bool = True) -> Path:
    """The local snapshot directory of `repo_id` at `revision` (default branch when None)."""
    at = f"{repo_id}@{revision}" if revision else repo_id
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError as e:
        raise ModelError(f"model {at}: a hub id needs huggingface_hub "
                         f"(pip install 'oracle-determinism[hub]'), "
                         f"or give a checkpoint directory") from e
    cache = hub_cache_dir()
    where = f"the hub cache {cache}" if cache else "the default hub cache"
    patterns = list(METADATA_FILES) + (list(WEIGHT_PATTERNS) if weights else [])
    try:
        path = snapshot_download(repo_id, revision=revision, cache_dir=cache, allow_patterns=patterns,
                                 local_files_only=offline())
    except (LocalEntryNotFoundError, GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError,
            HfHubHTTPError, OSError, ValueError) as e:
        raise ModelError(f"model {at}: {_fetch_failure(e, repo_id, revision, where)}") from e
    return Path(str(path))


def _fetch_failure(e: Exception, repo_id: str, revision: str | None, where: str) -> str:
    """What a failed download means for the user, and what to do (the most specific error first: a gated
    repository is also one not found)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    if isinstance(e, LocalEntryNotFoundError):
        why = "offline (HF_HUB_OFFLINE=1)" if offline() else "the hub cannot be reached"
        return f"not in {where} and {why}; download it first (`hf download {repo_id}`) or give a checkpoint directory"
    if isinstance(e, GatedRepoError):
        return "gated repository; accept its terms on the hub and log in (`hf auth login`)"
    if isinstance(e, RepositoryNotFoundError):
        return "no such model repository on the hub (or it is private)"
    if isinstance(e, RevisionNotFoundError):
        return f"revision {revision!r} not found"
    return f"cannot fetch from the hub: {type(e).__name__}: {_first_line(e)}"


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
