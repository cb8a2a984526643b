#!/usr/bin/env bash
# llama-srb on a CUDA GPU with no network: packed here, run there (issue 40).
#
#   bench/gpu.sh pack DIR                 where the registries are: gather what the GPU
#                                         machine lacks into DIR (at most 60 MiB)
#   bench/gpu.sh run OUT --pack DIR [--steps A,B,...]
#                                         on the GPU machine (no network): build, make the
#                                         model, the checks and the benches (all steps, or
#                                         those named); OUT gets summary.txt, results.tar.gz
#   bench/gpu.sh dry-run OUT --pack DIR [--steps A,B,...]
#                                         the same steps on the CPU backend with the tiny
#                                         model; meant to run under `unshare -n`
#   bench/gpu.sh OUT                      the older, online path: `make install llama-tools
#                                         GPU=cuda`, the integration tests on the bundled
#                                         models, the benches (needs PyPI and the models)
#
# The pack: llama-cpp-python 0.3.36's source trimmed to what the build needs (no vendored
# vocabulary models, docs, examples, tests, web UI or other backends), and wheels (CPython
# 3.12 manylinux x86_64) of the runtime dependencies the machine's image lacks
# (../shared/reference/gpu-machine.md), pinned to the versions .venv holds. The model is
# made from its llama.cpp's gguf-py.
#
# The dry run here runs on CPython 3.12 too, so that it installs the very wheels the GPU
# run will: `pack` also makes, outside DIR, a 3.12 venv holding the image's packages that
# this tree uses (numpy, jinja2, httpx, pytest, ...; ~/.cache/llama-srb/gpu-image-py3.12,
# or GPU_IMAGE), the stand-in for the machine's `python3`. It needs a python3.12 (on PATH,
# in pyenv, or PYTHON312=...). The dry run brings the loopback up when it starts in a
# fresh network namespace (`unshare -n`), and the steps talk to 127.0.0.1 only.
#
# One llama.cpp build serves everything: shared libraries (libllama, libggml*) that the
# llama_cpp Python package loads, and llama-quantize and llama-batched-bench linked to the
# same ones, so CUDA's kernels are compiled once. The Python package is llama-cpp-python's
# own llama_cpp/ with those libraries in llama_cpp/lib, installed as llama_cpp_python 0.3.36.
# The dry run builds the same four targets (CPU backend); ccache, where it is on PATH, is
# used by llama.cpp's CMake (GGML_CCACHE), and the dry run's work folder is kept, so a
# second dry run's build is incremental. Measured here (2 shared cores, nice 19): the whole
# CPU build 12 minutes from scratch (721 s, others' tests loading both cores), a dry run
# with the build done about 5 minutes. The dry run takes --steps too: split as on the
# machine (below), two dry runs on the same work folder, with the build and the model
# there, took 35 s and 271 s.
#
# `run` on the GPU machine (one H200, 16 cores) is two device commands on one warm machine:
# a command may run 600 s at most, and the steps' limits add up to 710 s. Each call carries
# build/gpu-pack and nothing more; the work folder build/gpu (ignored, never carried) stays
# on the machine between them. Send the second as soon as the first returns: the machine
# stays warm 30 s after a call, and a fresh one would have neither the build nor the model.
#   1. bench/gpu.sh run "$OUT" --pack build/gpu-pack --steps setup,build,model,checks,backend
#      (timeout_s 595), limits in seconds:
#        setup      30  unpack, a venv on the image's Python 3.12, the wheels, llama-srb (-e)
#        build     300  CMake + ninja: ggml-cuda for sm_90 only, libllama, the two tools
#        model     100  a random Llama-3.1-8B (F16, 16 GB, bench/make_model.py), then
#                       Q4_K_M (4.6 GB)
#        checks     60  offload, every sampling path, a grammar, the prefix cache, each
#                       with --backend-sampling off and on; greedy the same with both
#                       (bench/gpu_checks.py)
#        backend    60  --backend-sampling off against on, n=8 and 64, the defaults and
#                       greedy: the engine, each the median of 2, and from outside, two
#                       servers (bench/bench_backend_sampling.py --parts 1,4). Not a
#                       min-p first, nor SillyTavern's presets: on random weights' flat
#                       rows a min-p keeps thousands of tokens, and the host path's sort
#                       of them (ms a branch-step) would be all the table showed.
#                  550
#   2. bench/gpu.sh run "$OUT" --pack build/gpu-pack --steps decode,host_free,host_real,cache
#      (timeout_s 300; `decode` is decode_512,decode_4096):
#        decode_512  60  one request of n=1,8,32,64 beside llama-batched-bench -pps -kvu,
#        decode_4096 60  prompts of 512 and 4,096 tokens (bench/gpu_decode.py)
#        host_free   30  host time per branch-step, decode free and real (bench/bench_host.py)
#        host_real   30
#        cache       60  swipes and a tree walk (bench/bench_cache.py --parts swipes,walks)
#                   240
# The 15 minutes of device time: the machine's start (1 to 2 minutes), the tree and the
# pack sent with each call (about 52 MiB), and at most 550 + 240 s of steps (a step that
# overruns is killed, 10 s later at the latest, and the others still run): about 15
# minutes if every step took its whole limit (the slowest case). What the GPU is lent for
# comes first: the checks and backend sampling are in the first call, so a second call cut
# short loses only the figures of the host path. A step whose input is missing (no venv, no
# model: the machine went back between the calls) is recorded as not run, at once.
# Done work is kept in the work folder: setup keeps the unpacked source and the venv made
# from the same pack, build keeps its folder (CMake and ninja redo only what changed), and
# model keeps a Q4_K_M of the same recipe (make_model.py --check: its text, the shape and
# the seed, stored in the file). So a failed command can be sent again as it is, or with
# only what is left (`--steps model,checks`).
#
# What comes back: at most 8 files from $OUT. So the tables go to the work folder's
# results/ and OUT gets two files alone, renewed after each step (a command killed at its
# limit still returns the steps it finished):
#   summary.txt     each step's exit code and seconds, for every call since the last setup
#   results.tar.gz  results/: summary.txt, machine.txt (each call's machine lines), and
#                   <step>.txt for each step run (its output and table)
# A call that runs setup starts results/ afresh; a later one adds its steps, so the second
# command's OUT holds both commands' tables.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
self=$root/bench/$(basename "$0")
LLAMA_CPP=0.3.36
SDIST=llama_cpp_python-$LLAMA_CPP
# What the image lacks, or holds in a version ours may not accept (gpu-machine.md).
WHEELS="fastapi starlette uvicorn pydantic pydantic-core pydantic-settings python-dotenv
annotated-types annotated-doc typing-inspection typing-extensions llguidance diskcache google-re2
opentelemetry-api"
# What the image holds and this tree (and gguf-py, for the model) uses at run time, for the
# dry run's stand-in of the image: at .venv's versions where .venv has them.
IMAGE="numpy jinja2 markupsafe httpx httpcore h11 anyio idna certifi prometheus-client pytest
pytest-timeout pluggy iniconfig packaging pygments click annotated-doc typing-extensions pyyaml
tqdm requests urllib3 charset-normalizer setuptools"
IMAGE_DIR=${GPU_IMAGE:-$HOME/.cache/llama-srb/gpu-image-py3.12}

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
    local dir=$1 py=${PYTHON:-$root/.venv/bin/python} tmp pins
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
    "$py" -m pip download --quiet --no-deps --disable-pip-version-check --only-binary=:all: \
        --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 \
        -d "$dir/wheels" -r "$dir/wheels/requirements.txt" || die "pip download failed"
    (cd "$dir" && find . -type f ! -name SHA256SUMS -print0 | sort -z | xargs -0 sha256sum) \
        >"$dir/SHA256SUMS"
    echo ">> pack in $dir: $(mib "$dir") MiB (limit 60)"
    ls -l "$dir" "$dir/wheels" | awk 'NF > 5 {print "   ", $5, $NF}'
    awk -v m="$(mib "$dir")" 'BEGIN { exit !(m <= 60) }' || die "the pack is over 60 MiB"
    image_stand_in "$py"
}

