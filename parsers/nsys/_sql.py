"""SQL text made from names: every table or column name put into a query goes through
:func:`ident`, since an export may hold any name (``CREATE TABLE "we""ird"`` is legal SQLite)
and a name spliced in as it is breaks the query, or changes it.
"""

from __future__ import annotations


def ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (``"`` doubled).

    >>> ident('we"ird')
    '"we""ird"'
    """
    return '"' + name.replace('"', '""') + '"'


def text(value: str) -> str:
    """``value`` as a SQL string literal (``'`` doubled).

    >>> text("it's")
    "'it''s'"
    """
    return "'" + value.replace("'", "''") + "'"
