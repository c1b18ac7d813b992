"""Result: what one analysis answers, the same way in Python, the shell and a notebook.

A Result holds the fields of the command's ``--json`` document in order (tables as Polars
frames, the rest as plain values), names its main table, and carries the warnings of the run
it was computed on. ``to_dict()`` is exactly ``traceview NAME PATH --json``: the CLI prints
it. ``to_polars()``/``to_pandas()`` give the main table; ``--csv`` writes it.

>>> import polars as pl
>>> r = Result("demo", {"window": {"ranks": None}, "rows": pl.DataFrame({"rank": [0, 1]})},
...            main="rows")
>>> r.to_dict()
{'window': {'ranks': None}, 'rows': [{'rank': 0}, {'rank': 1}], 'warnings': [], 'warnings_plain': []}
>>> r.to_pandas().dtypes["rank"]
Int64Dtype()
>>> r.rows.height, "rows" in dir(r), r._ipython_key_completions_()
(2, True, ['window', 'rows'])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from html import escape
from typing import Any

import orjson
import polars as pl

from traceview._dependencies import lazy_module

# pyarrow only for to_pandas' nullable types.
pa = lazy_module("pyarrow")
pd = lazy_module("pandas", missing="to_pandas needs pandas: pip install pandas")


@dataclass(frozen=True)
class Result:
    """One command's answer. ``fields``: its ``--json`` document in order (frames for tables);
    ``main``: the key of its main table; ``warnings``: what the run said about the data, in
    full technical detail; ``plain``: the same in plain words, each once (what the text
    output prints without ``--verbose``; None: the warnings are plain already);
    ``reading_notes``: those of the warnings that tell how the files were read this time (a
    damaged cache entry healed, no cache folder), not what the data holds: an answer that
    has any is not kept for the next same command line (``traceview.cli._answers``)."""

    command: str
    fields: Mapping[str, Any]
    main: str
    warnings: tuple[str, ...] = field(default=())
    plain: tuple[str, ...] | None = None
    reading_notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def plain_warnings(self) -> list[str]:
        """The warnings in plain words, each once."""
        return list(dict.fromkeys(self.warnings if self.plain is None else self.plain))

    def with_warnings(self, *more: str) -> Result:
        """This answer with ``more`` warnings (already plain) after its own."""
        plain = None if self.plain is None else (*self.plain, *more)
        return replace(self, warnings=(*self.warnings, *more), plain=plain)

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def __getattr__(self, name: str) -> Any:
        """A field by attribute (``res.ranks`` is ``res["ranks"]``); only called when no real
        attribute has the name, so ``res.warnings`` stays the Result's own."""
        # vars(): fields may be unset while copy/pickle rebuild the object (no recursion)
        fields = vars(self).get("fields")
        if fields is None or name.startswith("__") or name not in fields:
            raise AttributeError(f"{type(self).__name__} {vars(self).get('command')!r} has no "
                                 f"attribute or field {name!r}")
        return fields[name]

    def __dir__(self) -> list[str]:  # tab completion offers the fields as attributes too
        return sorted({*super().__dir__(), *(k for k in self.fields if k.isidentifier())})

    def _ipython_key_completions_(self) -> list[str]:  # res["<TAB>
        return list(self.fields)

    def __iter__(self):  # noqa: ANN204 - the keys, as a dict's
        return iter(self.fields)

    def keys(self):  # noqa: ANN201
        return self.fields.keys()

    def table(self, name: str | None = None) -> pl.DataFrame:
        """A table of the result by its ``--json`` key (the main one by default)."""
        value = self.fields[name or self.main]
        if not isinstance(value, pl.DataFrame):
            raise KeyError(f"{self.command}: {name!r} is not a table")
        return value

    @property
    def tables(self) -> dict[str, pl.DataFrame]:
        return {k: v for k, v in self.fields.items() if isinstance(v, pl.DataFrame)}

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document: JSON values only (NaN becomes null, as orjson writes it)."""
        return orjson.loads(self.to_json())

    def to_json(self, *, indent: bool = True) -> bytes:
        doc = {k: v.to_dicts() if isinstance(v, pl.DataFrame) else v
               for k, v in self.fields.items()}
        doc["warnings"] = list(self.warnings)
        doc["warnings_plain"] = self.plain_warnings
        return json_bytes(doc, indent=indent)

    def to_polars(self) -> pl.DataFrame:
        """The main table."""
        return self.table()

    def to_pandas(self) -> Any:
        """The main table in pandas, with nullable dtypes: integers stay integers (``Int64``,
        not float64) where a value is missing, booleans are ``boolean``."""
        return to_pandas(self.table())

    def to_csv(self) -> str:
        """The main table as CSV; list cells are joined with ``;``, nested ones as JSON."""
        return csv_text(self.table())

    def __repr__(self) -> str:
        main = self.table()
        more = f", {len(self.warnings)} warnings" if self.warnings else ""
        return f"<Result {self.command}: {main.height} rows in {self.main!r}{more}>\n{main}"

    def _repr_html_(self) -> str:
        head = f"<p><b>{escape(self.command)}</b>: <code>{escape(self.main)}</code></p>"
        warns = "".join(f"<p>warning: {escape(w)}</p>" for w in self.warnings)
        return head + warns + self.table()._repr_html_()


def json_bytes(doc: Any, *, indent: bool = True) -> bytes:
    """The project's JSON text: keys in the order given, NaN as null, numpy values and
    frames (as records) allowed. Every ``--json`` output is written with it."""
    option = orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_INDENT_2 if indent else 0)
    return orjson.dumps(doc, option=option, default=_plain)


def _plain(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, pl.DataFrame):
        return obj.to_dicts()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def to_pandas(df: pl.DataFrame) -> Any:
    """``df`` in pandas with pandas' nullable dtypes for integers and booleans."""
    nullable = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(),
                pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype(),
                pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
                pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype(),
                pa.bool_(): pd.BooleanDtype()}
    return df.to_arrow().to_pandas(types_mapper=nullable.get)


def csv_text(df: pl.DataFrame) -> str:
    """CSV of ``df``: list columns joined with ``;``, struct and nested list columns (a list
    of structs) as JSON text; a text cell a spreadsheet would take for a formula starts
    with ``'`` (``_FORMULA``)."""
    flat = []
    for name, dtype in df.schema.items():
        col = pl.col(name)
        if isinstance(dtype, pl.List) and not dtype.inner.is_nested():
            flat.append(col.cast(pl.List(pl.String)).list.join(";").alias(name))
        elif isinstance(dtype, (pl.Struct, pl.Array, pl.List)):  # nested: as JSON text
            flat.append(col.map_elements(
                lambda v: orjson.dumps(v.to_list() if isinstance(v, pl.Series) else v).decode(),
                return_dtype=pl.String).alias(name))
        elif isinstance(dtype, (pl.Categorical, pl.Enum)):
            flat.append(col.cast(pl.String))
        else:
            flat.append(col)
    flat_df = df.select(flat)
    return flat_df.with_columns(
        pl.when(pl.col(name).str.contains(_FORMULA)).then("'" + pl.col(name))
        .otherwise(pl.col(name)).alias(name)
        for name, dtype in flat_df.schema.items() if dtype == pl.String).write_csv()


#: Text a spreadsheet would run as a formula (a kernel's name, a label from a fork's branch:
#: ``=HYPERLINK(...)``): cells starting with ``=``, ``+``, ``-``, ``@``, a tab or a carriage
#: return get a leading ``'``, as OWASP's CSV injection advice says. Numbers stay numbers.
_FORMULA = r"^[=+\-@\t\r]"
