"""The results database's tables and how a database gets from any earlier version to this one.

Version 1 (docs/ci-gate.md, *The history database*):

* ``schema_version(program, version, written_by)``: one row; ``program`` is
  ``traceview-history``, so a database whose ``schema_version`` belongs to something else is
  refused, not written into.
* ``runs``: one recorded run: ``label``, ``inputs_hash`` (the xxh3-128 of the inputs' sorted
  content hashes; unique with ``label``, so re-recording the same inputs under the same label
  is a no-op), ``recorded_at`` (UTC, ISO 8601, sorts as text), ``commit_sha``, ``branch``,
  ``host``, and JSON columns ``meta`` (all the metadata), ``inputs`` (file, bytes, xxh3 per
  input file) and ``warnings`` (the inputs' damage warnings).
* ``metrics(run_id, name, value, unit, note)``: the gate metrics (``traceview.outputs.gate``).
* ``samples(run_id, kind, n, steps)``: the per-step samples behind them, a JSON list a kind.

Version 2: ``label``, ``commit_sha``, ``branch`` and ``host`` are TEXT (PostgreSQL refused
values SQLite took); a label is at most ``MAX_LABEL_CHARS`` on both.

Migrations are hand-written steps, not Alembic: ``UPGRADES[i]`` takes a database from version
``i`` to ``i + 1`` on the caller's connection, inside the caller's transaction (SQLite and
PostgreSQL both roll DDL back), and :func:`upgrade` runs the missing ones and writes the new
version. Four tables do not need Alembic's machinery (an ini file, an env.py, a versions
folder to ship in the wheel, its own version table), and a step that is a plain function on a
connection is tested the way the rest is: on a real SQLite file and a real PostgreSQL server.
Step 0 creates version 1 from nothing; when a later version changes a table, step 0 keeps
creating version 1's tables (its own ``Table`` definitions) and the new step alters them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sqlalchemy as sa

PROGRAM = "traceview-history"

metadata = sa.MetaData()

schema_version = sa.Table(
    "schema_version", metadata,
    sa.Column("program", sa.String(64), primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("written_by", sa.String(64), nullable=False),
)

runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("label", sa.Text, nullable=False),
    sa.Column("inputs_hash", sa.String(64), nullable=False),
    sa.Column("recorded_at", sa.String(40), nullable=False),
    sa.Column("commit_sha", sa.Text),
    sa.Column("branch", sa.Text),
    sa.Column("host", sa.Text),
    sa.Column("meta", sa.JSON, nullable=False),
    sa.Column("inputs", sa.JSON, nullable=False),
    sa.Column("warnings", sa.JSON, nullable=False),
    sa.UniqueConstraint("label", "inputs_hash", name="runs_label_inputs"),
    sa.Index("runs_recorded", "recorded_at", "id"),
)

metrics = sa.Table(
    "metrics", metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("name", sa.String(100), primary_key=True),
    sa.Column("value", sa.Float),
    sa.Column("unit", sa.String(16), nullable=False),
    sa.Column("note", sa.Text),
)

samples = sa.Table(
    "samples", metadata,
    sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"),
              primary_key=True),
    sa.Column("kind", sa.String(100), primary_key=True),
    sa.Column("n", sa.Integer, nullable=False),
    sa.Column("steps", sa.JSON, nullable=False),
)

#: The tables of the current version (a database missing one of them is damaged).
TABLES = tuple(metadata.tables)

Step = Callable[[sa.Connection], None]


#: Version 1's lengths of the columns version 2 made TEXT (PostgreSQL enforced them, SQLite
#: never did: a label of 201 characters was recorded on one and refused by the other).
_V1_LENGTHS = {"label": 200, "commit_sha": 100, "branch": 255, "host": 255}

#: The longest label (in characters) either backend records: the label is in the unique
#: index (label, inputs_hash), and a PostgreSQL B-tree entry holds at most ~2,700 bytes.
MAX_LABEL_CHARS = 512


def _create_v1(conn: sa.Connection) -> None:
    v1 = sa.MetaData()
    tables = [t.to_metadata(v1) for t in (schema_version, runs, metrics, samples)]
    for name, length in _V1_LENGTHS.items():
        v1.tables["runs"].c[name].type = sa.String(length)
    v1.create_all(conn, tables=tables)


def _text_columns(conn: sa.Connection) -> None:
    """Version 2: the label, commit, branch and host are TEXT on PostgreSQL too, as on SQLite
    (which ignores declared lengths): both take the same values."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("ALTER TABLE runs " + ", ".join(
            f"ALTER COLUMN {name} TYPE TEXT" for name in _V1_LENGTHS)))


#: ``UPGRADES[i]``: version i -> i + 1. The current version is ``len(UPGRADES)``.
UPGRADES: tuple[Step, ...] = (_create_v1, _text_columns)
SCHEMA_VERSION = len(UPGRADES)
#: The oldest version read as it is, without an upgrade (``show``, ``check --history``,
#: ``report --history``): version 2 only widened columns, so a CI job that reads a version
#: 1 database keeps working until the next ``record`` upgrades it.
READS_FROM = 1


def upgrade(conn: sa.Connection, from_version: int, *, written_by: str,
            steps: Sequence[Step] = UPGRADES) -> int:
    """Run ``steps[from_version:]`` on ``conn`` and record the version they reach; the
    caller's transaction makes it all or nothing. Returns the new version."""
    for step in steps[from_version:]:
        step(conn)
    version = len(steps)
    if from_version == 0:
        conn.execute(schema_version.insert().values(program=PROGRAM, version=version,
                                                    written_by=written_by))
    else:
        conn.execute(schema_version.update().where(schema_version.c.program == PROGRAM)
                     .values(version=version, written_by=written_by))
    return version
