"""Real-derived traces as torch writes them: the source's own text replicated, not re-encoded.

Kineto's writer (libkineto ``output_json.cpp``) puts one event on ~6 indented lines::

      {
        "ph": "X", "cat": "kernel", "name": "...", "pid": 0, "tid": 7,
        "ts": 1683564901552508, "dur": 27,
        "args": {
          "External id": 29,"Ev Idx": 28, ...
        }
      },

so ~20 % of a trace's bytes are whitespace; ``orjson.dumps`` writes none. A scanner measured on
compact text never pays for the whitespace users' files hold (issue 25). This module keeps each
event's text as the source holds it when the source is in that layout (:func:`element_texts`),
writes it the writer's way when the source was re-encoded (TraceLens's traces are
``json.dump(indent=...)`` output: 16-22 lines an event, 40-58 % whitespace;
:func:`torch_event_text`), and shifts times, ids and step numbers per replica on the text
itself (:func:`shifted`), so every replica keeps the layout byte for byte.
"""

from __future__ import annotations

import re
import orjson

#: A source written by Kineto's writer: at most this many lines an event and this share of
#: whitespace (the corpus's torch-written traces: 6.0-9.5 lines, 16-25 %; re-encoded ones:
#: 16-22 lines, 40-58 %).
TORCH_LINES_PER_EVENT, TORCH_WHITESPACE = 10.0, 0.30

#: Integer ids that must stay unique per replica, shifted by the replica's offset: the flow
#: ``id`` and the ``args`` ids (as ``inputs._ID_ARGS``).
ID_KEYS = ("id", "correlation", "External id", "Python id", "Python parent id",
           "Record function id", "Ev Idx", "Fwd thread id", "Sequence number")

#: ``"ts": 123`` (the integer part: a fraction ``.456`` stays as written), ``"KEY": 123`` for
#: the ids, and ``"ProfilerStep#12"``.
_SHIFTED = re.compile(
    rb'"(ts|' + b"|".join(re.escape(k.encode()) for k in ID_KEYS) + rb')":(\s*)(\d+)'
    rb'|"ProfilerStep#(\d+)"')

def layout_stats(raw: bytes, events: int) -> dict[str, float]:
    """Whitespace share (every whitespace byte, those inside strings included: a few names
    hold a space) and lines per event of a trace's text."""
    blank = len(raw) - len(raw.translate(None, b" \t\r\n"))
    return {"whitespace": blank / max(1, len(raw)),
            "lines_per_event": raw.count(b"\n") / max(1, events)}


def is_torch_layout(raw: bytes, events: int) -> bool:
    stats = layout_stats(raw, events)
    return (stats["lines_per_event"] <= TORCH_LINES_PER_EVENT
            and stats["whitespace"] <= TORCH_WHITESPACE)


_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


def element_texts(raw: bytes, count: int) -> tuple[bytes, list[bytes], bytes] | None:
    """(the text before the first event, each event's text with its leading whitespace, the
    text after the last event: its closing ``]`` and any keys after it), or None when the
    events cannot be told apart by their indentation (the caller writes them instead).

    Kineto's writer opens each event on a line of its own at one indentation; nested objects
    sit deeper or inline, so a comma, a newline and that indentation before ``{`` is an event
    boundary. Checked: as many pieces as events, each one JSON object."""
    key = _EVENTS_KEY.search(raw)
    if key is None or count == 0:
        return None
    first = raw.find(b"{", key.end())
    line_start = raw.rfind(b"\n", key.end(), first)
    if line_start < 0 or raw[line_start + 1:first].strip():
        return None  # the first event does not open a line: not the writer's layout
    indent = raw[line_start + 1:first]
    boundary = re.compile(rb",(?=[ \t]*\r?\n" + re.escape(indent) + rb"\{)")
    starts = [line_start] + [m.start() + 1 for m in boundary.finditer(raw, first)]
    if len(starts) != count:
        return None
    last = starts[-1]
    end = _close_of_last(raw, last)
    if end is None:
        return None
    pieces = [raw[a:b - 1] for a, b in zip(starts, starts[1:])] + [raw[last:end]]
    try:
        if not all(isinstance(orjson.loads(p), dict) for p in pieces):
            return None
    except orjson.JSONDecodeError:
        return None
    return raw[:line_start], pieces, raw[end:]


def _close_of_last(raw: bytes, last: int) -> int | None:
    """Where the last event's text ends (just past its ``}``): the first ``]`` after it that
    closes the array."""
    at = raw.find(b"]", last)
    while at >= 0:
        text = raw[last:at].rstrip()
        if text.endswith(b"}"):
            try:
                orjson.loads(text)
                return last + len(text)
            except orjson.JSONDecodeError:
                pass
        at = raw.find(b"]", at + 1)
    return None


#: Keys Kineto's writer puts on an event's first line; ``ts``, ``dur`` and the rest follow
#: on the second, ``args`` on lines of their own.
_FIRST_LINE = ("ph", "id", "cat", "s", "name", "pid", "tid", "bp")


