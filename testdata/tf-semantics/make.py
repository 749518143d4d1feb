"""Writes expected.json: TensorFlow 2.21's own answers for the cases in
tests/decode/tf_semantics.rs (run: /work/tfvenv/bin/python testdata/tf-semantics/make.py).

Each case: `records` (base64 serialized protos), `specs` (tfpipe's text specs for the
same features), and `tf`: {"ok": {feature: column}} or {"error": message}, where a
column is {"values", "row_splits", "inner_shape"} in tfpipe's batch layout (float
values as hex bit patterns so NaN and -0.0 compare exactly), or for padded dense
TF output {"padded": values, "shape": [...]}.
"""
import base64, json, re, sys
import numpy as np
import tensorflow as tf

def ex(**f):
    e = tf.train.Example()
    for k, v in f.items():
        e.features.feature[k].CopyFrom(v)
    return e.SerializeToString()

I = lambda *v: tf.train.Feature(int64_list=tf.train.Int64List(value=list(v)))
F = lambda *v: tf.train.Feature(float_list=tf.train.FloatList(value=list(v)))
B = lambda *v: tf.train.Feature(bytes_list=tf.train.BytesList(value=list(v)))
NOKIND = tf.train.Feature()

def enc(a):
    a = np.asarray(a)
    if a.dtype == np.float32:
        return ["%08x" % x for x in a.reshape(-1).view(np.uint32).tolist()]
    if a.dtype == np.float64:
        return ["%016x" % x for x in a.reshape(-1).view(np.uint64).tolist()]
    if a.dtype == object:
        return [base64.b64encode(x).decode() for x in a.reshape(-1).tolist()]
    return [int(x) for x in a.reshape(-1).tolist()]

def column(t):
    if isinstance(t, tf.SparseTensor):
        return {"sparse_indices": t.indices.numpy().tolist(), "values": enc(t.values.numpy()),
                "dense_shape": t.dense_shape.numpy().tolist()}
    if isinstance(t, tf.RaggedTensor):
        splits = [s.numpy().tolist() for s in t.nested_row_splits]
        flat = t.flat_values.numpy()
        return {"values": enc(flat), "row_splits": splits, "inner_shape": list(flat.shape[1:])}
    a = t.numpy()
    return {"values": enc(a), "row_splits": [], "inner_shape": list(a.shape[1:])}

cases = []
def case(name, records, specs, tf_spec, post=None, padded=False, note=None, sequence=False):
    entry = {"name": name, "records": [base64.b64encode(r).decode() for r in records], "specs": specs}
    if note:
        entry["note"] = note
    try:
        if sequence:
            ctx, seq = tf_spec
            out, _, _ = tf.io.parse_sequence_example(tf.constant(records, tf.string), ctx, seq)
        else:
            out = tf.io.parse_example(tf.constant(records, tf.string), tf_spec)
        if post:
            out = post(out)
        cols = {}
        for k, v in out.items():
            if padded:
                a = v.numpy()
                cols[k] = {"padded": enc(a), "shape": list(a.shape)}
            else:
                cols[k] = column(v)
        entry["tf"] = {"ok": cols}
    except Exception as e:  # TF's error, first line
        message = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", str(e)).strip().split("\n")[0]
        entry["tf"] = {"error": "%s: %s" % (type(e).__name__, message[:300])}
    cases.append(entry)

# --- Deliberate differences (tests/decode/tf_semantics.rs checks ours, and that TF differs)
seq = tf.train.SequenceExample()
seq.context.feature["c"].CopyFrom(NOKIND)
case("sequence_context_kindless_feature", [seq.SerializeToString()], ["c:int64=7", "t:int64:seq:var"],
     ({"c": tf.io.FixedLenFeature([], tf.int64, default_value=7)}, {"t": tf.io.VarLenFeature(tf.int64)}), sequence=True)