python312() {  # a CPython 3.12 here: PYTHON312, python3.12 on PATH, or pyenv's
    local c
    for c in ${PYTHON312:-} python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
        [[ -n $c ]] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null &&
            { command -v "$c"; return 0; }
    done
    return 1
}

image_stand_in() {  # image_stand_in PY: the dry run's python3, a 3.12 venv with IMAGE's packages
    local py=$1 py312 pins
    py312=$(python312) || {
        echo "bench/gpu.sh: no CPython 3.12 here (PYTHON312=...): the dry run will need one" >&2
        return 0
    }
    pins=$("$py" -c "
import sys
from importlib.metadata import PackageNotFoundError, version
def pin(n):
    try:
        return f'{n}=={version(n)}' if n not in ('setuptools', 'pip') else n
    except PackageNotFoundError:
        return n
print(' '.join(map(pin, sys.argv[1:])))" $IMAGE) || die "cannot read $py's versions"
    rm -rf "$IMAGE_DIR"
    "$py312" -m venv "$IMAGE_DIR" || die "cannot make $IMAGE_DIR"
    # shellcheck disable=SC2086  # one argument per pin
    "$IMAGE_DIR/bin/python" -m pip install --quiet --disable-pip-version-check \
        --only-binary=:all: $pins || die "cannot install the image's packages"
    echo ">> the dry run's stand-in for the image's python3: $IMAGE_DIR ($("$IMAGE_DIR/bin/python" -V))"
}

# --- run / dry-run --------------------------------------------------------------------

status=0
step() {  # step NAME SECONDS COMMAND...: under a time limit, its output to RESULTS/NAME.txt
    local name=$1 limit=$2
    shift 2
    echo ">> $name (at most ${limit} s)"
    local started=$SECONDS
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$results/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "$name: exit $rc after $((SECONDS - started)) s (limit $limit s)" | tee -a "$results/summary.txt"
    [[ $rc == 0 ]] || status=1
    deliver
    return "$rc"
}

deliver() {  # OUT: summary.txt and results.tar.gz (every table), renewed after each step
    [[ -n ${out_files:-} ]] || return 0
    cp "$results/summary.txt" "$out_files/summary.txt.part" &&
        mv "$out_files/summary.txt.part" "$out_files/summary.txt"
    tar czf "$out_files/results.tar.gz.part" -C "$work" results &&
        mv "$out_files/results.tar.gz.part" "$out_files/results.tar.gz"
}

sync_tree() {  # the dry run's copy of this tree, as the GPU machine gets it on every call
    # Another tree, so that building llama-srb's C part in place never touches this one's
    # (which a running .venv may have loaded): tracked and untracked, not ignored, written
    # over the last copy (times kept), so its built C part stays, as on the machine.
    mkdir -p "$tree"
    git -C "$root" ls-files -z --cached --others --exclude-standard |
        (cd "$root" && xargs -0 tar cf - --no-recursion --ignore-failed-read) |
        tar xf - -C "$tree"
}

setup() {  # the source unpacked, a venv with the wheels and llama-srb; what is done is kept
    local py=$work/venv/bin/python src_key venv_key
    # The source: unpacked again only from another tarball (and then the build folder goes
    # too: its objects could look newer than the new sources).
    src_key=$(sha256sum <"$pack_dir/$SDIST-trimmed.tar.gz" | cut -c1-16)
    if [[ -f $work/src/unpacked-from && $(<"$work/src/unpacked-from") == "$src_key" &&
        -d $work/src/$SDIST ]]; then
        echo "source: $work/src/$SDIST is there, from the same tarball: kept"
    else
        [[ -f $work/src/unpacked-from ]] && rm -rf "$build_dir"
        rm -rf "$work/src" && mkdir -p "$work/src"
        tar xzf "$pack_dir/$SDIST-trimmed.tar.gz" -C "$work/src" || return 1
        echo "$src_key" >"$work/src/unpacked-from"
        echo "source: unpacked into $work/src"
    fi
    # The venv: made again only for another pack (its SHA256SUMS) or mode.
    venv_key="$mode $(cat "$pack_dir/SHA256SUMS" 2>/dev/null | sha256sum | cut -c1-16)"
    if [[ -f $work/venv/made-from && $(<"$work/venv/made-from") == "$venv_key" && -x $py ]]; then
        echo "venv: $work/venv is there, from the same pack: kept"
    else
        rm -rf "$work/venv"
        if [[ $mode == run ]]; then  # the machine's copy of the working tree: built in place
            python3 -m venv --system-site-packages "$work/venv" || return 1
            # The image's python3 may be a venv itself, whose packages a venv made from it
            # does not see: its site folders go after the new venv's own (a .pth line).
            local site
            site=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
            python3 -c "import site; print('\n'.join(site.getsitepackages()))" >"$site/zz-image.pth"
        else
            # The image's packages (numpy, jinja2, httpx, pytest, ...): the stand-in's (pack
            # made it), after the venv's own in sys.path (a .pth line), never installed into it.
            [[ -x $IMAGE_DIR/bin/python ]] ||
                { echo "no $IMAGE_DIR: make it with bench/gpu.sh pack (online)"; return 1; }
            local base site
            base=$("$IMAGE_DIR/bin/python" -c "import sys; print(sys._base_executable)")
            "$base" -m venv --without-pip "$work/venv" || return 1  # pip: the stand-in's
            site=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
            "$IMAGE_DIR/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" \
                >"$site/zz-image-stand-in.pth"
        fi
        "$py" -m pip install --quiet --no-index --no-deps --ignore-installed \
            --find-links "$pack_dir/wheels" -r "$pack_dir/wheels/requirements.txt" || return 1
        echo "$venv_key" >"$work/venv/made-from"
        echo "venv: made in $work/venv, the pack's wheels installed"
    fi
    # What llama-srb needs at run time, and what that needs, all there in versions that fit
    # (the image's or the pack's); `pip check` would also judge the image's own packages.
    # shellcheck disable=SC2086  # one argument per name
    "$py" - $WHEELS <<'EOF' || { rm -f "$work/venv/made-from"; return 1; }
import sys
from importlib.metadata import PackageNotFoundError, distribution
from packaging.requirements import Requirement
todo = [Requirement(r) for r in sys.argv[1:] + """fastapi uvicorn pydantic pydantic-settings
    prometheus-client jinja2 numpy llguidance google-re2 httpx pytest diskcache""".split()]
seen, bad = set(), []
while todo:
    req = todo.pop()
    if req.name.lower() in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    seen.add(req.name.lower())
    try:
        dist = distribution(req.name)
    except PackageNotFoundError:
        bad.append(f"{req}: not installed")
        continue
    if not req.specifier.contains(dist.version, prereleases=True):
        bad.append(f"{req}: {dist.version} installed")
    todo += [Requirement(r) for r in dist.requires or []]
print(f"{len(seen)} run-time packages, their requirements met" if not bad else "\n".join(bad))
sys.exit(bool(bad))
EOF
    # llama-srb itself: its C part built in place, the tree on the venv's path (what
    # `pip install -e .` makes, without needing a recent setuptools and wheel offline).
    (cd "$tree" && "$py" setup.py --quiet build_ext --inplace) || return 1
    echo "$tree" >"$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/llama_srb_tree.pth"
    "$py" -c "import sys, fastapi, uvicorn, pydantic, pydantic_settings, llguidance, diskcache; \
print('Python', sys.version.split()[0], '- wheels installed:', fastapi.__file__.rsplit('/', 3)[0])"
}

build() {  # llama.cpp from the pack: shared libraries and the two tools, one build
    local cpp=$work/src/$SDIST/vendor/llama.cpp backend=() jobs
    jobs=$(nproc)
    if [[ $mode == run ]]; then
        backend=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
        command -v nvcc >/dev/null || { echo "no nvcc on PATH"; return 1; }
    fi
    # The build folder is kept (and setup keeps the source): CMake and ninja redo only what
    # changed, nothing on a second call. Another source (path) needs a fresh folder.
    if [[ -f $build_dir/CMakeCache.txt ]]; then
        if grep -qxF "CMAKE_HOME_DIRECTORY:INTERNAL=$cpp" "$build_dir/CMakeCache.txt"; then
            echo "build folder: $build_dir is there: building what changed"
        else
            echo "build folder: $build_dir was for another source: made afresh"
            rm -rf "$build_dir"
        fi
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
    # llama.cpp's libraries load first in every process of the venv (a .pth line, after
    # the image's folders: zz-image*.pth): llama_srb/__init__.py says why; the benches
    # import numpy before llama_srb.
    echo "import llama_cpp" >"$site/zzz-llama-cpp-first.pth"
    ls "$pkg/lib"
    "$work/venv/bin/python" -c "
import llama_cpp
print('llama_cpp', llama_cpp.__version__, 'from', llama_cpp.__file__)
print('GPU offload:', bool(llama_cpp.llama_supports_gpu_offload()))"
}

make_model() {  # the shape's F16 GGUF, then Q4_K_M with this build's llama-quantize
    # A model already made by this recipe (make_model.py's text, the shape, the seed: the
    # file's llama_srb.recipe key) is kept; so is the F16 of one cut short while quantizing.
    local f16=$work/model-$shape-f16.gguf mm
    mm=(env PYTHONPATH="$work/src/$SDIST/vendor/llama.cpp/gguf-py"
        "$work/venv/bin/python" "$tree/bench/make_model.py")
    if "${mm[@]}" "$model" --shape "$shape" --check --file-type MOSTLY_Q4_K_M; then
        rm -f "$f16"
        ls -l "$model"
        return 0
    fi
    "${mm[@]}" "$f16" --shape "$shape" --check --file-type MOSTLY_F16 ||
        "${mm[@]}" "$f16" --shape "$shape" || return 1
    rm -f "$model"  # written under another name, so that one cut short is never taken
    "$build_dir/bin/llama-quantize" "$f16" "$model.part" Q4_K_M "$(nproc)" | tail -n 4
    [[ ${PIPESTATUS[0]} == 0 ]] || return 1
    mv "$model.part" "$model" && rm -f "$f16"
    "${mm[@]}" "$model" --shape "$shape" --check --file-type MOSTLY_Q4_K_M || return 1
    ls -l "$model"
}

run_all() {
    mode=$1
    shift
    out=${1:-}
    [[ -n $out && $out != --* ]] || die "usage: bench/gpu.sh $mode OUT --pack DIR [--steps A,B,...]"
    shift
    pack_dir= steps=all
    while (($#)); do
        case $1 in
            --pack) pack_dir=${2:-}; shift 2 ;;
            --steps) steps=${2:-}; shift 2 ;;
            *) die "unknown argument: $1" ;;
        esac
    done
    [[ -f $pack_dir/$SDIST-trimmed.tar.gz ]] || die "--pack DIR: no $SDIST-trimmed.tar.gz there"
    pack_dir=$(cd "$pack_dir" && pwd)
    # The work folder: the GPU machine's disk, kept between the two calls on a warm machine
    # (build/ is ignored, and not carried); here, one that a second dry run reuses.
    if [[ $mode == run ]]; then
        work=${GPU_WORK:-$root/build/gpu}
        shape=llama-3.1-8b
    else
        work=${GPU_WORK:-$HOME/.cache/llama-srb/gpu-dry-run}
        shape=tiny
    fi
    mkdir -p "$work" && work=$(cd "$work" && pwd)
    build_dir=$work/llama.cpp
    model=$work/model-$shape-q4_k_m.gguf
    results=$work/results
    tree=$root
    [[ $mode == run ]] || tree=$work/tree
    # Budgets: `run` is sized for 16 cores and an H200; the dry run's CPU build on 2 cores
    # and its tiny model need other limits, the steps are the same.
    local b_setup=30 b_build=300 b_model=100 b_checks=60 b_decode=60 b_host=30 b_backend=60
    local b_cache=60
    # The tree walk's `end` story fills 3/4 of --n-ctx: 24,576 tokens on the GPU.
    local ns=1,8,32,64 prompts="512 4096" cpu=() walks=1500,end n_ctx=32768
    if [[ $mode == dry-run ]]; then
        b_setup=120 b_build=3600 b_model=60 b_checks=180 b_decode=300 b_host=300 b_backend=300
        b_cache=300
        ns=1,8 prompts="512" cpu=(--cpu) walks=1500 n_ctx=8192
    fi
    # The steps asked for (--steps, comma-separated; `decode` is every decode_*; `all`),
    # run in this order whatever the order asked.
    local all=(setup build model checks) p s sel=()
    for p in $prompts; do all+=("decode_$p"); done
    all+=(host_free host_real backend cache)
    want=" "
    IFS=, read -ra sel <<<"$steps"
    ((${#sel[@]})) || die "--steps: none named"
    for s in "${sel[@]}"; do
        case $s in
            all) want+="${all[*]} " ;;
            decode) for p in $prompts; do want+="decode_$p "; done ;;
            *) [[ " ${all[*]} " == *" $s "* ]] ||
                die "--steps: no step '$s' in $mode (${all[*]}; decode; all)"
                want+="$s " ;;
        esac
    done
    # Tables go to RESULTS (in the work folder); OUT gets summary.txt and results.tar.gz
    # (all of RESULTS) alone, renewed after each step. A call that runs setup starts the
    # tables afresh; a later call adds its own, so its OUT holds both calls' tables.
    wants setup && rm -rf "$results"
    mkdir -p "$results" "$out" && out=$(cd "$out" && pwd)
    rm -f "$out/summary.txt" "$out/results.tar.gz"
    out_files=$out
    # The steps below run as `bench/gpu.sh _STEP` under `timeout`, and read these.
    export mode work pack_dir build_dir shape model tree
    export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
    # In a fresh network namespace (`unshare -n`) the loopback is down: the servers the
    # steps start listen on 127.0.0.1.
    # (/sys/class/net shows the namespace /sys was mounted in: `ip` asks this one.)
    if command -v ip >/dev/null && ! ip -o link show lo | grep -q '[<,]UP[,>]'; then
        ip link set lo up || die "the loopback is down and cannot be brought up (ip link)"
    fi
    started=$SECONDS
    local order=() head
    for s in "${all[@]}"; do wants "$s" && order+=("$s"); done
    head="== bench/gpu.sh $mode --steps $(IFS=,; echo "${order[*]}") ($(date -u +%FT%TZ))"
    echo "$head" | tee -a "$results/summary.txt"
    {
        echo "$head"
        echo "mode: $mode; pack: $pack_dir; work: $work; $(nproc) cores"
        command -v ip >/dev/null && echo "network: $(ip -o -br addr | tr -s ' ' | paste -sd ';')"
        if [[ $mode == run ]]; then
            nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
            nvcc --version | tail -n 1
        fi
        uptime
    } >>"$results/machine.txt" 2>&1
    deliver
    if [[ $mode == dry-run ]]; then  # as the machine gets the tree anew on each call
        sync_tree || die "cannot copy the tree into $tree"
    fi
    py=$work/venv/bin/python
    if wants setup; then
        step setup "$b_setup" "$self" _setup || { finish; return; }
    fi
    if wants build; then
        ready build setup "$work/src/$SDIST/vendor/llama.cpp" "$py" &&
            step build "$b_build" "$self" _build || { finish; return; }
    fi
    if wants model; then
        ready model build "$build_dir/bin/llama-quantize" "$py" &&
            step model "$b_model" "$self" _model || { finish; return; }
    fi
    cd "$tree" || return
    wants checks && ready checks model "$model" "$py" &&
        step checks "$b_checks" "$py" bench/gpu_checks.py --model "$model" "${cpu[@]}"
    for p in $prompts; do
        wants "decode_$p" && ready "decode_$p" model "$model" "$py" &&
            step "decode_$p" "$b_decode" "$py" bench/gpu_decode.py --model "$model" \
                --ns "$ns" --prompt-tokens "$p" --new-tokens 32 --llama-tools "$build_dir/bin"
    done
    wants host_free && ready host_free model "$model" "$py" &&
        step host_free "$b_host" "$py" bench/bench_host.py --model "$model" --ns "$ns" \
            --no-sillytavern --decode free
    wants host_real && ready host_real model "$model" "$py" &&
        step host_real "$b_host" "$py" bench/bench_host.py --model "$model" --ns "$ns" \
            --no-sillytavern --decode real
    wants backend && ready backend model "$model" "$py" &&
        step backend "$b_backend" "$py" bench/bench_backend_sampling.py --model "$model" \
            --ns 8,64 --tokens 32 --parts 1,4 \
            --presets defaults,greedy --repeats 2 --no-sillytavern
    wants cache && ready cache model "$model" "$py" &&
        step cache "$b_cache" "$py" bench/bench_cache.py --model "$model" --parts swipes,walks \
            --walk-words "$walks" --n-ctx "$n_ctx" --new-tokens 32 --swipe-tokens 64
    finish
}

wants() { [[ $want == *" $1 "* ]]; }

ready() {  # ready NAME STEP PATH...: each PATH there, or NAME is recorded as not run
    local name=$1 before=$2 path
    shift 2
    for path; do
        [[ -e $path ]] && continue
        echo "$name: not run: no $path (run --steps $before first, same work folder)" |
            tee -a "$results/summary.txt"
        status=1
        deliver
        return 1
    done
}

finish() {
    local where="tables in $results"
    [[ -n ${out_files:-} ]] && where+="; OUT: summary.txt, results.tar.gz"
    echo "all: $((SECONDS - started)) s; exit $status; $where" | tee -a "$results/summary.txt"
    deliver
}

# --- the older, online path -----------------------------------------------------------

online() {
    out=$1
    mkdir -p "$out" && out=$(cd "$out" && pwd)
    results=$out
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
    "" | -h | --help) sed -n '2,16p' "$0"; exit 2 ;;
    *) online "$1"; exit $status ;;
esac
