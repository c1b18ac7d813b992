"""What a file's first bytes and name say, before any parser runs: its format, whether a
directory entry is a trace, its rank; and each format's parser version (the cache key).

Kept apart from the parsers so that choosing files and looking up the cache import none of them
(the Kineto parser's import is ~0.07 s of every analysis command).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

from traceview.errors import UnreadableTraceError

#: Each format family's parser version, part of the cache key: bump it when the parser's output
#: for the same input changes.
#: kineto 3: invalid UTF-8 inside ``args`` is replaced (it reached the store's text as is);
#: kineto 4, nsys 2: the ranks table's ``device_memory`` (the device's total memory).
#: kineto 5: other accelerators' device events keep their ``args.stream``.
#: kineto 6: a ``baseTimeNanoseconds`` that wraps the times is refused (entries kept from such a
#: file held negative times).
#: kineto 7: an event over 32 MiB or nested over 64 levels is skipped (the C path stored it).
#: kineto 8: a trace cut short is read by the C scanner up to the damage: ``args_json`` keeps
#: the file's own text there too (the salvage wrote the decoded objects back out, compact).
#: nsys 3: a report's only process takes its file name's rank whatever it ran (a CPU-only
#: process kept rank None); several processes without a rank or GPU work are refused.
PARSER_VERSIONS: dict[str, int] = {"kineto": 8, "nsys": 3}


#: Kineto files on disk from this size are scanned as they are read: mapped (uncompressed) or
#: inflated in a thread the scanner follows (gzip). A smaller one is read first: the thread's
#: start cost a file of a few KB more than the overlap gains (~0.7 ms; docs/performance.md,
#: log 45).
FOLLOW_FROM_BYTES = 1 << 20


def family(fmt: str) -> str:
    """The parser family of a format (``detect_format``): ``nsys`` or ``kineto``, the key
    of ``PARSER_VERSIONS``."""
    return "nsys" if fmt.startswith("nsys") else "kineto"


def detect_format(path: Path) -> str:
    """``kineto-json``, ``kineto-json-gz``, ``nsys-sqlite`` or ``nsys-rep``, by content first."""
    with open(path, "rb") as fh:
        head = fh.read(16)
    if head.startswith(b"\x1f\x8b"):
        return "kineto-json-gz"
    if head.startswith(b"SQLite format 3\x00"):
        return "nsys-sqlite"
    if path.suffix in (".nsys-rep", ".qdrep"):
        return "nsys-rep"
    return "kineto-json"


_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_problem(path: str | Path, *, folder_ok: bool = False) -> str | None:
    """Why ``path`` cannot be read as an input file, or None when it can be opened safely: a
    regular file (or a folder, with ``folder_ok``). Asked before opening: opening a FIFO for
    reading blocks until a writer comes, and a device such as ``/dev/zero`` never ends."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:  # the tables hold names as UTF-8 text, as Arrow strings must be
        return "its name is not valid UTF-8: rename it"
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symbolic link loop (a link that points back at itself)"
        return exc.strerror or type(exc).__name__
    if stat.S_ISREG(st.st_mode) or (folder_ok and stat.S_ISDIR(st.st_mode)):
        return None
    if stat.S_ISDIR(st.st_mode):
        return "a folder, not a file"
    kind = next((name for test, name in _NOT_REGULAR if test(st.st_mode)), "not a file")
    return f"not a regular file ({kind})"


def refuse_non_json(path: Path, fmt: str) -> None:
    """An ``UnreadableTraceError`` for an uncompressed Kineto file whose first KiB is not the
    start of JSON (a file of NUL bytes was hashed and read whole before it was refused);
    white space and a UTF-8 byte-order mark may come first."""
    if fmt != "kineto-json":
        return
    with open(path, "rb") as fh:
        head = fh.read(1024)
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if start and start not in (b"{", b"["):
        raise UnreadableTraceError(path, "not JSON (does not start with { or [)")


TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", ".nsys-rep", ".qdrep")


def is_trace_name(path: Path) -> bool:
    """Whether a file in a directory looks like an input we should read."""
    name = path.name
    return name.endswith(TRACE_SUFFIXES) and not name.startswith(".") and name not in (
        "run.json", "ground_truth.json", "baseline.json")


#: ``rank`` or ``worker`` (any case), a ``-`` or ``_`` perhaps, then digits, where the word
#: starts: after the start, a digit or a separator, or as the capital of a camelCase word
#: (``traceRank3``); never inside a word (``frank0``, ``cranky3``).
_RANK_IN_NAME = re.compile(r"(?:^|(?<=[^A-Za-z])|(?<=[a-z])(?=[RW]))(?i:rank|worker)[-_]?"
                           r"(\d+)(?!\d)")


#: The largest rank (ranks are int32 in the store): a rank beyond it, from a file's contents
#: or its name, is not believed (docs/formats.md, *Bounds*).
MAX_RANK = (1 << 31) - 1


def rank_from_file_name(name: str, warnings: list[str] | None = None) -> int | None:
    """``rank-3.json`` / ``rank_3`` / ``worker3.pt.trace.json`` / ``job_rank_3_x`` /
    ``trace_rank0.sqlite`` / ``traceRank3`` -> 3. A local rank (``local_rank0``) is no rank
    of the run: every node has one of each. A number beyond :data:`MAX_RANK` is no rank
    either: None, with a warning in ``warnings`` when given.

    >>> [rank_from_file_name(n) for n in ["rank-3.json", "a_rank_12_b.json", "worker0.1.json",
    ...                                   "trace.json", "trace_rank0.sqlite", "frank0.json",
    ...                                   "local_rank1.json"]]
    [3, 12, 0, None, 0, None, None]
    >>> said = []
    >>> rank_from_file_name("trace_rank2147483648.sqlite", said), said
    (None, ['file name rank 2147483648 is no rank (0 to 2^31-1): left out'])
    """
    for found in _RANK_IN_NAME.finditer(name):
        if not name[:found.start()].rstrip("-_.").lower().endswith("local"):
            rank = int(found.group(1))  # a name is at most 255 bytes: int() takes it
            if rank > MAX_RANK:
                if warnings is not None:
                    warnings.append(f"file name rank {rank} is no rank (0 to 2^31-1): left out")
                return None
            return rank
    return None
