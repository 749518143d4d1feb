"""Writes testdata/tf-semantics/sequences.json: TensorFlow's own outputs for
unbatch, rebatch, window, padded_batch and bucket_by_sequence_length on small
fixed inputs. tests/pipeline/tf_sequences.rs runs tfpipe on the same inputs and
compares.

Run from the repository root: /work/venv-tf/bin/python scripts/tf_semantics_sequences.py
(TensorFlow 2.21 CPU; the inputs are built here, so it needs no data).

Each case: {"name", "op", "params", "input", "expected"}. Integer lists stay
integers; floats are written as numbers (all exactly representable); byte
strings as latin-1 text.
"""
import json
import os
import numpy as np
import tensorflow as tf

cases = []


def add(name, op, params, input, expected):
    cases.append({"name": name, "op": op, "params": params, "input": input, "expected": expected})


def ragged_ds(seqs, dtype=tf.int64, inner=()):
    def gen():
        for s in seqs:
            yield np.array(s, dtype=dtype.as_numpy_dtype).reshape((-1,) + tuple(inner)) if inner else np.array(s, dtype=dtype.as_numpy_dtype)
    shape = [None] + list(inner)
    return tf.data.Dataset.from_generator(gen, output_signature=tf.TensorSpec(shape, dtype))


def to_list(t):
    a = t.numpy()
    if a.dtype == object:
        return [x.decode("latin-1") for x in a.reshape(-1).tolist()], list(a.shape)
    return a.reshape(-1).tolist(), list(a.shape)


# --- unbatch: batches of different sizes back to elements
seqs = [[1, 2, 3], [], [4], [5, 6]]
add("unbatch", "unbatch", {}, seqs, [int(x) for x in ragged_ds(seqs).unbatch().as_numpy_iterator()])

# --- rebatch over batch(a)
for n, a, b, drop in [(10, 3, 4, False), (10, 3, 4, True), (7, 2, 1, False), (9, 4, 9, False), (5, 5, 2, True)]:
    ds = tf.data.Dataset.range(n).batch(a).rebatch(b, drop_remainder=drop)
    add(f"rebatch_{n}_{a}_{b}_{drop}", "rebatch", {"n": n, "batch": a, "size": b, "drop_remainder": drop},
        list(range(n)), [x.tolist() for x in ds.as_numpy_iterator()])

# --- rebatch with a list of sizes, cycled through
for n, a, sizes, drop in [(10, 3, [2, 3], False), (10, 3, [2, 3], True), (11, 4, [1, 4, 2], False), (6, 6, [4, 1], False)]:
    ds = tf.data.Dataset.range(n).batch(a).rebatch(sizes, drop_remainder=drop)
    add(f"rebatch_sizes_{n}_{a}_{'_'.join(map(str, sizes))}_{drop}", "rebatch_sizes",
        {"n": n, "batch": a, "sizes": sizes, "drop_remainder": drop},
        list(range(n)), [x.tolist() for x in ds.as_numpy_iterator()])

# --- window(size, shift, stride, drop_remainder) over range(n)
for n, size, shift, stride, drop in [(7, 3, 2, 1, False), (7, 3, 2, 1, True), (10, 2, 3, 2, False),
                                      (10, 3, 1, 3, False), (5, 4, 4, 1, False), (6, 2, 5, 1, False),
                                      (3, 5, 1, 1, False), (3, 5, 1, 1, True), (8, 3, 3, 2, True)]:
    ds = tf.data.Dataset.range(n).window(size, shift, stride, drop).flat_map(lambda w: w.batch(1000))
    add(f"window_{n}_{size}_{shift}_{stride}_{drop}", "window",
        {"size": size, "shift": shift, "stride": stride, "drop_remainder": drop},
        list(range(n)), [x.tolist() for x in ds.as_numpy_iterator()])


# --- padded_batch: var-length int64, fixed sequence float32 [None, 2], bytes, var sequence int64 [None, None]
def padded_case(name, layout, dtype, seqs, size, width, pad, drop, inner=()):
    if layout == "var_sequence":
        ds = tf.data.Dataset.from_generator(lambda: (np.array(s, dtype=np.int64) for s in seqs),
                                            output_signature=tf.TensorSpec([None, None], dtype))
    else:
        ds = ragged_ds(seqs, dtype, inner)
    shapes = [width] + list(inner) if width is not None else [None] + list(inner)
    if layout == "var_sequence":
        shapes = [width, None]
    pad_value = tf.constant(pad, dtype)
    out = []
    for b in ds.padded_batch(size, padded_shapes=shapes, padding_values=pad_value, drop_remainder=drop):
        values, shape = to_list(b)
        out.append({"values": values, "shape": shape})
    add(name, "padded_batch", {"layout": layout, "dtype": dtype.name, "size": size, "width": width,
                               "pad": pad.decode("latin-1") if isinstance(pad, bytes) else pad,
                               "drop_remainder": drop, "inner": list(inner)},
        [np.array(s).reshape(-1).tolist() if layout != "bytes" else [x.decode("latin-1") for x in s] for s in seqs]
        if layout != "var_sequence" else seqs, out)