def torch_event_text(event: dict) -> bytes:
    """One event as Kineto's writer lays it out (leading newline and indentation included)."""
    first = [k for k in event if k in _FIRST_LINE]
    second = [k for k in event if k not in _FIRST_LINE and k != "args"]
    lines = [b"\n  {"]
    for keys in (first, second):
        if keys:
            lines.append(b"    " + b", ".join(_pair(k, event[k]) for k in keys)
                         + (b"," if keys is first and (second or "args" in event) or
                            keys is second and "args" in event else b""))
    args = event.get("args")
    if isinstance(args, dict):
        lines.append(b'    "args": {')
        if args:
            lines.append(b"      " + b", ".join(_pair(k, v) for k, v in args.items()))
        lines.append(b"    }")
    elif "args" in event:
        lines.append(b"    " + _pair("args", args))
    lines.append(b"  }")
    return b"\n".join(lines)


def _pair(key: str, value: object) -> bytes:
    return orjson.dumps(key) + b": " + orjson.dumps(value)


def torch_head(doc: dict) -> bytes:
    """The document's top-level values, one a line, and the opening of the events array."""
    lines = [b"  " + _pair(k, v) + b"," for k, v in doc.items()]
    return b"{\n" + b"\n".join(lines) + (b"\n" if lines else b"") + b'  "traceEvents": ['


TORCH_TAIL = b"\n]\n}\n"


def shifted(text: bytes, ts_us: int, ids: int, steps: int) -> bytes:
    """``text`` with every ``ts`` later by ``ts_us`` microseconds, every id of
    :data:`ID_KEYS` larger by ``ids`` and every ``ProfilerStep#N`` by ``steps``; all else,
    whitespace included, as it was. Negative ids (none in Kineto's output but ``-1`` for
    "none") keep their value: the pattern reads digits only after the colon."""
    if not (ts_us or ids or steps):
        return text

    def one(m: re.Match) -> bytes:
        if m.group(4) is not None:
            return b'"ProfilerStep#%d"' % (int(m.group(4)) + steps)
        key = m.group(1)
        add = ts_us if key == b"ts" else ids
        return b'"%s":%s%d' % (key, m.group(2), int(m.group(3)) + add)

    return _SHIFTED.sub(one, text)


def with_rank(head: bytes, rank: int, world: int) -> bytes:
    """``head`` with ``distributedInfo``'s rank and world size rewritten (added, with backend
    nccl, when the source has none)."""
    at = head.find(b'"distributedInfo"')
    if at < 0:
        open_at = head.find(b"{") + 1
        info = b'\n  "distributedInfo": {"backend": "nccl", "rank": %d, "world_size": %d},' \
            % (rank, world)
        return head[:open_at] + info + head[open_at:]
    end = head.find(b"}", at)
    info = _sub_int(head[at:end], b"rank", rank)
    info = _sub_int(info, b"world_size", world)
    return head[:at] + info + head[end:]


def _sub_int(text: bytes, key: bytes, value: int) -> bytes:
    pattern = re.compile(rb'("' + key + rb'"\s*:\s*)-?\d+')
    if pattern.search(text):
        return pattern.sub(lambda m: m.group(1) + b"%d" % value, text, count=1)
    return text.replace(b"{", b'{"%s": %d, ' % (key, value), 1)


def event_mix(events: list[dict], raw: bytes) -> dict[str, float]:
    """What a trace holds, as shares of its events (and of its bytes for ``args``): the mix a
    result is read beside."""
    n = max(1, len(events))
    phases: dict[str, int] = {}
    gpu = cpu_op = 0
    args_bytes = 0
    for e in events:
        ph = e.get("ph")
        phases[ph] = phases.get(ph, 0) + 1
        cat = str(e.get("cat", "")).lower()
        gpu += cat in ("kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset")
        cpu_op += cat in ("cpu_op", "operator")
        if "args" in e:
            args_bytes += len(orjson.dumps(e["args"]))
    flows = sum(phases.get(k, 0) for k in ("s", "f", "t"))
    return {"events": len(events), "flow": flows / n,
            "instant": (phases.get("i", 0) + phases.get("I", 0)) / n,
            "gpu": gpu / n, "cpu_op": cpu_op / n, "args_bytes": args_bytes / max(1, len(raw))}


def describe_mix(mix: dict[str, float]) -> str:
    """A mix in a few words: ``flows 38 %, instant 0 %, GPU 7 %, CPU ops 23 %, args 24 % of
    bytes; 19 % whitespace, 6.1 lines an event``."""
    def pct(key: str) -> str:
        return f"{100 * mix.get(key, 0):.0f} %"

    text = (f"flows {pct('flow')}, instant {pct('instant')}, GPU {pct('gpu')}, CPU ops "
            f"{pct('cpu_op')}, args {pct('args_bytes')} of bytes")
    if "whitespace" in mix:
        text += f"; {pct('whitespace')} whitespace, {mix['lines_per_event']:.1f} lines an event"
    return text

