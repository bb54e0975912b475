"""Making user strings safe for each output: model text, target names and error messages are data,
never markup, terminal escapes or XML that a parser rejects, and never a secret.

Every view (console, JUnit, Markdown, HTML) writes user strings through these functions, so they are
also where secrets are scrubbed from text (oracle.redaction.scrub_text: the secret values of the
configs this process read, Authorization headers, `--api-key VALUE`, token-shaped words)."""

from __future__ import annotations

import re

from oracle.redaction import scrub_text

# XML 1.0 allows tab, newline, carriage return and everything from U+0020 except lone surrogates
# and U+FFFE/U+FFFF; anything else makes a JUnit parser reject the whole file. DEL, the C1 controls
# and the bidirectional overrides are allowed, but a CI page shows them as a terminal would: out too.
_XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
                            "\ufffe\uffff]")
# C0 and C1 control characters (ESC starts terminal escape sequences, CSI is U+009B) and the
# bidirectional overrides that reorder what a terminal or a browser shows; lone surrogates, which
# no file encoding can write.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")
_CONTROL_OR_NEWLINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")


def _codepoint(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def xml_text(s: object) -> str:
    """`s` as text XML 1.0 accepts: forbidden characters written as `\\xNN` (ElementTree escapes the rest)."""
    return _XML_FORBIDDEN.sub(_codepoint, scrub_text(str(s)))


def terminal_text(s: object, newlines: bool = False) -> str:
    """`s` without control or escape bytes (written as `\\xNN`); newlines kept only when `newlines`."""
    text = scrub_text(str(s))
    if not newlines:
        text = text.replace("\r\n", " ").replace("\n", " ")
        return _CONTROL_OR_NEWLINE.sub(_codepoint, text)
    return _CONTROL.sub(_codepoint, text)


def markdown_text(s: object) -> str:
    """`s` for a Markdown table cell or line: no HTML, no code spans, no cell breaks, no control bytes. `<` and
    `&` are written as entities (no tag or entity of the text's own can start); `>` stays as typed (it opens
    nothing inside a line), so the source reads `KV length > 64`, escaped only where it would open a quote."""
    text = terminal_text(s).replace("&", "&amp;").replace("<", "&lt;")
    text = text.replace("\\", "\\\\").replace("`", "\\`").replace("|", "\\|")
    return "\\" + text if text.startswith(">") else text
