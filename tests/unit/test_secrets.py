"""Secrets in a config never reach a file or a line oracle writes, and a redacted report is never
replayed with the redaction as the secret (issue 17, class 4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from oracle.cli import main
from oracle.config import load_config
from oracle.errors import ConfigError
from oracle.redaction import hint, is_secret_name, redact_tree, restore_secrets, scrub_text

API_KEY = "sk-live-7f3a9c2e41d84b6fa0c5e9d2b18f6a3c"
HUB_TOKEN = "hf_QwErTyUiOpAsDfGhJkLzXcVbNm123456"
SERVER_KEY = "p4ssw0rd-for-the-server"
URL_PASSWORD = "urlpass-9911"
SECRETS = (API_KEY, HUB_TOKEN, SERVER_KEY, URL_PASSWORD)

# A custom engine that takes secret options, as a user's adapter would, and fails with an error that
# quotes them (the way an HTTP client's error quotes a request's headers).
ENGINE = '''
from fake_engine import FakeEngine


class SecretEngine(FakeEngine):
    def __init__(self, model, mode, *, api_key, env, command, url, fail=False, **kw):
        super().__init__(model, mode, **kw)
        if "<redacted" in repr((api_key, env, command, url)):
            raise RuntimeError("started with a redacted secret")
        self.api_key, self.env, self.command, self.url, self.fail = api_key, env, command, url, fail

    def describe(self):
        return {"engine": "secret", "command": self.command, "env": self.env, "url": self.url}

    def generate(self, requests, max_num_batched_tokens=None):
        if self.fail:
            raise RuntimeError("401 from server; request headers {'Authorization': 'Bearer %s'} env %s "
                               "cmd %s" % (self.api_key, self.env, " ".join(self.command)))
        return super().generate(requests, max_num_batched_tokens)
'''


def secret_config(tmp_path: Path, model: Path, fail: bool = False) -> Path:
    (tmp_path / "secret_engine.py").write_text(ENGINE)
    data: dict[str, Any] = {
        "model": str(model),
        "engine": {"kind": "secret_engine:SecretEngine", "options": {
            "api_key": API_KEY,
            "env": {"HF_TOKEN": HUB_TOKEN, "VLLM_BATCH_INVARIANT": "1"},
            "command": ["serve", "--host", "{host}", "--api-key", SERVER_KEY],
            "url": f"https://ci:{URL_PASSWORD}@models.example.com/v1",
            "fail": fail}},
        "prompts": {"random": {"count": 2}},
        "schedule": {"trials": 3, "repeat_trials": 1, "seed": 1},
    }
    path = tmp_path / "oracle.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def written_text(report_dir: Path) -> str:
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(report_dir.rglob("*"))
                     if p.is_file())


@pytest.mark.parametrize("fail", [False, True], ids=["passing run", "engine error quoting the secrets"])
def test_no_secret_in_any_report_file_or_console_line(
    fail: bool, tmp_path: Path, fake_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = secret_config(tmp_path, fake_model, fail)
    code = main(["run", str(config), "--report-dir", str(tmp_path / "r")])
    out = capsys.readouterr()
    assert code == (3 if fail else 0), out.err
    files = written_text(tmp_path / "r")
    assert {p.name for p in (tmp_path / "r").iterdir()} >= {"report.json", "junit.xml", "summary.md", "report.html"}
    for secret in SECRETS:
        assert secret not in files
        assert secret not in out.out + out.err
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    options = report["config"]["engine"]["options"]
    assert options["api_key"] == f"<redacted: set, {len(API_KEY)} chars>"
    assert options["env"] == {"HF_TOKEN": f"<redacted: set, {len(HUB_TOKEN)} chars>", "VLLM_BATCH_INVARIANT": "1"}
    assert options["command"][-2:] == ["--api-key", hint(SERVER_KEY)]
    # The digest names the config that ran: the real one, secrets included.
    assert report["config_digest"] == load_config(config).digest()
    if fail:
        assert "<redacted: set" in report["error"] and "Bearer <redacted: set" in report["error"]


def test_replay_of_a_redacted_report_asks_for_the_secrets(
    tmp_path: Path, fake_model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from oracle.replay import replay

    config = secret_config(tmp_path, fake_model)
    assert main(["run", str(config), "--report-dir", str(tmp_path / "r")]) == 0
    capsys.readouterr()
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    report = tmp_path / "r" / "report.json"
    # Through replay() (what `oracle replay` and `oracle localize` run once the report is trusted).
    with pytest.raises(ConfigError) as refused:
        replay(report, 0, trusted=True)
    err = str(refused.value)
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"{report}: ")
    assert "engine.options.api_key (set OPENAI_API_KEY or ORACLE_SECRET_ENGINE_OPTIONS_API_KEY)" in err
    assert "engine.options.env.HF_TOKEN (set HF_TOKEN or " in err
    assert "ORACLE_SECRET_ENGINE_OPTIONS_COMMAND_4" in err and "ORACLE_SECRET_ENGINE_OPTIONS_URL" in err

    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    monkeypatch.setenv("ORACLE_SECRET_ENGINE_OPTIONS_COMMAND_4", SERVER_KEY)
    monkeypatch.setenv("ORACLE_SECRET_ENGINE_OPTIONS_URL", f"https://ci:{URL_PASSWORD}@models.example.com/v1")
    assert replay(report, 0, trusted=True).divergence is None  # ran, with the real secrets (the engine takes them as given)


def test_restore_takes_each_secret_from_the_environment() -> None:
    real = {"engine": {"options": {"api_key": API_KEY, "env": {"HF_TOKEN": HUB_TOKEN},
                                   "command": ["serve", f"--api-key={SERVER_KEY}"]}}}
    redacted = redact_tree(real)
    assert redacted["engine"]["options"]["command"][1] == f"--api-key={hint(SERVER_KEY)}"
    env = {"OPENAI_API_KEY": API_KEY, "HF_TOKEN": HUB_TOKEN,
           "ORACLE_SECRET_ENGINE_OPTIONS_COMMAND_1": f"--api-key={SERVER_KEY}"}
    assert restore_secrets(redacted, env) == real
    with pytest.raises(ConfigError, match=r"engine.options.env.HF_TOKEN \(set HF_TOKEN or"):
        restore_secrets(redacted, {k: v for k, v in env.items() if k != "HF_TOKEN"})


OPENAI_OPTIONS = {
    "api_key": API_KEY,
    "env": {"HF_TOKEN": HUB_TOKEN, "HUGGING_FACE_HUB_TOKEN": HUB_TOKEN, "VLLM_ATTENTION_BACKEND": "FLASH_ATTN",
            "CUSTOM_FLAG": "on"},
    "mode_env": {"invariant": {"VLLM_BATCH_INVARIANT": "1", "AWS_SECRET_ACCESS_KEY": "aws/secret/abc"}},
    "command": ["vllm", "serve", "{model}", "--host", "{host}", "--port", "{port}", "--api-key", SERVER_KEY,
                "--hf-token=" + HUB_TOKEN, "HF_TOKEN=" + HUB_TOKEN],
}


def test_redaction_by_structure_keeps_what_is_not_secret() -> None:
    found: set[str] = set()
    out = redact_tree({"engine": {"kind": "openai", "options": OPENAI_OPTIONS, "max_num_seqs": 8},
                       "sampling": {"max_tokens": 16}, "base_url": f"https://u:{URL_PASSWORD}@h/v1?api_key=zz99zz"},
                      found)
    text = json.dumps(out)
    for secret in (*SECRETS, "aws/secret/abc", "zz99zz"):
        assert secret not in text
    options = out["engine"]["options"]
    assert options["env"]["VLLM_ATTENTION_BACKEND"] == "FLASH_ATTN"  # determinism settings stay readable
    assert options["env"]["CUSTOM_FLAG"] == hint("on")  # an unknown variable may be a secret
    assert options["mode_env"]["invariant"]["VLLM_BATCH_INVARIANT"] == "1"
    assert options["command"][:8] == OPENAI_OPTIONS["command"][:8]
    assert out["sampling"] == {"max_tokens": 16} and out["engine"]["max_num_seqs"] == 8
    assert {API_KEY, HUB_TOKEN, SERVER_KEY, URL_PASSWORD} <= found
    assert redact_tree(out) == out  # a redacted report read back is not redacted twice


@pytest.mark.parametrize(("name", "secret"), [
    ("api_key", True), ("HF_TOKEN", True), ("x-api-key", True), ("clientSecret", True), ("Authorization", True),
    ("password", True), ("apikey", True), ("max_tokens", False), ("max_num_batched_tokens", False),
    ("tokenizer", False), ("kv_cache_space_gib", False), ("VLLM_BATCH_INVARIANT", False)])
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


@pytest.mark.parametrize("text", [
    f"headers: {{'Authorization': 'Bearer {API_KEY}'}}",
    f"Authorization: Basic {SERVER_KEY}",
    f"vllm serve m --api-key {SERVER_KEY} --port 8000",
    f"connecting with api_key={SERVER_KEY}",
    f"clone https://ci:{URL_PASSWORD}@git.example.com/r.git failed",
    f"token {HUB_TOKEN} rejected",
])
def test_free_text_is_scrubbed(text: str) -> None:
    out = scrub_text(text)
    assert "<redacted: set" in out
    for secret in SECRETS:
        assert secret not in out


def test_free_text_keeps_ordinary_words() -> None:
    text = "engine raised KeyError: 'vocab_size'; step 3 token 12345678 -> 5, expected_token: 512"
    assert scrub_text(text) == text


def test_determinism_variables_stay_readable_in_the_environment() -> None:
    from oracle.environment import DETERMINISM_VARS

    env = {"env": {name: "1" for name in DETERMINISM_VARS}}
    assert redact_tree(env) == env


def test_an_unknown_variables_plain_value_is_hidden_but_not_searched_for() -> None:
    found: set[str] = set()
    out = redact_tree({"env": {"MY_DTYPE": "bfloat16", "MY_TOKENISH": "a1b2c3d4e5f6g7h8i9"}}, found)
    assert out == {"env": {"MY_DTYPE": hint("bfloat16"), "MY_TOKENISH": hint("a1b2c3d4e5f6g7h8i9")}}
    assert found == {"a1b2c3d4e5f6g7h8i9"}
    assert scrub_text("dtype bfloat16", found) == "dtype bfloat16"
