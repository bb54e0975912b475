"""The native engine's tensor-parallel ranks: rank 0 is the engine's own process, ranks 1..N-1 are processes
it spawns, joined by a gloo communicator on loopback (`torch.distributed.ProcessGroupGloo` over a
`TCPStore` that rank 0 owns; no default process group, so two engines can live in one process).

Rank 0 schedules; for every forward pass it sends each rank the pass's inputs (and, under per-op capture,
the target's layout), then all ranks run the same pass, their all-reduces meeting over gloo. Messages go
over one pipe per rank, pickled by value. A rank answers each message; a rank that fails answers with its
traceback and exits, which breaks the gloo ring, so rank 0 never waits on a dead peer: the pass raises
`EngineError` naming the rank. A rank whose parent dies sees its pipe close and exits. `close()` asks
each rank to exit, then terminates and kills what is left.

Each rank sets its own kernels: in invariant mode `oracle_kernels.enable()` for the process's life; its
start reports them, and `audit()` runs one pass in every rank under `oracle_kernels.audit`, each rank
reporting what its pass reached.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import pickle
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from oracle.engines.native.parallel import Reducer, bound, shard
from oracle.errors import EngineError

_CLOSE_GRACE_S = 5.0
_KERNELS_UNREGISTERED = "oracle_kernels are not registered in its process"


class GlooGroup:
    """One rank's end of the group: an all-gather over gloo (`oracle.engines.native.parallel.Communicator`)."""

    def __init__(self, store: Any, rank: int, size: int, timeout_s: float) -> None:
        import torch.distributed as dist

        self.rank, self.size = rank, size
        self.pg: Any = dist.ProcessGroupGloo(store, rank, size, datetime.timedelta(seconds=timeout_s))

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        outs = [torch.empty_like(t) for _ in range(self.size)]
        self.pg.allgather([outs], [t]).wait()
        return outs


def _send(conn: Connection, obj: Any) -> None:
    conn.send_bytes(pickle.dumps(obj))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


@dataclass(frozen=True)
class RankSpec:
    """What a spawned rank needs to build its shard."""

    rank: int
    size: int
    port: int
    model_dir: str
    dtype: str
    mode: str
    num_threads: int
    reducer: Reducer
    timeout_s: float


@dataclass
class _RankState:
    spec: RankSpec
    decoder: Any
    group: GlooGroup
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    num_blocks: int = -1
    rows: Any = None  # a RowCapture while rank 0 captures
    last_capture: Any = None  # the last one, whose snapshot `run_alone` re-runs
    audit: dict[str, set[str]] | None = None


def kernel_report(rank: int) -> dict[str, Any]:
    """What a rank's process says of its kernels, before any pass."""
    import oracle_kernels

    return {"rank": rank, "pid": os.getpid(), "device": "cpu", "kernels": oracle_kernels.is_enabled(),
            "threads": torch.get_num_threads()}


def rank_main(spec: RankSpec, conn: Connection) -> None:
    """A spawned rank: build the shard, join the group, then serve rank 0's messages until `close` or EOF."""
    import oracle_kernels
    import torch.distributed as dist

    from oracle.engines.native.loader import DTYPES, load_decoder
    from oracle.engines.native.model import Decoder
    from oracle.engines.native.parallel import all_reduce

    try:
        torch.set_num_threads(max(1, spec.num_threads))
        if spec.mode == "invariant":
            oracle_kernels.enable()
        spec.reducer.start(spec.rank)
        full = load_decoder(Path(spec.model_dir), DTYPES[spec.dtype], torch.device("cpu"))
        config, weights = shard(full.config, full.w, spec.rank, spec.size)
        decoder = Decoder(config, weights)
        decoder.reduce = all_reduce
        del full
        _send(conn, ("ok", kernel_report(spec.rank)))
        store = dist.TCPStore("127.0.0.1", spec.port, spec.size, False, datetime.timedelta(seconds=spec.timeout_s))
        state = _RankState(spec, decoder, GlooGroup(store, spec.rank, spec.size, spec.timeout_s))
        _send(conn, ("ok", None))
    except BaseException:  # noqa: BLE001 - anything a rank's start raises is the engine's error, reported whole
        with contextlib.suppress(OSError):
            _send(conn, ("error", traceback.format_exc()))
        return
    _serve(state, conn)