case("sequence_empty_batch", [], ["c:int64", "t:int64:seq:var"],
     ({"c": tf.io.FixedLenFeature([], tf.int64)}, {"t": tf.io.VarLenFeature(tf.int64)}), sequence=True)
case("example_kindless_feature_takes_default", [ex(c=NOKIND)], ["c:int64=7"], {"c": tf.io.FixedLenFeature([], tf.int64, default_value=7)})
DEC = "1.00000005960464477560746544742179795794254798"
case("float_default_long_decimal", [ex()], ["x:float32=" + DEC],
     {"x": tf.io.FixedLenFeature([], tf.float32, default_value=float(DEC))})
# Hand-made wire bytes: Example{features{feature{"x": int64_list{value: <10-byte varint, bits past 64>}}}}
def wrap_feature(feature_bytes, key=b"x"):
    entry = b"\x0a" + bytes([len(key)]) + key + b"\x12" + bytes([len(feature_bytes)]) + feature_bytes
    feats = b"\x0a" + bytes([len(entry)]) + entry
    return b"\x0a" + bytes([len(feats)]) + feats
overlong = b"\xff" * 9 + b"\x7f"
int_list = b"\x08" + overlong                  # Int64List field 1, varint (unpacked)
case("overlong_varint", [wrap_feature(b"\x1a" + bytes([len(int_list)]) + int_list)], ["x:int64:var"],
     {"x": tf.io.VarLenFeature(tf.int64)}, post=lambda o: {"x": tf.RaggedTensor.from_sparse(o["x"])})
float_list = b"\x0a\x05" + b"\x00\x00\x80\x3f\x00"   # packed, 5 bytes
case("packed_float_not_multiple_of_4", [wrap_feature(b"\x12" + bytes([len(float_list)]) + float_list)], ["x:float32:var"],
     {"x": tf.io.VarLenFeature(tf.float32)}, post=lambda o: {"x": tf.RaggedTensor.from_sparse(o["x"])})
case("example_field_1_varint", [b"\x08\x01"], ["x:int64:var"],
     {"x": tf.io.VarLenFeature(tf.int64)}, post=lambda o: {"x": tf.RaggedTensor.from_sparse(o["x"])})
case("zero_size_default_empty_list", [ex()], None, {"x": tf.io.FixedLenFeature([0], tf.float32, default_value=[])},
     note="tfpipe: schema JSON {\"name\": \"x\", \"dtype\": \"float32\", \"shape\": [0], \"default\": []} fills nothing")

# --- Agreement: tfpipe must give TF's answer
case("zero_size_present_empty", [ex(x=F(), y=I()), ex(x=F(), y=I())], ["x:float32:0", "y:int64:2x0"],
     {"x": tf.io.FixedLenFeature([0], tf.float32), "y": tf.io.FixedLenFeature([2, 0], tf.int64)})
case("zero_size_missing_no_default", [ex()], ["x:float32:0"], {"x": tf.io.FixedLenFeature([0], tf.float32)})
case("zero_size_one_value", [ex(x=F(1.0))], ["x:float32:0"], {"x": tf.io.FixedLenFeature([0], tf.float32)})

flsf = lambda shape, dt=tf.float32: tf.io.FixedLenSequenceFeature(shape, dt, allow_missing=True)
case("var_fixed_pairs", [ex(), ex(x=F(1, 2, 3, 4)), ex(x=F()), ex(x=NOKIND)], ["x:float32:var:2"], {"x": flsf([2])}, padded=True)
case("var_fixed_2x3", [ex(x=I(*range(12))), ex(x=I(*range(6)))], ["x:int64:var:2x3"], {"x": flsf([2, 3], tf.int64)}, padded=True)
case("var_fixed_not_multiple", [ex(x=F(1, 2, 3))], ["x:float32:var:2"], {"x": flsf([2])}, padded=True)
case("var_fixed_wrong_kind", [ex(x=I(1, 2))], ["x:float32:var:2"], {"x": flsf([2])}, padded=True)
case("var_fixed_bytes", [ex(x=B(b"a", b"b")), ex()], ["x:bytes:var:1"], {"x": flsf([1], tf.string)}, padded=True)

