"""Redaction is linear in a word's length, and one redaction path covers every file a run writes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from oracle.redaction import redact_tree, scrub_text

# Words of 48 KB that made the old patterns restart a scan at every position (O(n^2): minutes each).
_WORDS = ("'a' * 48000", "'-a' * 24000", "'a.' * 24000", "'1a' * 24000", "'-eyJ' * 12000", "'a-' * 24000")


def test_long_unbroken_words_are_redacted_in_linear_time() -> None:
    # The input's size, not a clock, makes the point: at O(n^2) these words take minutes and the
    # subprocess is killed by the (generous) timeout; at O(n) they take milliseconds.
    code = textwrap.dedent(f"""
        from oracle.redaction import redact_tree, scrub_text
        from oracle.report import Report
        for word in ({", ".join(_WORDS)},):
            assert scrub_text('engine said: ' + word).endswith(word[-8:])
            redact_tree({{"name": word, "argv": [word, word], "env": {{"X": word}}}})
            r = Report(oracle_version="0", seed=0, config={{"prompts": {{"name": word}}}}, config_digest="0" * 64,
                       environment={{}})
            r.set_error("engine error: " + word)
            r.to_json()
        print("done")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "done"


def test_bounded_lookbehinds_still_find_secrets_inside_text() -> None:
    text = scrub_text("options.api_key=abcdef123 x-api-key: qwerty12 --api-key sekret99 "
                      "url https://u:passw0rd@h/x token eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4f")
    for secret in ("abcdef123", "qwerty12", "sekret99", "passw0rd", "eyJhbGci"):
        assert secret not in text
    assert redact_tree({"argv": ["serve", "--api-key", "hunter22"]})["argv"][2].startswith("<redacted")
