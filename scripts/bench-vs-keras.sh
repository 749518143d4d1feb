#!/usr/bin/env bash
# Side by side, in the same minute: `tfpipe bench-train` and Keras fit() on the
# same TFRecord files (image_raw: 784 bytes, label: int64), each run REPEAT
# times, alternating which goes first; prints each JSON line, the load, and
# the ratios (tfpipe / Keras) of whole-fit examples/s and median step time.
#
#   scripts/bench-vs-keras.sh 'DATA/mnist-*.tfrecord'                 # MLP 784-256-10, batch 256, 1 epoch
#   MODEL=cnn STEPS=300 scripts/bench-vs-keras.sh 'DATA/mnist-*.tfrecord'   # LeNet-like CNN, batch 64
#
# Environment: TFVENV (a venv with tensorflow-cpu==2.21.0; default
# /work/tfvenv), TFPIPE (default target/release/tfpipe), KERAS_FIT (default
# scripts/keras_fit.py, a copy of the shared folder's bench/keras_fit.py), REPEAT
# (default 2), MODEL (mlp or cnn), STEPS (cnn: steps per run, default 300),
# TFPIPE_ARGS (extra bench-train flags, e.g. --compute-threads 1).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,14p' "$0"; exit 2; }
py="${TFVENV:-/work/tfvenv}/bin/python"
tfpipe="${TFPIPE:-target/release/tfpipe}"
model="${MODEL:-mlp}"
repeat="${REPEAT:-2}"
keras="${KERAS_FIT:-scripts/keras_fit.py}"
# shellcheck disable=SC2206
files=($@)
if [ "$model" = cnn ]; then
    steps="${STEPS:-300}"
    tf_cmd=("$tfpipe" bench-train "${files[@]}" --model cnn --batch-size 64 --epochs 1000 --steps "$steps")
    k_cmd=("$py" scripts/keras_cnn.py "${files[@]}" --batch-size 64 --steps "$steps")
else
    tf_cmd=("$tfpipe" bench-train "${files[@]}" --batch-size 256 --epochs 1)
    k_cmd=("$py" "$keras" "${files[@]}" --batch-size 256 --epochs 1)
fi
# shellcheck disable=SC2206
tf_cmd+=(${TFPIPE_ARGS:-})
echo "tfpipe: ${tf_cmd[*]}"
echo "keras:  ${k_cmd[*]}"
results=$(mktemp)
for i in $(seq 1 "$repeat"); do
    order="tfpipe keras"
    [ $((i % 2)) -eq 0 ] && order="keras tfpipe"
    for side in $order; do
        echo "-- run $i $side, load $(cut -d' ' -f1-3 /proc/loadavg)"
        if [ "$side" = tfpipe ]; then
            line=$("${tf_cmd[@]}")
        else
            line=$(PYTHONUNBUFFERED=1 "${k_cmd[@]}" 2>/dev/null | tail -1)
        fi
        echo "$line"
        echo "$i $side $line" >>"$results"
    done
done
python3 - "$results" <<'PY'
import json, sys
runs = {}
for line in open(sys.argv[1]):
    i, side, js = line.split(" ", 2)
    runs.setdefault(i, {})[side] = json.loads(js)
for i, r in sorted(runs.items()):
    t, k = r["tfpipe"], r["keras"]
    print(f"run {i}: tfpipe {t['ex_per_s']:,.0f} ex/s vs keras {k['ex_per_s']:,.0f} ex/s = "
          f"{t['ex_per_s'] / k['ex_per_s']:.2f}x; median step {t['median_step_ms']:.2f} ms vs "
          f"{k['median_step_ms']:.2f} ms; tfpipe stall {t['stall_fraction']:.1%}, "
          f"{t['compute_threads']} compute threads")
PY
rm -f "$results"