padded_case("padded_var_int64", "var", tf.int64, [[1, 2], [3], [], [4, 5, 6], [7]], 2, None, -1, False)
padded_case("padded_var_int64_fixed_drop", "var", tf.int64, [[1, 2], [3], [], [4, 5, 6], [7]], 2, 4, 9, True)
padded_case("padded_fixed_seq_float32", "fixed_sequence", tf.float32, [[[1, 2], [3, 4]], [[5, 6]], [[7, 8], [9, 10], [11, 12]]], 3, None, 0.5, False, inner=(2,))
padded_case("padded_bytes", "bytes", tf.string, [[b"a", b"bc"], [b"d"], []], 3, None, b"?", False)
padded_case("padded_var_sequence", "var_sequence", tf.int64, [[[1, 2], [3, 4], [5, 6]], [[7]], [[8, 9, 10]]], 2, None, 0, False)


# --- bucket_by_sequence_length over {"t": var-length int64, "id": scalar}
# length "steps": the length of t; "even": the count of even values in t (a
# user's element_length_func).
LENGTH_FNS = {
    "steps": lambda x: tf.shape(x["t"])[0],
    "even": lambda x: tf.reduce_sum(tf.cast(x["t"] % 2 == 0, tf.int32)),
}


def bucket_case(name, lengths, boundaries, sizes, to_boundary, drop, length="steps"):
    def gen():
        for i, n in enumerate(lengths):
            yield {"t": np.arange(1, n + 1, dtype=np.int64) + 1000 * i, "id": np.int64(i)}
    ds = tf.data.Dataset.from_generator(gen, output_signature={"t": tf.TensorSpec([None], tf.int64), "id": tf.TensorSpec([], tf.int64)})
    ds = ds.bucket_by_sequence_length(LENGTH_FNS[length], boundaries, sizes,
                                      pad_to_bucket_boundary=to_boundary, drop_remainder=drop)
    out = []
    for b in ds:
        values, shape = to_list(b["t"])
        out.append({"ids": b["id"].numpy().tolist(), "values": values, "shape": shape})
    params = {"boundaries": boundaries, "batch_sizes": sizes,
              "pad_to_bucket_boundary": to_boundary, "drop_remainder": drop}
    if length != "steps":
        params["length"] = length
    add(name, "bucket_by_sequence_length", params, lengths, out)


# --- bucket_by_sequence_length over a two-level column {"t": [steps, values]}:
# with pad_to_bucket_boundary, tf.data pads every unknown dimension to the
# boundary, the steps' values too.
def bucket_two_level_case(name, seqs, boundaries, sizes, to_boundary):
    def gen():
        for i, steps in enumerate(seqs):
            width = max([len(s) for s in steps], default=0)
            dense = np.zeros((len(steps), width), dtype=np.int64)  # rectangular for TF
            for j, s in enumerate(steps):
                dense[j, :len(s)] = s
            yield {"t": dense, "id": np.int64(i)}
    ds = tf.data.Dataset.from_generator(gen, output_signature={"t": tf.TensorSpec([None, None], tf.int64), "id": tf.TensorSpec([], tf.int64)})
    ds = ds.bucket_by_sequence_length(lambda x: tf.shape(x["t"])[0], boundaries, sizes,
                                      pad_to_bucket_boundary=to_boundary)
    out = []
    for b in ds:
        values, shape = to_list(b["t"])
        out.append({"ids": b["id"].numpy().tolist(), "values": values, "shape": shape})
    add(name, "bucket_two_level", {"boundaries": boundaries, "batch_sizes": sizes,
                                   "pad_to_bucket_boundary": to_boundary}, seqs, out)


lengths = [1, 5, 2, 9, 6, 0, 3, 12, 4, 4, 1, 7, 8, 2]
bucket_case("bucket_basic", lengths, [3, 7], [2, 3, 2], False, False)
bucket_case("bucket_drop", lengths, [3, 7], [2, 3, 2], False, True)
bucket_case("bucket_to_boundary", lengths, [3, 7, 13], [2, 2, 3, 1], True, False)
bucket_case("bucket_remainders_order", [8, 1, 4, 9, 2], [3, 6], [4, 4, 4], False, False)
bucket_case("bucket_length_fn_even", lengths, [2, 4], [2, 2, 3], False, False, length="even")
# Steps of equal length within a row (TF's elements are rectangular), values 1.. so no pad is ambiguous.
two_level = [[[1, 2], [3, 4]], [[5]], [[6, 7, 8], [9, 10, 11], [12, 13, 14]], [], [[15, 16]], [[17], [18]]]
bucket_two_level_case("bucket_two_level_to_boundary", two_level, [3, 5], [2, 2, 2], True)
bucket_two_level_case("bucket_two_level_longest", two_level, [3, 5], [2, 2, 2], False)

path = os.path.join("testdata", "tf-semantics", "sequences.json")
with open(path, "w") as f:
    json.dump({"tensorflow": tf.__version__, "cases": cases}, f, indent=1)
    f.write("\n")
print(f"wrote {len(cases)} cases to {path}")