def _serve(state: _RankState, conn: Connection) -> None:
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            return  # rank 0 is gone
        if msg[0] == "close":
            return
        try:
            reply = _handle(state, msg)
        except BaseException:  # noqa: BLE001 - reported to rank 0 whole; this rank then leaves the group
            with contextlib.suppress(OSError):
                _send(conn, ("error", traceback.format_exc()))
            return
        _send(conn, ("ok", reply))


def _handle(state: _RankState, msg: tuple[Any, ...]) -> Any:
    kind = msg[0]
    if kind == "pass":
        _, inputs, num_blocks, layout = msg
        _run_pass(state, inputs, num_blocks, layout)
        return None
    if kind == "capture_begin":
        from oracle.capture.rows import RowCapture

        rows = RowCapture(snapshot_at=msg[1])
        scopes = state.decoder.scopes
        rows.module_path = lambda: scopes.path[-1] if scopes.path else ""
        state.rows = rows
        return None
    if kind == "capture_end":
        rows, state.rows = state.rows, None
        state.last_capture = rows
        return captured_of(rows)
    if kind == "run_alone":
        from oracle.capture.confirm import run_alone

        snap = state.last_capture.snapshot if state.last_capture is not None else None
        return None if snap is None else run_alone(snap, msg[1], msg[2])
    if kind == "audit_begin":
        state.audit = {"covered": set(), "uncovered": set()}
        return None
    if kind == "audit_end":
        seen, state.audit = state.audit or {"covered": set(), "uncovered": set()}, None
        return {**kernel_report(state.spec.rank), "batch_variant_covered": sorted(seen["covered"]),
                "batch_variant_uncovered": sorted(seen["uncovered"])}
    raise ValueError(f"unknown message {kind!r}")


def captured_of(rows: Any) -> dict[str, Any]:
    """A rank's capture as plain data (its calls and passes; a snapshot's inputs, not the op)."""
    snap = rows.snapshot
    return {"calls": list(rows.calls), "passes": list(rows.passes),
            "snapshot": None if snap is None else snap.plain()}


def _run_pass(state: _RankState, inputs: Any, num_blocks: int, layout: Any) -> None:
    import oracle_kernels

    from oracle.engines.native.model import StepInputs

    c = state.decoder.config
    if num_blocks != state.num_blocks:
        shape = (num_blocks + 1, int(inputs["block_size"]), c.num_kv_heads, c.head_dim)
        state.kv = [(torch.zeros(shape, dtype=state.decoder.dtype), torch.zeros(shape, dtype=state.decoder.dtype))
                    for _ in range(c.num_layers)]
        state.num_blocks = num_blocks
    tensors = {k: torch.tensor(v[0], dtype=v[1]).view(v[2]) for k, v in inputs.items() if isinstance(v, tuple)}
    step = StepInputs(**tensors, num_kv_splits=int(inputs["num_kv_splits"]))
    spec = state.spec

    def forward() -> None:
        with bound(state.group, spec.reducer), spec.reducer.around_pass(spec.rank, state.decoder.scopes):
            if state.rows is not None and layout is not None:
                with state.rows.forward_pass(layout, (step.input_ids, step.positions)):
                    state.decoder.forward(step, state.kv)
            else:
                state.decoder.forward(step, state.kv)

    with torch.no_grad():
        if state.audit is not None:
            result = oracle_kernels.audit(forward)
            state.audit["covered"].update(result.covered)
            state.audit["uncovered"].update(result.uncovered)
        else:
            forward()


def wire_inputs(step: Any, block_size: int) -> dict[str, Any]:
    """A pass's `StepInputs` as plain lists (values, dtype, shape), to send to the ranks."""
    out: dict[str, Any] = {"block_size": block_size}
    for name in ("input_ids", "positions", "slot_mapping", "block_tables", "seq_lens", "query_start_loc",
                 "logits_indices"):
        t = getattr(step, name)
        out[name] = (t.reshape(-1).tolist(), t.dtype, tuple(t.shape))
    out["num_kv_splits"] = step.num_kv_splits
    return out


