"""Sequence stages from Python: unbatch, rebatch, padded_batch,
bucket_by_sequence_length and pack over parsed features, and a packed
dataset's state resumed at every cut point."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tfpipe

SPECS = ["tokens:int64:var", "label:int64"]


def _length(i: int) -> int:
    return (i * 7) % 11


@pytest.fixture()
def tokens(tmp_path):
    """40 records: `tokens` of length 0-10 (values 1000 * i + j + 1), `label` i."""
    path = tmp_path / "tokens.tfrecord"
    with tfpipe.TFRecordWriter(path) as w:
        for i in range(40):
            values = [1000 * i + j + 1 for j in range(_length(i))]
            w.write(tfpipe.encode_example({"tokens": np.array(values, dtype=np.int64), "label": i}))
    return [str(path)]


def _parsed(paths):
    return tfpipe.Dataset.tfrecord(paths).batch(16).parse(SPECS)


def test_unbatch_and_rebatch(tokens):
    rows = list(_parsed(tokens).unbatch())
    assert [int(r["label"]) for r in rows] == list(range(40))
    sizes = [len(b["label"]) for b in _parsed(tokens).rebatch(6)]
    assert sizes == [6] * 6 + [4]
    assert [len(b["label"]) for b in _parsed(tokens).rebatch(6, drop_remainder=True)] == [6] * 6
    cycled = list(_parsed(tokens).rebatch([3, 5]))
    assert [len(b["label"]) for b in cycled] == [3, 5] * 5
    assert [int(i) for b in cycled for i in b["label"]] == list(range(40))
    with pytest.raises(ValueError):
        _parsed(tokens).rebatch([])


def test_padded_batch_pads_to_the_longest_row_with_a_mask(tokens):
    batches = list(_parsed(tokens).padded_batch(5, padding_value=-1, mask=True))
    first = batches[0]
    lengths = [_length(i) for i in range(5)]
    assert first["tokens"].shape == (5, max(lengths))
    assert first["tokens_mask"].tolist() == [[1] * n + [0] * (max(lengths) - n) for n in lengths]
    assert first["tokens"][0].tolist() == [-1] * max(lengths)  # row 0 is empty
    fixed = next(iter(_parsed(tokens).padded_batch(5, padded_shape=12)))
    assert fixed["tokens"].shape == (5, 12)
    with pytest.raises(Exception, match="longer than the padded shape 3"):
        list(_parsed(tokens).padded_batch(5, padded_shape=3))


def test_bucket_by_sequence_length_groups_similar_lengths(tokens):
    ds = _parsed(tokens).bucket_by_sequence_length("tokens", [4, 8], [3, 3, 3])
    seen = []
    for b in ds:
        lengths = [_length(int(i)) for i in b["label"]]
        buckets = {0 if n < 4 else 1 if n < 8 else 2 for n in lengths}
        assert len(buckets) == 1, lengths
        assert b["tokens"].shape[1] == max(lengths)
        seen += [int(i) for i in b["label"]]
    assert sorted(seen) == list(range(40))
    with pytest.raises(Exception, match="batch sizes"):
        list(_parsed(tokens).bucket_by_sequence_length("tokens", [4, 8], [3, 3]))


def _sequences(batch, length):
    """The (label, tokens) of each sequence in a packed batch."""
    out = []
    for row in range(len(batch["tokens"])):
        labels = {int(s): int(v) for s, v in zip(batch["label_segment_ids"][row], batch["label"][row]) if s}
        for s, label in labels.items():
            cells = batch["tokens_segment_ids"][row] == s
            assert batch["tokens_positions"][row][cells].tolist() == list(range(int(cells.sum())))
            out.append((label, batch["tokens"][row][cells].tolist()))
    return out


@pytest.mark.parametrize("shuffle_bins", [False, True])
def test_pack_keeps_each_sequence_with_its_label_across_restarts(tokens, shuffle_bins):
    ds = _parsed(tokens).pack(["tokens", "label"], length=12, num_packing_bins=3, shuffle_bins=shuffle_bins, seed=4)
    full = [_sequences(b, 12) for b in ds]
    plain = [_sequences(b, 12) for b in _parsed(tokens).pack(["tokens", "label"], length=12, num_packing_bins=3)]
    # Shuffled bins: the same rows in each batch, in another order.
    assert [sorted(b) for b in full] == [sorted(b) for b in plain]
    assert (full != plain) == shuffle_bins
    flat = sorted(s for b in full for s in b)
    assert flat == [(i, [1000 * i + j + 1 for j in range(_length(i))]) for i in range(40)]
    assert all(len(b["tokens"]) <= 3 for b in ds)
    for cut in range(len(full) + 1):
        it = iter(ds)
        head = [_sequences(next(it), 12) for _ in range(cut)]
        state = json.loads(json.dumps(it.get_state()))
        del it
        rest = [_sequences(b, 12) for b in ds.iter(state=state)]
        assert head + rest == full, cut


def test_sequence_stages_need_parsed_rows(tokens):
    with pytest.raises(Exception, match="call parse"):
        list(tfpipe.Dataset.tfrecord(tokens).batch(4).unbatch())


def _window_rows(n, size, shift, stride, drop):
    """tf.data's window over range(n), each window's elements (its semantics,
    checked against TensorFlow in tests/pipeline/tf_sequences.rs)."""
    out = []
    for start in range(0, n, shift):
        w = list(range(start, n, stride))[:size]
        if drop and len(w) < size:
            break
        out.append(w)
    return out


@pytest.mark.parametrize("size,shift,stride,drop", [(3, 3, 1, False), (4, 2, 1, True), (3, 1, 2, False), (2, 5, 1, False)])
def test_window_of_parsed_rows_is_a_batch_per_window(tokens, size, shift, stride, drop):
    ds = tfpipe.Dataset.tfrecord(tokens).parse(SPECS).window(size, shift, stride, drop)
    windows = list(ds)
    assert [w["label"].tolist() for w in windows] == _window_rows(40, size, shift, stride, drop)
    w = windows[1]
    assert w["tokens"].to_list() == [[1000 * i + j + 1 for j in range(_length(i))] for i in w["label"].tolist()]
    # The same from unbatched batches, and from records parsed per window.
    again = [w["label"].tolist() for w in _parsed(tokens).unbatch().window(size, shift, stride, drop)]
    assert again == [w["label"].tolist() for w in windows]
    parsed_after = tfpipe.Dataset.tfrecord(tokens).window(size, shift, stride, drop).parse(SPECS)
    assert [w["label"].tolist() for w in parsed_after] == again


def test_window_of_records_and_its_state(tokens):
    records = list(tfpipe.Dataset.tfrecord(tokens))
    windows = list(tfpipe.Dataset.tfrecord(tokens).window(4, 3))
    assert windows == [records[i : i + 4] for i in range(0, 40, 3)]
    ds = tfpipe.Dataset.tfrecord(tokens).parse(SPECS).window(5, 2, drop_remainder=True).repeat(2)
    full = [w["label"].tolist() for w in ds]
    for cut in (0, 1, 9, 18, 25, len(full)):
        it = iter(ds)
        head = [next(it)["label"].tolist() for _ in range(cut)]
        state = json.loads(json.dumps(it.get_state()))
        del it
        assert head + [w["label"].tolist() for w in ds.iter(state=state)] == full, cut
    with pytest.raises(ValueError, match="unbatch"):
        iter(_parsed(tokens).window(2))
    with pytest.raises(ValueError):
        tfpipe.Dataset.tfrecord(tokens).window(0)
