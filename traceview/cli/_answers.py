"""Answers kept for a command line asked again of unchanged inputs.

A CI job, a script or a notebook asks the same question of the same run again and again. The
cached ``summary --json`` of a 262 MB trace took 0.45-0.6 s, of which importing Polars was
0.3-0.4 s and the answer 0.03 s (docs/performance.md, log 49). So an analysis command's
``--json`` or ``--csv`` answer is kept in the cache folder (``CACHE_DIR/answers/``) and printed
again, without importing anything that computed it, while all of these are unchanged:

* the command line, word for word; the working folder; the environment variables that steer
  traceview or Polars (``TRACEVIEW_*``, ``POLARS_*``, ``XDG_CACHE_HOME``, ``HOME``); whether
  stdout takes UTF-8 (these name the kept answer);
* every path the command line names, as it is on disk before the command reads it and
  still at its end (:func:`inputs_before`, :func:`keep`): a file's identity (device, inode,
  size, mtime, ctime: any write changes the ctime, which no tool can set back), a folder's
  entries with theirs (a trace added to a run folder is another run), a name that did not
  exist still missing;
* the code (``cache_folder.code_identity``): every source file of traceview, every folder
  Python imports from but the working folder (installing or upgrading a library changes its
  site-packages folder), and the Python.

Kept only when it is the whole answer: an analysis command (its answer is its ``Result``:
warnings on stderr, the document on stdout, exit 0), caching on, no URL input, every input
settled (written more than 2 s before: a later write shows in its identity), and nothing said
about reading the files themselves (a damaged cache entry's note belongs to that run, not to
the answer). ``--no-cache`` neither reads nor keeps one, and nor does
``TRACEVIEW_ANSWERS=off`` (for timing or profiling what a command computes). The first run's
computation is the answer: a kept answer is the same bytes.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import xxhash

from traceview.cli._streams import takes_utf8, unguarded
from traceview.store import cache_folder

#: Bump with any change to what a kept answer holds or how it is named.
ANSWERS_VERSION = 1

#: Environment variables an answer may depend on (by prefix or name).
_STEERING = ("TRACEVIEW_", "POLARS_")
_STEERING_NAMES = ("XDG_CACHE_HOME", "HOME")


def replay(argv: Sequence[str]) -> bool:
    """Print the answer kept for ``argv`` (its warnings on stderr, its document on stdout)
    and return True; False when none is kept or anything it depends on changed."""
    path = _answer_path(argv)
    if path is None:
        return False
    try:
        with open(path, "rb") as fh:
            if cache_folder.untrusted(os.fstat(fh.fileno())):
                return False  # another user's, or writable by them: computed anew
            kept = orjson.loads(fh.read())
        same = (isinstance(kept, dict) and kept.get("digest") == _digest(kept)
                and kept.get("argv") == list(argv)
                and kept.get("code") == cache_folder.code_identity()
                and kept.get("inputs") == _on_disk(argv, path.parent.parent)[0])
    except (OSError, orjson.JSONDecodeError):
        return False  # never kept: the command runs (and keeps it)
    if not same or not _plain_text(kept):
        return False  # damaged, or asked of other inputs or code: the command runs
    for line in kept["stderr"]:
        print(line, file=sys.stderr)
    unguarded(sys.stdout).write(kept["stdout"])
    return True


#: Characters a kept answer's text never holds as themselves: C0 controls but tab, newline and
#: carriage return, DEL, C1 controls. What this program prints of a --json or --csv answer
#: escapes them, so a kept answer holding one was not written by it: computed anew.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _plain_text(kept: dict[str, Any]) -> bool:
    """Whether a kept answer's text is what this program prints: strings, no raw control
    characters (an escape sequence would reach the terminal as such)."""
    texts = [kept.get("stdout"), *(kept.get("stderr") or [])]
    return isinstance(kept.get("stderr"), list) and all(
        isinstance(t, str) and not _CONTROL.search(t) for t in texts)


def printed(args: argparse.Namespace, result: Any, stderr: list[str], stdout: str) -> None:
    """Note what an analysis command printed for its ``Result`` (``_render.emit_result``):
    :func:`keep` writes it once the command has returned 0."""
    args.printed_answer = (result, stderr, stdout)


def inputs_before(argv: Sequence[str]) -> str | None:
    """What every path ``argv`` names is on disk, taken before the command reads any of them
    (:func:`keep` compares it with what they are at the end); None without a kept answer's
    place (``--no-cache``, answers off) or when the paths cannot be listed."""
    path = _answer_path(argv)
    if path is None:
        return None
    try:
        return _on_disk(argv, path.parent.parent)[0]
    except (OSError, RuntimeError):
        return None


def keep(argv: Sequence[str], args: argparse.Namespace, before: str | None = None) -> None:
    """Keep what the command of ``args`` printed (see :func:`printed`) for ``argv``, when it
    is the whole answer (module docstring) and its inputs are what they were ``before`` it
    read them (:func:`inputs_before`): a file written, replaced, added or removed meanwhile
    (a profiler or a copy still writing) keeps nothing, with a warning, since the answer
    may mix the old and the new bytes. Never fails the command: an unwritable cache folder
    keeps nothing."""
    answer = getattr(args, "printed_answer", None)
    path = _answer_path(argv)
    if answer is None or path is None or getattr(args, "no_cache", False) or before is None:
        return
    result, stderr, stdout = answer
    if getattr(result, "reading_notes", ()) or any("://" in a for a in argv):
        return
    try:
        parsed_folder = getattr(args, "cache_dir", None) or cache_folder.default_cache_dir()
        if Path(parsed_folder).expanduser().resolve() != path.parent.parent:
            return  # the folder was named in a way argv alone does not show (an abbreviation)
        inputs, stats = _on_disk(argv, path.parent.parent)
        if inputs != before:
            print("traceview: warning: an input changed while the command read it (a file "
                  "written, replaced, added or removed); the answer may mix old and new "
                  "bytes and was not kept", file=sys.stderr)
            return
        if inputs is None or not all(cache_folder.is_settled(st) for st in stats):
            return  # written in the last 2 s: a write within one timestamp tick would not show
        record = {"argv": list(argv), "code": cache_folder.code_identity(), "inputs": inputs,
                  "stderr": stderr, "stdout": stdout}
        if not _plain_text(record):
            return  # a name's raw control character: such an answer is never replayed
        record["digest"] = _digest(record)
        from traceview.store.safe_write import atomic_write  # only when keeping

        atomic_write(path, lambda tmp: tmp.write_bytes(orjson.dumps(record)))
    except (OSError, RuntimeError):
        pass  # a read-only or full cache folder, no home folder: computed next time too


def _digest(record: dict[str, Any]) -> str:
    """A hash of what a kept answer holds: a damaged file is never printed as an answer."""
    return xxhash.xxh3_128_hexdigest(orjson.dumps(
        [record.get(k) for k in ("argv", "code", "inputs", "stderr", "stdout")]))


def _answer_path(argv: Sequence[str]) -> Path | None:
    """Where the answer for ``argv`` is kept; None with ``--no-cache``, with
    ``TRACEVIEW_ANSWERS=off``, or without a cache folder."""
    if "--no-cache" in argv or os.environ.get("TRACEVIEW_ANSWERS", "").lower() == "off":
        return None
    folder = _named_cache_dir(argv)
    try:
        folder = Path(folder) if folder else cache_folder.default_cache_dir()
        folder = folder.expanduser().resolve()
        cwd = os.getcwd()
    except (RuntimeError, OSError):  # no home folder (no default cache), no working folder
        return None
    env = sorted((k, v) for k, v in os.environ.items()
                 if k.startswith(_STEERING) or k in _STEERING_NAMES)
    name = xxhash.xxh3_128_hexdigest(orjson.dumps(
        [ANSWERS_VERSION, list(argv), cwd, env, takes_utf8(sys.stdout)]))
    return folder / "answers" / f"{name}.json"


def _named_cache_dir(argv: Sequence[str]) -> str | None:
    """The ``--cache-dir`` argv gives, in either spelling (``--cache-dir X``, ``=X``)."""
    for i, word in enumerate(argv):
        if word == "--cache-dir" and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith("--cache-dir="):
            return word.split("=", 1)[1]
    return None


def _words(argv: Sequence[str]) -> list[str]:
    """Every word of argv that could name a path: the words, and the values of ``--opt=V``."""
    return [*argv, *(w.split("=", 1)[1] for w in argv if w.startswith("--") and "=" in w)]


def _on_disk(argv: Sequence[str], cache: Path) -> tuple[str | None, list[os.stat_result]]:
    """(a hash of what every word of argv names on disk, every stat it took): a file's
    identity, a folder's with its entries', None for a name that does not exist; the cache
    folder is named, not looked into (it changes with every command). The hash is None when
    a path exists but cannot be read (a folder that cannot be listed): nothing is kept."""
    digest, stats = xxhash.xxh3_128(), []
    for word in _words(argv):
        path = Path(word)
        if _is_cache(path, cache):
            digest.update(orjson.dumps([word, "cache folder"]))
            continue
        try:
            st = path.stat()
        except (OSError, ValueError):  # no such path (or no path at all)
            digest.update(orjson.dumps([word, None]))
            continue
        stats.append(st)
        found: Any = cache_folder.identity(st)
        if path.is_dir():
            try:
                with os.scandir(path) as entries:
                    inside = sorted((e.name, e.stat()) for e in entries)
            except OSError:
                return None, stats
            stats += [entry for _, entry in inside]
            found = [found, [(name, cache_folder.identity(entry)) for name, entry in inside]]
        digest.update(orjson.dumps([word, found]))
    return digest.hexdigest(), stats


def _is_cache(path: Path, cache: Path) -> bool:
    try:
        return path.resolve() == cache
    except (OSError, RuntimeError):
        return False
