"""A pickle reader that builds plain data only, so an untrusted snapshot runs no code.

A pickle can name any importable callable (``os.system``) and call it while it is read: the
standard ``pickle.load`` runs whatever the file asks for. Every such request goes through
``Unpickler.find_class`` (globals, ``copyreg`` extensions) or ``persistent_load``; both refuse
here, so a file is read only when it is made of dicts, lists, tuples, sets, strings, bytes,
numbers, booleans and None, which is what ``torch.cuda.memory._dump_snapshot`` writes.

Nesting is bounded too (:data:`MAX_NESTING` levels; a real snapshot nests 7): Python hashes a
tuple, prints a list and Polars converts one by recursing into its items, so a few hundred KB
of pickle nesting 200,000 deep would crash the interpreter (a tuple hashed as a dict key while
the pickle is read: a C recursion that no limit stops) or raise ``RecursionError`` wherever the
data is used. Tuples are bounded as they are built (they cannot change afterwards); every
container, and a container holding itself (which no snapshot does), when the pickle is read.

>>> import io, pickle
>>> plain_loads(pickle.dumps({"segments": [], "device_traces": [[]]}))
{'segments': [], 'device_traces': [[]]}
>>> plain_loads(b"\\x80\\x02N" + b"r\\xff\\xff\\xff\\xff" + b".")  # LONG_BINPUT 2**32 - 1: no 64 GB
>>> plain_loads(b"\\x80\\x04]" * 100 + b"a" * 99 + b".")
Traceback (most recent call last):
...
traceview.parsers.torch_snapshot._unpickle.RefusedPickle: lists, dicts or tuples nested more than 64 deep (a snapshot nests 7)
>>> plain_loads(pickle.dumps(print))
Traceback (most recent call last):
...
traceview.parsers.torch_snapshot._unpickle.RefusedPickle: the pickle asks for builtins.print (only plain data is read)
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from itertools import chain
from typing import Any, BinaryIO

#: The deepest nesting of containers read: a snapshot's deepest value (a frame's name) lies 7
#: levels down (dict, device_traces, a device's list, an entry, its frames, a frame, ...).
MAX_NESTING = 64
_CONTAINERS = (list, dict, tuple, set, frozenset)


class RefusedPickle(pickle.UnpicklingError):
    """The pickle asks for something other than plain data (a class, a function, ...)."""


class PlainUnpickler(pickle._Unpickler):  # noqa: SLF001 - the unpickler written in Python
    """An unpickler that refuses every global and persistent id.

    It is the standard library's unpickler written in Python, not the C one: the C one keeps
    its memo in an array indexed by the pickle's own numbers, so a 9-byte pickle asking to
    store at index 2**32 - 1 (``LONG_BINPUT``) makes it allocate 64 GB. Here the memo is a
    dict, one entry per store the file holds (bounded by its size); the reader is ~4x slower.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickle(f"the pickle asks for {module}.{name} (only plain data is read)")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("the pickle asks for a persistent object (only plain data is read)")

    def __init__(self, file: BinaryIO) -> None:
        super().__init__(file)
        #: id -> (tuple, nesting) of each tuple built holding a tuple (the tuple is kept, so
        #: its id is not reused); a tuple not here holds none: it nests 1
        self._tuples: dict[int, tuple[tuple[Any, ...], int]] = {}

    def _bounded_tuple(self) -> None:
        """The tuple just built (top of the stack) nests at most MAX_NESTING tuples deep."""
        built = self.stack[-1]
        inner = [self._tuples.get(id(item), (item, 1))[1] for item in built
                 if type(item) is tuple]
        if inner:
            nesting = 1 + max(inner)
            if nesting > MAX_NESTING:
                raise RefusedPickle(_too_deep())
            self._tuples[id(built)] = (built, nesting)

    def _tuple_opcode(base: Any) -> Any:  # noqa: N805 - runs in the class body
        def load(self: PlainUnpickler) -> None:
            base(self)
            self._bounded_tuple()
        return load

    # the unpickler runs opcodes through this table, not through methods
    dispatch = dict(pickle._Unpickler.dispatch)  # noqa: SLF001
    for _opcode in (pickle.TUPLE, pickle.TUPLE1, pickle.TUPLE2, pickle.TUPLE3):
        dispatch[_opcode[0]] = _tuple_opcode(dispatch[_opcode[0]])
    del _opcode, _tuple_opcode


def plain_load(fp: BinaryIO) -> Any:
    """The plain data pickled in ``fp``, nested at most :data:`MAX_NESTING` deep and holding
    no container inside itself; :class:`RefusedPickle` for anything else."""
    data = PlainUnpickler(fp).load()
    _check_nesting(data)
    return data


def _too_deep() -> str:
    return f"lists, dicts or tuples nested more than {MAX_NESTING} deep (a snapshot nests 7)"


def _items(container: Any) -> Iterator[Any]:
    """What a container holds: a dict's keys and values, any other's items."""
    return chain(container, container.values()) if type(container) is dict else iter(container)


def _check_nesting(data: Any) -> None:
    """:class:`RefusedPickle` when containers in ``data`` nest more than MAX_NESTING deep or
    one holds itself. A walk without recursion, each container once (a pickle shares
    objects: the nesting below each is remembered by its id, every one being alive in
    ``data``)."""
    if type(data) not in _CONTAINERS:
        return
    below: dict[int, int] = {}  # id -> levels of containers from it down, once walked
    path: list[list[Any]] = [[data, _items(data), 1]]  # [container, its items, levels]
    on_path = {id(data)}
    while path:
        top = path[-1]
        for item in top[1]:
            if type(item) not in _CONTAINERS:
                continue
            known = below.get(id(item))
            if known is not None:
                top[2] = max(top[2], known + 1)
                continue
            if id(item) in on_path:
                raise RefusedPickle("a list, dict or tuple that holds itself (no snapshot "
                                    "does)")
            if len(path) >= MAX_NESTING:
                raise RefusedPickle(_too_deep())
            path.append([item, _items(item), 1])
            on_path.add(id(item))
            break
        else:
            path.pop()
            on_path.discard(id(top[0]))
            below[id(top[0])] = top[2]
            if path:
                path[-1][2] = max(path[-1][2], top[2] + 1)
    if below[id(data)] > MAX_NESTING:
        raise RefusedPickle(_too_deep())


def plain_loads(data: bytes) -> Any:
    return plain_load(io.BytesIO(data))