class RankGroup:
    """Rank 0's side: spawns ranks 1..size-1, joins the gloo group with them, drives their passes."""

    def __init__(self, size: int, model_dir: Path, dtype: str, mode: str, num_threads: int, reducer: Reducer,
                 timeout_s: float = 120.0) -> None:
        import torch.distributed as dist

        self.size, self.reducer, self.timeout_s = size, reducer, timeout_s
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self.reports: list[dict[str, Any]] = []
        self.group: GlooGroup | None = None
        ctx = multiprocessing.get_context("spawn")
        try:
            store = dist.TCPStore("127.0.0.1", 0, size, True, datetime.timedelta(seconds=timeout_s),
                                  wait_for_workers=False)
            for rank in range(1, size):
                parent, child = ctx.Pipe()
                spec = RankSpec(rank, size, store.port, str(model_dir), dtype, mode, num_threads, reducer, timeout_s)
                proc = ctx.Process(target=rank_main, args=(spec, child), name=f"oracle-native-rank{rank}",
                                   daemon=True)
                proc.start()
                child.close()
                self.procs.append(proc)
                self.conns.append(parent)
            self.reports = [self._answer(r, "start") for r in range(1, size)]
            self.group = GlooGroup(store, 0, size, timeout_s)
            for r in range(1, size):
                self._answer(r, "joining the group")
            self._store = store
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _answer(self, rank: int, what: str) -> Any:
        """Rank `rank`'s reply; EngineError naming it when it failed, died or said nothing in time."""
        conn, proc = self.conns[rank - 1], self.procs[rank - 1]
        deadline = time.monotonic() + self.timeout_s
        while not conn.poll(0.2):
            if not proc.is_alive() and not conn.poll(0):
                raise EngineError(f"native tensor parallel: rank {rank} (pid {proc.pid}) died during {what} "
                                  f"(exit code {proc.exitcode})")
            if time.monotonic() > deadline:
                raise EngineError(f"native tensor parallel: rank {rank} (pid {proc.pid}) did not answer {what} "
                                  f"within {self.timeout_s:g} s")
        try:
            kind, payload = _recv(conn)
        except (EOFError, OSError) as e:
            proc.join(2.0)  # its pipe closed as it exited: reap it for the exit code
            raise EngineError(f"native tensor parallel: rank {rank} (pid {proc.pid}) died during {what} "
                              f"(exit code {proc.exitcode})") from e
        if kind == "error":
            raise EngineError(f"native tensor parallel: rank {rank} (pid {proc.pid}) failed during {what}:\n{payload}")
        return payload

    def broadcast(self, msg: tuple[Any, ...]) -> None:
        for rank, conn in enumerate(self.conns, start=1):
            try:
                _send(conn, msg)
            except OSError as e:
                raise EngineError(f"native tensor parallel: rank {rank} is gone ({e}) before {msg[0]}") from e

    def gather(self, what: str) -> list[Any]:
        return [self._answer(r, what) for r in range(1, self.size)]

    @contextlib.contextmanager
    def forward_pass(self, inputs: Any, block_size: int, num_blocks: int, scopes: Any,
                     layout: Any = None) -> Iterator[None]:
        """Every rank runs this pass beside rank 0's (the block); a rank's failure is an EngineError naming it."""
        assert self.group is not None
        self.broadcast(("pass", wire_inputs(inputs, block_size), num_blocks, layout))
        try:
            with bound(self.group, self.reducer), self.reducer.around_pass(0, scopes):
                yield
        except RuntimeError as e:  # gloo: a peer left the group mid-pass
            self.gather("a forward pass")  # raises naming the rank that failed, if one did
            raise EngineError(f"native tensor parallel: rank 0's pass failed: {e}") from e
        self.gather("a forward pass")

    def call_one(self, rank: int, msg: tuple[Any, ...]) -> Any:
        """Send `msg` to rank `rank` alone and return its answer."""
        try:
            _send(self.conns[rank - 1], msg)
        except OSError as e:
            raise EngineError(f"native tensor parallel: rank {rank} is gone ({e}) before {msg[0]}") from e
        return self._answer(rank, str(msg[0]))

    def call(self, msg: tuple[Any, ...]) -> list[Any]:
        self.broadcast(msg)
        return self.gather(str(msg[0]))

    def close(self) -> None:
        """Ask each rank to exit; terminate, then kill, those that do not. Never raises."""
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                _send(conn, ("close",))
        deadline = time.monotonic() + _CLOSE_GRACE_S
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()
        self.procs, self.conns = [], []
        self.group = None
