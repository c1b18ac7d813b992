"""Names from traces made safe to show: every output for people (the terminal, the report, the
JUnit XML) shows a control character as a visible escape, never as itself.

A trace names its kernels, ops and metrics with whatever bytes its writer chose. Shown raw, an
escape sequence (ESC ``[2J``) clears a terminal, an OSC 8 sequence plants a link, BEL rings,
a bidi override (U+202E) reorders the text around it so that a line reads as something else,
and most C0 characters make an XML file invalid even as character references. Each becomes
the escape Python and JavaScript would write for it (``\\x1b``, ``\\u202e``): visible, and the
same character again to anyone who decodes it. ``--json`` and ``--csv`` keep the exact names.
"""

from __future__ import annotations

import re

#: C0 controls (tab and newline where a caller keeps them), DEL, C1 controls; the bidi
#: embeddings, overrides, isolates and marks; the line and paragraph separators; lone
#: surrogates (a file name's undecodable bytes), which no UTF-8 output can hold; and the two
#: noncharacters XML forbids.
_UNSAFE = ("\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
           "\ud800-\udfff\ufffe\uffff")
_PATTERNS: dict[str, re.Pattern[str]] = {}

#: How long an error or warning line may grow before it is cut (polars' messages can carry a
#: whole query plan).
MOST_CHARS = 1000


def _escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, keep: str = "") -> str:
    """``text`` with every unsafe character (above) written as its escape, except those in
    ``keep`` (``"\\n"`` for text of several lines, ``"\\t"`` too where tabs lay it out).

    >>> printable("gemm\\x1b[2J\\u202eevil\\tx")
    'gemm\\\\x1b[2J\\\\u202eevil\\\\x09x'
    >>> printable("a\\nb", keep="\\n")
    'a\\nb'
    """
    pattern = _PATTERNS.get(keep)
    if pattern is None:
        kept = "".join(re.escape(c) for c in keep)
        pattern = re.compile(f"(?![{kept}])[{_UNSAFE}]" if keep else f"[{_UNSAFE}]")
        _PATTERNS[keep] = pattern
    return pattern.sub(_escape, text)


def one_line(text: str, most: int = MOST_CHARS) -> str:
    """A message as one printable line: its lines joined by `` / `` (blank ones dropped),
    cut to ``most`` characters.

    >>> one_line("cannot read\\n\\n  Resolved plan:\\n  SCAN x\\n")
    'cannot read / Resolved plan: / SCAN x'
    """
    lines = [line.strip() for line in printable(text, keep="\n").split("\n")]
    flat = " / ".join(line for line in lines if line)
    return flat if len(flat) <= most else flat[: most - 1] + "…"


def ascii_json(text: str) -> str:
    """JSON text with every non-ASCII character as its ``\\uXXXX`` escape: the same JSON to
    any reader, printable on an ASCII-only output. (Outside strings JSON is ASCII already.)

    >>> ascii_json('{"name": "é\\u202e😀"}')
    '{"name": "\\\\u00e9\\\\u202e\\\\ud83d\\\\ude00"}'
    """
    def escape(found: re.Match[str]) -> str:
        code = ord(found.group())
        if code < 0x10000:
            return f"\\u{code:04x}"
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return re.sub(r"[^\x00-\x7f]", escape, text)
