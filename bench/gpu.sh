#!/usr/bin/env bash
# llama-srb on a CUDA GPU with no network, in one prepared run (issue 40).
#
#   bench/gpu.sh pack DIR                 where the registries are: gather what the GPU
#                                         machine lacks into DIR (at most 60 MiB)
#   bench/gpu.sh run OUT --pack DIR       on the GPU machine (no network): build, make the
#                                         model, the checks and the benches, tables into OUT
#   bench/gpu.sh dry-run OUT --pack DIR   the same steps on the CPU backend with the tiny
#                                         model; meant to run under `unshare -n`
#   bench/gpu.sh OUT                      the older, online path: `make install llama-tools
#                                         GPU=cuda`, the integration tests on the bundled
#                                         models, the benches (needs PyPI and the models)
#
# The pack: llama-cpp-python 0.3.36's source trimmed to what the build needs (no vendored
# vocabulary models, docs, examples, tests, web UI or other backends), and wheels (CPython
# 3.12 manylinux x86_64; 3.11 too where a wheel is per version, for the dry run here) of the
# runtime dependencies the machine's image lacks (../shared/reference/gpu-machine.md),
# pinned to the versions .venv holds. The model is made from its llama.cpp's gguf-py.
#
# One llama.cpp build serves everything: shared libraries (libllama, libggml*) that the
# llama_cpp Python package loads, and llama-quantize and llama-batched-bench linked to the
# same ones, so CUDA's kernels are compiled once. The Python package is llama-cpp-python's
# own llama_cpp/ with those libraries in llama_cpp/lib, installed as llama_cpp_python 0.3.36.
#
# `run`, 12 minutes on 16 cores (one H200), each step under its own limit (seconds):
#   setup     30  unpack, a venv on the image's Python 3.12, the wheels, llama-srb (-e)
#   build    300  CMake + ninja: ggml-cuda for sm_90 only, libllama, the two tools
#   model    100  a random Llama-3.1-8B (F16, 16 GB, bench/make_model.py), then Q4_K_M (4.6 GB)
#   checks    40  offload, every sampling path, a grammar, the prefix cache (bench/gpu_checks.py)
#   decode   120  one request of n=1,8,32,64 beside llama-batched-bench -pps -kvu, prompts of
#                 512 and 4,096 tokens (bench/gpu_decode.py), 60 s each
#   host      60  host time per branch-step, decode free and real (bench/bench_host.py)
#   cache     60  swipes and a tree walk (bench/bench_cache.py --parts swipes,walks)
# 710 s of limits; a step that overruns is killed, and the others still write their tables.
# Backend sampling (llama_set_sampler) is not in this tree yet: `host` measures the host
# path only. OUT/summary.txt: each step's exit code and seconds; OUT/<step>.txt: its table.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
self=$root/bench/$(basename "$0")
LLAMA_CPP=0.3.36
SDIST=llama_cpp_python-$LLAMA_CPP
# What the image lacks, or holds in a version ours may not accept (gpu-machine.md).
WHEELS="fastapi starlette uvicorn pydantic pydantic-core pydantic-settings python-dotenv
annotated-types annotated-doc typing-inspection typing-extensions llguidance diskcache google-re2"

die() { echo "bench/gpu.sh: $*" >&2; exit 2; }

mib() { du -sb "$1" | awk '{printf "%.1f", $1 / 1048576}'; }

# --- pack -----------------------------------------------------------------------------

trim_source() {  # trim_source DIR: llama-cpp-python's unpacked sdist, in place
    local src=$1 cpp=$1/vendor/llama.cpp
    rm -rf "$src"/{docs,examples,tests,docker,.github,mkdocs.yml}
    rm -rf "$cpp"/{models,docs,examples,pocs,benches,media,tests,app,ci,conversion,skills,scripts}
    rm -rf "$cpp"/{.github,.devops,grammars,requirements,convert_*.py,build-xcframework.sh}
    rm -rf "$cpp"/tools/{ui,server,cli}  # built only with LLAMA_BUILD_SERVER
    rm -rf "$cpp"/gguf-py/{tests,examples}
    local backend
    for backend in "$cpp"/ggml/src/ggml-*/; do  # only the CPU, CUDA and RPC backends
        case $(basename "$backend") in ggml-cpu | ggml-cuda | ggml-rpc) ;; *) rm -rf "$backend" ;; esac
    done
}

