"""A shard's raw results, beside its report.json: what `oracle merge` judges again as one run.

A shard's own verdicts cover its slice only; the run's verdicts need every trial's outputs side by
side (coverage counts, drift's distribution, the negative control, the first failing trial), so a
shard writes what its checks read: both modes' frozen results (oracle.execute.ModeResult: token
ids, logprobs, every kept logits row, row digests, top-2, per-pass evidence), the targets and the
whole schedule. One file, `shard-results.npz`: logits rows as arrays, everything else as JSON in
the `meta` entry, every field of ModeResult written and read by its type (oracle.shards.codec), so a
field added to it is in the file with no edit here; read with `allow_pickle=False`, so a results file
from another machine can hold data only, never code, and with bounded memory (each member's size is
checked from the zip's and the .npy's headers before it is read; see `_read_arrays`). Secrets are
redacted as in report.json. Floats go through JSON as `repr` (exact) and rows keep their dtype: what
is read back is bitwise what the shard held.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np

from oracle.engines.contract import Completion, Mode
from oracle.errors import ConfigError
from oracle.execute import ModeResult
from oracle.files import GIB, open_regular
from oracle.judge import check_data
from oracle.prompts import Target
from oracle.redaction import redact_document
from oracle.report import write_atomic_with
from oracle.schedule import Trial
from oracle.shards.assign import MAX_SHARDS, Shard
from oracle.shards.codec import Row, Rows, codec_for

RESULTS_FILE = "shard-results.npz"
FORMAT = 3  # 2: every ModeResult field, by its type (oracle.shards.codec); 3: the checks' own runs in `checks`
# Bounds on what a results file may make a merge read (a file from another machine is untrusted input).
MAX_RESULTS_BYTES = 64 * GIB  # on disk, and so in memory: members are stored uncompressed
MAX_META_BYTES = 2 * GIB
MAX_MEMBERS = 50_000_000


@dataclass(frozen=True)
class ShardResults:
    """One shard's results as `oracle merge` reads them."""

    path: Path
    shard: Shard
    seed: int
    config_digest: str
    oracle_version: str
    targets: tuple[Target, ...]
    modes: dict[Mode, ModeResult]


# Every field of ModeResult (and of what it holds) by its type (oracle.shards.codec), built at import: a field
# of a type with no encoding fails here, never drops out of the file. A Completion's `logits` (typed
# list[Any]) holds arrays, stored beside the JSON; `checks` holds each check's own runs, of the type its
# row declares (oracle.judge.CHECKS), so a check added there is in the file with no edit here.
CheckData = TypedDict("CheckData", check_data(), total=False)  # type: ignore[misc]
MODE_RETYPE = {(Completion, "logits"): list[Row | None] | None, (ModeResult, "checks"): CheckData}
_MODE = codec_for(ModeResult, retype=MODE_RETYPE)
_TARGETS = codec_for(tuple[Target, ...])


def save_results(report_dir: Path, shard: Shard, seed: int, config_digest: str, oracle_version: str,
                 targets: tuple[Target, ...], results: dict[Mode, ModeResult]) -> Path:
    """Write `report_dir/shard-results.npz` atomically (a temporary name, then a rename)."""
    rows = Rows()
    meta = {"format": FORMAT, "shard": {**shard.to_json(), "schedule": [t.to_json() for t in shard.schedule]},
            "seed": seed, "config_digest": config_digest, "oracle_version": oracle_version,
            "targets": _TARGETS.encode(targets, rows), "modes": {m: _MODE.encode(r, rows) for m, r in results.items()}}
    # The engines' descriptions hold their options (a server's command line, `env`, an api_key): the same
    # redaction as report.json's (oracle.redaction.redact_document), so no file a run writes holds a secret.
    meta = redact_document(meta, ("modes.*.engine", "modes.*.checks.*.engine"))
    blob = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    report_dir.mkdir(parents=True, exist_ok=True)
    path = report_dir / RESULTS_FILE
    arrays: dict[str, Any] = {"meta": blob, **rows.arrays}
    write_atomic_with(path, lambda f: np.savez(f, **arrays))
    return path


def _read_mode(mode: Mode, d: Any, rows: Rows) -> ModeResult:
    result: ModeResult = _MODE.decode(d, rows)
    if result.mode != mode:
        raise ValueError(f"the {result.mode} results are filed under {mode}")
    return result


