"""The results database: a URL to an engine, the schema checked (or created, or upgraded) in
the same transaction as the write, one run inserted or runs read back. SQLAlchemy 2 Core;
SQLite by default, PostgreSQL through the same statements.

* A plain path is a SQLite file; ``sqlite:///FILE`` and ``postgresql://...`` URLs are taken
  as they are (``postgresql://`` uses psycopg 3, the ``postgres`` extra). Anything else, a
  database that cannot be reached or opened, and a database of another program (tables but
  no ``schema_version`` of ours) are a :class:`HistoryError`: one line naming the database
  (password hidden), exit 2.
* SQLite: WAL (set when this program creates the file's first table; readers then never
  block the writer), ``busy_timeout`` 30 s, and ``BEGIN IMMEDIATE`` for writes, so parallel CI
  jobs recording at once queue for the write lock instead of failing on "database is
  locked" part-way through a transaction; a write that still meets a busy database is
  retried whole. PostgreSQL: writers take a transaction-level advisory lock, so two jobs
  creating the schema of a new database at once do not collide.
* Every write is one transaction: the schema, the run, its metrics and samples all land, or
  none does.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, unquote

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from traceview import __version__
from traceview.errors import TraceviewError, keep_secret, redacted
from traceview.outputs import history_schema as S

#: SQLite waits this long for the write lock before "database is locked" (ms).
BUSY_TIMEOUT_MS = 30_000
#: ... and a write that still fails on a busy database is tried this many times in all.
WRITE_ATTEMPTS = 6
#: PostgreSQL: seconds to wait for the server before calling it unreachable.
CONNECT_TIMEOUT_S = 10
#: PostgreSQL: the longest a statement waits for a lock (the writers' advisory lock, a table
#: another session locked) and the longest any statement runs, in seconds; past them the
#: command is one line naming the database (exit 2) instead of waiting forever. A record
#: holds the writers' lock for well under a second, so a minute is many jobs queueing.
PG_LOCK_TIMEOUT_S = 60
PG_STATEMENT_TIMEOUT_S = 300
#: PostgreSQL advisory lock key of this program's writers (any fixed 64-bit number).
PG_LOCK_KEY = 0x7472616365766965  # "traceview"[:8]

T = TypeVar("T")


class HistoryError(TraceviewError):
    """The history database cannot be used: bad URL, unreachable, not ours, or too new."""


class NoHistoryYet(HistoryError):
    """No history database at all: a SQLite file not created yet (no run recorded), or an
    empty URL (a CI secret that is not set, as on pull requests from forks). ``check`` and
    ``report`` go on without recorded runs; ``record`` refuses an empty URL."""


@dataclass(frozen=True)
class Database:
    """An engine and how to name its database in a message (the password hidden)."""

    engine: sa.Engine
    where: str
    kind: str  #: "sqlite" or "postgresql"
    path: Path | None = None  #: the SQLite file
    read_only: bool = False  #: ``sqlite:///FILE?mode=ro``: read, never written

    def close(self) -> None:
        self.engine.dispose()


def open_database(url: str, *, create: bool) -> Database:
    """The database ``url`` names (a path, ``sqlite:///FILE`` or ``postgresql://``). A SQLite
    file that does not exist is created only when ``create`` (``record``); ``show`` and
    ``check`` refuse it. Its password (in the user info, or ``?password=``) is never printed
    (``errors.keep_secret``): ``where`` names the database without it."""
    if not url.strip():
        raise NoHistoryYet("the history database URL is empty (an unset CI secret?): give a "
                           "SQLite path or a database URL")
    sa_url = _parse(url)
    where = _shown_url(sa_url) if "://" in url else url
    backend = sa_url.get_backend_name()
    if backend == "sqlite":
        return _sqlite(sa_url, where, create)
    if backend == "postgresql":
        return _postgresql(sa_url, where)
    raise HistoryError(f"{where}: unsupported database URL (use a file path, sqlite:///FILE "
                       "or postgresql://USER@HOST/DB)")


#: Query parameters of a URL that carry secrets (libpq's names): left out of ``where``.
_SECRET_PARAMETERS = ("password", "sslpassword")


def _parse(url: str) -> sa.URL:
    if "://" not in url:  # a plain path: a SQLite file
        return sa.URL.create("sqlite", database=str(Path(url).expanduser().resolve()))
    if url.startswith("postgres://"):  # the short scheme some services hand out
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql"):
        url = _userinfo_quoted(url)
    try:
        parsed = sa.make_url(url)
        parsed.port  # noqa: B018 - a port that is not a number fails here, not in the driver
    except (sa_exc.ArgumentError, ValueError):
        raise HistoryError(f"{_unparsed_shown(url)}: not a database URL (use a file path, "
                           "sqlite:///FILE or postgresql://USER@HOST/DB)") from None
    keep_secret(parsed.password)
    for name in _SECRET_PARAMETERS:
        given = parsed.query.get(name)
        for value in given if isinstance(given, tuple) else [given]:  # repeated: a tuple
            keep_secret(value)
    if "password" in parsed.query and parsed.password is None:
        # the driver takes it as the URL's password, which SQLAlchemy knows to hide
        value = parsed.query["password"]
        parsed = parsed.set(password=value if isinstance(value, str) else value[-1])
        parsed = parsed.difference_update_query(["password"])
    return parsed


def _userinfo_quoted(url: str) -> str:
    """A PostgreSQL URL whose user or password holds ``@`` or ``/`` as it is (not
    %-encoded, as copied from a secret store): the host is after the *last* ``@`` before the
    query, as libpq and most clients read it; SQLAlchemy took the first."""
    scheme, rest = url.split("://", 1)
    before_query = rest.split("?", 1)[0]
    at = before_query.rfind("@")
    if at < 0:
        return url
    user, sep, password = rest[:at].partition(":")

    def quoted(text: str) -> str:
        return quote(unquote(text), safe="")

    info = quoted(user) + (":" + quoted(password) if sep else "")
    return f"{scheme}://{info}{rest[at:]}"


def _shown_url(url: sa.URL) -> str:
    """How messages and outputs name the database: no password, no secret parameter."""
    return url.difference_update_query(list(_SECRET_PARAMETERS)).render_as_string(
        hide_password=True)


def _unparsed_shown(url: str) -> str:
    """A URL that would not parse, named without anything that may be a secret: the user
    info and the query left out."""
    scheme, _, rest = url.partition("://")
    host = rest.split("?", 1)[0].rsplit("@", 1)[-1]
    return redacted(f"{scheme}://{host}")


#: SQLite URL parameters and the values taken (``mode``, as SQLite's own URIs name it).
_SQLITE_MODES = ("ro", "rw", "rwc")


def _sqlite(url: sa.URL, where: str, create: bool) -> Database:
    name = url.database or ""
    mode = url.query.get("mode")
    if name in ("", ":memory:") or mode == "memory":
        raise HistoryError(f"{where}: an in-memory database keeps nothing; give a file")
    unknown = sorted(set(url.query) - {"mode"})
    if unknown or (mode is not None and mode not in _SQLITE_MODES):
        raise HistoryError(f"{where}: unsupported SQLite URL parameter "
                           f"({', '.join(unknown) or f'mode={mode}'}); sqlite:///FILE takes "
                           f"mode={'|'.join(_SQLITE_MODES)}")
    path = Path(name)
    read_only = mode == "ro"
    if not path.exists() and (not create or read_only):
        raise NoHistoryYet(f"{where}: no such history database (`traceview history record` "
                           "creates it)")
    if not path.parent.is_dir():
        raise HistoryError(f"{where}: folder {path.parent} does not exist")
    # the file through SQLite's own URI, so that mode=ro is SQLite's (no write ever reaches
    # the file), not a parameter SQLAlchemy would pass over with a warning
    target = sa.URL.create("sqlite+pysqlite", database=f"file:{quote(str(path))}",
                           query={"mode": mode or "rwc", "uri": "true"})
    engine = sa.create_engine(target, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000},
                              poolclass=sa.pool.NullPool)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # transactions are begun below, not by the driver
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # a writer takes the write lock up front: one that took it part-way would fail with
        # "database is locked" without waiting (SQLite cannot let two upgrade their lock)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.info.get("write") else "BEGIN")

    return Database(engine, where, "sqlite", path, read_only)


def _postgresql(url: sa.URL, where: str) -> Database:
    if url.drivername == "postgresql":  # SQLAlchemy's default is psycopg2: use psycopg 3
        url = url.set(drivername="postgresql+psycopg")
    try:
        engine = sa.create_engine(url, connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
                                  poolclass=sa.pool.NullPool)
    except (ImportError, sa_exc.NoSuchModuleError) as exc:
        raise HistoryError(f"{where}: PostgreSQL needs its driver ({exc}): "
                           'pip install "traceview[postgres]"') from None
    return Database(engine, where, "postgresql")


# ------------------------------------------------------------------------- transactions

@contextmanager
def _transaction(db: Database, *, write: bool) -> Iterator[sa.Connection]:
    """One transaction on ``db``; its errors as :class:`HistoryError` naming the database."""
    driver_error = db.engine.dialect.loaded_dbapi.Error
    try:
        with db.engine.connect() as conn:
            conn.info["write"] = write
            if write and db.kind == "sqlite":
                _wal_for_a_new_file(conn.connection.dbapi_connection)
            with conn.begin():
                if db.kind == "postgresql":  # for this transaction only (SET LOCAL)
                    conn.exec_driver_sql(
                        f"SET LOCAL lock_timeout = '{int(PG_LOCK_TIMEOUT_S * 1000)}ms'")
                    conn.exec_driver_sql("SET LOCAL statement_timeout = "
                                         f"'{int(PG_STATEMENT_TIMEOUT_S * 1000)}ms'")
                if write and db.kind == "postgresql":
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(PG_LOCK_KEY)))
                yield conn
    except HistoryError:
        raise
    except (sa_exc.DBAPIError, driver_error) as exc:
        err = getattr(exc, "orig", None) or exc
        if _busy(err):
            raise _Busy(str(err)) from exc
        text = redacted(_first_line(err))
        if "lock timeout" in text or "statement timeout" in text:
            text += (f" (waited {PG_LOCK_TIMEOUT_S} s for a lock another session holds, or "
                     f"ran past {PG_STATEMENT_TIMEOUT_S} s)")
        raise HistoryError(f"{db.where}: {text}") from None


def _wal_for_a_new_file(dbapi_conn: Any) -> None:
    """WAL mode (it stays with the file) for a database with no tables yet: one that has
    tables is ours already in WAL, or another program's, whose settings are not ours to
    change. On the driver's connection: outside any transaction, as SQLite requires."""
    cur = dbapi_conn.cursor()
    try:
        mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
        if mode != "wal" and not cur.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            cur.execute("PRAGMA journal_mode = WAL")
    finally:
        cur.close()


class _Busy(Exception):
    """The database was busy past the wait: the whole write is tried again."""


def _busy(err: BaseException) -> bool:
    text = str(err).lower()
    return ("database is locked" in text or "database is busy" in text
            or "deadlock detected" in text or "could not serialize" in text)


def _first_line(err: Any) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0] if lines else type(err).__name__


