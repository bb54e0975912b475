"""The shard results file holds every field of ModeResult: each one, set to a value other than its default,
reads back bitwise; a field of a type the codec cannot write fails when the codec is built, never drops out."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracle.capture.rules import LocalizedOp
from oracle.checks.prefix_cache import PrefixRuns
from oracle.checks.seeded_sampling import SampledRound, SampledRuns
from oracle.engines.contract import Completion, StepEvidence
from oracle.errors import ConfigError
from oracle.mode_result import InstanceRun, ModeResult
from oracle.prompts import Target
from oracle.schedule import Filler, Trial
from oracle.search import SearchOutcome
from oracle.shards.assign import Shard
from oracle.shards.codec import Row, Rows, codec_for
from oracle.shards.results import MODE_RETYPE, RESULTS_FILE, load_results, save_results
from oracle.shrink import ShrinkResult


def _completion(seed: int) -> Completion:
    rng = np.random.default_rng(seed)
    rows = [rng.standard_normal(7).astype(np.float32), None, rng.standard_normal(7).astype(np.float16)]
    logprobs = [float(np.float32(-x)) for x in rng.random(3)]
    logprobs[1] = float(np.nextafter(np.float32(logprobs[1]), np.float32(0)))  # a float32 neighbour: bitwise
    evidence = StepEvidence(engine_step=4, num_seqs=3, num_tokens=17, is_prefill=True, chunked=True,
                            num_cached_tokens=2, token_index=1, seq_position=2, num_prefill_tokens=9,
                            num_decode_tokens=8, max_query_len=5, kv_len=11, max_kv_len=12, has_chunked=False,
                            has_cache_hit=True)
    assert all(getattr(evidence, f.name) != f.default for f in dataclasses.fields(StepEvidence)
               if f.default is not dataclasses.MISSING)
    return Completion(f"req-{seed}", [seed, 5, 9], logprobs, rows,
                      [hashlib.sha256(bytes([seed, i])).hexdigest() for i in range(3)],
                      [(1.5, 0.25), (float(np.float32(0.1)), -3.0), (2.0, 1.0)], [evidence])


def _trial(trial_id: int) -> Trial:
    return Trial(trial_id, 1, 1, 2, (Filler(11, 4, 3, 1, 2), Filler(12, 5, 2, 0)), max_num_batched_tokens=64,
                 origin="shrink", parent=0, probe="fa3_kv_256:above")


def _op() -> LocalizedOp:
    return LocalizedOp("model.layers.1.mlp.down_proj", "aten.mm.default", 1, 2, 3, (0, 4), (6, 8), 12, 0.5, True,
                       pass_evidence={"num_seqs": 3}, eager=True, status="localized", op_class="matmul",
                       confirmation="confirmed", depends_on={"split": [1, 2]}, repro="repro/0")


def full_result() -> ModeResult:
    """A ModeResult whose every field holds a value other than its default."""
    c = _completion
    return ModeResult(
        mode="invariant", engine={"kind": "fake", "options": {"tensor_parallel": 2, "flags": ["a", "b"]}},
        solo={0: c(1), 1: c(2)}, trials={0: c(3), 5: c(4)}, repeats={0: c(5)},
        shrink=ShrinkResult(_trial(0), _trial(9), minimal=True, runs=3, tried=[9, 10]),
        shrink_trials=(_trial(9), _trial(10)),
        localized={9: _op(), ("prefill", 1, 2): None, ("prefix", 1): _op()},
        localize_notes=("localize 5: no capture",), seconds=1.25,
        search=SearchOutcome(asked=4, seed=2**60 + 3, trials=(_trial(11),), failing=(11,), best={"kv": 1.5}),
        search_trials=(_trial(11),), timings={"engine_start": 0.125, "trials": 3.5},
        checks={"prefill_decode": {(1, 2): c(6)},
                "prefix_cache": PrefixRuns({1: (c(7), c(8))}, "the engine keeps no prefix cache"),
                "seeded_sampling": SampledRuns((SampledRound(1, (0, 1), (7, 8), (c(9), c(10)),
                                                             ((c(11), c(12)), (c(12), c(11)))),),
                                               "temperature 0 only"),
                "cross_instance": InstanceRun({"kind": "fake", "instance": 2}, {0: c(13)}, {0: c(14)},
                                              "a second engine"),
                "tp_parity": InstanceRun({"kind": "fake", "tensor_parallel_size": 1}, {0: c(15)}, {}, "")},
        reruns={5: c(16)}, solo_again={1: c(17)})


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def assert_same(a: Any, b: Any, where: str) -> None:
    """Bitwise equal and of the same types, all the way down (arrays: dtype, shape and bytes)."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and (a.dtype, a.shape) == (b.dtype, b.shape), where
        assert a.tobytes() == b.tobytes(), where
    elif dataclasses.is_dataclass(a):
        assert type(a) is type(b), where
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping) and list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert type(b) is float and struct.pack("<d", a) == struct.pack("<d", b), where
    else:
        assert type(a) is type(b) and a == b, where


def _shard() -> Shard:
    return Shard(0, 1, 1, (0,), frozenset({0}), (_trial(0),))


