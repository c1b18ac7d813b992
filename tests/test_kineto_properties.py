"""Property tests: every input event is stored or counted as dropped; times exact to the ns."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceview.parsers import kineto

_ts = st.builds(lambda whole, frac: f"{whole}.{frac}" if frac else str(whole),
                st.integers(0, 9_000_000_000_000_000), st.from_regex(r"\A[0-9]{0,6}\Z"))
_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "i", "s", "f", "C", "M", "B", "E", "?"]),
     "cat": st.sampled_from(["cpu_op", "kernel", "gpu_memcpy", "cuda_runtime", "odd"])},
    optional={"ts": _ts, "dur": _ts, "pid": st.one_of(st.integers(0, 2**40), st.text(max_size=3)),
              "tid": st.integers(-5, 2**70), "name": st.text(max_size=5)})


def _to_json(events: list[dict]) -> str:
    parts = []
    for e in events:  # numbers as their decimal text, exactly as a profiler writes them
        fields = [f'"{k}": {v}' if k in ("ts", "dur") else f'"{k}": {_dump(v)}'
                  for k, v in e.items()]
        parts.append("{" + ", ".join(fields) + "}")
    return '{"traceEvents": [' + ", ".join(parts) + "]}"


def _dump(value: object) -> str:
    import json

    return json.dumps(value)


def _exact_ns(text: str) -> int:
    return int((Decimal(text) * 1000).to_integral_value(rounding=ROUND_HALF_EVEN))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_event, max_size=30))
def test_every_event_accounted_and_times_exact(tmp_path, events):
    path = tmp_path / "t.json"
    path.write_text(_to_json(events))
    parsed = kineto.parse(path)
    assert parsed.input_events == len(events)
    assert parsed.input_events == parsed.events.num_rows + sum(parsed.dropped.values())
    frame = pl.from_arrow(parsed.events)
    # Complete (X) events keep their exact start and duration.
    want = sorted((_exact_ns(e["ts"]), _exact_ns(e["dur"])) for e in events
                  if e["ph"] == "X" and "ts" in e and "dur" in e)
    got = sorted(frame.filter(pl.col("dur_ns").is_not_null()
                              & (pl.col("kind") != "flow"))
                 .select("ts_ns", "dur_ns").rows())
    for e_ts, e_dur in want:
        assert (e_ts, e_dur) in got
