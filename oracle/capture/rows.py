"""Per-op capture of one target's rows: a `TorchDispatchMode` that sees every op of a forward pass.

An engine opens each forward pass with `RowCapture.forward_pass(layout, inputs)`, saying where the
target's tokens sit in it (`PassLayout`); inside, every op whose inputs derive from the pass's token
inputs (tracked by tensor identity, so weights and caches never match by accident) has the target's
rows of its results copied to the CPU, keyed by (module path, op, occurrence of that op in that
module within the pass) and token position, so two runs line up by position however the prompt
was chunked.

What counts as an op's result (and what does not):
- its returned tensors, and every argument its schema says it writes (`(a!)`: `out=` variants,
  in-place ops, custom ops such as vLLM's `unified_attention_with_output` or `_C.rms_norm(out, ..)`),
  read after the op ran; a write into a slice of a row-aligned tensor records that tensor;
- never the contents of a fresh allocation (`empty`, `empty_like`, `new_empty`, `resize_`, ...): it
  holds no value until something writes it;
- writes into the KV cache (`kv_write`: a written tensor indexed by a row-aligned slot mapping) and
  what attention reads back from it (`kv_read`: the target's cached positions through its block
  table, before the op runs), each keyed by token position.
A custom op of an `enter` namespace that returns nothing (it writes its outputs, as vLLM's attention
wrappers do) is entered: the ops it calls are captured too, one level deeper, so the kernel inside
is what can be named. Other custom ops are opaque: named as a whole.
Equality is decided later, bitwise, by `oracle.capture.rules`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from oracle.capture.copies import arg_names, block_table, clone_inputs, flat_leaves, named_args
from oracle.capture.state import OpState
from oracle.capture.target_rows import fits, is_paged_cache, kv_place, kv_rows, row_base, select_rows
from oracle.engines.contract import Completion, PassLayout
from oracle.engines.contract import Grid as Grid  # engines import it from here with PassLayout

# (module path, op label, occurrence of that op in that module within its pass)
OpKey = tuple[str, str, int]

# Ops whose output is storage without a value.
ALLOCATORS = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                        "new_empty_strided", "resize_", "resize_as_"})
# Those whose result holds no value at all (a resize keeps the old contents of the storage it keeps).
FRESH_MAKERS = ALLOCATORS - {"resize_", "resize_as_"}
# In-place ops that overwrite `self` without reading it.
OVERWRITERS = frozenset({"copy_", "fill_", "zero_", "index_copy_"})


@dataclass
class OpCall:
    """One captured result of an op call: the target's rows of it, in execution order.

    `kind`: "out" (a returned tensor), "write" (an argument the op wrote), "kv_write" (rows it wrote
    into a cache by slot), "kv_read" (the target's cached rows an attention op was about to read).
    `inputs`: the producers of its row-aligned inputs; `overwritten_by`: set when a later op replaced
    this result wholesale before anything read it; `depth`: 1 inside an entered custom op, named
    by `within`; `grid`: which of the pass's grids the rows were taken on.
    """

    index: int
    forward_pass: int
    key: OpKey
    positions: tuple[int, ...]
    rows: torch.Tensor  # [n, *row_shape], on the CPU
    shape: tuple[int, ...]
    inputs: tuple[OpKey, ...]
    kind: str = "out"
    depth: int = 0
    within: str = ""
    grid: int = 0
    overwritten_by: OpKey | None = None


@dataclass(frozen=True)
class Snapshot:
    """The full inputs of one op call, cloned before it ran: enough to run it again, alone."""

    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: str  # "return:J" or "arg:NAME": where the captured rows came from
    layout: PassLayout
    threads: int  # torch's intra-op threads when it ran: a CPU kernel's blocking can follow them
    # Written arguments that held no value yet (fresh from an allocation, written by nothing since):
    # the op only writes them, whatever its schema's names say, so their old contents are not inputs.
    fresh_args: frozenset[str] = frozenset()
    # The kernel mode, threads and flags it ran under (None: not recorded; a re-run keeps the current ones).
    state: OpState | None = None

    def plain(self) -> dict[str, Any]:
        """As plain data, to leave its process: its inputs and the op's name (an op does not pickle)."""
        return {"op": str(self.func), "args": self.args, "kwargs": self.kwargs, "result": self.result,
                "threads": self.threads, "layout": self.layout, "state": self.state}


@dataclass(frozen=True)
class Captured:
    """Everything one captured run produced."""

    calls: tuple[OpCall, ...]
    passes: tuple[PassLayout, ...]
    completion: Completion
    snapshot: Snapshot | None = None

    def rows_at(self) -> dict[tuple[OpKey, int], tuple[OpCall, int]]:
        """(op key, position) -> (the call, its row index): where to find each position's row."""
        index: dict[tuple[OpKey, int], tuple[OpCall, int]] = {}
        for call in self.calls:
            for i, pos in enumerate(call.positions):
                index.setdefault((call.key, pos), (call, i))
        return index


@functools.cache
def op_base_name(func: Any) -> str:
    """`aten::empty_like` -> `empty_like` (cached: asked on every dispatched op)."""
    return str(func._schema.name).split("::")[-1]


def written_args(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """The tensors the op writes, by argument name (schema alias `(a!)`), including lists of them."""
    out: list[tuple[str, torch.Tensor]] = []
    for i, name in _write_args(func):
        value = args[i] if i < len(args) else kwargs.get(name)
        if isinstance(value, torch.Tensor):
            out.append((name, value))
        elif isinstance(value, (list, tuple)):
            out.extend((f"{name}.{j}", t) for j, t in enumerate(value) if isinstance(t, torch.Tensor))
    return out


@functools.cache
def _write_args(func: Any) -> tuple[tuple[int, str], ...]:
    """(position, name) of each argument the op's schema says it writes (cached: asked on every captured op)."""
    names = arg_names(func)
    return tuple((i, names[i]) for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write)


def reads_written(func: Any, arg: str) -> bool:
    """Whether the op reads the old value of an argument it writes (in place), or only writes it (`out`,
    `output`, a copy or fill)."""
    return not arg.startswith("out") and op_base_name(func) not in OVERWRITERS


class RowCapture(TorchDispatchMode):
    """Records the target's rows of every row-aligned op result while a pass is active.

    `module_path()` names the innermost module the model is in (set by the engine's capture, from
    a scope stack or module hooks). With `snapshot_at=(forward_pass, key)` the full inputs of that
    one call are cloned before it runs (`Snapshot`), to run it again alone.
    """

    def __init__(self, snapshot_at: tuple[int, OpKey] | None = None) -> None:
        super().__init__()
        self.module_path: Callable[[], str] = lambda: ""
        self.calls: list[OpCall] = []
        self.passes: list[PassLayout] = []
        self.snapshot_at = snapshot_at
        self.bypass: tuple[str, ...] = ()  # ops observed at the Python call (see `_bypassing`)
        self.enter: tuple[str, ...] = ()  # namespaces of wrapper ops whose insides are captured (vLLM: "vllm")
        self.snapshot: Snapshot | None = None
        self.snapshot_note = ""
        self._layout: PassLayout | None = None
        self._producer: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> OpKey of what made it
        self._fresh: WeakIdKeyDictionary = WeakIdKeyDictionary()  # allocated, not written since: no value
        self._last_call: dict[OpKey, OpCall] = {}
        self._counts: dict[tuple[str, str], int] = {}
        self._within: list[str] = []
        self._inner: list[list[OpKey]] = []  # keys recorded inside each entered op, innermost last

    def reset(self) -> None:
        """Forget what was captured (a warm-up run is not part of the captured run)."""
        self.calls.clear()
        self.passes.clear()

    @contextlib.contextmanager
    def forward_pass(self, layout: PassLayout, inputs: Sequence[torch.Tensor]) -> Iterator[None]:
        """Capture one pass; `inputs` are its token-aligned inputs (ids, positions, slots): rows start there."""
        self._layout = layout
        self._counts = {}
        self._last_call = {}
        self.passes.append(layout)
        for t in inputs:
            self._record(("", "input", self._count("", "input")), t, (), "out")
        try:
            with self, self._bypassing():
                yield
        finally:
            self._layout = None

    @contextlib.contextmanager
    def _bypassing(self) -> Iterator[None]:
        """Proxies for `bypass` ops (`namespace.name`) while a pass runs: ops whose calls fail under
        Python dispatch (vLLM's FlashAttention 3 `_vllm_fa3_C.fwd` returns `Tensor[]` with an alias
        annotation torch cannot cast back) are observed at the Python call instead."""
        saved: list[tuple[Any, str, Any]] = []
        for qualname in self.bypass:
            ns_name, _, op_name = qualname.partition(".")
            try:
                namespace = getattr(torch.ops, ns_name)
                packet = getattr(namespace, op_name)
            except (AttributeError, RuntimeError):
                continue  # not loaded in this process
            saved.append((namespace, op_name, packet))
            setattr(namespace, op_name, _Bypass(self, packet))
        try:
            yield
        finally:
            for namespace, op_name, packet in saved:
                setattr(namespace, op_name, packet)

    def _count(self, module: str, op: str) -> int:
        n = self._counts.get((module, op), 0)
        self._counts[(module, op)] = n + 1
        return n

    def _record(self, key: OpKey, t: torch.Tensor, inputs: tuple[OpKey, ...], kind: str) -> bool:
        assert self._layout is not None
        for g, grid in enumerate(self._layout.grids):
            rows = select_rows(t, grid)
            if rows is not None:
                self._add(key, grid.positions, rows, tuple(t.shape), inputs, kind, g)
                self._producer[t] = key
                return True
        return False

    def _add(self, key: OpKey, positions: tuple[int, ...], rows: torch.Tensor, shape: tuple[int, ...],
             inputs: tuple[OpKey, ...], kind: str, grid: int = 0) -> None:
        """One captured result of the current pass: `rows` (the target's, `[n, ...]`) copied to the CPU."""
        assert self._layout is not None
        call = OpCall(len(self.calls), self._layout.forward_pass, key, positions, rows.detach().to("cpu", copy=True),
                      shape, inputs, kind, len(self._within), self._within[-1] if self._within else "", grid)
        self.calls.append(call)
        self._last_call[call.key] = call
        for keys in self._inner:
            keys.append(call.key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return self._observe(func, args, kwargs or {}, bypassed=False)

    def _observe(self, func: Any, args: Any, kwargs: dict[str, Any], *, bypassed: bool) -> Any:
        """One op call: what it read, the call itself, what it produced. `bypassed`: called from a
        `_Bypass` proxy (the op cannot pass through Python dispatch), so run it with the modes off."""
        layout = self._layout
        if layout is None:
            return _call(func, args, kwargs, bypassed)
        module, name = self.module_path(), str(func)
        key: OpKey = (module, name, self._count(module, name))
        flat_in = flat_leaves((args, kwargs))
        written = written_args(func, args, kwargs)
        producers = self._producers_of(func, flat_in, written)
        if self.snapshot_at is not None and self.snapshot is None and _same_call(
                self.snapshot_at, (layout.forward_pass, key)):
            self._take_snapshot(func, args, kwargs, self.snapshot_at[1][1])
        if producers:
            self._record_kv_reads(key, func, args, kwargs, producers)
        if not bypassed and self._enters(func, flat_in):
            out, inner = self._call_entered(func, args, kwargs, flat_in)
            producers = tuple(dict.fromkeys((*producers, *inner)))  # what the wrapper wrote came from the ops inside it
        else:
            out = _call(func, args, kwargs, bypassed)
        self._after(key, func, args, kwargs, out, written, producers)
        return out

    def _producers_of(self, func: Any, flat_in: Sequence[Any], written: list[tuple[str, torch.Tensor]]
                      ) -> tuple[OpKey, ...]:
        """What made the tracked tensors the op reads (an argument it only writes is not read), in order."""
        pure_out = {id(t) for a, t in written if not reads_written(func, a)}
        read = (t for t in flat_in if isinstance(t, torch.Tensor) and id(t) not in pure_out)
        return tuple(dict.fromkeys(p for t in read if (p := self._producer.get(t)) is not None))

    def _enters(self, func: Any, flat_in: Sequence[Any]) -> bool:
        """A wrapper of an `enter` namespace that returns nothing (it writes its outputs), on CPU or CUDA tensors."""
        return func.namespace in self.enter and not func._schema.returns and any(
            isinstance(t, torch.Tensor) and t.device.type in ("cpu", "cuda") for t in flat_in)

    def _call_entered(self, func: Any, args: Any, kwargs: dict[str, Any], flat_in: Sequence[Any]
                      ) -> tuple[Any, list[OpKey]]:
        """Run a wrapper with the ops it calls captured, one level deeper: its result, and the keys recorded inside."""
        self._within.append(str(func))
        self._inner.append([])
        try:
            # Below the Python key (or the op would come back here), with this mode active for what it calls.
            keys = _keys_below_python(flat_in)
            with self:
                out = func.redispatch(keys, *args, **kwargs)
        finally:
            self._within.pop()
            inner = self._inner.pop()
        return out, inner

    def _after(self, key: OpKey, func: Any, args: Any, kwargs: dict[str, Any], out: Any,
               written: list[tuple[str, torch.Tensor]], producers: tuple[OpKey, ...]) -> None:
        """What the op's results hold: no value (an allocation), the same values (a view), or new rows to record."""
        base_name = op_base_name(func)
        if base_name in ALLOCATORS:
            for t in _tensors(out) if base_name in FRESH_MAKERS else ():
                self._fresh[t] = True  # storage without a value came out
            return
        for _, t in written:  # it holds a value now
            self._fresh.pop(t, None)
            if isinstance(t._base, torch.Tensor):
                self._fresh.pop(t._base, None)
        if not producers:
            return  # nothing of the target's went in
        if getattr(func, "is_view", False) and len(producers) == 1:
            # A view holds the same values as its base: pass the base's identity on (to each of a split's parts),
            # row-aligned or not: in a one-token pass `cache.view(-1, H, D)[slots] = k` writes `k.view(H, D)`, whose
            # rows are not the pass's tokens, and the KV write it feeds must still know where its values came from.
            for t in _tensors(out):
                self._producer[t] = producers[0]
            return
        self._record_results(key, func, args, kwargs, out, written, producers)

    def _record_results(self, key: OpKey, func: Any, args: Any, kwargs: dict[str, Any], out: Any,
                        written: list[tuple[str, torch.Tensor]], producers: tuple[OpKey, ...]) -> None:
        """Every argument the op wrote, then every tensor it returned (labelled `name[arg]`, `name[j]` when several)."""
        module, name, occurrence = key
        for arg, t in written:
            label = name if len(written) == 1 else f"{name}[{arg}]"
            self._record_write((module, label, occurrence), func, arg, t, args, kwargs, producers)
        written_ids = {id(t) for _, t in written}
        returned = [t for t in _tensors(out) if id(t) not in written_ids]
        for j, t in enumerate(returned):
            self._record((module, name if len(returned) == 1 else f"{name}[{j}]", occurrence), t, producers, "out")

    def _record_write(self, key: OpKey, func: Any, arg: str, t: torch.Tensor, args: Any, kwargs: dict[str, Any],
                      producers: tuple[OpKey, ...]) -> None:
        """A written argument: its rows, or its row-aligned base's when it is a slice; else a KV-cache write."""
        assert self._layout is not None
        before = self._producer.get(t)
        target = t if fits(t, self._layout) else row_base(t, self._layout)
        if target is None:
            self._record_kv_write(key, args, kwargs, t, producers)
            return
        recorded = self._record(key, target, producers, "write")
        if target is not t:
            return
        if recorded and before is not None and not reads_written(func, arg):
            self._overwrite(before, key)
        base = t._base
        if isinstance(base, torch.Tensor) and fits(base, self._layout):
            self._producer[base] = key  # a slice of a fresh buffer written whole: the buffer now holds it

    def _overwrite(self, before: OpKey, key: OpKey) -> None:
        """`key` replaced the result `before` made wholesale: unless already replaced, nothing read it since."""
        old = self._last_call.get(before)
        if old is not None and old.overwritten_by is None:
            old.overwritten_by = key

    def _record_kv_write(self, key: OpKey, args: Any, kwargs: dict[str, Any], cache: torch.Tensor,
                         producers: tuple[OpKey, ...]) -> None:
        """Rows the op wrote into a cache at the target's slots (a row-aligned integer index argument)."""
        assert self._layout is not None
        grid = self._layout.grids[0]
        rows = kv_rows(cache, args, kwargs, grid, self._layout.block_size)
        if rows is not None:
            self._add(key, grid.positions, rows, tuple(cache.shape), producers, "kv_write")

    def _record_kv_reads(self, key: OpKey, func: Any, args: Any, kwargs: dict[str, Any],
                         producers: tuple[OpKey, ...]) -> None:
        """The target's cached positions [0, kv_len) as an attention op is about to read them."""
        layout = self._layout
        assert layout is not None
        place = kv_place(layout)
        if place is None:
            return
        seq, n, bs = place
        named = named_args(func, args, kwargs)
        table = block_table(named)
        if table is None or table.dim() != 2 or seq >= table.shape[0]:
            return
        blocks = table[seq, : -(-n // bs)].long()
        for arg, t in named.items():
            if is_paged_cache(t, table, bs) and not fits(t, layout):
                rows = t.index_select(0, blocks.to(t.device)).flatten(0, 1)[:n]  # [kv_len, Hkv, D]
                self._add((key[0], f"{key[1]}<kv:{arg}>", key[2]), tuple(range(n)), rows, tuple(t.shape), producers,
                          "kv_read")

    def _take_snapshot(self, func: Any, args: Any, kwargs: dict[str, Any], label: str) -> None:
        assert self._layout is not None
        if "[" in label:  # name[j] (the j-th returned tensor) or name[arg] (a written argument)
            inner = label[label.index("[") + 1:-1]
            result = f"return:{inner}" if inner.isdigit() else f"arg:{inner}"
        else:
            written = written_args(func, args, kwargs)
            result = f"arg:{written[0][0]}" if written else "return:0"
        try:
            c_args, c_kwargs = clone_inputs(func, args, kwargs)
        except (RuntimeError, MemoryError) as e:
            self.snapshot_note = f"inputs could not be copied: {e}"
            return
        fresh = frozenset(name for name, t in written_args(func, args, kwargs)
                          if t in self._fresh or (isinstance(t._base, torch.Tensor) and t._base in self._fresh))
        self.snapshot = Snapshot(func, c_args, c_kwargs, result, self._layout, torch.get_num_threads(), fresh,
                                 OpState.now())


def _same_call(want: tuple[int, OpKey], now: tuple[int, OpKey]) -> bool:
    """The call named by `want` (its label may carry a [result] suffix) is the one running now."""
    (wp, (wm, wl, wo)), (np_, (nm, nl, no)) = want, now
    return (wp, wm, wo) == (np_, nm, no) and wl.split("[", 1)[0] == nl


class _Bypass:
    """Stands in for an op packet (`torch.ops.ns.name`) while a pass runs: calls go to the capture."""

    def __init__(self, capture: RowCapture, packet: Any) -> None:
        self._capture, self._packet = capture, packet

    def __getattr__(self, name: str) -> Any:
        return getattr(self._packet, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capture._observe(self._packet.default, args, kwargs, bypassed=True)


def _call(func: Any, args: Any, kwargs: dict[str, Any], bypassed: bool) -> Any:
    """The op itself: through dispatch, or with the modes off when it came from a `_Bypass` proxy."""
    return _call_plain(func, args, kwargs) if bypassed else func(*args, **kwargs)


def _tensors(out: Any) -> list[torch.Tensor]:
    """The tensors in an op's result (a tensor, or a nest of them)."""
    return [t for t in flat_leaves(out) if isinstance(t, torch.Tensor)]


def _call_plain(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Call an op with every Python dispatch mode off (they are restored after)."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return func(*args, **kwargs)


def _keys_below_python(flat_in: Sequence[Any]) -> Any:
    """The backend key alone (CPU or CUDA) of the call's tensors: where a custom op's own kernel is."""
    t = next(t for t in flat_in if isinstance(t, torch.Tensor))
    key = {"cuda": torch._C.DispatchKey.CUDA, "cpu": torch._C.DispatchKey.CPU}[t.device.type]
    return torch._C.DispatchKeySet(key)