def _array(path: Path, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """One `.npy` member, its size checked from its header before anything is read: the header's shape
    times its dtype must be what the member holds (a tampered header cannot make us allocate more)."""
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ConfigError(f"{path}: {info.filename}: .npy format {version} is not one numpy.savez writes")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f, max_header_size=10_000)
        if dtype.hasobject:
            raise ConfigError(f"{path}: {info.filename}: holds Python objects; shard results hold data only")
        count = 1
        for n in shape:
            count *= int(n)
        nbytes = count * dtype.itemsize
        if nbytes != info.file_size - f.tell():
            raise ConfigError(f"{path}: {info.filename}: its header claims {nbytes:,} bytes, the member holds "
                              f"{info.file_size - f.tell():,}: damaged or tampered")
        data = f.read(nbytes)
    if len(data) != nbytes:
        raise ConfigError(f"{path}: {info.filename}: short ({len(data):,} of {nbytes:,} bytes)")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C").copy()


def _check_members(path: Path, infos: list[zipfile.ZipInfo], size: int) -> None:
    """Every member stored uncompressed, a `.npy`, and all of them together within the file's `size` bytes."""
    total = 0
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise ConfigError(f"{path}: {info.filename}: a compressed member; oracle writes shard results "
                              "uncompressed (numpy.savez), so this file is not one it wrote")
        total += info.file_size
        if info.file_size > size or total > size or not info.filename.endswith(".npy"):
            raise ConfigError(f"{path}: {info.filename}: claims {info.file_size:,} bytes in a file of "
                              f"{size:,}: damaged or tampered")


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of the results file, with bounded memory whatever the file claims: a regular file of
    at most MAX_RESULTS_BYTES (oracle.files), members stored uncompressed as numpy.savez writes them
    (so a member's size is bounded by the file's: a deflated zip bomb is refused before it inflates),
    each member's size checked against its header before it is read."""
    with open_regular(path, MAX_RESULTS_BYTES, "shard results file") as raw, zipfile.ZipFile(raw) as zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise ConfigError(f"{path}: {len(infos):,} members, over the bound of {MAX_MEMBERS:,}")
        _check_members(path, infos, raw.seek(0, 2))
        arrays = {info.filename[:-4]: _array(path, zf, info) for info in infos}
    if "meta" not in arrays or arrays["meta"].dtype != np.uint8 or arrays["meta"].size > MAX_META_BYTES:
        raise ConfigError(f"{path}: no meta entry of at most {MAX_META_BYTES:,} bytes: not oracle's shard results")
    return arrays


def _shard(path: Path, sh: dict[str, Any]) -> Shard:
    """The shard record, its numbers checked before anything is built from them (a count of 10^10 would
    make a merge list ten billion missing shards)."""
    index, count, size = int(sh["index"]), int(sh["count"]), int(sh["schedule_size"])
    schedule = tuple(Trial.from_json(t) for t in sh["schedule"])
    if not 1 <= count <= MAX_SHARDS or not 0 <= index < count:
        raise ConfigError(f"{path}: shard {index}/{count}: COUNT must be in 1..{MAX_SHARDS} and INDEX below it")
    if size != len(schedule):
        raise ConfigError(f"{path}: shard {index}/{count}: schedule_size {size:,} but {len(schedule)} trials")
    return Shard(index, count, size, tuple(int(i) for i in sh["trials"]), frozenset(int(i) for i in sh["repeats"]),
                 schedule)


def load_results(report_dir: Path) -> ShardResults:
    """Read `report_dir/shard-results.npz`; ConfigError naming the file when it is missing, damaged, over
    its bounds or tampered with (see `_read_arrays`)."""
    path = report_dir / RESULTS_FILE
    if not path.exists():
        raise ConfigError(f"{path}: missing: the shard did not finish, or its folder is not a shard's "
                          "(oracle run --shard i/N writes it)")
    try:
        arrays = _read_arrays(path)
        meta = json.loads(arrays.pop("meta").tobytes().decode("utf-8"))
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            got = meta.get("format") if isinstance(meta, dict) else None
            raise ConfigError(f"{path}: shard results format {got!r}, this oracle reads {FORMAT}")
        shard = _shard(path, meta["shard"])
        rows = Rows(arrays)
        targets: tuple[Target, ...] = _TARGETS.decode(meta["targets"], rows)
        modes: dict[Mode, ModeResult] = {m: _read_mode(m, d, rows) for m, d in meta["modes"].items()}
        return ShardResults(path, shard, int(meta["seed"]), str(meta["config_digest"]), str(meta["oracle_version"]),
                            targets, modes)
    except ConfigError:
        raise
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError, zipfile.BadZipFile,
            EOFError) as e:
        raise ConfigError(f"{path}: damaged or partial shard results ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:160] if str(e) else ''})") from e