RS, RL, U = tf.io.RaggedFeature.RowSplits, tf.io.RaggedFeature.RowLengths, tf.io.RaggedFeature.UniformRowLength
def rag(*parts, dt=tf.int64):
    return {"v": tf.io.RaggedFeature(dt, value_key="v", partitions=list(parts), row_splits_dtype=tf.int64, validate=True)}
case("ragged_plain", [ex(v=I(1, 2, 3)), ex(), ex(v=NOKIND)], ["v:int64:ragged"], rag())
case("ragged_row_lengths", [ex(v=I(1, 2, 3), l=I(2, 0, 1)), ex(v=I(4), l=I(1)), ex()], ["v:int64:ragged:row_lengths(l)"], rag(RL("l")))
case("ragged_row_splits", [ex(v=I(1, 2, 3), s=I(0, 1, 3)), ex(v=I(), s=I(0)), ex(s=I())], ["v:int64:ragged:row_splits(s)"], rag(RS("s")))
case("ragged_uniform_inner", [ex(v=I(1, 2, 3, 4)), ex(v=I())], ["v:int64:ragged:uniform_row_length(2)"], rag(U(2)))
case("ragged_lengths_then_uniform", [ex(v=I(1, 2, 3, 4, 5, 6), l=I(2, 1))], ["v:int64:ragged:row_lengths(l):uniform_row_length(2)"], rag(RL("l"), U(2)))
case("ragged_three_levels", [ex(v=I(1, 2, 3, 4, 5, 6), l=I(1, 2), s=I(0, 1, 2, 3))],
     ["v:int64:ragged:row_lengths(l):row_splits(s):uniform_row_length(2)"], rag(RL("l"), RS("s"), U(2)))
case("ragged_uniform_outer", [ex(v=I(1, 2, 3, 4, 5, 6), l=I(1, 2, 0, 3))], ["v:int64:ragged:uniform_row_length(2):row_lengths(l)"], rag(U(2), RL("l")))
case("ragged_bytes", [ex(v=B(b"a", b"b"), l=I(1, 1))], ["v:bytes:ragged:row_lengths(l)"], rag(RL("l"), dt=tf.string))
case("ragged_float", [ex(v=F(0.5, -0.0, float("nan")), l=I(3))], ["v:float32:ragged:row_lengths(l)"], rag(RL("l"), dt=tf.float32))
case("ragged_lengths_bad_sum", [ex(v=I(1, 2, 3), l=I(2))], ["v:int64:ragged:row_lengths(l)"], rag(RL("l")))
case("ragged_lengths_missing", [ex(v=I(1, 2, 3))], ["v:int64:ragged:row_lengths(l)"], rag(RL("l")))
case("ragged_splits_bad_start", [ex(v=I(1, 2), s=I(1, 2))], ["v:int64:ragged:row_splits(s)"], rag(RS("s")))
case("ragged_splits_decreasing", [ex(v=I(1, 2), s=I(0, 2, 1, 2))], ["v:int64:ragged:row_splits(s)"], rag(RS("s")))
case("ragged_uniform_not_multiple", [ex(v=I(1, 2, 3))], ["v:int64:ragged:uniform_row_length(2)"], rag(U(2)))
case("ragged_wrong_kind", [ex(v=F(1.0))], ["v:int64:ragged"], rag())
case("ragged_partition_wrong_kind", [ex(v=I(1), l=F(1.0))], ["v:int64:ragged:row_lengths(l)"], rag(RL("l")))
case("ragged_empty_batch", [], ["v:int64:ragged:row_lengths(l)"], rag(RL("l")))
case("ragged_validate_false_bad_sum", [ex(v=I(1, 2, 3), l=I(2))], ["v:int64:ragged:row_lengths(l)"],
     {"v": tf.io.RaggedFeature(tf.int64, value_key="v", partitions=[RL("l")], row_splits_dtype=tf.int64)},
     note="TF's default validate=False: values past the lengths are dropped silently")

