"""Distinct rows of a few columns, found cheaply: a search's plans share far fewer distinct values of what a cost
depends on (rank counts, message sizes) than there are plans, so costing each distinct one once and scattering the
results back (``on_distinct``) is faster than costing every plan, once there are DISTINCT_FROM of them."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

DISTINCT_FROM = 20000


def on_distinct(f: Callable[..., Any], *cols: Any) -> Any:
    """``f(*cols)`` for an ``f`` that works entry by entry (an array, or a tuple of arrays, of the columns' broadcast
    shape), computed on the distinct rows of ``cols`` alone where there are many entries."""
    cols = np.broadcast_arrays(*(np.asarray(x) for x in cols))
    shape = cols[0].shape
    if cols[0].size < DISTINCT_FROM:
        return f(*cols)
    flat = [x.ravel() for x in cols]
    rows, inverse = distinct(*flat)
    out = f(*(x[rows] for x in flat))
    back = (lambda y: np.broadcast_to(y, (len(rows),))[inverse].reshape(shape))  # noqa: E731
    return tuple(back(y) for y in out) if isinstance(out, tuple) else back(out)


def distinct(*cols: Any) -> tuple[Any, Any]:
    """(rows, inverse): the index of one entry per distinct tuple of the 1-d ``cols``, and for every entry which of
    those it equals. Neighbours are compared first (a search's enumeration repeats a row over its innermost choices),
    so that the work below runs on the heads of those runs only."""
    if len(cols[0]) == 0:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp)
    new = np.zeros(len(cols[0]), dtype=bool)
    new[0] = True
    for x in cols:
        new[1:] |= x[1:] != x[:-1]
    heads = np.flatnonzero(new)
    key, n_keys = np.zeros(len(heads), dtype=np.int64), 1
    for x in cols:  # the runs' tuples as one integer: mixed radix over each column's distinct values
        n_values, code = _codes(x[heads])
        key, n_keys = key * n_values + code, n_keys * n_values
        if n_keys >= TABLE_BELOW:  # renumbered, so that it never outgrows the number of runs
            n_keys, key = _codes(key)
    first, inverse = _first_of_each(key)
    return heads[first], np.repeat(inverse, np.diff(heads, append=len(new)))  # each run's entries


# whole numbers below this are told apart by a look-up table rather than np.unique's sort (rank counts, the keys)
TABLE_BELOW = 1 << 20


def _codes(x: Any) -> tuple[int, Any]:
    """(how many distinct values ``x`` holds, each entry's index among them in ascending order)."""
    top = x.max(initial=0)
    if x.min(initial=0) >= 0 and top < TABLE_BELOW and (x.dtype.kind in "biu" or np.all(x == np.floor(x))):
        present = np.zeros(int(top) + 1, dtype=bool)
        at = x.astype(np.intp)
        present[at] = True
        return int(present.sum()), (np.cumsum(present) - 1)[at]
    values, code = np.unique(x, return_inverse=True)
    return len(values), code


def _first_of_each(key: Any) -> tuple[Any, Any]:
    """(the index of the first entry of each distinct integer ``key``, each entry's index among those)."""
    if key.max(initial=0) < TABLE_BELOW:
        first = np.full(int(key.max(initial=0)) + 1, len(key))
        np.minimum.at(first, key, np.arange(len(key)))
        present = first < len(key)
        return first[present], (np.cumsum(present) - 1)[key]
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return first, inverse
