"""The openai engine under load: 256 requests in flight at once against a server with random latency,
none lost, none duplicated, each answer matched to its request. A real HTTP server on loopback."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from oracle.config import EngineConfig
from oracle.engines.contract import Request, SamplingParams

N = 256


def _answer(body: dict[str, Any]) -> dict[str, Any]:
    base = sum(body["prompt"]) % 1000
    tokens = [f"token_id:{(base + i) % 1000}" for i in range(body["max_tokens"])]
    lps = [-0.25 * (i + 1) for i in range(body["max_tokens"])]
    tops = [{f"token_id:{(base + i + j) % 1000}": lps[i] - j for j in range(body["logprobs"])}
            for i in range(body["max_tokens"])]
    return {"object": "text_completion", "model": body["model"], "choices": [{
        "index": 0, "text": "", "finish_reason": "length",
        "logprobs": {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": [0] * len(tokens)},
    }]}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - the http.server protocol
        if self.path == "/v1/models":
            self._send({"object": "list", "data": [{"id": "load-model", "object": "model"}]})
        else:
            self._send({})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        s = self.server
        with s.lock:
            s.in_flight += 1
            s.max_in_flight = max(s.max_in_flight, s.in_flight)
            s.prompts.append(tuple(body["prompt"]))
            delay = s.rng.uniform(0.0, 0.05)
        try:
            threading.Event().wait(delay)  # random latency: answers come back out of order
            self._send(_answer(body))
        finally:
            with s.lock:
                s.in_flight -= 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # 256 connections arrive at once

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.rng = random.Random(12)
        self.in_flight = self.max_in_flight = 0
        self.prompts: list[tuple[int, ...]] = []


@pytest.fixture
def server() -> Iterator[_Server]:
    pytest.importorskip("httpx")
    s = _Server()
    thread = threading.Thread(target=s.serve_forever, daemon=True)
    thread.start()
    yield s
    s.shutdown()
    s.server_close()


def test_256_concurrent_requests_none_lost(server: _Server, tmp_path: Path) -> None:
    from oracle.engines.openai_engine import OpenAIEngine

    url = f"http://127.0.0.1:{server.server_address[1]}"
    engine = OpenAIEngine(tmp_path, "production", EngineConfig.of("openai", base_url=url, concurrency=N))
    try:
        sampling = SamplingParams(max_tokens=3, logits="digest")
        requests = [Request(f"r{i}", (i, 7, 11), sampling) for i in range(N)]
        out = engine.generate(requests)
    finally:
        engine.close()
    assert [c.request_id for c in out] == [r.request_id for r in requests]
    for i, c in enumerate(out):
        base = (i + 18) % 1000
        assert c.token_ids == [base, (base + 1) % 1000, (base + 2) % 1000]
        assert c.logprobs == [-0.25, -0.5, -0.75]
    assert sorted(server.prompts) == sorted(r.prompt_token_ids for r in requests)  # each sent exactly once
    assert server.max_in_flight > 1
