# shellcheck shell=bash
# Source this (bash) to build tfpipe's `cuda` feature, also on a machine
# without a CUDA install and without a GPU:
#
#   . scripts/cuda-env.sh
#   CARGO_TARGET_DIR=target-cuda cargo check --features cuda
#   CARGO_TARGET_DIR=target-cuda cargo build --release --features cuda
#
# It finds a CUDA toolkit (CUDA_HOME, nvcc on PATH, /usr/local/cuda), or
# else installs NVIDIA's CUDA 13.0 wheels from PyPI into a venv
# ($TFPIPE_CUDA_VENV, default /work/cuda-venv) and uses those; adds the
# unversioned `.so` links the linker wants (-lcublas -lcublasLt -lcurand
# -lnvrtc); and, when no GPU driver provides `libcuda`, builds a stub
# `libcuda.so` that is good for linking only (at run time the driver's
# `libcuda.so.1` is loaded instead: the stub is never on the run-time path).
#
# Why the 13.0 wheels, not the newest (13.5 at the time of writing): candle
# compiles its kernels to PTX at build time, and a driver JIT-compiles only
# PTX from a toolkit no newer than itself. The lent H200 machines run driver
# 580 (CUDA 13.0, with nvcc 13.0). cudarc 0.19 knows CUDA up to 13.4; with a
# newer toolkit set CUDARC_CUDA_VERSION=13040 (it is derived from nvcc here).
# TFPIPE_CUDA_WHEELS=13.4 installs the 13.4 wheels instead (check and link
# pass with them too; their PTX needs a 13.4 driver to run).
#
# Settings (environment): TFPIPE_CUDA_VENV, TFPIPE_CUDA_WHEELS (13.0 or
# 13.4), CUDA_COMPUTE_CAP (default 90: H100/H200), TFPIPE_CUDA_LINKS (where
# the links go; default target-cuda/cuda-links).

_tfpipe_cuda_wheels() {
    case "${TFPIPE_CUDA_WHEELS:-13.0}" in
    13.0) echo nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 \
        nvidia-cuda-crt==13.0.88 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14 \
        nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88 ;;
    13.4) echo "nvidia-cuda-nvcc==13.4.*" "nvidia-nvvm==13.4.*" "nvidia-cuda-runtime==13.4.*" \
        "nvidia-cuda-crt==13.4.*" "nvidia-cuda-cccl==13.4.*" "nvidia-cublas==13.4.*" \
        "nvidia-curand" "nvidia-cuda-nvrtc==13.4.*" ;;
    *) echo "cuda-env: TFPIPE_CUDA_WHEELS must be 13.0 or 13.4" >&2; return 1 ;;
    esac
}

_tfpipe_cuda_env() {
    local root="" venv="${TFPIPE_CUDA_VENV:-/work/cuda-venv}" d
    # 1. A toolkit: CUDA_HOME, nvcc on PATH, /usr/local/cuda, or the wheels.
    if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
        root="$CUDA_HOME"
    elif command -v nvcc >/dev/null 2>&1; then
        root="$(dirname "$(dirname "$(command -v nvcc)")")"
    elif [ -x /usr/local/cuda/bin/nvcc ]; then
        root=/usr/local/cuda
    else
        if ! ls "$venv"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc >/dev/null 2>&1; then
            echo "cuda-env: installing the CUDA wheels into $venv" >&2
            local list
            local -a wheels
            list="$(_tfpipe_cuda_wheels)" || return 1
            read -r -a wheels <<<"$list"
            if [ ! -x "$venv/bin/pip" ]; then
                python3 -m venv "$venv" || return 1
            fi
            "$venv/bin/pip" install -q "${wheels[@]}" || return 1
        fi
        for d in "$venv"/lib/python3*/site-packages/nvidia/cu13; do
            [ -x "$d/bin/nvcc" ] && root="$d"
        done
    fi
    if [ -z "$root" ]; then
        echo "cuda-env: no nvcc found (set CUDA_HOME, or TFPIPE_CUDA_VENV to a venv with the nvidia-cuda-* wheels)" >&2
        return 1
    fi
    export CUDA_ROOT="$root" CUDA_PATH="$root" CUDA_HOME="$root"
    export PATH="$root/bin:$PATH"
    export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
    local version major minor
    version="$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')"
    read -r major minor <<<"$version"
    local v=$((major * 1000 + minor * 10))
    # cudarc 0.19 knows CUDA up to 13.4.
    [ "$v" -gt 13040 ] && v=13040
    export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-$v}"
    # 2. Unversioned links for -lcublas -lcublasLt -lcurand -lnvrtc -lcudart.
    local links="${TFPIPE_CUDA_LINKS:-$PWD/target-cuda/cuda-links}" lib name f
    mkdir -p "$links"
    for lib in "$root/lib" "$root/lib64" "$root/targets/x86_64-linux/lib" "$root"/../*/lib; do
        [ -d "$lib" ] || continue
        for name in cublas cublasLt curand nvrtc cudart; do
            for f in "$lib/lib$name.so".*; do
                [ -e "$f" ] && [ ! -e "$links/lib$name.so" ] && ln -sf "$f" "$links/lib$name.so"
            done
        done
    done
    # 3. libcuda: the driver's when there is one, else a link-only stub.
    local driver
    driver="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF; exit}')"
    if [ -z "$driver" ]; then
        for f in /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/lib64/libcuda.so.1; do
            [ -e "$f" ] && driver="$f" && break
        done
    fi
    if [ -n "$driver" ]; then
        ln -sf "$driver" "$links/libcuda.so"
    elif [ ! -e "$links/libcuda.so" ] || [ ! -e "$links/cuda-stub.c" ]; then
        local sys=""
        for f in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.*/src/driver/sys/mod.rs; do
            [ -e "$f" ] && sys="$f"
        done
        if [ -z "$sys" ]; then
            echo "cuda-env: no libcuda and no cudarc source to make a stub from (run cargo fetch first)" >&2
            return 1
        fi
        # Every driver entry point cudarc declares, each returning
        # CUDA_ERROR_UNKNOWN (999): the stub links, and fails loudly if run.
        grep -oE 'pub unsafe fn cu[A-Za-z0-9_]+' "$sys" | sort -u |
            sed 's/pub unsafe fn \(.*\)/int \1(void) { return 999; }/' >"$links/cuda-stub.c"
        cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$links/libcuda.so" "$links/cuda-stub.c" || return 1
        echo "cuda-env: no GPU driver here: linking against a stub libcuda (the binary needs a real driver to run)" >&2
    fi
    export LIBRARY_PATH="$links${LIBRARY_PATH:+:$LIBRARY_PATH}"
    # At run time: the toolkit's libraries (the driver's libcuda comes from the system).
    export LD_LIBRARY_PATH="$root/lib:$root/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "cuda-env: $(nvcc --version | tail -1) at $root, compute cap $CUDA_COMPUTE_CAP, CUDARC_CUDA_VERSION=$CUDARC_CUDA_VERSION, links in $links" >&2
}
_tfpipe_cuda_env