def refuse_read_only(db: Database) -> None:
    """A database opened read-only (``?mode=ro``) is a :class:`HistoryError` for a writer:
    ``record`` says so before it reads any trace."""
    if db.read_only:
        raise HistoryError(f"{db.where}: opened read-only (mode=ro): nothing can be recorded "
                           "or upgraded in it")


def write(db: Database, work: Callable[[sa.Connection], T]) -> T:
    """``work(conn)`` in one write transaction, after the schema is checked (created or
    upgraded when needed); a busy database retries it whole. A database opened read-only
    (``?mode=ro``) is refused, before anything is read."""
    refuse_read_only(db)
    for attempt in range(WRITE_ATTEMPTS):
        try:
            with _transaction(db, write=True) as conn:
                ensure_schema(conn, db.where, create=True)
                return work(conn)
        except _Busy as busy:
            if attempt == WRITE_ATTEMPTS - 1:
                raise HistoryError(f"{db.where}: still busy after {WRITE_ATTEMPTS} tries "
                                   f"({busy})") from None
            time.sleep(random.uniform(0.05, 0.3) * 2 ** attempt)
    raise AssertionError("unreachable")


def read(db: Database, work: Callable[[sa.Connection], T]) -> T:
    """``work(conn)`` in one read transaction on a database that must be ours already."""
    try:
        with _transaction(db, write=False) as conn:
            ensure_schema(conn, db.where, create=False)
            return work(conn)
    except _Busy as busy:
        raise HistoryError(f"{db.where}: busy ({busy})") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        # rows this program did not write (JSON that is not, text where numbers belong):
        # one line naming the database, never half an answer
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HistoryError(f"{db.where}: a row this traceview did not write: "
                           f"{redacted(said)}") from None