def sp(keys, size, dt=tf.int64):
    return {"v": tf.io.SparseFeature(index_key=keys, value_key="v", dtype=dt, size=size)}
case("sparse_1d_unsorted", [ex(v=I(10, 20, 30), i=I(5, 1, 3)), ex(), ex(v=NOKIND, i=NOKIND)], ["v:int64:sparse(i):8"], sp("i", 8))
case("sparse_2d", [ex(v=I(10, 20, 30), i=I(1, 0, 1), j=I(2, 3, 0)), ex(v=I(1), i=I(0), j=I(0))], ["v:int64:sparse(i,j):2x4"], sp(["i", "j"], [2, 4]))
case("sparse_bytes", [ex(v=B(b"b", b"", b"a"), i=I(2, 0, 1))], ["v:bytes:sparse(i):3"], sp("i", 3, tf.string))
case("sparse_float", [ex(v=F(0.5, -0.0), i=I(1, 0))], ["v:float32:sparse(i):2"], sp("i", 2, tf.float32))
case("sparse_empty_batch", [], ["v:int64:sparse(i,j):2x4"], sp(["i", "j"], [2, 4]))
case("sparse_size_0_empty", [ex()], ["v:int64:sparse(i):0"], sp("i", 0))
case("sparse_count_mismatch", [ex(v=I(10, 20), i=I(1))], ["v:int64:sparse(i):8"], sp("i", 8))
case("sparse_index_missing", [ex(v=I(10, 20))], ["v:int64:sparse(i):8"], sp("i", 8))
case("sparse_values_missing", [ex(i=I(1))], ["v:int64:sparse(i):8"], sp("i", 8))
case("sparse_index_wrong_kind", [ex(v=I(1), i=F(1.0))], ["v:int64:sparse(i):8"], sp("i", 8))
case("sparse_index_out_of_range", [ex(v=I(10), i=I(8))], ["v:int64:sparse(i):8"], sp("i", 8))
case("sparse_index_negative", [ex(v=I(10), i=I(-1))], ["v:int64:sparse(i):8"], sp("i", 8))
case("sparse_index_twice", [ex(v=I(10, 20), i=I(1, 1))], ["v:int64:sparse(i):8"], sp("i", 8))

rng = np.random.default_rng(7)
for name, dtype, shape in [("raw_float32", tf.float32, [2, 3]), ("raw_int16", tf.int16, [4]), ("raw_uint16", tf.uint16, [3]),
                           ("raw_int32", tf.int32, [2]), ("raw_float64", tf.float64, [2])]:
    width = np.dtype(dtype.as_numpy_dtype).itemsize
    n = int(np.prod(shape))
    blobs = [rng.integers(0, 256, n * width, dtype=np.uint8).tobytes() for _ in range(3)]
    if dtype == tf.float32:
        blobs[0] = np.array([np.nan, -0.0, np.inf, 1e-45, 3.4e38, -1.5], np.float32).tobytes()
    spec_shape = "x".join(map(str, shape))
    def post(o, dtype=dtype, shape=shape):
        return {"x": tf.reshape(tf.io.decode_raw(o["x"], dtype), [-1] + shape)}
    case(name, [ex(x=B(b)) for b in blobs], ["x:%s:%s" % (name, spec_shape)], {"x": tf.io.FixedLenFeature([], tf.string)}, post=post)
    case(name + "_wrong_size", [ex(x=B(blobs[0][:-1]))], ["x:%s:%s" % (name, spec_shape)], {"x": tf.io.FixedLenFeature([], tf.string)}, post=post)

json.dump({"tensorflow": tf.__version__, "cases": cases}, open(sys.argv[1] if len(sys.argv) > 1 else "testdata/tf-semantics/expected.json", "w"), indent=1)
print(len(cases), "cases")
