"""TF Serving warm-up files, both ways, with the `tensorflow-serving-api` package.

    python scripts/serve_warmup_interop.py write testdata/serve/tf_serving_warmup_requests
    python scripts/serve_warmup_interop.py read DIR/assets.extra/tf_serving_warmup_requests

`write` makes the file `tests/serve.rs` replays (the inputs of its test
models: `x` float32 [3], `img` uint8 [2] as raw bytes, `n` int64): one predict
log of two examples (tensors from `tf.make_tensor_proto`, so numbers travel in
`tensor_content`), one classify log of two `tf.train.Example`s, one regress
log of one example with a context. `read` parses a file `tfpipe serve
--write-warmup` wrote and prints what each record holds; it fails on a record
that is not a `PredictionLog`.

Needs tensorflow-cpu==2.21.0 and tensorflow-serving-api==2.21.0 (the venv of
docs/serve.md).
"""

import sys

import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    input_pb2,
    model_pb2,
    predict_pb2,
    prediction_log_pb2,
    regression_pb2,
)


def example(x, img, n=None):
    feature = {
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
        "img": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes(img)])),
    }
    if n is not None:
        feature["n"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[n]))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def write(path):
    spec = model_pb2.ModelSpec(name="penguins", signature_name="serving_default")
    predict = predict_pb2.PredictRequest(model_spec=spec)
    predict.inputs["x"].CopyFrom(
        tf.make_tensor_proto([[0.5, 1.0, 1.5], [2.0, 2.5, 3.0]], dtype=tf.float32)
    )
    predict.inputs["img"].CopyFrom(tf.make_tensor_proto([b"\x01\x02", b"\x03\x04"]))
    predict.inputs["n"].CopyFrom(tf.make_tensor_proto([4, 5], dtype=tf.int64))
    classify = classification_pb2.ClassificationRequest(
        model_spec=spec,
        input=input_pb2.Input(
            example_list=input_pb2.ExampleList(
                examples=[example([1, 2, 3], [9, 8], 1), example([4, 5, 6], [7, 6], 2)]
            )
        ),
    )
    regress = regression_pb2.RegressionRequest(
        model_spec=spec,
        input=input_pb2.Input(
            example_list_with_context=input_pb2.ExampleListWithContext(
                examples=[example([0.25, 0.5, 0.75], [1, 1])],
                context=tf.train.Example(
                    features=tf.train.Features(
                        feature={"n": tf.train.Feature(int64_list=tf.train.Int64List(value=[3]))}
                    )
                ),
            )
        ),
    )
    logs = [
        prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=predict)
        ),
        prediction_log_pb2.PredictionLog(
            classify_log=prediction_log_pb2.ClassifyLog(request=classify)
        ),
        prediction_log_pb2.PredictionLog(
            regress_log=prediction_log_pb2.RegressLog(request=regress)
        ),
    ]
    with tf.io.TFRecordWriter(path) as w:
        for log in logs:
            w.write(log.SerializeToString())
    print(f"wrote {len(logs)} PredictionLog records to {path}")


def read(path):
    count = 0
    for i, raw in enumerate(tf.data.TFRecordDataset(path).as_numpy_iterator()):
        log = prediction_log_pb2.PredictionLog.FromString(raw)
        kind = log.WhichOneof("log_type")
        if kind != "predict_log":
            raise SystemExit(f"record {i}: {kind}, expected predict_log")
        inputs = log.predict_log.request.inputs
        described = {
            name: (tf.dtypes.as_dtype(t.dtype).name, [d.size for d in t.tensor_shape.dim])
            for name, t in sorted(inputs.items())
        }
        if i < 2:
            print(f"record {i}: model {log.predict_log.request.model_spec.name!r}: {described}")
            for name, t in sorted(inputs.items()):
                print(f"  {name} = {tf.make_ndarray(t).tolist()!r}"[:160])
        count += 1
    print(f"{count} records, every one a PredictionLog with a predict request")


if __name__ == "__main__":
    {"write": write, "read": read}[sys.argv[1]](sys.argv[2])
