"""A pickle reader that builds plain data only, so an untrusted snapshot runs no code.

A pickle can name any importable callable (``os.system``) and call it while it is read: the
standard ``pickle.load`` runs whatever the file asks for. Every such request goes through
``Unpickler.find_class`` (globals, ``copyreg`` extensions) or ``persistent_load``; both refuse
here, so a file is read only when it is made of dicts, lists, tuples, sets, strings, bytes,
numbers, booleans and None, which is what ``torch.cuda.memory._dump_snapshot`` writes.

>>> import io, pickle
>>> plain_loads(pickle.dumps({"segments": [], "device_traces": [[]]}))
{'segments': [], 'device_traces': [[]]}
>>> plain_loads(b"\\x80\\x02N" + b"r\\xff\\xff\\xff\\xff" + b".")  # LONG_BINPUT 2**32 - 1: no 64 GB
>>> plain_loads(pickle.dumps(print))
Traceback (most recent call last):
...
traceview.parsers.torch_snapshot._unpickle.RefusedPickle: the pickle asks for builtins.print (only plain data is read)
"""

from __future__ import annotations

import io
import pickle
from typing import Any, BinaryIO


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


def plain_load(fp: BinaryIO) -> Any:
    """The plain data pickled in ``fp``; :class:`RefusedPickle` for anything else."""
    return PlainUnpickler(fp).load()


def plain_loads(data: bytes) -> Any:
    return plain_load(io.BytesIO(data))
