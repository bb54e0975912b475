"""The `openai` engine adapter: any server with an OpenAI-style `/v1/completions` endpoint (vLLM, ...).

Requests go out from one asyncio loop, at most `concurrency` in flight, each after its arrival
delay, so the server batches them as it would batch real traffic. Prompts are token ids and the
server is asked for token ids back (vLLM's `return_tokens_as_token_ids`, SGLang's
`return_token_ids`), so no tokenizer is involved.

What is compared: token ids; the float32 log-probability of each sampled token; `top2` holds the
top-1 and top-2 logprobs of each step (their difference is the logit margin); and
`logits_digests[i]` is a sha256 of step i's top-k as sorted (token id, float32 bits) pairs, so the
top-k is compared bitwise. A server returns no full logits rows, so `sampling.logits: full` gets
digests too.

Evidence is client-side: a server does not say which requests shared a forward pass, so each
token's `StepEvidence.num_seqs` is the most requests that were in flight at once during that
request's lifetime (itself included), and `num_tokens` is 0 (unknown).

No weights are read: the model directory needs only config.json (the vocabulary size, for random
prompts and fillers) and a tokenizer where prompts are text.

Servers (`engine.options`, typed as `oracle.engine_options.OpenAIOptions`):

    base_url: {invariant: URL, production: URL}: a pre-started server per mode. A single URL is
        accepted and serves both modes; the mode comparison then compares a server with itself,
        and describe() carries a warning saying so.
    command: argv that starts a server per mode on 127.0.0.1 ({python}, {model}, {host}, {port}
        are substituted; {host} is required), with env and mode_env[mode] added to the
        environment. The server is stopped on close(), on every error and at interpreter exit.
        It must listen on loopback only: a command naming another address (0.0.0.0, ::, a LAN
        IP) is a config error, and so is a server found listening elsewhere once it answers.
        Its output goes to a temporary log that is removed when it stops; a server that exits
        is reported with its exit code and the log's last lines, not as a connection error.

Answers are checked: a null, NaN or infinite logprob (sampled or top-k), fewer than two top-k
entries, or a token count other than max_tokens is an EngineError naming the request: a broken
model or server is never compared (its NaNs would be bitwise equal to themselves).

Transient failures (HTTP 429/500/502/503/504, a connection reset or dropped) are retried up to
`max_retries` times with exponential backoff (`retry_backoff_s`, doubling, at most 8 s) and counted
in describe()["retries"]; what persists is an EngineError naming the URL.

A server started by `command` is oracle.engines.openai_server's; an answer is read by oracle.engines.openai_answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oracle.config import EngineConfig
from oracle.engine_options import ModeURLs, OpenAIOptions
from oracle.engines.contract import Capabilities, Completion, Mode, Request
from oracle.engines.openai_answers import cached_tokens, parse_choice
from oracle.engines.openai_server import HOST, Server, free_port, substitute
from oracle.errors import ConfigError, EngineError

EVIDENCE = ("client-side concurrency: num_seqs is the most requests in flight at once during the "
            "request's lifetime; the server's own batches are not visible")
_BODY_EXCERPT = 200
_EXIT_WAIT_S = 2.0  # after a failed request: how long a dying server may take to exit
TRANSIENT_STATUS = (429, 500, 502, 503, 504)
_MAX_BACKOFF_S = 8.0
SHARED_URL_WARNING = ("one base_url serves both modes: invariant and production runs hit the same server, "
                      "so fidelity, drift and the negative control compare the server with itself; "
                      "give base_url: {invariant: URL, production: URL}")


def _option(name: str) -> str:
    return f"engine.options.{name}"


def _import_httpx() -> Any:
    try:
        import httpx
    except ImportError as e:
        from oracle.engines.kinds import OPENAI_INSTALL

        raise ConfigError(f"engine.kind: the openai engine needs the httpx package, which is not installed: "
                          f"{OPENAI_INSTALL}") from e
    return httpx


def _one_line(text: str, limit: int = _BODY_EXCERPT) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


def _new_salt() -> str:
    return f"oracle-{secrets.token_hex(8)}"


class OpenAIEngine:
    """Implements `oracle.engines.contract.Engine` over an OpenAI-compatible HTTP server.

    Configured by `config.options` (`oracle.engine_options.OpenAIOptions`: a running server per mode, or the
    command that starts one); the engine fields do not apply to a server.
    """

    def __init__(self, model: Path | str, mode: Mode, config: EngineConfig) -> None:
        options = config.options_as(OpenAIOptions)
        self._httpx = _import_httpx()
        self.mode: Mode = mode
        self.model = Path(model)
        self.concurrency = options.concurrency
        self.arrival_step_s = float(options.arrival_step_s)
        self.logprobs = options.logprobs
        self.request_timeout_s = float(options.request_timeout_s)
        self.max_retries = options.max_retries
        self.retry_backoff_s = float(options.retry_backoff_s)
        key = options.api_key or os.environ.get("OPENAI_API_KEY")
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.retries: dict[str, int] = {}  # reason ("HTTP 503", "ReadError") -> retries made
        self.mode_env = dict(options.mode_env.get(mode, {}))
        self.warnings: list[str] = [SHARED_URL_WARNING] if isinstance(options.base_url, str) else []
        self.prefix_cache_reset = options.prefix_cache_reset
        self.fingerprints: set[str] = set()  # system_fingerprint of the answers: the server's build, where it says
        # Only with a way to start a trial cold is the server's prefix cache something the run can test.
        self.capabilities = Capabilities(reset_prefix_cache=self.prefix_cache_reset != "off")
        self._salt: str | None = None
        if self.prefix_cache_reset == "cache_salt":
            self._salt = _new_salt()  # the first trial starts cold too
        self._server: Server | None = None
        self.command: list[str] | None = None
        try:
            if options.base_url is None:
                self.base_url = self._start_server(options.command or [], options.env, options.startup_timeout_s)
            else:
                self.base_url = mode_url(options.base_url, mode).rstrip("/")
            self._info = self._probe(options.served_model_name)
        except BaseException:
            self.close()
            raise

    def _start_server(self, command: list[str], env: dict[str, str], startup_timeout_s: float) -> str:
        """Start the mode's server on a free port of 127.0.0.1 (the command's {python}, {model}, {host} and
        {port} substituted; `env` and the mode's env added to ours); its URL once it answers."""
        port = free_port()
        subs = {"{python}": sys.executable, "{model}": str(self.model), "{host}": HOST, "{port}": str(port)}
        self.command = [substitute(c, subs) for c in command]
        server_env = {**os.environ, **env, **self.mode_env}
        base_url = f"http://{HOST}:{port}"
        self._server = Server.start(self.command, server_env, base_url, startup_timeout_s, self._httpx)
        self._server.check_loopback(port)
        return base_url

    def _probe(self, served_model_name: str | None) -> dict[str, Any]:
        """Ask the server what it serves and its version; a server that does not answer is an EngineError."""
        models = self._get_json("/v1/models")
        ids = [m.get("id") for m in models.get("data", []) if isinstance(m, dict)] if isinstance(models, dict) else []
        if served_model_name is None:
            if not ids:
                raise EngineError(f"{self.base_url}/v1/models lists no model; set {_option('served_model_name')}")
            served_model_name = str(ids[0])
        elif ids and served_model_name not in ids:
            raise ConfigError(f"{_option('served_model_name')}: {served_model_name!r} is not served by "
                              f"{self.base_url} (it serves {', '.join(map(str, ids))})")
        version = None
        with contextlib.suppress(EngineError):
            answer = self._get_json("/version")
            version = answer.get("version") if isinstance(answer, dict) else None
        return {"served_model": served_model_name, "server_version": version, "models": ids}

    def _get_json(self, path: str) -> Any:
        url = self.base_url + path
        attempt = 0
        while True:
            try:
                r = self._httpx.get(url, timeout=min(self.request_timeout_s, 30.0), headers=self._headers)
            except self._httpx.HTTPError as e:
                retry = self._retry(e, attempt)
                self._raise_if_server_died(url, e, wait=not retry)
                if retry:
                    time.sleep(self._backoff(attempt))
                    attempt += 1
                    continue
                raise EngineError(f"{url}: {type(e).__name__}: {_one_line(str(e))}{self._after(attempt)}") from e
            if r.status_code in TRANSIENT_STATUS and self._retry(r.status_code, attempt):
                time.sleep(self._backoff(attempt))
                attempt += 1
                continue
            return self._answer(url, r, attempt)

    def _raise_if_server_died(self, url: str, e: BaseException, wait: bool = True) -> None:
        """A failed request to a server this engine started: if the server exited, say so (with its
        exit code and the last lines of its log), not the connection error it left behind. `wait`: give
        a dying server a moment to exit (only when the request is about to fail for good)."""
        server = self._server
        if server is None:
            return
        code = server.exit_code(wait_s=_EXIT_WAIT_S if wait else 0.0)
        if code is not None:
            raise EngineError(f"the server exited with code {code} while answering {url} "
                              f"({type(e).__name__}){server.log_tail()}") from e

    def _retry(self, failure: BaseException | int, attempt: int) -> bool:
        """Whether `failure` is transient and retries are left; counts the retry it allows."""
        httpx = self._httpx
        if isinstance(failure, int):
            reason = f"HTTP {failure}"
        elif isinstance(failure, httpx.TransportError) and not isinstance(
                failure, (httpx.TimeoutException, httpx.ConnectError, httpx.UnsupportedProtocol)):
            reason = type(failure).__name__  # ReadError, WriteError, RemoteProtocolError: a reset connection
        else:
            return False
        if attempt >= self.max_retries:
            return False
        self.retries[reason] = self.retries.get(reason, 0) + 1
        return True

    def _backoff(self, attempt: int) -> float:
        return float(min(self.retry_backoff_s * 2**attempt, _MAX_BACKOFF_S))

    @staticmethod
    def _after(attempt: int) -> str:
        return f" (after {attempt} retries)" if attempt else ""

    def _answer(self, url: str, r: Any, attempt: int) -> Any:
        if r.status_code != 200:
            raise EngineError(f"{url} answered HTTP {r.status_code}{self._after(attempt)}: {_one_line(r.text)}")
        try:
            return r.json()
        except ValueError as e:
            raise EngineError(f"{url} answered no JSON: {_one_line(r.text)}") from e

    def reset_prefix_cache(self) -> None:
        """Start the next requests from a cold prefix cache: a new cache_salt (the server keys its cached
        blocks by it, so no block of an earlier request matches), or the server's own flush endpoint."""
        if self.prefix_cache_reset == "cache_salt":
            self._salt = _new_salt()
            return
        if self.prefix_cache_reset == "off":
            raise EngineError(f"the server's prefix cache cannot be reset ({_option('prefix_cache_reset')} is off)")
        url = f"{self.base_url}/{self.prefix_cache_reset}"
        try:
            r = self._httpx.post(url, headers=self._headers, timeout=self.request_timeout_s)
        except self._httpx.HTTPError as e:
            raise EngineError(f"{url}: {type(e).__name__}: {_one_line(str(e))}") from e
        if r.status_code != 200:
            hint = (" (vLLM serves it only with VLLM_SERVER_DEV_MODE=1)"
                    if self.prefix_cache_reset == "reset_prefix_cache" else "")
            raise EngineError(f"{url} answered HTTP {r.status_code}{hint}; set {_option('prefix_cache_reset')} "
                              f"to what the server supports: {_one_line(r.text)}")

    def describe(self) -> dict[str, Any]:
        return {
            "engine": "openai",
            "enable_prefix_caching": self.prefix_cache_reset != "off",
            "prefix_cache_reset": self.prefix_cache_reset,
            "base_url": self.base_url,
            "served_model": self._info["served_model"],
            "server_version": self._info["server_version"],
            # What the answers said of the server's configuration (OpenAI's system_fingerprint); more than one
            # means the server changed under the run. Read again when the mode ends.
            "system_fingerprint": sorted(self.fingerprints) or None,
            "command": self.command,
            "invariance_mechanism": "whatever the server was started with"
            + (f"; mode env {self.mode_env}" if self.mode_env else ""),
            "evidence": EVIDENCE,
            "logits": f"sha256 of the top-{self.logprobs} logprobs as sorted (token id, float32 bits) pairs",
            "concurrency": self.concurrency,
            "arrival_step_s": self.arrival_step_s,
            "retries": dict(self.retries),
            "retries_total": sum(self.retries.values()),
            "warnings": list(self.warnings),
        }

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        """Send every request (after its arrival delay) and wait for all; one Completion per request, in order."""
        if max_num_batched_tokens is not None:
            raise ConfigError("schedule.max_num_batched_tokens: the openai engine cannot change a server's "
                              "token budget per trial (it is fixed when the server starts); leave it unset")
        if self._server is not None:
            self._server.check_alive()
        if not requests:
            return []
        return asyncio.run(self._generate(list(requests)))

    async def _generate(self, requests: list[Request]) -> list[Completion]:
        httpx = self._httpx
        sem = asyncio.Semaphore(self.concurrency)
        url = self.base_url + "/v1/completions"
        in_flight: dict[int, int] = {}  # index of a request now in flight -> the most in flight seen with it
        timeout = httpx.Timeout(self.request_timeout_s, connect=min(self.request_timeout_s, 10.0))
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)

        async def one(client: Any, i: int, r: Request) -> Completion:
            delay = r.arrival_delay_s or r.arrival_step * self.arrival_step_s
            if delay > 0:
                await asyncio.sleep(delay)
            async with sem:
                in_flight[i] = 0
                now = len(in_flight)
                for k in in_flight:
                    in_flight[k] = max(in_flight[k], now)
                try:
                    answer = await self._post(client, url, self._body(r))
                finally:
                    num_seqs = in_flight.pop(i)
            fingerprint = answer.get("system_fingerprint") if isinstance(answer, dict) else None
            if isinstance(fingerprint, str) and fingerprint:
                self.fingerprints.add(fingerprint)
            try:
                return parse_choice(r, answer["choices"][0], num_seqs, cached_tokens(answer))
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise EngineError(f"{url}: unexpected answer for request {r.request_id}: "
                                  f"{type(e).__name__}: {_one_line(str(e))}") from e

        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            tasks = [asyncio.ensure_future(one(client, i, r)) for i, r in enumerate(requests)]
            try:
                return list(await asyncio.gather(*tasks))
            except BaseException:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

    def _body(self, r: Request) -> dict[str, Any]:
        """The request's own `seed` goes with it (vLLM and SGLang seed that request's sampler with it);
        top_p / top_k only where they truncate."""
        s = r.sampling
        truncation = {**({"top_p": s.top_p} if s.top_p < 1.0 else {}), **({"top_k": s.top_k} if s.top_k > 0 else {})}
        return {
            "model": self._info["served_model"], "prompt": list(r.prompt_token_ids), "max_tokens": s.max_tokens,
            "temperature": s.temperature, "seed": s.seed, "logprobs": self.logprobs,
            "return_tokens_as_token_ids": True, "return_token_ids": True, "ignore_eos": True, **truncation,
            **({"cache_salt": self._salt} if self._salt else {}),
        }

    async def _post(self, client: Any, url: str, body: dict[str, Any]) -> Any:
        httpx = self._httpx
        attempt = 0
        while True:
            try:
                r = await client.post(url, json=body, headers=self._headers)
            except httpx.TimeoutException as e:
                self._raise_if_server_died(url, e)
                raise EngineError(f"{url}: no answer within {self.request_timeout_s:g} s "
                                  f"({_option('request_timeout_s')}): {type(e).__name__}") from e
            except httpx.HTTPError as e:
                retry = self._retry(e, attempt)
                self._raise_if_server_died(url, e, wait=not retry)  # no blocking wait in the loop while retrying
                if retry:
                    await asyncio.sleep(self._backoff(attempt))
                    attempt += 1
                    continue
                raise EngineError(f"{url}: {type(e).__name__}: {_one_line(str(e))}{self._after(attempt)}") from e
            if r.status_code in TRANSIENT_STATUS and self._retry(r.status_code, attempt):
                await asyncio.sleep(self._backoff(attempt))
                attempt += 1
                continue
            return self._answer(url, r, attempt)

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    @property
    def server_pid(self) -> int | None:
        """The PID of the server this engine started (None when it uses a running one, or after close())."""
        return self._server.proc.pid if self._server is not None else None


def mode_url(base_url: str | ModeURLs, mode: Mode) -> str:
    """The URL of `mode`'s server: one URL serves both modes; of a mode's list, the first (the cross_instance
    check resolves its second instance's beforehand, the openai row's `instance` in oracle.engines.kinds)."""
    if isinstance(base_url, str):
        return base_url
    url = base_url.invariant if mode == "invariant" else base_url.production
    return url if isinstance(url, str) else url[0]


