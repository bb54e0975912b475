"""The openai engine against a stub OpenAI server (stdlib http.server on 127.0.0.1), no vllm.

The stub answers /health, /v1/models, /version and /v1/completions deterministically from the
prompt, records the most requests it held at once and when each arrived. The same source runs
in a thread for most tests and, written to a file, as the server the engine starts itself.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oracle.config import EngineConfig
from oracle.engines.contract import Request, SamplingParams
from oracle.engines.openai_answers import topk_digest
from oracle.engines.openai_engine import OpenAIEngine  # imports httpx only when built
from oracle.errors import ConfigError, EngineError

STUB = r'''
import json
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def completion(body, fault=""):
    """Token i of a prompt is (sum(prompt) + i) % 1000 with logprob -0.125 * (i + 1); `fault` breaks the answer.
    Sampled (temperature > 0), the request's own seed moves the tokens: (sum(prompt) + 7919 * seed + i) % 1000."""
    base = sum(body["prompt"]) % 1000
    if body.get("temperature", 0) > 0:
        base = (base + 7919 * body.get("seed", 0)) % 1000
    k = body.get("logprobs") or 0
    tokens, lps, tops = [], [], []
    for i in range(body["max_tokens"]):
        t = (base + i) % 1000
        lp = -0.125 * (i + 1)
        tokens.append(f"token_id:{t}")
        lps.append(lp)
        # listed worst first, so the engine must sort
        tops.append({f"token_id:{(t + j) % 1000}": lp - j for j in reversed(range(k))})
    if fault == "nan":
        lps[-1] = float("nan")  # json writes NaN, which json.loads reads back
    elif fault == "null":
        lps[1] = None
    elif fault == "inf":
        lps[0] = float("-inf")
    elif fault == "short":
        tokens.pop(), lps.pop(), tops.pop()
    elif fault == "top_nan":
        tops[0] = {key: float("nan") for key in tops[0]}
    elif fault == "top_one":
        tops[0] = dict(list(tops[0].items())[:1])
    logprobs = {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": [0] * len(tokens)}
    choice = {"index": 0, "text": "", "finish_reason": "stop" if fault == "short" else "length", "logprobs": logprobs}
    if fault == "bool_ids":
        choice["token_ids"] = [True] * len(tokens)
    return {"object": "text_completion", "model": body["model"], "choices": [choice],
            "system_fingerprint": "fp-stub-1"}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "stub-model", "object": "model"}]})
        elif self.path == "/version":
            self._send(200, {"version": "stub-1"})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        if self.path == "/flush_cache":  # SGLang's: forget every cached prefix
            with self.server.lock:
                self.server.cache.clear()
                self.server.flushes += 1
            self._send(200, {})
            return
        if self.path != "/v1/completions":
            self._send(404, {"detail": "Not Found"})
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if os.environ.get("STUB_EXIT_ON_POST"):  # a server that crashes on its first completion request
            print("stub: dying on a completion request", flush=True)
            os._exit(int(os.environ["STUB_EXIT_ON_POST"]))
        s = self.server
        with s.lock:
            s.in_flight += 1
            s.max_in_flight = max(s.max_in_flight, s.in_flight)
            s.arrivals[body["prompt"][0]] = time.monotonic()
            s.bodies.append(body)
            s.auth.append(self.headers.get("Authorization"))
            drop, s.drop_first = s.drop_first > 0, max(0, s.drop_first - 1)
            fail, s.fail_first = s.fail_first > 0, max(0, s.fail_first - 1)
        time.sleep(s.delay_s + s.rng.uniform(0, s.jitter_s))
        # No longer in flight before the answer leaves: a client that sends its next request on
        # receiving this one must never see two in flight.
        with s.lock:
            s.in_flight -= 1
        if drop:  # close the connection without an answer: the client sees it reset
            self.close_connection = True
            return
        if fail:
            self._send(503, {"error": "stub is busy"})
        elif s.status != 200:
            self._send(s.status, {"error": "stub says no"})
        else:
            answer = completion(body, s.fault)
            # A prefix cache keyed by cache_salt: a prompt seen before under the same salt is served from it.
            key = (body.get("cache_salt"), tuple(body["prompt"]))
            with s.lock:
                cached = len(body["prompt"]) - 1 if key in s.cache else 0
                s.cache.add(key)
            if s.report_cache:
                answer["usage"] = {"prompt_tokens": len(body["prompt"]),
                                   "prompt_tokens_details": {"cached_tokens": cached}}
            self._send(200, answer)


