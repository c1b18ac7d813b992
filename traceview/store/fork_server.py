"""Imported by the pool's fork server only (``executors._PRELOAD``): from then on it leaves
when the command that started it is gone (``orphans``), killed included."""

from __future__ import annotations

from traceview.store.orphans import leave_when_orphaned

leave_when_orphaned()
