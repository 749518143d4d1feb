"""Grain: a tfpipe dataset as a ``grain.IterDataset``.

>>> import grain
>>> source = tfpipe.grain.IterDataset(ds)          # a real grain.IterDataset
>>> for batch in source.map(augment): ...

The engine does the reading, shuffling, batching and parsing; Grain's
``map``, ``filter`` and the rest chain on top. The iterator's
``get_state()``/``set_state()`` carry the engine's position, so Grain's
checkpointing (and Orbax's ``grain`` handler) saves and restores it.

grain is imported when this module is.
"""

from __future__ import annotations

from typing import Any, Dict

import grain

from . import Dataset

__all__ = ["IterDataset", "DatasetIterator"]


class DatasetIterator(grain.DatasetIterator):
    """The running iterator, with Grain's ``get_state``/``set_state``."""

    def __init__(self, dataset: Dataset):
        super().__init__()
        self._dataset = dataset
        self._it = dataset.iter()
        self._taken = False

    def __next__(self) -> Any:
        self._taken = True
        return next(self._it)

    def get_state(self) -> Dict[str, Any]:
        return {"tfpipe": self._it.get_state()}

    def set_state(self, state: Dict[str, Any]) -> None:
        if self._taken:
            # Grain may restore a used iterator: start a new engine iterator there.
            self._it.close()
            self._it = self._dataset.iter(state=state["tfpipe"])
            self._taken = False
        else:
            self._it.set_state(state["tfpipe"])

    def close(self) -> None:
        self._it.close()

    def __str__(self) -> str:
        return f"tfpipe.grain.DatasetIterator({self._dataset!r})"


class IterDataset(grain.IterDataset):
    """A ``grain.IterDataset`` over a tfpipe `Dataset` (a source: no parents)."""

    def __init__(self, dataset: Dataset):
        if not isinstance(dataset, Dataset):
            raise TypeError(f"IterDataset(dataset): expected a tfpipe.Dataset, got {type(dataset).__name__}")
        super().__init__()
        self._dataset = dataset

    def __iter__(self) -> DatasetIterator:
        return DatasetIterator(self._dataset)

    def __str__(self) -> str:
        return f"tfpipe.grain.IterDataset({self._dataset!r})"