pack() {
    local dir=$1 py=${PYTHON:-$root/.venv/bin/python} tmp name pins
    [[ -x $py ]] || die "pack needs a Python with pip (PYTHON=..., default .venv/bin/python)"
    mkdir -p "$dir/wheels" && dir=$(cd "$dir" && pwd)
    tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' RETURN
    local cached=$HOME/.cache/llama-srb/src-$LLAMA_CPP/$SDIST.tar.gz
    if [[ -f $cached ]]; then
        cp "$cached" "$tmp/"
    else
        "$py" -m pip download --quiet --no-deps --no-binary :all: \
            "llama-cpp-python==$LLAMA_CPP" -d "$tmp" || die "cannot download llama-cpp-python"
    fi
    tar xzf "$tmp/$SDIST.tar.gz" -C "$tmp"
    trim_source "$tmp/$SDIST"
    tar czf "$dir/$SDIST-trimmed.tar.gz" -C "$tmp" "$SDIST"
    # The versions this tree is tested with, as .venv holds them.
    pins=$("$py" -c "
import sys
from importlib.metadata import version
print(' '.join(f'{n}=={version(n)}' for n in sys.argv[1:]))" $WHEELS) || die "a dependency is missing from $py's environment"
    echo "$pins" | tr ' ' '\n' >"$dir/wheels/requirements.txt"
    for name in 3.12 3.11; do
        "$py" -m pip download --quiet --no-deps --disable-pip-version-check --only-binary=:all: --python-version "$name" \
            --implementation cp --platform manylinux2014_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
            --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 \
            -d "$dir/wheels" -r "$dir/wheels/requirements.txt" || die "pip download failed"
    done
    (cd "$dir" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum) \
        >"$dir/SHA256SUMS"
    echo ">> pack in $dir: $(mib "$dir") MiB (limit 60)"
    ls -l "$dir" "$dir/wheels" | awk 'NF > 5 {print "   ", $5, $NF}'
    awk -v m="$(mib "$dir")" 'BEGIN { exit !(m <= 60) }' || die "the pack is over 60 MiB"
}

# --- run / dry-run --------------------------------------------------------------------

status=0
step() {  # step NAME SECONDS COMMAND...: under a time limit, its output to OUT/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo ">> $name (at most ${limit} s)"
    local started=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "$name: exit $rc after $((SECONDS - started)) s (limit $limit s)" | tee -a "$out/summary.txt"
    [[ $rc == 0 ]] || status=1
    return "$rc"
}

setup() {  # the source unpacked, a venv with the wheels and llama-srb, the tree to run in
    rm -rf "$work/src" "$work/venv" && mkdir -p "$work/src"
    tar xzf "$pack_dir/$SDIST-trimmed.tar.gz" -C "$work/src" || return 1
    if [[ $mode == run ]]; then  # the machine's copy of the working tree: built in place
        python3 -m venv --system-site-packages "$work/venv" || return 1
    else
        # Another tree, so that building llama-srb's C part in place never touches this
        # one's (which a running .venv may have loaded): tracked and untracked, not ignored.
        rm -rf "$tree" && mkdir -p "$tree"
        git -C "$root" ls-files -z --cached --others --exclude-standard |
            (cd "$root" && xargs -0 tar cf - --no-recursion --ignore-failed-read) |
            tar xf - -C "$tree" || return 1
        # The image's packages (numpy, jinja2, httpx, pytest, ...): .venv's stand in for them,
        # after the venv's own in sys.path (a .pth line), never installed into it.
        local base site
        base=$("$root/.venv/bin/python" -c "import sys; print(sys._base_executable)")
        "$base" -m venv --without-pip "$work/venv" || return 1  # pip: the stand-in's
        site=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        "$root/.venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
            >"$site/zz-image-stand-in.pth"
    fi
    local py=$work/venv/bin/python
    "$py" -m pip install --quiet --no-index --no-deps --ignore-installed \
        --find-links "$pack_dir/wheels" -r "$pack_dir/wheels/requirements.txt" || return 1
    # llama-srb itself: its C part built in place, the tree on the venv's path (what
    # `pip install -e .` makes, without needing a recent setuptools and wheel offline).
    (cd "$tree" && "$py" setup.py --quiet build_ext --inplace) || return 1
    echo "$tree" >"$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/llama_srb_tree.pth"
    "$py" -c "import fastapi, uvicorn, pydantic, pydantic_settings, llguidance, diskcache; \
print('wheels installed:', fastapi.__file__.rsplit('/', 3)[0])"
}

build() {  # llama.cpp from the pack: shared libraries and the two tools, one build
    local cpp=$work/src/$SDIST/vendor/llama.cpp backend=() jobs
    jobs=$(nproc)
    if [[ $mode == run ]]; then
        backend=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
        command -v nvcc >/dev/null || { echo "no nvcc on PATH"; return 1; }
    fi
    # $ORIGIN: each library finds its siblings wherever llama_cpp/lib puts them.
    cmake -S "$cpp" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_RPATH="\$ORIGIN" "${backend[@]}" \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_NUMBER=0 -DLLAMA_BUILD_COMMIT=llama-cpp-python-$LLAMA_CPP || return 1
    cmake --build "$build_dir" -j "$jobs" \
        --target llama ggml llama-quantize llama-batched-bench || return 1
    # The Python side: llama-cpp-python's own package, with this build's libraries.
    local site pkg
    site=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    pkg=$site/llama_cpp
    rm -rf "$pkg" "$site"/llama_cpp_python-*.dist-info
    cp -r "$work/src/$SDIST/llama_cpp" "$pkg" && mkdir -p "$pkg/lib"
    find "$build_dir/bin" -maxdepth 1 -name 'lib*.so*' -exec cp -a {} "$pkg/lib/" \;
    mkdir -p "$site/llama_cpp_python-$LLAMA_CPP.dist-info"
    printf 'Metadata-Version: 2.1\nName: llama_cpp_python\nVersion: %s\n' "$LLAMA_CPP" \
        >"$site/llama_cpp_python-$LLAMA_CPP.dist-info/METADATA"
    echo "bench/gpu.sh" >"$site/llama_cpp_python-$LLAMA_CPP.dist-info/INSTALLER"
    : >"$site/llama_cpp_python-$LLAMA_CPP.dist-info/RECORD"
    ls "$pkg/lib"
    "$work/venv/bin/python" -c "
import llama_cpp
print('llama_cpp', llama_cpp.__version__, 'from', llama_cpp.__file__)
print('GPU offload:', bool(llama_cpp.llama_supports_gpu_offload()))"
}

make_model() {  # the shape's F16 GGUF, then Q4_K_M with this build's llama-quantize
    local f16=$work/model-$shape-f16.gguf
    PYTHONPATH=$work/src/$SDIST/vendor/llama.cpp/gguf-py \
        "$work/venv/bin/python" "$tree/bench/make_model.py" "$f16" --shape "$shape" || return 1
    "$build_dir/bin/llama-quantize" "$f16" "$model" Q4_K_M "$(nproc)" | tail -n 4 || return 1
    rm -f "$f16"
    ls -l "$model"
}

run_all() {
    mode=$1
    shift
    out=${1:-}
    [[ -n $out && $out != --pack ]] || die "usage: bench/gpu.sh $mode OUT --pack DIR"
    shift
    pack_dir=
    while (($#)); do
        case $1 in
            --pack) pack_dir=${2:-}; shift 2 ;;
            *) die "unknown argument: $1" ;;
        esac
    done
    [[ -f $pack_dir/$SDIST-trimmed.tar.gz ]] || die "--pack DIR: no $SDIST-trimmed.tar.gz there"
    pack_dir=$(cd "$pack_dir" && pwd)
    mkdir -p "$out" && out=$(cd "$out" && pwd) && : >"$out/summary.txt"
    # The work folder: the GPU machine's disk; here, one that a second dry run reuses (its
    # build is then incremental: CMake sees the same sources with the same times).
    if [[ $mode == run ]]; then
        work=${GPU_WORK:-$root/build/gpu}
        build_dir=$work/llama.cpp
        shape=llama-3.1-8b
    else
        work=${GPU_WORK:-$HOME/.cache/llama-srb/gpu-dry-run}
        build_dir=$work/llama.cpp
        shape=tiny
    fi
    mkdir -p "$work" && work=$(cd "$work" && pwd)
    model=$work/model-$shape-q4_k_m.gguf
    tree=$root
    [[ $mode == run ]] || tree=$work/tree
    # The steps below run as `bench/gpu.sh _STEP` under `timeout`, and read these.
    export mode work pack_dir build_dir shape model tree
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    started=$SECONDS
    {
        echo "mode: $mode; pack: $pack_dir; work: $work; $(nproc) cores"
        date -u
        if [[ $mode == run ]]; then
            nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
            nvcc --version | tail -n 1
        fi
        uptime
    } >"$out/machine.txt" 2>&1
    # Budgets: `run` is sized for 16 cores and an H200; the dry run's CPU build on 2 cores
    # and its tiny model need other limits, the steps are the same.
    local b_setup=30 b_build=300 b_model=100 b_checks=40 b_decode=60 b_host=30 b_cache=60
    # The tree walk's `end` story fills 3/4 of --n-ctx: 24,576 tokens on the GPU.
    local ns=1,8,32,64 prompts="512 4096" cpu=() walks=1500,end n_ctx=32768
    if [[ $mode == dry-run ]]; then
        b_setup=120 b_build=2400 b_model=60 b_checks=180 b_decode=300 b_host=300 b_cache=300
        ns=1,8 prompts="512" cpu=(--cpu) walks=1500 n_ctx=8192
    fi
    step setup "$b_setup" "$self" _setup || { finish; return; }
    py=$work/venv/bin/python
    step build "$b_build" "$self" _build || { finish; return; }
    step model "$b_model" "$self" _model || { finish; return; }
    cd "$tree" || return
    step checks "$b_checks" "$py" bench/gpu_checks.py --model "$model" "${cpu[@]}"
    local p
    for p in $prompts; do
        step "decode_$p" "$b_decode" "$py" bench/gpu_decode.py --model "$model" --ns "$ns" \
            --prompt-tokens "$p" --new-tokens 32 --llama-tools "$build_dir/bin"
    done
    step host_free "$b_host" "$py" bench/bench_host.py --model "$model" --ns "$ns" \
        --no-sillytavern --decode free
    step host_real "$b_host" "$py" bench/bench_host.py --model "$model" --ns "$ns" \
        --no-sillytavern --decode real
    step cache "$b_cache" "$py" bench/bench_cache.py --model "$model" --parts swipes,walks \
        --walk-words "$walks" --n-ctx "$n_ctx" --new-tokens 32 --swipe-tokens 64
    finish
}

finish() {
    echo "all: $((SECONDS - started)) s; exit $status; tables in $out" | tee -a "$out/summary.txt"
}

# --- the older, online path -----------------------------------------------------------

online() {
    out=$1
    mkdir -p "$out" && out=$(cd "$out" && pwd)
    export PYTHONUNBUFFERED=1
    local py=.venv-cuda/bin/python tools=$HOME/.cache/llama-srb/llama-tools-$LLAMA_CPP-cuda/bin
    started=$SECONDS
    make install llama-tools GPU=cuda 2>&1 | tee "$out/build.txt"
    [[ ${PIPESTATUS[0]} == 0 ]] || die "the CUDA build failed: $out/build.txt"
    echo "build (or check): $((SECONDS - started)) s" | tee "$out/summary.txt"
    $py -c "
import llama_cpp, sys
from llama_srb.native import has_gpu_device
sys.exit(not (llama_cpp.llama_supports_gpu_offload() and has_gpu_device()))
" || die "no GPU: the CUDA build sees no device"
    step tests 240 $py -m pytest -q -p no:cacheprovider \
        tests/integration/test_completions.py tests/integration/test_sampling_paths.py \
        tests/integration/test_constrained.py tests/integration/test_prefix_cache.py
    step decode_only 90 $py bench/bench_decode_only.py --ns 1,2,4,8,16,32,64 --llama-tools "$tools"
    step batching 120 $py bench/bench_batching.py --ns 1,2,4,8,16,32,64
    step vs_llama 120 $py bench/bench_vs_llama.py --llama-tools "$tools"
    step host 120 $py bench/bench_host.py
    finish
}

case ${1:-} in
    pack) [[ -n ${2:-} ]] || die "usage: bench/gpu.sh pack DIR"; pack "$2" ;;
    run | dry-run) run_all "$@"; exit $status ;;
    _setup) setup ;;
    _build) build ;;
    _model) make_model ;;
    "" | -h | --help) sed -n '2,14p' "$0"; exit 2 ;;
    *) online "$1"; exit $status ;;
esac
