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


def test_pack_keeps_each_sequence_with_its_label_across_restarts(tokens):
    ds = _parsed(tokens).pack(["tokens", "label"], length=12, num_packing_bins=3)
    full = [_sequences(b, 12) for b in ds]
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
