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
# on a machine with cargo, carry gpu-bundle/ along (it is git-ignored: the
# device tool's `carry: ["gpu-bundle"]`), and run this script unchanged there.
# The bundle is the stripped binary and the two test executables, gzipped
# (about 15 MB each: candle's kernels make each about 60 MB unpacked), so
# that it fits the device tool's 64 MiB with the source tree.
#
# At run time the binaries need the driver's libcuda.so.1 and the cuBLAS,
# cuRAND and NVRTC libraries (candle links them dynamically): without them
# the loader refuses to start tfpipe; with them but without a GPU, the CUDA
# commands fail with tfpipe's message and the CUDA unit tests skip.
#
# Environment: OUT (the reports, at most 6 small files; default
# target-cuda/gpu-check), WORK (scratch: converted data, the demo's output;
# default a new temporary directory: never inside the tree), STEPS (train benchmark steps, default
# 500), DEVICE (default cuda), STEP_TIMEOUT (seconds per command, default 240).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-run}"
case "$mode" in
run | --bundle) ;;
*)
    echo "usage: scripts/gpu-check.sh [--bundle]" >&2
    exit 2
    ;;
esac
out="${OUT:-target-cuda/gpu-check}"
steps="${STEPS:-500}"
device="${DEVICE:-cuda}"
limit="${STEP_TIMEOUT:-240}"
bundle=gpu-bundle
# Scratch: converted data, the demo's output, the unpacked bundle.
work="${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/tfpipe-gpu-check.XXXXXX")}"
mkdir -p "$work"

# The executable of one test target (cargo's JSON messages name it).
test_executable() {
    cargo test --release --features cuda "$@" --no-run --message-format=json |
        grep '"profile":{[^}]*"test":true' |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1
}

if command -v cargo >/dev/null 2>&1; then
    # shellcheck source=scripts/cuda-env.sh
    . scripts/cuda-env.sh
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target-cuda}"
    t0=$(date +%s)
    cargo build --release --features cuda --bin tfpipe
    # The library's unit tests (its CUDA tests skip themselves without a
    # GPU) and tests/train.rs (its CUDA test is #[ignore]d: run by name).
    lib_test=$(test_executable --lib)
    train_test=$(test_executable --test train)
    echo "gpu-check: built in $(($(date +%s) - t0)) s" >&2
    bin="$CARGO_TARGET_DIR/release/tfpipe"
    if [ "$mode" = "--bundle" ]; then
        rm -rf "$bundle"
        mkdir -p "$bundle"
        for pair in "$bin:tfpipe" "$lib_test:tfpipe-lib-tests" "$train_test:tfpipe-train-tests"; do
            strip -o "$bundle/${pair##*:}" "${pair%%:*}"
            gzip -6 "$bundle/${pair##*:}"
        done
        # Which source the bundle was built from (printed where it runs).
        { git rev-parse HEAD && git status --short; } >"$bundle/SOURCE" 2>/dev/null || true
        du -sh "$bundle"/*
        echo "gpu-check: bundle ready in $bundle/ (carry it to the GPU machine)" >&2
        exit 0
    fi
else
    if [ "$mode" = "--bundle" ]; then
        echo "gpu-check: --bundle needs cargo" >&2
        exit 2
    fi
    for name in tfpipe tfpipe-lib-tests tfpipe-train-tests; do
        if [ ! -f "$bundle/$name.gz" ]; then
            echo "gpu-check: no cargo here and no $bundle/$name.gz: run scripts/gpu-check.sh --bundle where cargo is, and carry $bundle/" >&2
            exit 2
        fi
        mkdir -p "$work/bin"
        gzip -dc "$bundle/$name.gz" >"$work/bin/$name"
        chmod +x "$work/bin/$name"
    done
    bin="$work/bin/tfpipe"
    lib_test="$work/bin/tfpipe-lib-tests"
    train_test="$work/bin/tfpipe-train-tests"
    echo "gpu-check: running the bundle built from $(head -1 "$bundle/SOURCE" 2>/dev/null || echo '(unknown source)')"
    # cuBLAS, cuRAND and NVRTC: a system toolkit's, or Python's NVIDIA
    # wheels' (nvidia/cu13/lib); the driver's libcuda where ldconfig may not look.
    libs=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 \
        $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in sorted(os.listdir(p))))' 2>/dev/null || true); do
        [ -d "$d" ] && libs="$libs${libs:+:}$d"
    done
    export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

mkdir -p "$out"
echo "== device"
{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
        echo "(no nvidia-smi)"
    echo "cores $(nproc); $(uptime)"
} | tee "$out/device.txt"
for b in "$bin" "$lib_test" "$train_test"; do
    missing=$(ldd "$b" | awk '/not found/{print $1}')
    if [ -n "$missing" ]; then
        echo "gpu-check: $b cannot find: $missing (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)" >&2
        exit 2
    fi
done
ldd "$bin" | grep -E 'libcuda|cublas|curand|cudart|nvrtc' | tee -a "$out/device.txt"

status=0
echo "== CUDA tests"
# Both run; either failing fails the check.
{
    rc=0
    timeout "$limit" "$lib_test" --test-threads 1 cuda || rc=1
    timeout "$limit" "$train_test" --ignored --exact trains_on_cuda || rc=1
    exit $rc
} 2>&1 | tee "$out/cuda-tests.txt" || status=1

echo "== demo --device $device"
timeout "$limit" "$bin" demo --device "$device" --epochs 2 --testdata testdata/mnist --out "$work/demo" 2>&1 |
    tee "$out/demo.txt" || status=1

echo "== train benchmark (bench-train: MLP 784-256-10 and the CNN, $steps steps): cpu, then $device"
data="$work/data"
if [ ! -e "$data/mnist.features.json" ]; then
    rm -rf "$data"
    "$bin" convert idx testdata/mnist/train-images-idx3-ubyte.gz -o "$data/mnist" --shards 4 >/dev/null
fi
: >"$out/bench-train.jsonl"
for model in mlp cnn; do
    for dev in cpu "$device"; do
        timeout "$limit" "$bin" bench-train "$data"/mnist-*.tfrecord --model "$model" --epochs 1000 \
            --steps "$steps" --device "$dev" | tee -a "$out/bench-train.jsonl" || status=1
    done
done
echo "== tfpipe train --device $device (the report's start-up breakdown and phases)"
timeout "$limit" "$bin" train --schema "$data/mnist.features.json" --data "$data"/mnist-*.tfrecord \
    --steps "$steps" --device "$device" --report-json "$out/train-$device.json" 2>&1 |
    tee "$out/train-$device.txt" || status=1
echo "gpu-check: reports in $out, scratch in $work (status $status)"
exit $status
