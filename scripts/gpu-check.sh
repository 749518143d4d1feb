#!/usr/bin/env bash
# The GPU check: builds tfpipe with the `cuda` feature, runs the CUDA tests,
# the demo on --device cuda, and the training benchmark on the CPU and on
# CUDA, and prints the numbers (also written under $OUT).
#
#   scripts/gpu-check.sh            # build (where cargo is) and run
#   scripts/gpu-check.sh --bundle   # build here, copy the binaries to gpu-bundle/, stop
#
# Where cargo is, it sources scripts/cuda-env.sh (which finds nvcc, or
# installs NVIDIA's CUDA 13.0 wheels from PyPI into a venv) and builds into
# target-cuda/. Where cargo is missing (the lent H200 machines have nvcc, a
# driver and Python's CUDA libraries, but no Rust toolchain and no network),
# it runs the binaries that `--bundle` left in gpu-bundle/: build the bundle
# on a machine with cargo, carry gpu-bundle/ along, and run this script
# unchanged there.
#
# Environment: OUT (where the reports go; default target-cuda/gpu-check),
# STEPS (train benchmark steps, default 1000), DEVICE (default cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"
out="${OUT:-target-cuda/gpu-check}"
mkdir -p "$out"
steps="${STEPS:-1000}"
device="${DEVICE:-cuda}"
bundle=gpu-bundle

if command -v cargo >/dev/null 2>&1; then
    # shellcheck source=scripts/cuda-env.sh
    . scripts/cuda-env.sh
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-cuda}"
    t0=$(date +%s)
    cargo build --release --features cuda --bin tfpipe
    # The library's unit tests (its CUDA tests skip themselves without a GPU).
    lib_test=$(cargo test --release --features cuda --lib --no-run --message-format=json |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
    echo "gpu-check: built in $(($(date +%s) - t0)) s" >&2
    bin="$CARGO_TARGET_DIR/release/tfpipe"
    if [ "$mode" = "--bundle" ]; then
        mkdir -p "$bundle"
        cp "$bin" "$bundle/tfpipe"
        cp "$lib_test" "$bundle/tfpipe-lib-tests"
        strip "$bundle/tfpipe" "$bundle/tfpipe-lib-tests" 2>/dev/null || true
        du -sh "$bundle"/*
        echo "gpu-check: bundle ready in $bundle/ (carry it to the GPU machine)" >&2
        exit 0
    fi
else
    bin="$bundle/tfpipe"
    lib_test="$bundle/tfpipe-lib-tests"
    if [ ! -x "$bin" ]; then
        echo "gpu-check: no cargo here and no $bin: run scripts/gpu-check.sh --bundle where cargo is, and carry $bundle/" >&2
        exit 2
    fi
    # cuBLAS, cuRAND and NVRTC: a system toolkit's, or Python's NVIDIA wheels'.
    libs=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in os.listdir(p)))' 2>/dev/null || true); do
        [ -d "$d" ] && libs="$libs${libs:+:}$d"
    done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

echo "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$out/nvidia-smi.txt" ||
    echo "(no nvidia-smi)"
nproc
missing=$(ldd "$bin" | awk '/not found/{print $1}')
if [ -n "$missing" ]; then
    echo "gpu-check: $bin cannot find: $missing" >&2
    exit 2
fi

status=0
echo "== CUDA tests"
"$lib_test" --test-threads 1 cuda 2>&1 | tee "$out/cuda-tests.txt" || status=1

echo "== demo --device $device"
"$bin" demo --device "$device" --epochs 2 --testdata testdata/mnist --out "$out/demo" 2>&1 |
    tee "$out/demo.txt" || status=1

echo "== train benchmark (bench-train: MLP 784-256-10 and the CNN, $steps steps): cpu, then $device"
data="$out/data"
if [ ! -e "$data/mnist.features.json" ]; then
    rm -rf "$data"
    "$bin" convert idx testdata/mnist/train-images-idx3-ubyte.gz -o "$data/mnist" --shards 4 >/dev/null
fi
for model in mlp cnn; do
    for dev in cpu "$device"; do
        "$bin" bench-train "$data"/mnist-*.tfrecord --model "$model" --epochs 1000 --steps "$steps" \
            --device "$dev" | tee "$out/bench-train-$model-$dev.json" || status=1
    done
done
echo "== tfpipe train --device $device (the report's start-up breakdown and phases)"
"$bin" train --schema "$data/mnist.features.json" --data "$data"/mnist-*.tfrecord \
    --steps "$steps" --device "$device" --report-json "$out/train-$device.json" 2>&1 |
    tee "$out/train-$device.txt" || status=1
echo "gpu-check: reports in $out (status $status)"
exit $status
