"""tfpipe: TFRecord datasets for PyTorch, JAX and Keras, without TensorFlow.

The engine is Rust (threads, bounded buffers, CRC checks, Example parsing);
this package is its Python face. A dataset is a description, built with
tf.data's vocabulary, that starts running when you iterate it::

    import tfpipe

    schema = tfpipe.Schema(["image_raw:uint8:28x28", "label:int64"])
    ds = (
        tfpipe.Dataset.tfrecord("data/train-*.tfrecord")
        .interleave(4, 16)
        .shuffle(10_000, seed=0)
        .batch(256)
        .parse(schema)
        .prefetch(2)
    )
    for batch in ds:                      # dict[str, numpy.ndarray]
        images, labels = batch["image_raw"], batch["label"]

Batches are numpy arrays that own their memory (moved out of Rust, never
copied). ``tfpipe.torch``, ``tfpipe.grain`` and ``tfpipe.keras`` adapt a
dataset to those frameworks; each imports its framework only when used.

Errors: `DataError` (a ``ValueError``) for a corrupt or unparsable record,
with ``.path``, ``.record`` and ``.offset``; `SchemaError` for a bad spec;
``FileNotFoundError`` for a missing file.
"""

from __future__ import annotations

import json as _json
import os as _os
import random as _random
from typing import Any, Dict, Iterable, Iterator as _Iter, List, Optional, Sequence, Tuple, Union

from . import _tfpipe
from ._tfpipe import DataError, Schema, SchemaError, TFRecordWriter
from ._types import Ragged, Sparse

__all__ = [
    "Dataset",
    "Schema",
    "Ragged",
    "Sparse",
    "Iterator",
    "TFRecordWriter",
    "read_records",
    "encode_example",
    "encode_sequence_example",
    "parse_examples",
    "image_spec",
    "index",
    "DataError",
    "SchemaError",
    "set_bucket_options",
]

__version__ = "0.1.0"

#: The running iterator type (``iter(dataset)``): ``next()``, ``get_state()``,
#: ``set_state(state)``, ``metrics()``, ``close()``.
Iterator = _tfpipe.Iterator

PathLike = Union[str, "_os.PathLike[str]"]

DataError.__module__ = "tfpipe"
SchemaError.__module__ = "tfpipe"