class Stub(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # listen backlog: 256 clients connecting at once are not reset

    def __init__(self, port=0, host="127.0.0.1"):
        super().__init__((host, port), Handler)
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0
        self.arrivals, self.bodies, self.auth = {}, [], []
        self.delay_s, self.status = 0.2, 200
        self.fail_first = self.drop_first = 0   # answer 503 / drop the connection for the first N requests
        self.jitter_s, self.rng = 0.0, random.Random(0)
        self.fault = ""  # see completion()
        self.cache, self.flushes, self.report_cache = set(), 0, True

    def handle_error(self, request, client_address):
        pass  # a client that timed out and left: nothing to report


if __name__ == "__main__":
    Stub(int(sys.argv[1]), *sys.argv[2:3]).serve_forever()
'''


GREEDY = SamplingParams(max_tokens=4, logits="digest")


def _stub_module() -> types.ModuleType:
    mod = types.ModuleType("stub_server")
    exec(compile(STUB, "stub_server", "exec"), mod.__dict__)
    return mod


@pytest.fixture
def needs_httpx() -> None:
    pytest.importorskip("httpx")  # the `vllm` extra


@pytest.fixture
def stub(needs_httpx: None) -> Iterator[Any]:
    server = _stub_module().Stub()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: Any) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _reqs(n: int, **kw: Any) -> list[Request]:
    return [Request(f"r{i}", (i + 1, 10, 20), GREEDY, **kw) for i in range(n)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_parses_token_ids_logprobs_top2_and_digests(stub: Any, tmp_path: Path) -> None:
    engine = OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=_url(stub), logprobs=3))
    [c] = engine.generate([Request("a", (7, 8, 9), GREEDY)])
    assert c.token_ids == [24, 25, 26, 27]
    assert c.logprobs == [-0.125, -0.25, -0.375, -0.5]
    assert c.top2 == [(-0.125, -1.125), (-0.25, -1.25), (-0.375, -1.375), (-0.5, -1.5)]
    assert c.logits_digests is not None and c.logits_digests[0] == topk_digest({24: -0.125, 25: -1.125, 26: -2.125})
    assert len(set(c.logits_digests)) == 4
    assert [(e.engine_step, e.token_index, e.is_prefill, e.num_seqs) for e in c.evidence] == [
        (0, 0, True, 1), (1, 1, False, 1), (2, 2, False, 1), (3, 3, False, 1)]
    body = stub.bodies[0]
    assert body == {"model": "stub-model", "prompt": [7, 8, 9], "max_tokens": 4, "temperature": 0.0, "seed": 0,
                    "logprobs": 3, "return_tokens_as_token_ids": True, "return_token_ids": True, "ignore_eos": True}
    info = engine.describe()
    assert (info["engine"], info["served_model"], info["server_version"]) == ("openai", "stub-model", "stub-1")
    assert info["system_fingerprint"] == ["fp-stub-1"]  # read from the answers
    assert "client-side" in info["evidence"]


def test_digest_differs_when_one_topk_value_moves_one_float32_ulp() -> None:
    import struct

    nudged = struct.unpack("<f", struct.pack("<I", struct.unpack("<I", struct.pack("<f", -1.5))[0] + 1))[0]
    assert topk_digest({1: -0.5, 2: -1.5}) != topk_digest({1: -0.5, 2: nudged})
    assert topk_digest({1: -0.5, 2: -1.5}) == topk_digest({2: -1.5, 1: -0.5})


def test_logits_none_gives_no_digests(stub: Any, tmp_path: Path) -> None:
    engine = OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=_url(stub)))
    [c] = engine.generate([Request("a", (1,), SamplingParams(max_tokens=2, logits="none"))])
    assert c.logits_digests is None and len(c.token_ids) == 2


@pytest.mark.parametrize(("concurrency", "expect_max"), [(6, 6), (1, 1)])
def test_concurrency_is_real_and_is_the_evidence(stub: Any, tmp_path: Path, concurrency: int,
                                                  expect_max: int) -> None:
    engine = OpenAIEngine(tmp_path, "production",
                          EngineConfig.of("openai", base_url=_url(stub), concurrency=concurrency))
    out = engine.generate(_reqs(6))
    assert [c.request_id for c in out] == [f"r{i}" for i in range(6)]
    assert [c.token_ids[0] for c in out] == [(i + 1 + 30) % 1000 for i in range(6)]
    if expect_max == 1:
        assert stub.max_in_flight == 1
        assert all(c.max_batch == 1 for c in out)
    else:
        assert stub.max_in_flight >= 2
        assert all(c.max_batch >= 2 for c in out)
        assert max(c.max_batch for c in out) <= 6


def test_arrival_delays_hold_requests_back(stub: Any, tmp_path: Path) -> None:
    stub.delay_s = 0.05
    engine = OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=_url(stub), arrival_step_s=0.3))
    reqs = [Request("now", (1,), GREEDY), Request("step", (2,), GREEDY, arrival_step=1),
            Request("delay", (3,), GREEDY, arrival_delay_s=0.6, arrival_step=5)]
    engine.generate(reqs)
    t = stub.arrivals
    assert t[2] - t[1] >= 0.25  # one step of 0.3 s
    assert t[3] - t[1] >= 0.5  # the explicit delay (0.6 s) holds the request back


def test_server_down_is_an_engine_error_quickly(tmp_path: Path, needs_httpx: None) -> None:
    port = _free_port()
    start = time.monotonic()
    with pytest.raises(EngineError, match=f"127.0.0.1:{port}/v1/models"):
        OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=f"http://127.0.0.1:{port}"))
    assert time.monotonic() - start < 10


def test_server_down_during_generate_is_an_engine_error(stub: Any, tmp_path: Path) -> None:
    engine = OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=_url(stub)))
    stub.shutdown()
    stub.server_close()
    with pytest.raises(EngineError, match="/v1/completions"):
        engine.generate(_reqs(2))


def test_http_500_is_an_engine_error_naming_the_status(stub: Any, tmp_path: Path) -> None:
    stub.status = 500
    engine = OpenAIEngine(tmp_path, "production",
                          EngineConfig.of("openai", base_url=_url(stub), max_retries=2, retry_backoff_s=0))
    with pytest.raises(EngineError, match=r"/v1/completions answered HTTP 500 \(after 2 retries\): .*stub says no") as e:
        engine.generate(_reqs(3))
    assert "\n" not in str(e.value)


def test_a_request_past_its_timeout_is_an_engine_error(stub: Any, tmp_path: Path) -> None:
    engine = OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=_url(stub), request_timeout_s=0.3))
    stub.delay_s = 3.0
    start = time.monotonic()
    with pytest.raises(EngineError, match="no answer within 0.3 s"):
        engine.generate(_reqs(1))
    assert time.monotonic() - start < 2.5


def test_a_per_call_token_budget_is_a_config_error(stub: Any, tmp_path: Path) -> None:
    engine = OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=_url(stub)))
    with pytest.raises(ConfigError, match="max_num_batched_tokens"):
        engine.generate(_reqs(1), max_num_batched_tokens=64)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({}, "base_url"),
    ({"base_url": "http://127.0.0.1:1", "command": ["x"]}, "base_url"),
    ({"command": "vllm serve"}, "command"),
    ({"base_url": "http://127.0.0.1:1", "logprobs": 1}, "logprobs"),
    ({"base_url": "http://127.0.0.1:1", "concurrency": 0}, "concurrency"),
    ({"base_url": "http://127.0.0.1:1", "mode_env": {"fast": {}}}, "mode_env"),
    ({"command": ["vllm", "serve", "--port", "{port}"]}, "command"),
    ({"base_url": {"invariant": "http://127.0.0.1:1"}}, "base_url"),
    ({"base_url": "http://127.0.0.1:1", "max_retries": -1}, "max_retries"),
])
def test_bad_options_are_config_errors_naming_the_field(tmp_path: Path, kwargs: dict[str, Any],
                                                        field: str) -> None:
    with pytest.raises(ConfigError, match=f"engine.options.{field}"):
        OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", **kwargs))


def test_missing_httpx_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(ConfigError, match=r"oracle-determinism\[openai\]"):
        OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url="http://127.0.0.1:1"))


def test_starts_its_own_server_with_mode_env_and_stops_it(tmp_path: Path, needs_httpx: None) -> None:
    script = tmp_path / "stub_server.py"
    script.write_text(STUB)
    marker = tmp_path / "mode_env_seen"
    command = ["{python}", "-c",
               "import os, runpy, sys; open(os.environ['MARKER'], 'w').write(os.environ['ORACLE_STUB_MODE']); "
               "sys.argv = sys.argv[1:4]; runpy.run_path(sys.argv[0], run_name='__main__')",
               str(script), "{port}", "{host}"]
    engine = OpenAIEngine(tmp_path / "model", "invariant",
                          EngineConfig.of("openai", command=command, env={"MARKER": str(marker)},
                                          mode_env={"invariant": {"ORACLE_STUB_MODE": "inv"}}, startup_timeout_s=30))
    try:
        pid = engine.server_pid
        assert pid is not None and _alive(pid)
        assert engine.base_url.startswith("http://127.0.0.1:")
        assert marker.read_text() == "inv"
        [c] = engine.generate([Request("a", (7, 8, 9), GREEDY)])
        assert c.token_ids == [24, 25, 26, 27]
        assert "ORACLE_STUB_MODE" in engine.describe()["invariance_mechanism"]
    finally:
        engine.close()
    assert engine.server_pid is None
    assert not _alive(pid)


def test_a_server_that_dies_while_starting_is_an_engine_error_with_its_log(tmp_path: Path, needs_httpx: None) -> None:
    command = ["{python}", "-c", "import sys; print('no model at {model}', flush=True); sys.exit(3)", "{host}"]
    with pytest.raises(EngineError, match=r"(?s)exited with code 3.*no model at .*mdl"):
        OpenAIEngine(tmp_path / "mdl", "production", EngineConfig.of("openai", command=command, startup_timeout_s=30))


def test_a_server_that_never_answers_is_killed_after_the_startup_timeout(tmp_path: Path, needs_httpx: None) -> None:
    pid_file = tmp_path / "pid"
    command = ["{python}", "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
               "time.sleep(60)", "{host}"]
    start = time.monotonic()
    with pytest.raises(EngineError, match="not ready within 1 s"):
        OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", command=command, startup_timeout_s=1))
    assert time.monotonic() - start < 10
    assert not _alive(int(pid_file.read_text()))


def _stubs(n: int) -> list[Any]:
    servers = [_stub_module().Stub() for _ in range(n)]
    for server in servers:
        server.delay_s = 0.0
        threading.Thread(target=server.serve_forever, daemon=True).start()
    return servers


@pytest.fixture
def two_stubs(needs_httpx: None) -> Iterator[list[Any]]:
    servers = _stubs(2)
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def test_one_server_per_mode(two_stubs: list[Any], tmp_path: Path) -> None:
    inv, prod = two_stubs
    urls = {"invariant": _url(inv), "production": _url(prod)}
    for mode, server in (("invariant", inv), ("production", prod)):
        engine = OpenAIEngine(tmp_path, mode, EngineConfig.of("openai", base_url=urls))  # type: ignore[arg-type]
        engine.generate(_reqs(2))
        assert engine.base_url == _url(server)
        assert engine.describe()["warnings"] == []
    assert len(inv.bodies) == len(prod.bodies) == 2


def test_one_url_for_both_modes_is_accepted_with_a_warning(stub: Any, tmp_path: Path) -> None:
    engine = OpenAIEngine(tmp_path, "invariant", EngineConfig.of("openai", base_url=_url(stub)))
    [warning] = engine.describe()["warnings"]
    assert "both modes" in warning and "{invariant: URL, production: URL}" in warning


@pytest.mark.parametrize("fault", ["fail_first", "drop_first"])
def test_transient_failures_are_retried_and_counted(stub: Any, tmp_path: Path, fault: str) -> None:
    """503s and dropped connections for the first 3 requests: retried, every answer right, 3 retries counted."""
    stub.delay_s = 0.0
    setattr(stub, fault, 3)
    engine = OpenAIEngine(tmp_path, "production",
                          EngineConfig.of("openai", base_url=_url(stub), concurrency=1, retry_backoff_s=0))
    out = engine.generate(_reqs(4))
    assert [c.token_ids[0] for c in out] == [(i + 1 + 30) % 1000 for i in range(4)]
    info = engine.describe()
    assert info["retries_total"] == 3
    assert list(info["retries"]) == (["HTTP 503"] if fault == "fail_first" else ["RemoteProtocolError"])
    assert len(stub.bodies) == 4 + 3


def test_a_persistent_transient_failure_ends_after_max_retries(stub: Any, tmp_path: Path) -> None:
    stub.delay_s = 0.0
    stub.drop_first = 100
    engine = OpenAIEngine(tmp_path, "production",
                          EngineConfig.of("openai", base_url=_url(stub), concurrency=1, max_retries=2,
                                          retry_backoff_s=0))
    with pytest.raises(EngineError, match=rf"{_url(stub)}/v1/completions: RemoteProtocolError.*after 2 retries"):
        engine.generate(_reqs(1))
    assert len(stub.bodies) == 3
    assert engine.describe()["retries_total"] == 2


def test_256_concurrent_requests_with_random_latency_none_lost(stub: Any, tmp_path: Path) -> None:
    stub.delay_s, stub.jitter_s = 0.0, 0.05
    engine = OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=_url(stub), concurrency=256))
    reqs = [Request(f"r{i}", (i, 7, 11), GREEDY) for i in range(256)]
    out = engine.generate(reqs)
    assert [c.request_id for c in out] == [r.request_id for r in reqs]
    assert [c.token_ids for c in out] == [[(i + 18 + k) % 1000 for k in range(4)] for i in range(256)]
    assert sorted(b["prompt"][0] for b in stub.bodies) == list(range(256))  # each answered once


def test_oracle_run_on_two_servers_with_only_a_tokenizer_on_disk(two_stubs: list[Any], tmp_path: Path) -> None:
    """config.json and tokenizer files, no weights: the openai engine runs text prompts against two servers."""
    import yaml

    from oracle.config import load_config
    from oracle.models import make_model
    from oracle.runner import run

    model = make_model("tiny-qwen3", tmp_path / "model")
    (model / "model.safetensors").unlink()
    inv, prod = two_stubs
    cfg = tmp_path / "server.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": "model",
        "engine": {"kind": "openai", "options": {"base_url": {"invariant": _url(inv), "production": _url(prod)},
                                                 "concurrency": 4}},
        "prompts": {"texts": ["hello there", "a second prompt"]},
        "sampling": {"max_tokens": 3, "logits": "digest"},
        "schedule": {"trials": 3, "batch_size": [1, 3], "repeat_trials": 1, "shrink": False},
        "checks": {"prefill_decode": "off", "prefix_cache": "off"},
    }))
    report = run(load_config(cfg), seed=1, report_dir=tmp_path / "report")
    assert report.complete and report.error is None
    assert {c.name: c.verdict for c in report.checks}["invariance"] in ("pass", "vacuous")
    engines = report.environment["engines"]
    assert engines["invariant"]["base_url"] == _url(inv) and engines["production"]["base_url"] == _url(prod)
    assert inv.bodies and prod.bodies


def test_token_ids_beside_text_tokens_are_used(tmp_path: Path) -> None:
    """A server that names tokens by text but returns `token_ids` (SGLang's return_token_ids)."""
    from oracle.engines.openai_answers import parse_choice

    choice = {"token_ids": [5, 9], "logprobs": {"tokens": ["he", "llo"], "token_logprobs": [-0.5, -0.25],
                                                "top_logprobs": [{"he": -0.5, "ha": -1.0}, {"llo": -0.25, "y": -2.0}]}}
    c = parse_choice(Request("a", (1,), SamplingParams(max_tokens=2, logits="digest")), choice, 1)
    assert c.token_ids == [5, 9] and c.logprobs == [-0.5, -0.25]
    assert c.top2 == [(-0.5, -1.0), (-0.25, -2.0)]
    import numpy as np

    moved = {"he": -0.5, "ha": float(np.nextafter(np.float32(-1.0), np.float32(0)))}
    assert c.logits_digests is not None and c.logits_digests[0] != topk_digest(moved)
    assert c.logits_digests[0] == topk_digest({"he": -0.5, "ha": -1.0})


def test_an_api_key_is_sent_as_a_bearer_token(stub: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    OpenAIEngine(tmp_path, "production",
                 EngineConfig.of("openai", base_url=_url(stub), api_key="k1")).generate(_reqs(1))
    OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=_url(stub))).generate(_reqs(1))
    monkeypatch.setenv("OPENAI_API_KEY", "k2")
    OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=_url(stub))).generate(_reqs(1))
    assert stub.auth == ["Bearer k1", None, "Bearer k2"]


def test_a_started_server_is_stopped_when_the_engine_fails_after_start(tmp_path: Path, needs_httpx: None) -> None:
    """The server answers, then the engine refuses it (wrong served model): the server does not outlive that."""
    script = tmp_path / "stub_server.py"
    script.write_text(STUB)
    pid_file = tmp_path / "pid"
    command = ["{python}", "-c",
               f"import os, runpy, sys; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
               "sys.argv = sys.argv[1:4]; runpy.run_path(sys.argv[0], run_name='__main__')",
               str(script), "{port}", "{host}"]
    with pytest.raises(ConfigError, match="served_model_name"):
        OpenAIEngine(tmp_path, "production",
                     EngineConfig.of("openai", command=command, served_model_name="another-model", startup_timeout_s=30))
    assert not _alive(int(pid_file.read_text()))


# --- issue 17: broken answers are engine errors; a crashed server is named; no logs left; loopback only ----


@pytest.mark.parametrize(("fault", "says"), [
    ("nan", r"token_logprobs\[3\] is nan, not a finite logprob"),
    ("null", r"token_logprobs\[1\] is None, not a number"),
    ("inf", r"token_logprobs\[0\] is -inf"),
    ("short", r"3 tokens for max_tokens 4 \(finish_reason 'stop'\)"),
    ("top_nan", r"top_logprobs\[0\]\['token_id:\d+'\] is nan"),
    ("top_one", r"top_logprobs\[0\] holds 1 entries"),
])
def test_non_finite_or_short_answers_are_engine_errors(stub: Any, tmp_path: Path, fault: str, says: str) -> None:
    """The same NaN in the reference and every trial would be bitwise equal: a broken server, not a pass."""
    stub.delay_s, stub.fault = 0.0, fault
    engine = OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=_url(stub)))
    with pytest.raises(EngineError, match=f"unexpected answer for request r0: ValueError: {says}"):
        engine.generate(_reqs(1))


def test_boolean_token_ids_are_not_token_ids(stub: Any, tmp_path: Path) -> None:
    stub.delay_s, stub.fault = 0.0, "bool_ids"
    [c] = OpenAIEngine(tmp_path, "production",
                       EngineConfig.of("openai", base_url=_url(stub))).generate([Request("a", (7, 8, 9), GREEDY)])
    assert c.token_ids == [24, 25, 26, 27] and all(type(t) is int for t in c.token_ids)


def _stub_command(script: Path, host: str = "{host}") -> list[str]:
    return ["{python}", "-c", "import os, runpy, sys; sys.argv = [sys.argv[1], sys.argv[2], "
            "os.environ.get('STUB_BIND') or sys.argv[3]]; runpy.run_path(sys.argv[0], run_name='__main__')",
            str(script), "{port}", host]


@pytest.fixture
def server_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, needs_httpx: None) -> Path:
    """The temp folder where started servers' logs go, for this test alone."""
    import tempfile

    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def test_a_server_that_crashes_mid_run_is_named_with_its_exit_code_and_output(tmp_path: Path,
                                                                              server_tmp: Path) -> None:
    script = tmp_path / "stub_server.py"
    script.write_text(STUB)
    engine = OpenAIEngine(tmp_path, "production",
                          EngineConfig.of("openai", command=_stub_command(script), env={"STUB_EXIT_ON_POST": "7"},
                                          startup_timeout_s=30, retry_backoff_s=0))
    try:
        assert list(server_tmp.glob("oracle-server-*.log"))  # while it runs, its output is kept
        with pytest.raises(EngineError, match=r"(?s)the server exited with code 7 while answering .*/v1/completions"
                                              r".*last lines of its output:\nstub: dying on a completion request"):
            engine.generate(_reqs(1))
    finally:
        engine.close()
    assert not list(server_tmp.glob("oracle-server-*.log"))


def test_a_server_that_fails_to_start_leaves_no_log(tmp_path: Path, server_tmp: Path) -> None:
    command = ["{python}", "-c", "import sys; print('no model here', flush=True); sys.exit(3)", "{host}"]
    with pytest.raises(EngineError, match=r"(?s)exited with code 3 while starting.*no model here"):
        OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", command=command, startup_timeout_s=30))
    assert not list(server_tmp.glob("oracle-server-*.log"))


@pytest.mark.parametrize("item", ["0.0.0.0", "--host=0.0.0.0", "::", "[::]", "192.168.1.5"])
def test_a_command_naming_a_non_loopback_address_is_refused(tmp_path: Path, item: str, needs_httpx: None) -> None:
    command = ["vllm", "serve", "{model}", "--host", item, "--port", "{port}", "--served-model-name", "{host}"]
    with pytest.raises(ConfigError, match=r"engine.options.command: .* not loopback"):
        OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", command=command))


def test_a_server_that_binds_every_interface_anyway_is_stopped_and_refused(tmp_path: Path, server_tmp: Path) -> None:
    """{host} is on the command line, but the server binds 0.0.0.0 (here from an env var): what it listens on decides."""
    from oracle.engines.openai_server import listening_hosts

    if listening_hosts(1) is None:
        pytest.skip("no /proc/net/tcp here")
    script = tmp_path / "stub_server.py"
    script.write_text(STUB)
    pid_file = tmp_path / "pid"
    command = _stub_command(script)
    command[2] = f"open({str(pid_file)!r}, 'w').write(str(__import__('os').getpid())); " + command[2]
    with pytest.raises(ConfigError, match=r"the server listens on 0\.0\.0\.0 port \d+, not only on 127\.0\.0\.1"):
        OpenAIEngine(tmp_path, "production",
                     EngineConfig.of("openai", command=command, env={"STUB_BIND": "0.0.0.0"}, startup_timeout_s=30))
    assert not _alive(int(pid_file.read_text()))
    assert not list(server_tmp.glob("oracle-server-*.log"))


def test_a_loopback_server_passes_the_bind_check(tmp_path: Path, server_tmp: Path) -> None:
    script = tmp_path / "stub_server.py"
    script.write_text(STUB)
    engine = OpenAIEngine(tmp_path, "production",
                          EngineConfig.of("openai", command=_stub_command(script), startup_timeout_s=30))
    try:
        [c] = engine.generate([Request("a", (7, 8, 9), GREEDY)])
        assert c.token_ids == [24, 25, 26, 27]
    finally:
        engine.close()
    assert not list(server_tmp.glob("oracle-server-*.log"))


def test_one_server_for_both_modes_makes_the_mode_comparisons_vacuous(stub: Any, tmp_path: Path) -> None:
    """One base_url: fidelity, drift and the negative control compare the server with itself and say so in
    their verdict and in every view, never a plain pass."""
    import yaml

    from oracle.config import load_config
    from oracle.models import make_model
    from oracle.render.files import write_formats
    from oracle.runner import run

    model = make_model("tiny-qwen3", tmp_path / "model")
    (model / "model.safetensors").unlink()
    cfg = tmp_path / "server.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": "model",
        "engine": {"kind": "openai", "options": {"base_url": _url(stub), "concurrency": 4}},
        "prompts": {"random": {"count": 2, "min_len": 3, "max_len": 6}},
        "sampling": {"max_tokens": 3, "logits": "digest"},
        "schedule": {"trials": 3, "batch_size": [1, 3], "repeat_trials": 1, "shrink": False},
        "checks": {"fidelity": "warn", "prefill_decode": "off", "prefix_cache": "off"},
    }))
    out = tmp_path / "report"
    report = run(load_config(cfg), seed=1, report_dir=out, views=[write_formats])
    verdicts = {c.name: c for c in report.checks}
    for name in ("fidelity", "drift", "negative_control"):
        assert verdicts[name].verdict == "vacuous", name
        assert "compares the server with itself" in verdicts[name].message
    assert verdicts["invariance"].evidence.get("shared_server") is None
    assert "compares the server with itself" in (out / "summary.md").read_text()


def test_a_sampled_request_sends_its_own_seed_and_truncation(stub: Any, tmp_path: Path) -> None:
    engine = OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=_url(stub)))
    sampled = [SamplingParams(max_tokens=2, temperature=0.5, seed=s, top_p=0.9, top_k=8) for s in (3, 4)]
    out = engine.generate([Request(f"r{i}", (7, 8, 9), p) for i, p in enumerate(sampled)])
    assert sorted((b["seed"], b["top_p"], b["top_k"]) for b in stub.bodies) == [(3, 0.9, 8), (4, 0.9, 8)]
    assert out[0].token_ids != out[1].token_ids  # the stub honours the seed


def _server_run(tmp_path: Path, base_url: Any, checks: dict[str, Any]) -> Any:
    import yaml

    from oracle.config import load_config
    from oracle.models import make_model
    from oracle.runner import run

    model = make_model("tiny-qwen3", tmp_path / "model")
    (model / "model.safetensors").unlink()
    cfg = tmp_path / "server.yaml"
    cfg.write_text(yaml.safe_dump({
        "model": "model",
        "engine": {"kind": "openai", "options": {"base_url": base_url, "concurrency": 4}},
        "prompts": {"texts": ["hello there", "a second prompt"]},
        "sampling": {"max_tokens": 3, "logits": "digest"},
        "schedule": {"trials": 3, "batch_size": [1, 3], "repeat_trials": 1, "shrink": False},
        "checks": {"repeatability": "off", "fidelity": "off", "drift": "off", "negative_control": "off",
                   "prefill_decode": "off", "prefix_cache": "off", **checks},
    }))
    return run(load_config(cfg), seed=1, report_dir=tmp_path / "report")


def test_seeded_sampling_and_cross_instance_over_a_list_of_servers(needs_httpx: None, tmp_path: Path) -> None:
    """Invariant mode given two servers: the run uses the first, cross_instance the second; both pass, and the
    seeded_sampling check reads the servers' answers to each request's seed."""
    servers = _stubs(3)
    try:
        first, second, prod = servers
        report = _server_run(tmp_path, {"invariant": [_url(first), _url(second)], "production": _url(prod)},
                             {"seeded_sampling": "required", "cross_instance": "required"})
        verdicts = {c.name: c.verdict for c in report.checks}
        assert verdicts["seeded_sampling"] == verdicts["cross_instance"] == "pass", report.checks
        assert report.check("cross_instance").trials == 2 + 3  # type: ignore[union-attr]
        assert first.bodies and second.bodies and not prod.bodies
        assert {b["seed"] for b in first.bodies if b["temperature"] > 0} and \
            not any(b["temperature"] > 0 for b in second.bodies)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_cross_instance_on_one_server_is_vacuous(stub: Any, tmp_path: Path) -> None:
    stub.delay_s = 0.0
    report = _server_run(tmp_path, {"invariant": _url(stub), "production": _url(stub)},
                         {"invariance": "off", "seeded_sampling": "off", "cross_instance": "required"})
    result = report.check("cross_instance")
    assert result is not None and result.verdict == "vacuous" and "list of URLs" in result.message
    assert report.exit_code() == 1  # a required check that proves nothing


def test_cache_salt_starts_each_reset_cold_and_the_warm_run_reports_its_hit(stub: Any, tmp_path: Path) -> None:
    """prefix_cache_reset: cache_salt sends a salt with every request and a new one after each reset: the
    same prompt again under one salt is served from the server's cache (cached_tokens > 0), after a reset
    it is not."""
    engine = OpenAIEngine(tmp_path, "invariant", EngineConfig.of("openai", base_url=_url(stub),
                                                                  prefix_cache_reset="cache_salt"))
    from oracle.engines.contract import capabilities

    assert capabilities(engine).reset_prefix_cache and engine.describe()["enable_prefix_caching"] is True
    req = [Request("a", (7, 8, 9), GREEDY)]
    cold = engine.generate(req)[0]
    warm = engine.generate(req)[0]
    engine.reset_prefix_cache()
    cold_again = engine.generate(req)[0]
    assert [c.evidence[0].num_cached_tokens for c in (cold, warm, cold_again)] == [0, 2, 0]
    assert all(e.num_cached_tokens == 0 for e in warm.evidence[1:])  # only the prefill step read the cache
    salts = [b["cache_salt"] for b in stub.bodies]
    assert salts[0] == salts[1] != salts[2] and all(s.startswith("oracle-") for s in salts)


def test_flush_cache_posts_to_the_server_and_off_never_resets(stub: Any, tmp_path: Path) -> None:
    from oracle.engines.contract import capabilities

    engine = OpenAIEngine(tmp_path, "invariant", EngineConfig.of("openai", base_url=_url(stub),
                                                                  prefix_cache_reset="flush_cache"))
    req = [Request("a", (7, 8, 9), GREEDY)]
    engine.generate(req)
    engine.reset_prefix_cache()
    assert stub.flushes == 1 and "cache_salt" not in stub.bodies[0]
    assert engine.generate(req)[0].evidence[0].num_cached_tokens == 0
    off = OpenAIEngine(tmp_path, "invariant", EngineConfig.of("openai", base_url=_url(stub)))
    assert not capabilities(off).reset_prefix_cache and off.describe()["enable_prefix_caching"] is False
    with pytest.raises(EngineError, match="prefix_cache_reset"):
        off.reset_prefix_cache()


def test_a_reset_endpoint_the_server_lacks_is_an_engine_error_naming_the_option(stub: Any, tmp_path: Path) -> None:
    engine = OpenAIEngine(tmp_path, "invariant", EngineConfig.of("openai", base_url=_url(stub),
                                                                  prefix_cache_reset="reset_prefix_cache"))
    with pytest.raises(EngineError, match=r"/reset_prefix_cache answered HTTP 404 .*VLLM_SERVER_DEV_MODE"):
        engine.reset_prefix_cache()


@pytest.mark.parametrize("report_cache", [True, False])
def test_the_prefix_cache_check_runs_on_servers_that_reset_and_report_hits(two_stubs: list[Any], tmp_path: Path,
                                                                            fake_model: Path, report_cache: bool) -> None:
    """With a reset and cached_tokens reported, prefix_cache compares warm with cold runs on the server and
    passes; a server that reports no cached tokens leaves it vacuous, saying which flag reports them."""
    from oracle.config import parse_config
    from oracle.runner import run

    inv, prod = two_stubs
    for s in (inv, prod):
        s.delay_s, s.report_cache = 0.0, report_cache
    config = parse_config({
        "model": str(fake_model),
        "engine": {"kind": "openai", "options": {"base_url": {"invariant": _url(inv), "production": _url(prod)},
                                                 "prefix_cache_reset": "cache_salt"}},
        "prompts": {"random": {"count": 2, "min_len": 3, "max_len": 6}},
        "sampling": {"max_tokens": 3, "logits": "digest"},
        "schedule": {"trials": 2, "batch_size": [1, 3], "repeat_trials": 1, "shrink": False},
        "checks": {"prefill_decode": "off", "prefix_cache": "required"},
    })
    report = run(config, seed=1, report_dir=tmp_path / "report")
    check = report.check("prefix_cache")
    assert check is not None
    if report_cache:
        assert check.verdict == "pass" and check.evidence["warm_runs_with_cache_hits"] == 2
    else:
        assert check.verdict == "vacuous" and "--enable-prompt-tokens-details" in (check.message or "")