def probe(db: Database) -> None:
    """Fail now, before the traces are read, when the database cannot be used: unreachable,
    another program's, newer than this traceview. A database with no tables yet (or a SQLite
    file not there yet) is fine: the write creates it."""
    if db.kind == "sqlite" and (db.path is None or not db.path.exists()):
        return
    try:
        with _transaction(db, write=False) as conn:
            if sa.inspect(conn).get_table_names():
                ensure_schema(conn, db.where, create=False, older_ok=True)
    except _Busy:
        return  # busy is no reason to refuse: the write waits for its turn


def upgrade(db: Database) -> int:
    """Bring the database to this version's schema (``history upgrade``); the version."""
    return write(db, lambda conn: S.SCHEMA_VERSION)


# ------------------------------------------------------------------------------- schema

def ensure_schema(conn: sa.Connection, where: str, *, create: bool,
                  older_ok: bool = False) -> int:
    """Check that the database is a traceview history at this version: create it when empty
    and ``create``, upgrade an older one when ``create`` (a write; ``older_ok``: leave it, the
    caller only checks), refuse anything else."""
    names = set(sa.inspect(conn).get_table_names())
    if S.schema_version.name not in names:
        if names:
            shown = ", ".join(sorted(names)[:6]) + (", ..." if len(names) > 6 else "")
            raise HistoryError(f"{where}: not a traceview history database: it has tables "
                               f"({shown}) but no schema_version")
        if not create:
            raise HistoryError(f"{where}: empty database: no run recorded yet "
                               "(`traceview history record` creates the tables)")
        return S.upgrade(conn, 0, written_by=f"traceview {__version__}")
    try:
        rows = conn.execute(sa.select(S.schema_version.c.program,
                                      S.schema_version.c.version)).all()
    except sa_exc.DBAPIError:
        rows = []
    ours = [v for p, v in rows if p == S.PROGRAM]
    if len(rows) != 1 or not ours:
        raise HistoryError(f"{where}: not a traceview history database: its schema_version "
                           "table belongs to another program")
    version = int(ours[0])
    if version > S.SCHEMA_VERSION:
        raise HistoryError(f"{where}: written by a newer traceview (schema version {version}; "
                           f"this one knows up to {S.SCHEMA_VERSION}): upgrade traceview")
    if version < S.SCHEMA_VERSION:
        if older_ok or (not create and version >= S.READS_FROM):
            return version
        if not create:
            raise HistoryError(f"{where}: schema version {version} is older than this "
                               f"traceview's {S.SCHEMA_VERSION}: `traceview history upgrade "
                               "--db URL` (or the next `record`) upgrades it")
        version = S.upgrade(conn, version, written_by=f"traceview {__version__}")
    missing = [t for t in S.TABLES if t not in names]
    if missing:
        raise HistoryError(f"{where}: damaged history database: missing tables "
                           f"{', '.join(missing)}")
    return version