class Dataset:
    """A TFRecord dataset: a description of a pipeline, run when iterated.

    Build one with `Dataset.tfrecord` and chain methods; each returns a new
    ``Dataset`` and leaves the old one as it was. Nothing is read until you
    iterate. A ``Dataset`` pickles (it is a description, not a running
    pipeline), so it can be sent to worker processes.

    Elements, by what the chain did:

    * records: ``bytes``; after `batch`: ``list[bytes]``;
    * after `parse`: ``dict[str, numpy.ndarray | Ragged | Sparse | list[bytes]]``,
      with the batch as the first dimension if `batch` came before or after
      the parse (a parse with no batch gives one record's values);
    * after `window`: a window as a batch (``list[bytes]``, or a parsed
      batch of the window's rows);
    * from `Dataset.zip`: a ``tuple`` with one element of each zipped
      dataset, each of its own kind.

    ``parse`` then ``batch`` and ``batch`` then ``parse`` give the same
    batches; both run as one bulk parse per batch.
    """

    __slots__ = ("_ops",)

    def __init__(self, _ops: Sequence[Dict[str, Any]]):
        self._ops = tuple(_ops)

    # -- sources -------------------------------------------------------------

    @staticmethod
    def tfrecord(paths: Union[PathLike, Iterable[PathLike]], compression: Optional[str] = "auto") -> "Dataset":
        """The records of TFRecord files.

        ``paths`` is one path or a list; each may be a glob (``*``, ``?``,
        ``[``; matches sorted) and a local path or an ``s3://``, ``gs://``,
        ``az://`` or ``http(s)://`` URL. ``compression`` is ``"auto"`` (from
        each name: ``.gz`` GZIP, ``.zlib``/``.zz`` ZLIB), ``None``, ``"GZIP"``
        or ``"ZLIB"``. A path that names no file raises ``FileNotFoundError``
        when the dataset is iterated.
        """
        if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
            paths = [paths]
        names = [_os.fsdecode(_os.fspath(p)) for p in paths]  # type: ignore[arg-type]
        if not names:
            raise ValueError("Dataset.tfrecord(): no paths given")
        return Dataset([{"op": "tfrecord", "paths": names, "compression": "none" if compression is None else str(compression)}])

    @staticmethod
    def sample_from(
        datasets: Sequence["Dataset"],
        weights: Optional[Sequence[float]] = None,
        seed: Optional[int] = None,
        stop_on_empty_dataset: bool = False,
    ) -> "Dataset":
        """A weighted mixture (tf.data's ``sample_from_datasets``): each
        element comes from ``datasets[i]`` with probability ``weights[i] /
        sum(weights)`` (equal weights by default), drawn from ``seed`` (drawn
        now if ``None``), so the same seed gives the same sequence; a new one
        each epoch under `repeat`. When the drawn dataset is exhausted the
        mixture stops (``stop_on_empty_dataset=True``) or draws among the
        others, their weights renormalised. Each input keeps its own stages
        and threads; its errors name it (``sample_from[1]``), and the state of
        the mixture covers every input."""
        inputs = _inputs(datasets, "sample_from")
        if weights is None:
            weights = [1.0] * len(inputs)
        weights = [float(w) for w in weights]
        if len(weights) != len(inputs):
            raise ValueError(f"sample_from(): {len(weights)} weights for {len(inputs)} datasets")
        if any(not (w >= 0.0) or w == float("inf") for w in weights) or sum(weights) <= 0.0:
            raise ValueError(f"sample_from(): weights={weights}: finite, not negative, not all zero")
        if seed is None:
            seed = _random.getrandbits(63)
        return Dataset(
            [
                {
                    "op": "sample_from",
                    "datasets": inputs,
                    "weights": weights,
                    "seed": _seed(seed),
                    "stop_on_empty_dataset": bool(stop_on_empty_dataset),
                }
            ]
        )

    @staticmethod
    def choose_from(datasets: Sequence["Dataset"], choices: Iterable[int]) -> "Dataset":
        """Each element from the dataset the next of ``choices`` (indices into
        ``datasets``) names (tf.data's ``choose_from_datasets``, with the
        choices as a list); stops when the choices end or name an exhausted
        dataset. A choice out of range is an error in its place."""
        inputs = _inputs(datasets, "choose_from")
        picks = [_count(c, "choice", 0) for c in choices]
        return Dataset([{"op": "choose_from", "datasets": inputs, "choices": picks}])

    @staticmethod
    def zip(*datasets: Union["Dataset", Sequence["Dataset"]]) -> "Dataset":
        """Tuples of the datasets' elements, one from each in turn (tf.data's
        ``Dataset.zip``): ``Dataset.zip(a, b)`` or ``Dataset.zip((a, b))``
        yields ``(a_element, b_element)``, each of its own kind (a parsed
        dict, ``bytes``, a list of records, or a tuple of a nested zip). It
        ends when the shortest dataset ends.

        Each dataset keeps its own stages, threads and errors (an error
        names its dataset, ``zip[1]``), and the iterator state covers them
        all. ``batch`` after it gives a tuple of batches, as in tf.data (each
        dataset must then yield single records or parsed single rows);
        ``shuffle``, ``take``, ``skip``, ``repeat``, ``prefetch``, ``shard``,
        ``concatenate`` and mixing take tuples; ``parse``, ``window`` and the
        row operations belong before the zip. Under a DataLoader's worker
        processes each worker takes every n-th tuple (the datasets stay
        aligned).
        """
        if len(datasets) == 1 and not isinstance(datasets[0], Dataset):
            datasets = tuple(datasets[0])  # type: ignore[arg-type]
        return Dataset([{"op": "zip", "datasets": _inputs(datasets, "zip")}])  # type: ignore[arg-type]

    def concatenate(self, other: "Dataset") -> "Dataset":
        """The elements of this dataset, then those of ``other`` (which must
        yield the same kind of element)."""
        if not isinstance(other, Dataset):
            raise TypeError(f"concatenate(): expected a Dataset, got {type(other).__name__}")
        return self._then(op="concatenate", other=list(other._ops))

    # -- file-level ----------------------------------------------------------

    def shard(self, num_shards: int, index: int) -> "Dataset":
        """Keeps shard ``index`` of ``num_shards``: whole files right after
        `tfrecord` (as tf.data recommends), else every ``num_shards``-th element."""
        return self._then(op="shard", num_shards=_count(num_shards, "num_shards"), index=_count(index, "index", 0))

    def rank(self, rank: Optional[int] = None, world_size: Optional[int] = None, remainder: str = "drop") -> "Dataset":
        """This process's share of a data-parallel job: disjoint, and with
        ``remainder="drop"`` equal across ranks (``"keep"`` keeps the uneven rest).

        With no arguments, reads torchrun's (``RANK``, ``WORLD_SIZE``) or
        Slurm's (``SLURM_PROCID``, ``SLURM_NTASKS``) variables as the
        ``tfpipe`` CLI does; outside a launcher it reads everything. The
        files in order are cut into consecutive runs of records, one per
        rank (whole files, and part of a file where a cut falls inside it),
        so at most ``world_size - 1`` records are dropped per epoch. Call it
        right after `tfrecord` (or `global_shuffle`).
        """
        if (rank is None) != (world_size is None):
            raise ValueError("rank(): give both rank and world_size, or neither (to read the launcher's variables)")
        if rank is None:
            found = _tfpipe.rank_from_env()
            rank, world_size = found if found is not None else (0, 1)
        if remainder not in ("drop", "keep"):
            raise ValueError(f"rank(): remainder={remainder!r}: expected 'drop' or 'keep'")
        world = _count(world_size, "world_size")
        r = _count(rank, "rank", 0)
        if r >= world:
            raise ValueError(f"rank(): rank={r} must be below world_size={world}")
        return self._then(op="rank", rank=r, world_size=world, remainder=remainder)

    def interleave(
        self,
        cycle_length: int = 4,
        block_length: int = 16,
        num_parallel_calls: Union[None, int, str] = None,
        deterministic: bool = True,
    ) -> "Dataset":
        """Reads ``cycle_length`` files at once, ``block_length`` records from
        each in turn. ``num_parallel_calls`` (a number or ``"auto"``) reads them
        on threads; ``None`` reads them in turn on one. Right after `tfrecord`."""
        _check_parallel(num_parallel_calls, allow_none=True)
        return self._then(
            op="interleave",
            cycle_length=_count(cycle_length, "cycle_length"),
            block_length=_count(block_length, "block_length"),
            num_parallel_calls=num_parallel_calls,
            deterministic=bool(deterministic),
        )

    def global_shuffle(self, seed: int) -> "Dataset":
        """A full random permutation of every record across all files, new
        each epoch, read by random access (no shuffle buffer). Needs an index
        beside each file (`tfpipe.index`). Right after `tfrecord`; `shard`
        and `rank` after it split the permutation."""
        return self._then(op="global_shuffle", seed=_seed(seed))

    # -- element-level -------------------------------------------------------

    def shuffle(self, buffer_size: int, seed: Optional[int] = None) -> "Dataset":
        """Shuffles through a buffer of ``buffer_size`` elements. Without a
        ``seed`` one is drawn now, so every iteration of this dataset (and its
        saved states) uses the same one; each epoch of `repeat` reshuffles."""
        if seed is None:
            seed = _random.getrandbits(63)
        return self._then(op="shuffle", buffer_size=_count(buffer_size, "buffer_size"), seed=_seed(seed))

    def batch(self, batch_size: int, drop_remainder: bool = False) -> "Dataset":
        """Groups ``batch_size`` elements; the last of each epoch may be
        shorter unless ``drop_remainder``. Batches never straddle epochs."""
        return self._then(op="batch", batch_size=_count(batch_size, "batch_size"), drop_remainder=bool(drop_remainder))

    def parse(
        self, schema: Union[Schema, Sequence[str]], num_parallel_calls: Union[int, str] = "auto", seed: Optional[int] = None
    ) -> "Dataset":
        """Parses ``tf.train.Example`` records under ``schema`` (a `Schema`
        or a list of feature specs) on ``num_parallel_calls`` threads (a
        number, or ``"auto"`` to tune while running). ``seed`` (default 0)
        seeds the random crops and augmentations of image features
        (`image_spec`): each record's draws depend only on it, the epoch and
        the record's index in the epoch, so they are the same whatever the
        thread count, and a resumed iterator draws what the uninterrupted
        one would have."""
        if not isinstance(schema, Schema):
            schema = Schema(list(schema))
        _check_parallel(num_parallel_calls, allow_none=False)
        seed = 0 if seed is None else _seed(seed)
        return self._then(op="parse", schema=_json.loads(schema.to_json()), num_parallel_calls=num_parallel_calls, seed=seed)

    def unbatch(self) -> "Dataset":
        """Parsed rows one at a time (arrays without the batch dimension),
        like ``tf.data``'s ``unbatch``. Resumable, as every stage here."""
        return self._then(op="unbatch")

    def rebatch(self, batch_size: Union[int, Sequence[int]], drop_remainder: bool = False) -> "Dataset":
        """Parsed rows regrouped into batches of ``batch_size`` (``tf.data``'s
        ``rebatch``), or of the sizes of a list in turn (each epoch starts at
        the first); the last of each epoch may be shorter unless ``drop_remainder``."""
        if isinstance(batch_size, int) and not isinstance(batch_size, bool):
            sizes: Union[int, List[int]] = _count(batch_size, "batch_size")
        else:
            sizes = [_count(b, "batch_size") for b in batch_size]  # type: ignore[union-attr]
            if not sizes:
                raise ValueError("rebatch(): batch_size=[]: give at least one size")
        return self._then(op="rebatch", batch_size=sizes, drop_remainder=bool(drop_remainder))

    def padded_batch(
        self,
        batch_size: int,
        padded_shape: Optional[int] = None,
        padding_value: Union[int, float, str, None] = None,
        mask: bool = False,
        drop_remainder: bool = False,
    ) -> "Dataset":
        """Parsed rows in batches of ``batch_size`` with every variable-length
        feature padded dense: to the batch's longest row, or to
        ``padded_shape`` (a longer row is an error), with ``padding_value``
        (default 0, or the empty string). ``mask`` adds ``NAME_mask`` (1 for
        a value, 0 for padding) beside each padded feature."""
        return self._then(
            op="padded_batch",
            batch_size=_count(batch_size, "batch_size"),
            padded_shape=None if padded_shape is None else _count(padded_shape, "padded_shape"),
            padding_value=padding_value,
            mask=bool(mask),
            drop_remainder=bool(drop_remainder),
        )

    def bucket_by_sequence_length(
        self,
        feature: str,
        bucket_boundaries: Sequence[int],
        bucket_batch_sizes: Sequence[int],
        padding_value: Union[int, float, str, None] = None,
        pad_to_bucket_boundary: bool = False,
        drop_remainder: bool = False,
    ) -> "Dataset":
        """Parsed rows batched with rows of similar ``feature`` length
        (``tf.data``'s ``bucket_by_sequence_length``): bucket ``i`` holds
        lengths in ``[b[i-1], b[i])`` and emits padded batches of
        ``bucket_batch_sizes[i]`` (one more size than boundaries)."""
        return self._then(
            op="bucket_by_sequence_length",
            feature=str(feature),
            bucket_boundaries=[_count(b, "bucket_boundaries") for b in bucket_boundaries],
            bucket_batch_sizes=[_count(b, "bucket_batch_sizes") for b in bucket_batch_sizes],
            padding_value=padding_value,
            pad_to_bucket_boundary=bool(pad_to_bucket_boundary),
            drop_remainder=bool(drop_remainder),
        )

    def pack(
        self,
        features: Sequence[str],
        length: int,
        num_packing_bins: int,
        padding_value: Union[int, float, str, None] = None,
        shuffle_bins: bool = False,
        seed: Optional[int] = None,
    ) -> "Dataset":
        """Packs parsed rows first-fit into batches of ``num_packing_bins``
        rows of ``length`` values (Grain's first-fit packing): for each packed
        feature ``F``, ``F``, ``F_segment_ids`` (1, 2, ... per sequence, 0 for
        padding) and ``F_positions``. A scalar feature packs as one value per
        sequence; longer sequences are truncated; other features are dropped.
        ``shuffle_bins`` puts each batch's rows in a random order drawn from
        ``seed`` (drawn now if ``None``), as Grain's ``shuffle_bins``."""
        op: Dict[str, Any] = dict(
            op="pack",
            features=[str(f) for f in features],
            length=_count(length, "length"),
            num_packing_bins=_count(num_packing_bins, "num_packing_bins"),
            padding_value=padding_value,
        )
        if shuffle_bins:
            op["shuffle_bins_seed"] = _seed(_random.getrandbits(63) if seed is None else seed)
        return self._then(**op)

    def window(
        self,
        size: int,
        shift: Optional[int] = None,
        stride: int = 1,
        drop_remainder: bool = False,
    ) -> "Dataset":
        """Windows of ``size`` consecutive elements, a new one every ``shift``
        elements (default ``size``), taking every ``stride``-th (tf.data's
        ``window``); the last windows of an epoch may be short unless
        ``drop_remainder``. Each window is one batch: of records, a
        ``list[bytes]`` (a `parse` after it parses the window as a batch);
        of parsed single rows (a parse with no batch, or `unbatch`), a parsed
        batch of the window's rows, as tf.data's
        ``ds.window(n).flat_map(lambda w: Dataset.zip(w).batch(n))`` gives.
        Window before `batch`, or `unbatch` first."""
        size = _count(size, "size")
        return self._then(
            op="window",
            size=size,
            shift=size if shift is None else _count(shift, "shift"),
            stride=_count(stride, "stride"),
            drop_remainder=bool(drop_remainder),
        )

    def prefetch(self, buffer_size: int) -> "Dataset":
        """Runs everything before it on a thread, ``buffer_size`` elements ahead."""
        return self._then(op="prefetch", buffer_size=_count(buffer_size, "buffer_size", 0))

    def repeat(self, count: Optional[int] = None) -> "Dataset":
        """Repeats ``count`` times (``None``: forever)."""
        return self._then(op="repeat", count=None if count is None else _count(count, "count", 0))

    def take(self, count: int) -> "Dataset":
        """The first ``count`` elements."""
        return self._then(op="take", count=_count(count, "count", 0))

    def skip(self, count: int) -> "Dataset":
        """All but the first ``count`` elements."""
        return self._then(op="skip", count=_count(count, "count", 0))

    def ignore_errors(self) -> "Dataset":
        """Drops elements whose reading or parsing failed (counted in the metrics)."""
        return self._then(op="ignore_errors")

    # -- running -------------------------------------------------------------

    def iter(self, state: Optional[Dict[str, Any]] = None) -> "Iterator":
        """Starts the pipeline; from ``state`` (an iterator's `get_state()`)
        it continues exactly where that iterator stood."""
        _check_fork()
        return _tfpipe.start(_json.dumps(self._ops), state)

    def __iter__(self) -> "Iterator":
        return self.iter()

    def _then(self, **op: Any) -> "Dataset":
        return Dataset(self._ops + (op,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dataset) and self._ops == other._ops

    def __hash__(self) -> int:
        return hash(_json.dumps(self._ops, sort_keys=True))

    def __reduce__(self):
        return (Dataset, (list(self._ops),))

    def __repr__(self) -> str:
        parts = []
        for op in self._ops:
            hidden = ("op", "schema", "datasets", "other")
            args = ", ".join(f"{k}={v!r}" for k, v in op.items() if k not in hidden)
            if "datasets" in op:
                args = f"<{len(op['datasets'])} datasets>, " + args
            if "other" in op:
                args = "<a dataset>" + args
            if op["op"] == "parse":
                args = "schema=..., " + args
            parts.append(f"{op['op']}({args})")
        return "Dataset." + "\n    .".join(parts)


def read_records(path: PathLike, compression: Optional[str] = "auto") -> "Iterator":
    """The records of one TFRecord file (or glob), as ``bytes``, CRC-checked.

    A corrupt record raises `DataError` with its path, record and offset."""
    return iter(Dataset.tfrecord(path, compression))


def encode_example(features: Dict[str, Any]) -> bytes:
    """A serialized ``tf.train.Example`` from ``{name: value}``.

    Values: ``bytes``/``str`` (one ``bytes_list`` value), ``int``/``bool``
    (``int64_list``), ``float`` (``float_list``, float32), lists of those,
    and numpy arrays or scalars (integers and booleans as ``int64_list``,
    floats as ``float_list``, flattened). An empty list is a feature with no
    list set (TensorFlow reads it as no values). For a ``uint8`` or ``raw_*``
    spec, pass the array's ``.tobytes()``.
    """
    return _tfpipe.encode_example(features)


def encode_sequence_example(
    context: Optional[Dict[str, Any]] = None,
    feature_lists: Optional[Dict[str, Any]] = None,
) -> bytes:
    """A serialized ``tf.train.SequenceExample``.

    ``context`` holds per-sequence features, given as to `encode_example`.
    ``feature_lists`` maps each name to its steps: a list (or tuple) of step
    values, each given as to `encode_example`, or an array whose first axis
    is the steps (a ``[steps, n]`` float array becomes ``steps`` float lists
    of ``n`` values). Read them back with ``NAME:DTYPE:seq:N`` or
    ``NAME:DTYPE:seq:var`` specs::

        record = tfpipe.encode_sequence_example(
            context={"id": 7},
            feature_lists={"tokens": [[1, 2], [], [3]]},
        )
    """
    return _tfpipe.encode_sequence_example(context, feature_lists)


def parse_examples(records: Sequence[bytes], schema: Union[Schema, Sequence[str]]) -> Dict[str, Any]:
    """Parses serialized Examples as one batch: the same dict a parsed
    dataset yields. A bad record raises `DataError` whose ``.record`` is its
    index in ``records``."""
    if not isinstance(schema, Schema):
        schema = Schema(list(schema))
    return _tfpipe.parse_examples(list(records), schema)


def image_spec(
    feature: str,
    size: Union[int, Sequence[int]],
    channels: int = 3,
    crop: Optional[str] = None,
    flip: bool = False,
    normalize: Union[None, str, Tuple[Sequence[float], Sequence[float]]] = None,
    layout: str = "NHWC",
    method: str = "bilinear",
    brightness: Optional[float] = None,
    contrast: Optional[Tuple[float, float]] = None,
    saturation: Optional[Tuple[float, float]] = None,
) -> str:
    """The feature spec of an encoded image (JPEG, PNG, GIF or BMP bytes)
    decoded in the parallel parse stage, for `Dataset.parse` or `Schema`::

        spec = tfpipe.image_spec("image/encoded", 224, crop="random", flip=True, normalize="imagenet", layout="NCHW")
        # 'image/encoded:image:224x224x3:random_crop,imagenet,nchw,flip'
        ds = tfpipe.Dataset.tfrecord(files).shuffle(10_000, seed=1).batch(64).parse([spec, "image/class/label:int64"], seed=1)

    ``size`` is ``H`` or ``(H, W)``; ``channels`` 1 or 3. ``crop``: ``None``
    (resize the whole image), ``"center"`` (0.875 of the shorter side) or
    ``"random"`` (``sample_distorted_bounding_box``, area 0.08-1).
    ``flip``, ``brightness`` (max delta, 0..1 scale), ``contrast`` and
    ``saturation`` (factor ranges) are random, drawn per record from
    `Dataset.parse`'s ``seed``. ``normalize``: ``None`` gives ``uint8``;
    ``"unit"`` float32 in 0..1; ``"imagenet"``, or ``(mean, std)`` per
    channel on the 0..1 scale, float32 ``(x - mean) / std``. ``layout``:
    ``"NHWC"`` or ``"NCHW"``. ``method``: ``"bilinear"``, ``"area"`` or
    ``"nearest"``. The grammar is docs/images.md's."""
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    options: List[str] = []
    if crop is not None:
        if crop not in ("center", "random"):
            raise ValueError(f"crop={crop!r}: expected None, 'center' or 'random'")
        options.append("center" if crop == "center" else "random_crop")
    if method != "bilinear":
        options.append(method)
    if normalize is not None:
        if isinstance(normalize, str):
            if normalize not in ("unit", "imagenet"):
                raise ValueError(f"normalize={normalize!r}: expected 'unit', 'imagenet' or (mean, std)")
            options.append("float32" if normalize == "unit" else "imagenet")
        else:
            mean, std = (list(map(float, v)) for v in normalize)
            if channels == 1:
                mean, std = mean * 3 if len(mean) == 1 else mean, std * 3 if len(std) == 1 else std
            if len(mean) != 3 or len(std) != 3:
                raise ValueError(f"normalize={normalize!r}: expected 3 means and 3 stds (1 each for grey)")
            options.append("normalize({})".format(",".join(repr(v) for v in mean + std)))
    if layout.upper() not in ("NHWC", "NCHW"):
        raise ValueError(f"layout={layout!r}: expected 'NHWC' or 'NCHW'")
    if layout.upper() == "NCHW":
        options.append("nchw")
    if flip:
        options.append("flip")
    if brightness is not None:
        options.append(f"brightness({float(brightness)!r})")
    for name, value in (("contrast", contrast), ("saturation", saturation)):
        if value is not None:
            lo, hi = value
            options.append(f"{name}({float(lo)!r},{float(hi)!r})")
    spec = f"{feature}:image:{int(h)}x{int(w)}x{int(channels)}"
    return spec + (":" + ",".join(options) if options else "")


def index(paths: Union[PathLike, Iterable[PathLike]]) -> List[str]:
    """Writes a record index (``FILE.idx``, tfrecord2idx's format) beside each
    file (paths or globs) and returns their paths; `Dataset.global_shuffle`
    and ``rank`` (a share starting inside a file) use them."""
    if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__"):
        paths = [paths]
    return [str(p) for p in _tfpipe.index([_os.fsdecode(_os.fspath(p)) for p in paths])]  # type: ignore[arg-type]


def set_bucket_options(base: str, options: Dict[str, str]) -> None:
    """Sets ``object_store`` options for one bucket, over the environment:
    ``set_bucket_options("s3://b", {"aws_endpoint": "http://127.0.0.1:9000",
    "aws_allow_http": "true"})``."""
    _tfpipe.set_bucket_options(base, {str(k): str(v) for k, v in options.items()})


def _inputs(datasets: Sequence[Dataset], name: str) -> List[List[Dict[str, Any]]]:
    inputs = list(datasets)
    if not inputs:
        raise ValueError(f"{name}(): no datasets given")
    for ds in inputs:
        if not isinstance(ds, Dataset):
            raise TypeError(f"{name}(): expected Datasets, got {type(ds).__name__}")
    return [list(ds._ops) for ds in inputs]


def _count(value: Any, name: str, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            value = int(value.__index__())
        except AttributeError:
            raise TypeError(f"{name}={value!r}: expected an int") from None
    if value < least:
        raise ValueError(f"{name}={value}: must be at least {least}")
    return int(value)


def _seed(seed: Any) -> int:
    seed = _count(seed, "seed", 0)
    if seed >= 1 << 64:
        raise ValueError(f"seed={seed}: must fit in 64 bits")
    return seed


def _check_parallel(value: Any, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, str) and value.lower() == "auto":
        return
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return
    raise ValueError(f"num_parallel_calls={value!r}: expected 'auto' or a positive int")


def _worker_share(ds: Dataset, worker: int, workers: int) -> Dataset:
    """The share of worker ``worker`` of ``workers`` (a DataLoader's worker
    processes): disjoint, read by no other worker. Composes with a rank of a
    data-parallel job: worker ``k`` of ``n`` reads its part of rank ``r``'s
    share (a second ``rank`` splits the first one's run of records; over the
    global shuffle, the share ``k * w + r`` of ``w * n``)."""
    ops = [dict(op) for op in ds._ops]
    # A mixture shares each of its inputs (and a concatenated dataset its
    # own); a zip shares its tuples, since sharing each input would pair
    # elements that do not belong together.
    for op in ops:
        if "datasets" in op and op["op"] != "zip":
            op["datasets"] = [list(_worker_share(Dataset(d), worker, workers)._ops) for d in op["datasets"]]
        if "other" in op:
            op["other"] = list(_worker_share(Dataset(op["other"]), worker, workers)._ops)
    if ops[0]["op"] == "zip":
        return Dataset(ops[:1] + [{"op": "shard", "num_shards": workers, "index": worker}] + ops[1:])
    if ops[0]["op"] in ("sample_from", "choose_from"):
        return Dataset(ops)
    pos = 2 if len(ops) > 1 and ops[1]["op"] == "global_shuffle" else 1
    if len(ops) > pos and ops[pos]["op"] == "rank" and pos == 2:
        r, w = ops[pos]["rank"], ops[pos]["world_size"]
        ops[pos].update(rank=worker * w + r, world_size=w * workers)
    elif len(ops) > pos and ops[pos]["op"] == "rank":
        ops.insert(pos + 1, {"op": "rank", "rank": worker, "world_size": workers, "remainder": "keep"})
    else:
        ops.insert(pos, {"op": "rank", "rank": worker, "world_size": workers, "remainder": "keep"})
    return Dataset(ops)


# -- fork --------------------------------------------------------------------
# A forked child inherits no threads, only their bookkeeping (and any lock a
# thread held at that instant). A child of a parent with no tfpipe thread
# running starts its own pipelines safely (a DataLoader's workers); otherwise
# starting one could wait forever on the parent's state, so it raises instead.
_threads_at_fork = 0


def _before_fork() -> None:
    global _threads_at_fork
    _threads_at_fork = _tfpipe.live_threads()


def _after_fork_in_child() -> None:
    global _forked_with_threads
    _forked_with_threads = _threads_at_fork


_forked_with_threads = 0


def _check_fork() -> None:
    if _forked_with_threads:
        raise RuntimeError(
            f"tfpipe: this process was forked while {_forked_with_threads} tfpipe thread(s) were "
            "running in the parent; their state cannot be used here. Close or delete the parent's "
            "iterators before forking (it.close()), iterate only in the child, or start processes "
            "with multiprocessing's 'spawn' or 'forkserver' method."
        )


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
