"""The memory benchmark (issue 17, class 10): peak RSS of `oracle run` at 1,000 trials of a 152k vocabulary.

`pytest -m bench tests/integration/test_bench_memory.py -s` prints the figure (the same as
`python -m oracle.bench memory --trials 1000`); nothing here asserts a size or a speed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle.bench import MEMORY_VOCAB, bench_memory


@pytest.mark.slow
def test_the_memory_benchmark_runs_and_writes_its_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_memory(tmp_path / "memory.json", trials=3, max_tokens=4) == 0
    data = json.loads((tmp_path / "memory.json").read_text())
    assert data["trials"] == 3 and data["vocab_size"] == MEMORY_VOCAB and data["exit_code"] == 0
    assert data["checks"]["drift"][1] == 3 and data["peak_rss_mib"] > 0
    assert "peak RSS" in capsys.readouterr().out


@pytest.mark.bench
def test_peak_memory_of_1000_trials_at_a_152k_vocabulary(tmp_path: Path) -> None:
    bench_memory(tmp_path / "memory.json", trials=1000)
    print(json.dumps({k: v for k, v in json.loads((tmp_path / "memory.json").read_text()).items()
                      if k != "divergences"}, indent=1))
