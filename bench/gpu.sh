#!/usr/bin/env bash
# llama-srb on a CUDA GPU, in one prepared run: build, the GPU-relevant tests, the benches.
#
#   bench/gpu.sh [OUT_DIR]        (default: $OUT; the tables and logs are written there)
#
# 1. Builds, once (skipped when built): llama-cpp-python with CUDA and RPC into
#    ~/.cache/llama-srb/wheels/llama-cpp-python-0.3.36-cuda and a venv of its own
#    (.venv-cuda), and llama.cpp's llama-server and llama-batched-bench with CUDA into
#    ~/.cache/llama-srb/llama-tools-0.3.36-cuda (`make install llama-tools GPU=cuda`; set
#    CUDA_ARCHITECTURES=90 to build for an H100/H200 on a machine without one). The builds
#    need the package registries (PyPI, npm) the first time; docs/benchmarks.md says how long.
# 2. Checks the model is offloaded, then runs the tests that drive the engine end to end on
#    the GPU build, on both bundled models: completions, every sampling path, constrained
#    output, the prefix cache.
# 3. The benches, each bounded by `timeout` so that one stuck part leaves the others' tables:
#    one request of n = 1..64 against llama-batched-bench (decode alone) and SillyTavern's
#    body against top_k 40; bench_batching (one request of n vs n concurrent vs n sequential
#    vs the raw loop) for n = 1..64; ours beside llama-server and llama-server -bs; host time
#    per branch per step.
# Once built, it should take under 10 minutes on an H200 (its step limits add up to 11.5).
set -uo pipefail
out=${1:-${OUT:-}}
[[ -n $out ]] || { echo "usage: bench/gpu.sh OUT_DIR (or set OUT)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
py=.venv-cuda/bin/python
tools=$HOME/.cache/llama-srb/llama-tools-0.3.36-cuda/bin
status=0

step() {  # step NAME SECONDS COMMAND...: run it under a time limit, its output to NAME.txt
    local name=$1 limit=$2
    shift 2
    echo ">> $name (at most ${limit} s)"
    local started=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo ">> $name: exit $rc after $((SECONDS - started)) s" | tee -a "$out/summary.txt"
    [[ $rc == 0 ]] || status=1
}

started=$SECONDS
make install llama-tools GPU=cuda 2>&1 | tee "$out/build.txt"
[[ ${PIPESTATUS[0]} == 0 ]] || { echo "the CUDA build failed: $out/build.txt" >&2; exit 1; }
echo ">> build (or check): $((SECONDS - started)) s" | tee "$out/summary.txt"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; uptime; } \
    >"$out/machine.txt" 2>&1
# The build offloads, and the server would: llama.cpp sees a GPU device.
$py -c "
import llama_cpp, sys
from llama_srb.native import has_gpu_device
sys.exit(not (llama_cpp.llama_supports_gpu_offload() and has_gpu_device()))
" || { echo "no GPU: the CUDA build sees no device" >&2; exit 1; }

step tests 240 $py -m pytest -q -p no:cacheprovider \
    tests/integration/test_completions.py tests/integration/test_sampling_paths.py \
    tests/integration/test_constrained.py tests/integration/test_prefix_cache.py
step decode_only 90 $py bench/bench_decode_only.py --ns 1,2,4,8,16,32,64 \
    --llama-tools "$tools"
step batching 120 $py bench/bench_batching.py --ns 1,2,4,8,16,32,64
step vs_llama 120 $py bench/bench_vs_llama.py --llama-tools "$tools"
step host 120 $py bench/bench_host.py
echo ">> all: $((SECONDS - started)) s; tables in $out" | tee -a "$out/summary.txt"
exit $status