def test_every_mode_result_field_round_trips(tmp_path: Path) -> None:
    result = full_result()
    for f in dataclasses.fields(ModeResult):  # a new field needs a value here, or this test covers nothing of it
        assert getattr(result, f.name) != _default(f), f"give ModeResult.{f.name} a value in full_result()"
    targets = (Target("a", (1, 2, 3)), Target("b", (4,)))
    save_results(tmp_path, _shard(), 7, "d" * 64, "1.2.3", targets, {"invariant": result})
    loaded = load_results(tmp_path)
    assert_same(targets, loaded.targets, "targets")
    assert list(loaded.modes) == ["invariant"]
    back = loaded.modes["invariant"]
    # `localized` is typed Any -> Any: an op is written as its to_json() and read back as that (the judge and
    # the variance map read either).
    expected = dataclasses.replace(result, localized={k: None if v is None else v.to_json()
                                                      for k, v in result.localized.items()})
    for f in dataclasses.fields(ModeResult):
        assert_same(getattr(expected, f.name), getattr(back, f.name), f"ModeResult.{f.name}")


def test_a_field_added_to_mode_result_round_trips_with_no_edit_to_the_codec() -> None:
    grown = dataclasses.make_dataclass("GrownResult", [("extra", tuple[tuple[int, float], ...],
                                                        dataclasses.field(default=()))], bases=(ModeResult,), frozen=True)
    codec = codec_for(grown, retype={(Completion, "logits"): MODE_RETYPE[(Completion, "logits")],
                                     (grown, "checks"): MODE_RETYPE[(ModeResult, "checks")]})
    value = grown(**{f.name: getattr(full_result(), f.name) for f in dataclasses.fields(ModeResult)},
                  extra=((1, 0.5), (2, -1.0)))
    rows = Rows()
    text = json.dumps(codec.encode(value, rows))
    back = codec.decode(json.loads(text), Rows(rows.arrays))
    assert back.extra == ((1, 0.5), (2, -1.0))
    assert_same(value.trials, back.trials, "trials")


@dataclasses.dataclass(frozen=True)
class _WithSet:
    ids: set[int]


@dataclasses.dataclass(frozen=True)
class _Holder:
    inner: tuple[_WithSet, ...] = ()


def test_a_field_of_a_type_with_no_encoding_fails_when_the_codec_is_built() -> None:
    with pytest.raises(TypeError, match=r"_WithSet\.ids: type set\[int\] has no JSON encoding"):
        codec_for(_Holder)
    grown = dataclasses.make_dataclass("GrownResult", [("extra", complex, dataclasses.field(default=0j))],
                                       bases=(ModeResult,), frozen=True)
    with pytest.raises(TypeError, match=r"GrownResult\.extra: type <class 'complex'> has no JSON encoding"):
        codec_for(grown)
    with pytest.raises(TypeError, match=r"Completion\.logit"):  # a retype for a field that is not there
        codec_for(ModeResult, retype={(Completion, "logit"): list[Row]})


def _rewrite(folder: Path, change: Any) -> None:
    with np.load(folder / RESULTS_FILE, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays["meta"].tobytes())
    change(meta)
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    np.savez(folder / RESULTS_FILE, **arrays)


@pytest.mark.parametrize(("change", "named"), [
    (lambda m: m["modes"]["invariant"].pop("seconds"), r"fields missing \['seconds'\]"),
    (lambda m: m["modes"]["invariant"]["checks"]["prefix_cache"].pop("note"), r"PrefixRuns: fields missing \['note'\]"),
    (lambda m: m["modes"]["invariant"]["checks"].update(golden={}), r"unknown keys \['golden'\]"),
    (lambda m: m["modes"]["invariant"].update(verdict="pass"), r"unknown \['verdict'\]"),
    (lambda m: m["modes"]["invariant"].update(seconds=True), r"ModeResult\.seconds: bool"),
    (lambda m: m["modes"]["invariant"]["solo"][0][1].update(token_ids=[1, "2"]), r"Completion\.token_ids"),
    (lambda m: m["modes"]["invariant"]["solo"][0][1]["evidence"][0].update(num_seqs=1.5), r"StepEvidence\.num_seqs"),
    (lambda m: m["modes"]["invariant"]["solo"][0][1]["top2"][0].__setitem__(1, "x"), r"Completion\.top2\[item\]\[1\]"),
    (lambda m: m["modes"]["invariant"]["solo"][0][1].update(logprobs=[0.5, None, 1]), r"Completion\.logprobs"),
    (lambda m: m["modes"]["invariant"].update(mode="production"), "filed under invariant"),
    (lambda m: m["modes"]["invariant"]["shrink"]["start"].update(origin="elsewhere"), "'elsewhere' is none of"),
    (lambda m: m["modes"]["invariant"]["checks"]["prefill_decode"][0].append(1), r"not \[key, value\]"),
    (lambda m: m.update(format=2), "format 2, this oracle reads 3"),
])
def test_a_tampered_results_file_is_refused_naming_the_place(tmp_path: Path, change: Any, named: str) -> None:
    save_results(tmp_path, _shard(), 7, "d" * 64, "1.2.3", (Target("a", (1,)),), {"invariant": full_result()})
    _rewrite(tmp_path, change)
    with pytest.raises(ConfigError, match=named):
        load_results(tmp_path)