# ------------------------------------------------------------------------- runs in, out

def insert_run(conn: sa.Connection, run: dict[str, Any], metric_rows: list[dict[str, Any]],
               sample_rows: list[dict[str, Any]]) -> tuple[int, bool]:
    """Insert one run (a ``runs`` row without ``id``) with its metrics and samples; when a run
    with the same (label, inputs_hash) exists, nothing is written. Returns (id, inserted)."""
    insert = _insert_for(conn)
    new_id = conn.execute(insert(S.runs).values(**run)
                          .on_conflict_do_nothing(index_elements=["label", "inputs_hash"])
                          .returning(S.runs.c.id)).scalar()
    if new_id is None:
        same = sa.and_(S.runs.c.label == run["label"],
                       S.runs.c.inputs_hash == run["inputs_hash"])
        return int(conn.execute(sa.select(S.runs.c.id).where(same)).scalar_one()), False
    if metric_rows:
        conn.execute(S.metrics.insert(), [{**r, "run_id": new_id} for r in metric_rows])
    if sample_rows:
        conn.execute(S.samples.insert(), [{**r, "run_id": new_id} for r in sample_rows])
    return int(new_id), True


def _insert_for(conn: sa.Connection) -> Callable[..., Any]:
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert


def run_headers(conn: sa.Connection) -> list[dict[str, Any]]:
    """Every run's row, oldest first (by ``recorded_at``, then ``id``)."""
    rows = conn.execute(sa.select(S.runs).order_by(S.runs.c.recorded_at, S.runs.c.id))
    return [dict(r._mapping) for r in rows]


def run_details(conn: sa.Connection, ids: list[int]
                ) -> tuple[dict[int, list[dict[str, Any]]], dict[int, dict[str, list[int]]]]:
    """The metric rows and the samples (kind -> steps) of the runs ``ids``."""
    metric_rows: dict[int, list[dict[str, Any]]] = {i: [] for i in ids}
    sample_rows: dict[int, dict[str, list[int]]] = {i: {} for i in ids}
    if not ids:
        return metric_rows, sample_rows
    for r in conn.execute(sa.select(S.metrics).where(S.metrics.c.run_id.in_(ids))):
        metric_rows[r.run_id].append(dict(r._mapping))
    for r in conn.execute(sa.select(S.samples).where(S.samples.c.run_id.in_(ids))):
        sample_rows[r.run_id][r.kind] = list(r.steps)
    return metric_rows, sample_rows
