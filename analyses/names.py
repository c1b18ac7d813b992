"""Text rules on event names, evaluated once per distinct name.

A trace repeats a few hundred names over millions of events, so a regular expression run on
every row costs orders of magnitude more than the same expression run on the distinct names
and joined back by the (dictionary-encoded) name. Both helpers stay lazy.

>>> import polars as pl
>>> ev = pl.DataFrame({"name": ["cudaLaunchKernel", "cudaDeviceSynchronize", None],
...                    "ts_ns": [0, 5, 9]})
>>> matching(ev, r"Synchronize$").collect().get_column("ts_ns").to_list()
[5]
>>> per_name(ev, short=pl.col("name").str.slice(0, 4)).collect().get_column("short").to_list()
['cuda', 'cuda', None]
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import polars as pl

Frame = pl.LazyFrame | pl.DataFrame


def matching(rows: Frame, pattern: str) -> pl.LazyFrame:
    """The rows whose ``name`` matches the regex ``pattern`` (a null name never matches), in
    their order."""
    lf = rows.lazy()
    names = lf.select(pl.col("name").unique()).filter(
        pl.col("name").cast(pl.String).str.contains(pattern))
    return lf.join(names, on="name", how="semi", maintain_order="left")


def per_name(rows: Frame, **columns: pl.Expr) -> pl.LazyFrame:
    """``rows`` with ``columns`` added, each an expression over ``pl.col("name")`` computed
    once per distinct name, in their order."""
    lf = rows.lazy()
    names = lf.select(pl.col("name").unique()).with_columns(**columns)
    return lf.join(names, on="name", how="left", nulls_equal=True, maintain_order="left")



def short_name(name: str | None, width: int = 60) -> str:
    """A kernel name as a reader scans it: a C++ signature loses its return type, parameter
    list, namespaces and lambdas, then (if still longer than ``width``) its nested template
    arguments; anything left longer is cut with ``…``. Other names (``aten::mm``, ``Memcpy
    HtoD (Pageable -> Device)``) are only cut. Tables show the full name on hover.

    >>> short_name("void at::native::vectorized_elementwise_kernel<4, "
    ...            "at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >"
    ...            "(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)", width=80)
    'vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, Array<char*, 3>>'
    >>> short_name("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel"
    ...            "<float, float>(float const*, float*, int)")
    'layer_norm_grad_input_kernel<float, float>'
    >>> short_name("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long)")
    'ncclDevKernel_AllReduce_Sum_f32_RING_LL'
    >>> short_name("Memcpy HtoD (Pageable -> Device)")
    'Memcpy HtoD (Pageable -> Device)'
    """
    s = "" if name is None else str(name).strip()
    signature = re.sub(r"^(?:void|static|__global__)\s+", "", s)
    signature = signature.replace("(anonymous namespace)::", "")
    head = _cut_parameters(signature)
    if s.endswith(")") and head != signature and " " not in _outside_templates(head):
        s = re.sub(r"::\{lambda\([^)]*\)#\d+\}", "", head)
        s = re.sub(r"::operator\(\)\(\) const", "", s)
        s = re.sub(r"\([^()]*\)", "", s)  # parameter lists inside template arguments
        s = re.sub(r"\b(?:[A-Za-z_]\w*::)+", "", s)
        s = re.sub(r"\s+>", ">", re.sub(r"\s+", " ", s))
        while len(s) > width and re.search(r"<[^<>]*<[^<>…]+>", s):
            s = re.sub(r"(<[^<>]*)<[^<>…]+>", r"\1<…>", s, count=1)  # innermost first
    return s if len(s) <= width else s[: width - 1] + "…"


def unique_short_names(names: Iterable[str | None], width: int = 60) -> dict[str, str]:
    """Each distinct name's label: ``short_name``, made longer where two distinct names would
    share one, so that no two kernels share a label (a table row or a figure bar each). A
    clashing group keeps more of its template arguments (``width`` doubled, then doubled
    again, then the whole simplified signature); names that still read the same (they
    differ only in namespaces, lambdas or parameters) get `` #1``, `` #2``... in name order.

    >>> a = "void k<F<Mul>, A<int> >(int)"; b = "void k<F<Div>, A<int> >(int)"
    >>> short_name(a, 16) == short_name(b, 16)
    True
    >>> sorted(unique_short_names([a, b, a], width=16).values())
    ['k<F<Div>, A<int>>', 'k<F<Mul>, A<int>>']
    """
    distinct = list(dict.fromkeys(str(n) for n in names if n is not None))
    labels = {n: short_name(n, width) for n in distinct}
    for wider in (2 * width, 4 * width, 1 << 30):
        clashing = _clashing(labels)
        if not clashing:
            return labels
        labels.update({n: short_name(n, wider) for n in clashing})
    groups: dict[str, list[str]] = {}
    for n in sorted(_clashing(labels)):
        groups.setdefault(labels[n], []).append(n)
    for label, members in groups.items():
        labels.update({n: f"{label} #{i}" for i, n in enumerate(members, 1)})
    return labels


def _clashing(labels: dict[str, str]) -> set[str]:
    """The names whose label another name also has."""
    seen: dict[str, int] = {}
    for label in labels.values():
        seen[label] = seen.get(label, 0) + 1
    return {n for n, label in labels.items() if seen[label] > 1}


def _outside_templates(s: str) -> str:
    """``s`` without what is inside ``<…>``."""
    out, depth = [], 0
    for ch in s:
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">" and depth > 0
    return "".join(out)


def _cut_parameters(s: str) -> str:
    """``s`` up to its parameter list: the first ``(`` outside every ``<…>``."""
    depth = 0
    for i, ch in enumerate(s):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0 and i > 0:
            return s[:i]
    return s
