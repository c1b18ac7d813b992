"""Reading trace bytes: gzip with a fast inflater, and repairs for damaged JSON.

Real traces arrive truncated (a job killed mid-write), with NaN/Infinity tokens, with invalid
UTF-8 in kernel names, with integers beyond int64. The fast decoder rejects all of these; the
functions here turn such bytes into something decodable and say what they changed.
"""

from __future__ import annotations

import io
import mmap
import os
import re
import resource
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceview.errors import UnreadableTraceError
from traceview.parsers._memory import available_memory

try:  # the C scanner's progress protocol (publish, states): only a scan follows a reading thread
    import traceview.parsers.kineto._scan as _scan
except ImportError:  # no compiled scanner: the pure-Python path reads the bytes first (_parse)
    _scan = None

try:  # ISA-L inflates 2-3x faster than zlib; fall back to the standard library.
    from isal import igzip as _gzip
except ImportError:  # pragma: no cover - isal is a dependency, but keep working without it
    import gzip as _gzip


@dataclass
class Input:
    """A trace's JSON bytes for the scanner. ``releasable``: a memory map whose pages the
    scanner may hand back as it goes (then, after a failed scan, read the file again with
    :func:`read_bytes` rather than reuse ``data``). ``progress``: set while a thread is still
    inflating into ``data``; the scanner follows it (``_scan.scan``'s progress)."""

    data: bytes | mmap.mmap
    releasable: bool
    progress: mmap.mmap | None = None
    #: ``data`` maps the file itself: the scanner hashes it beside the scan (the file's
    #: content id) and turns a file cut short under it into a failed scan (``_scan.scan``)
    mapped_file: bool = False


@contextmanager
def open_input(path: Path, warnings: list[str], *, follow: bool = False) -> Iterator[Input]:
    """The file's JSON bytes: an uncompressed file read, a gzipped one inflated, into a
    private anonymous map of its size (the recorded size, for gzip). Either way the scanner can
    hand scanned pages back, so the input need not stay resident beside the columns. Damaged
    or unusual gzip (truncated, several members, > 4 GiB) is inflated into bytes instead.

    ``follow`` (the C scanner will read the bytes): an uncompressed file is memory-mapped,
    not read: the scanner's two threads start at once, with no copy (a 262 MB file scanned in
    0.85 s wall instead of 1.2, 0.25 CPU s less; docs/performance.md, log 48). A mapped page
    that cannot be read (the file cut by another process during the scan, an I/O error)
    raises SIGBUS, which the scanner catches while it reads (``Input.mapped_file``): a failed
    scan, after which the caller reads the file again with :func:`read_bytes` (a truncated
    trace, salvaged with a warning, that ingest sees changed). A gzipped file is inflated in a
    thread while the scanner follows it (``Input.progress``), instead of before the scan:
    inflating was a third of a gzip ingest's wall time with one core idle. Damage then shows
    as a failed scan (the producer reports it), handled the same way.

    Without ``follow`` the bytes are read (or inflated) first, into a private anonymous map.
    """
    inflating = None
    try:
        with open(path, "rb") as fh:
            gzipped = fh.read(2) == b"\x1f\x8b"
            size = os.fstat(fh.fileno()).st_size
            _sniff(path, fh, gzipped)
            if gzipped and _recorded_size(path) > inflate_limit():
                raise UnreadableTraceError(path, _too_large(inflate_limit()))
            file_map = _map_file(fh, size) if follow and not gzipped else None
            if file_map is not None:
                mapped = file_map
            elif follow:
                inflating = _InflatingMap.start(path) if gzipped else \
                    _InflatingMap.reading(path, size)
                mapped = inflating.map if inflating else None
            else:
                mapped = _read_into_map(path, _recorded_size(path), _gzip.open) if gzipped \
                    else _read_into_map(path, size, open)
    except (OSError, ValueError) as exc:
        raise UnreadableTraceError(path, f"cannot read: {getattr(exc, 'strerror', None) or exc}"
                                   ) from None
    if mapped is None:
        yield Input(read_bytes(path, warnings), releasable=False)
        return
    try:
        yield Input(mapped, releasable=True, progress=inflating.progress if inflating else None,
                    mapped_file=file_map is not None)
    finally:
        if inflating:
            inflating.stop()
        mapped.close()


