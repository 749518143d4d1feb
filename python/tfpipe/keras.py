"""Keras 3: a tfpipe dataset that ``keras.Model.fit()`` accepts directly.

>>> train = tfpipe.keras.dataset(ds, x="image_raw", y="label")
>>> model.fit(train, epochs=3, shuffle=False,   # the dataset shuffles
...           validation_data=tfpipe.keras.dataset(val, x="image_raw", y="label"))

``fit`` accepts a Grain ``IterDataset`` on every backend (JAX, torch,
TensorFlow), so that is what this returns: each parsed batch becomes
``(x, y)`` (``x`` one array, or a tuple for a list of names; a dict for a
dict of names). ``fit`` iterates it once per epoch: do not `repeat` the
dataset, or pass ``steps_per_epoch``. Keras cannot know the number of
batches of a Grain dataset, so after the first epoch it warns "Your input
ran out of data" (for every Grain dataset): that is the epoch's end. Pass
``shuffle=False``: the tfpipe dataset shuffles, and Keras warns that it cannot.

Needs ``grain`` (``pip install grain``) besides keras.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Union

from . import Dataset

__all__ = ["dataset"]

Names = Union[str, Sequence[str], Dict[str, str]]


def dataset(ds: Dataset, x: Names, y: Optional[Names] = None, sample_weight: Optional[str] = None) -> Any:
    """A dataset of ``(x, y[, sample_weight])`` tuples for ``Model.fit``/``evaluate``/``predict``.

    ``x`` and ``y`` name features of the parsed batches: one name, a list of
    names (a tuple of arrays) or a dict ``{input name: feature}``.
    """
    from .grain import IterDataset

    pick_x = _picker(x)
    pick_y = _picker(y) if y is not None else None

    def to_tuple(batch: Dict[str, Any]) -> Any:
        out = (pick_x(batch),)
        if pick_y is not None:
            out += (pick_y(batch),)
        if sample_weight is not None:
            out += (batch[sample_weight],)
        return out if len(out) > 1 else out[0]

    return IterDataset(ds).map(to_tuple)


def _picker(names: Names):
    if isinstance(names, str):
        return lambda batch: _get(batch, names)
    if isinstance(names, dict):
        return lambda batch: {k: _get(batch, v) for k, v in names.items()}
    names = list(names)
    return lambda batch: tuple(_get(batch, n) for n in names)


def _get(batch: Dict[str, Any], name: str) -> Any:
    try:
        return batch[name]
    except KeyError:
        raise KeyError(f"no feature {name!r} in the batch (features: {', '.join(batch)})") from None
