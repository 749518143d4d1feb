"""Writes testdata/tf-semantics/combine.json: TensorFlow's own outputs for the
combining operations that tests/pipeline/combine.rs checks tfpipe against
(`zip`, `concatenate`, `choose_from_datasets`, and stages after them).

Run: /work/venv-tf/bin/python scripts/tf_semantics_combine.py (TensorFlow 2.21).

Each case: `name` and `expected`, the elements in order, with tuples and
batches as JSON lists of integers. The Rust test builds the same pipeline
for each name from `from_vec` ranges.
"""
import json
import os

import numpy as np
import tensorflow as tf

R = lambda a, b: tf.data.Dataset.range(a, b)


def plain(x):
    if isinstance(x, tuple):
        return [plain(v) for v in x]
    a = np.asarray(x)
    return a.tolist()


cases = {
    "zip_equal": tf.data.Dataset.zip(R(0, 4), R(10, 14)),
    "zip_first_shorter": tf.data.Dataset.zip(R(0, 3), R(10, 15)),
    "zip_second_shorter": tf.data.Dataset.zip(R(0, 5), R(10, 12)),
    "zip_empty": tf.data.Dataset.zip(R(0, 0), R(10, 12)),
    "zip_nested": tf.data.Dataset.zip(tf.data.Dataset.zip(R(0, 5), R(10, 15)), R(20, 23)),
    "zip_then_batch": tf.data.Dataset.zip(R(0, 5), R(10, 15)).batch(2),
    "zip_three": tf.data.Dataset.zip(R(0, 4), R(10, 13), R(20, 25)),
    "zip_three_empty": tf.data.Dataset.zip(R(0, 4), R(10, 10), R(20, 25)),
    "concatenate": R(0, 3).concatenate(R(10, 12)),
    "concatenate_empty_first": R(0, 0).concatenate(R(0, 3)),
    "concatenate_empty_second": R(0, 3).concatenate(R(0, 0)),
    "concatenate_then_batch": R(0, 5).concatenate(R(10, 14)).batch(3),
    "concatenate_repeated_input": R(0, 2).repeat(2).concatenate(R(10, 12)),
    "concatenate_skip_take": R(0, 5).concatenate(R(10, 15)).skip(3).take(4),
    "concatenate_chain": R(0, 2).concatenate(R(10, 12)).concatenate(R(20, 21)),
    "zip_of_concatenate": tf.data.Dataset.zip(R(0, 3).concatenate(R(10, 12)), R(100, 110)),
    "choose_from": tf.data.Dataset.choose_from_datasets(
        [R(0, 3), R(10, 13)], tf.data.Dataset.from_tensor_slices(tf.constant([1, 0, 0, 1, 1, 0], tf.int64))),
    "choose_from_selector_shorter": tf.data.Dataset.choose_from_datasets(
        [R(0, 3), R(10, 13)], tf.data.Dataset.from_tensor_slices(tf.constant([1, 1], tf.int64))),
    "choose_from_exhausted_input_stops": tf.data.Dataset.choose_from_datasets(
        [R(0, 2), R(10, 13)], tf.data.Dataset.from_tensor_slices(tf.constant([0, 1, 0, 0, 1, 1], tf.int64))),
}

out = {
    "tensorflow": tf.__version__,
    "cases": [{"name": name, "expected": [plain(x) for x in ds.as_numpy_iterator()]}
              for name, ds in cases.items()],
}
path = os.path.join(os.path.dirname(__file__), "..", "testdata", "tf-semantics", "combine.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print("wrote", os.path.normpath(path), len(out["cases"]), "cases")