#: The most a gzip trace may inflate to, whatever memory there is (64 GiB).
MAX_INFLATED_BYTES = 64 << 30
#: Set to a number of bytes to lower that bound (a job with a memory quota).
INFLATE_LIMIT_ENV = "TRACEVIEW_MAX_INFLATED_BYTES"


def inflate_limit() -> int:
    """How far a gzip trace may inflate: :data:`MAX_INFLATED_BYTES`, or half the memory this
    process may use when less (MemAvailable, the memory limit of its control group: a
    container's, the address-space limit), or
    ``INFLATE_LIMIT_ENV``.
    A 13 KB file of zeros inflates to 6 GB; beyond the bound it is refused by name before
    the memory is asked for."""
    limits = [MAX_INFLATED_BYTES]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append(soft // 2)  # a parse holds about twice the inflated bytes
    available = available_memory()  # the machine's, and its container's limit
    if available is not None:
        limits.append(available // 2)
    if (given := os.environ.get(INFLATE_LIMIT_ENV, "")).strip().isdigit():
        limits.append(int(given))
    return min(limits)


def _too_large(limit: int) -> str:
    return (f"inflates to more than {limit} bytes (the bound on a gzip trace: half the "
            f"memory available, at most {MAX_INFLATED_BYTES}; docs/formats.md, Bounds)")


#: Bytes a JSON trace may start with before its first ``{`` or ``[``: a UTF-8 byte-order
#: mark and white space.
_LEADING = b"\xef\xbb\xbf \t\r\n"


def _sniff(path: Path, fh: Any, gzipped: bool) -> None:
    """Refuse a file whose first bytes are not JSON (a file of NUL bytes was read whole
    before it was refused). Only the first KiB is looked at (inflated, for gzip)."""
    fh.seek(0)
    try:
        head = (_gzip.GzipFile(fileobj=fh).read(1024) if gzipped else fh.read(1024))
    except Exception:  # noqa: BLE001 - damaged gzip: read_bytes words it (or salvages)
        return
    finally:
        fh.seek(0)
    start = head.lstrip(_LEADING)[:1]
    if head and not start and len(head) < 1024:
        return  # white space only: "empty" is said later
    if start and start not in (b"{", b"["):
        raise UnreadableTraceError(path, "not JSON (does not start with { or [)")


def _recorded_size(path: Path) -> int:
    """The uncompressed size a gzip file's trailer records (ISIZE: modulo 2**32)."""
    with open(path, "rb") as fh:
        fh.seek(-4, os.SEEK_END)
        return int.from_bytes(fh.read(4), "little")


#: Inflated bytes between two progress reports to a following scanner.
_FOLLOW_CHUNK = 1 << 20


class _InflatingMap:
    """A gzip file inflating, in a thread, into a private anonymous map of its recorded size,
    reporting through ``progress`` (16 bytes: count, state) how far it got; see
    ``_scan.publish``. The state ends DONE only when exactly the recorded size
    inflated with nothing after it, else FAILED, so a scanner never trusts a short or
    multi-member stream."""

    def __init__(self, path: Path, size: int, chunk: int, opener: Any = None) -> None:
        self._scan = _scan  # publish() and the producer's states
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        self.progress = mmap.mmap(-1, 16)  # page-aligned, as the atomic counters need
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._inflate,
                                        args=(path, size, chunk, opener or _gzip.open),
                                        name="traceview-inflate", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, path: Path, chunk: int = _FOLLOW_CHUNK) -> _InflatingMap | None:
        size = _recorded_size(path)
        return cls(path, size, chunk) if size else None

    @classmethod
    def reading(cls, path: Path, size: int, chunk: int = 4 * _FOLLOW_CHUNK
                ) -> _InflatingMap | None:
        """An uncompressed file of ``size`` bytes read the same way (``open`` for
        ``gzip.open``), where it cannot be mapped; it ends DONE only when the file held
        exactly ``size`` bytes."""
        return cls(path, size, chunk, opener=open) if size else None

    def _inflate(self, path: Path, size: int, chunk: int, opener: Any) -> None:
        scan = self._scan
        got, state = 0, scan.FAILED
        try:
            with opener(path, "rb") as stream, memoryview(self.map) as view:
                while got < size and not self._halt.is_set():
                    n = stream.readinto(view[got:min(size, got + chunk)])
                    if not n:
                        break
                    got += n
                    scan.publish(self.progress, got, scan.PRODUCING)
                if got == size and not self._halt.is_set() and not stream.read(1):
                    state = scan.DONE
        except Exception:  # noqa: BLE001 - any inflate error: the scan fails, read_bytes words it
            state = scan.FAILED
        finally:
            scan.publish(self.progress, got, state)

    def stop(self) -> None:
        """Stop inflating (when the scan gave up early) and wait for the thread."""
        self._halt.set()
        self._thread.join()
        self.progress.close()


def _map_file(fh: Any, size: int) -> mmap.mmap | None:
    """The open file mapped read-only (None when it is empty or cannot be mapped: a pipe-like
    or FUSE file, or no address space left; it is then read)."""
    if not size:
        return None
    try:
        return mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None


def _read_into_map(path: Path, size: int, opener: Any) -> mmap.mmap | None:
    """``opener(path)``'s bytes (``open``: the file's; ``gzip.open``: inflated) in a private
    anonymous map of ``size`` bytes (a gzip trailer's ISIZE); None when there are not exactly
    that many: damaged, several gzip members, > 4 GiB (ISIZE is mod 2**32), a file that changed
    size meanwhile, or a read error (:func:`read_bytes` then words it, or salvages)."""
    if not size:
        return None
    mapped = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    got, extra = 0, b""
    try:
        with opener(path, "rb") as stream, memoryview(mapped) as view:
            while got < size and (n := stream.readinto(view[got:])):
                got += n
            extra = stream.read(1)
    except Exception:  # noqa: BLE001 - any read error: read_bytes words it (or salvages)
        got = -1
    if got != size or extra:
        mapped.close()
        return None
    return mapped


def read_bytes(path: Path, warnings: list[str]) -> bytes:
    """The file's JSON bytes, inflated if gzipped. A truncated gzip stream yields what inflates."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UnreadableTraceError(path, f"cannot read: {exc.strerror or exc}") from None
    if not raw:
        raise UnreadableTraceError(path, "empty file")
    if not raw.startswith(b"\x1f\x8b"):
        return raw
    limit = inflate_limit()
    try:
        return _inflate_bounded(raw, limit)
    except _TooLarge:
        raise UnreadableTraceError(path, _too_large(limit)) from None
    except Exception:  # noqa: BLE001 - isal raises its own IsalError; all mean "damaged"
        pass
    # Truncated or damaged stream: keep what inflates before the damage.
    inflater = zlib.decompressobj(wbits=47)
    try:
        data = inflater.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise UnreadableTraceError(path, f"corrupt gzip data ({exc})") from None
    if len(data) > limit:
        raise UnreadableTraceError(path, _too_large(limit))
    if not data:
        raise UnreadableTraceError(path, "corrupt gzip data (nothing inflates)")
    warnings.append("gzip stream is truncated; reading what inflates")
    return data


class _TooLarge(Exception):
    """The stream inflates beyond the bound."""


def _inflate_bounded(raw: bytes, limit: int) -> bytes:
    """Every member of a gzip stream inflated, counting: :class:`_TooLarge` past ``limit``
    bytes (before they are all held)."""
    out = bytearray()
    with _gzip.GzipFile(fileobj=io.BytesIO(raw)) as stream:
        while block := stream.read(16 << 20):
            out += block
            if len(out) > limit:
                raise _TooLarge
    return bytes(out)


_NON_FINITE = re.compile(rb"(?<![\w\"])-?(?:NaN|Infinity)(?![\w\"])")


def repair_text(data: bytes, warnings: list[str]) -> bytes:
    """Replace invalid UTF-8 and non-standard number tokens so a strict decoder can read it."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        data = data.decode("utf-8", errors="replace").encode("utf-8")
        warnings.append("invalid UTF-8 replaced with U+FFFD")
    repaired, count = _replace_outside_strings(data)
    if count:
        warnings.append(f"{count} NaN/Infinity tokens read as null")
    return repaired


def _replace_outside_strings(data: bytes) -> tuple[bytes, int]:
    if b"NaN" not in data and b"Infinity" not in data:
        return data, 0
    # Split on string literals so a kernel named "NaN" stays intact.
    parts = re.split(rb'("(?:[^"\\]|\\.)*")', data)
    count = 0
    for i in range(0, len(parts), 2):
        parts[i], n = _NON_FINITE.subn(b"null", parts[i])
        count += n
    return b"".join(parts), count
