"""The value types a parsed batch holds besides numpy arrays: `Ragged` and `Sparse`."""

from __future__ import annotations

from typing import Any, List, Union

import numpy as np

__all__ = ["Ragged", "Sparse"]


class Ragged:
    """A ragged tensor in TensorFlow's layout (``tf.RaggedTensor``).

    Row ``i`` is ``values[row_splits[i]:row_splits[i + 1]]``. ``values`` is a
    numpy array (its first dimension is the rows' elements, the rest is each
    element's fixed shape), a list of ``bytes``, or another ``Ragged`` for a
    further level of nesting (``seq:var`` and multi-partition ``ragged``
    features).

    >>> r = Ragged(np.array([1, 2, 3]), np.array([0, 2, 2, 3]))
    >>> r.to_list()
    [[1, 2], [], [3]]
    >>> len(r), r[0]
    (3, array([1, 2]))
    """

    __slots__ = ("values", "row_splits")

    def __init__(self, values: Union[np.ndarray, List[bytes], "Ragged"], row_splits: np.ndarray):
        self.values = values
        self.row_splits = row_splits

    def __len__(self) -> int:
        return len(self.row_splits) - 1

    def row_lengths(self) -> np.ndarray:
        """The number of elements in each row."""
        return np.diff(self.row_splits)

    def __getitem__(self, i: int) -> Any:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} of a Ragged with {n} rows")
        start, end = int(self.row_splits[i]), int(self.row_splits[i + 1])
        if isinstance(self.values, Ragged):
            return Ragged(self.values, self.row_splits[i : i + 2]).to_list()[0]
        return self.values[start:end]

    def to_list(self) -> list:
        """Nested Python lists, one per row (as ``tf.RaggedTensor.to_list()``)."""
        inner = self.values.to_list() if isinstance(self.values, Ragged) else _as_list(self.values)
        splits = [int(s) for s in self.row_splits]
        return [inner[a:b] for a, b in zip(splits[:-1], splits[1:])]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ragged) and self.to_list() == other.to_list()

    def __repr__(self) -> str:
        return f"Ragged({self.to_list()!r})"

    def __reduce__(self):
        return (Ragged, (self.values, self.row_splits))


class Sparse:
    """A sparse tensor in TensorFlow's layout (``tf.SparseTensor``).

    ``indices`` is an ``int64`` array ``[nnz, rank]`` (row-major order),
    ``values`` the ``nnz`` values (a numpy array or a list of ``bytes``), and
    ``dense_shape`` the ``int64`` shape of the dense tensor. A batch's
    ``VarLenFeature``-like columns come in this form only for ``sparse(...)``
    features; ``var`` features are `Ragged`.

    >>> s = Sparse(np.array([[0, 1]]), np.array([5.0]), np.array([1, 3]))
    >>> s.to_dense()
    array([[0., 5., 0.]])
    """

    __slots__ = ("indices", "values", "dense_shape")

    def __init__(self, indices: np.ndarray, values: Union[np.ndarray, List[bytes]], dense_shape: np.ndarray):
        self.indices = indices
        self.values = values
        self.dense_shape = dense_shape

    def to_dense(self, default: Any = 0) -> np.ndarray:
        """A dense numpy array with ``default`` where there is no value (numeric values only)."""
        values = np.asarray(self.values)
        out = np.full(tuple(int(d) for d in self.dense_shape), default, dtype=values.dtype)
        if len(values):
            out[tuple(np.asarray(self.indices).T)] = values
        return out

    def __repr__(self) -> str:
        return (
            f"Sparse(indices={self.indices.tolist()!r}, values={_as_list(self.values)!r}, "
            f"dense_shape={self.dense_shape.tolist()!r})"
        )

    def __reduce__(self):
        return (Sparse, (self.indices, self.values, self.dense_shape))


def _as_list(values: Any) -> list:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)
