"""PyTorch: a tfpipe dataset as a ``torch.utils.data.IterableDataset``.

>>> from torch.utils.data import DataLoader
>>> loader = DataLoader(tfpipe.torch.IterableDataset(ds), batch_size=None)

``batch_size=None`` because the dataset batches already. Each batch is a
``dict`` of tensors made by ``torch.from_numpy`` (no copy), or for a zipped
dataset a tuple of those; `Ragged` and `Sparse` values and bytes pass through
as they are.

``num_workers=0`` is the fast path: the engine already reads, shuffles and
parses on its own threads, with the GIL released, and hands over memory
without a copy. Worker processes add a process hop (pickling every batch)
for nothing. With ``num_workers > 0`` each worker reads its own share (its
files, or its records when there are fewer files than workers), so no
record is read twice, and each worker's share composes with `Dataset.rank`.

With torchdata's ``StatefulDataLoader`` (``num_workers=0``), the loader's
``state_dict()`` holds the pipeline's position and ``load_state_dict()``
resumes exactly there.

torch is imported when this module is.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

import torch
import torch.utils.data

from . import Dataset, _worker_share

__all__ = ["IterableDataset"]


class IterableDataset(torch.utils.data.IterableDataset):
    """A ``torch.utils.data.IterableDataset`` over a parsed tfpipe `Dataset`.

    ``tensors=False`` yields the numpy dicts unchanged.
    """

    def __init__(self, dataset: Dataset, tensors: bool = True):
        super().__init__()
        if not isinstance(dataset, Dataset):
            raise TypeError(f"IterableDataset(dataset): expected a tfpipe.Dataset, got {type(dataset).__name__}")
        self.dataset = dataset
        self.tensors = tensors
        self._iterator: Any = None
        self._resume: Optional[Dict[str, Any]] = None

    def __iter__(self) -> Iterator[Any]:
        dataset = self.dataset
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            dataset = _worker_share(dataset, info.id, info.num_workers)
        state, self._resume = self._resume, None
        it = dataset.iter(state=state)
        self._iterator = it
        for element in it:
            yield _to_torch(element) if self.tensors else element

    def state_dict(self) -> Dict[str, Any]:
        """The position of the iterator in use (``StatefulDataLoader`` calls this)."""
        if self._iterator is None:
            return {"tfpipe": self._resume}
        return {"tfpipe": self._iterator.get_state()}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """The next iteration starts where ``state_dict`` was taken."""
        self._resume = state_dict.get("tfpipe")
        self._iterator = None


def _to_torch(element: Any) -> Any:
    if isinstance(element, dict):
        return {k: _to_torch(v) for k, v in element.items()}
    if isinstance(element, tuple):  # a zipped dataset's element
        return tuple(_to_torch(v) for v in element)
    if type(element).__module__ == "numpy" and hasattr(element, "dtype") and element.dtype.kind in "biuf":
        return torch.from_numpy(element)
    return element
