#!/usr/bin/env python3
"""The way a Keras user serves a model: a small Python web app around model.predict.

Serves the MLP of a tfpipe checkpoint (mlp 784-H-10, weights read from its
model.safetensors, so both servers compute the same function) at the
endpoints `scripts/serve_bench.py` calls: GET /v2/health/ready and
POST /v1/models/NAME:predict with TF Serving's row format,
{"instances": [{"image_raw": {"b64": ...}}, ...]} (784 raw pixel bytes),
answering {"predictions": [{"class": c, "probabilities": [...]}]}.

Prints `ready <seconds since process start>` on stderr once it listens (after
building the model; no warm-up call, as a typical app does).

Needs TensorFlow: python3 -m venv VENV && VENV/bin/pip install tensorflow-cpu==2.21.0
Usage: VENV/bin/python scripts/keras_serve.py CHECKPOINT_DIR --port 8601
"""
import argparse
import base64
import json
import os
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

T0 = time.time()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import keras  # noqa: E402


def read_safetensors(path):
    """The tensors of a safetensors file (F32 only), by name."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=np.float32).reshape(t["shape"])
    return out


def build(checkpoint):
    w = read_safetensors(os.path.join(checkpoint, "model.safetensors"))
    hidden = w["fc0.weight"].shape[0]
    inputs = keras.Input(shape=(784,))
    h = keras.layers.Dense(hidden, activation="relu")(inputs)
    logits = keras.layers.Dense(w["fc1.weight"].shape[0])(h)
    model = keras.Model(inputs, keras.layers.Softmax()(logits))
    # candle stores Linear weights [out, in]; Keras kernels are [in, out].
    model.layers[1].set_weights([w["fc0.weight"].T, w["fc0.bias"]])
    model.layers[2].set_weights([w["fc1.weight"].T, w["fc1.bias"]])
    return model


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    model = None

    def log_message(self, *args):
        pass

    def reply(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v2/health/ready":
            self.reply(200, {"ready": True})
        else:
            self.reply(404, {"error": "not found"})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            rows = json.loads(body)["instances"]
            x = np.stack([
                np.frombuffer(base64.b64decode(r["image_raw"]["b64"]), dtype=np.uint8)
                for r in rows
            ]).astype(np.float32) / 255.0
        except (KeyError, ValueError, TypeError) as e:
            self.reply(400, {"error": str(e)})
            return
        probs = self.model.predict(x, verbose=0)
        self.reply(200, {"predictions": [
            {"class": int(p.argmax()), "probabilities": p.tolist()} for p in probs
        ]})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--port", type=int, default=8601)
    args = ap.parse_args()
    Handler.model = build(args.checkpoint)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"ready {time.time() - T0:.3f}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
