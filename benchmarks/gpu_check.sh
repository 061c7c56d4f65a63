#!/usr/bin/env bash
# One command for a CUDA or ROCm machine with nothing prepared: install the project with a
# GPU torch, compile every kernel for every target (gates included), run the kernel tests and
# the property suite on GPU tensors, then the suite on a real NCCL process group with one rank
# per GPU found (torchrun; 1 on a single-GPU machine), benchmark the kernels (torch baseline
# and, when installed, Liger-Kernel side by side), the fused LM head's peak memory and time
# against the logits path, and what a sampling support costs over the raw logprob on every
# backend, write the platform corpus's output bits and compare the committed CPU bits with this
# GPU's, and write one JSON and one markdown report. Exits nonzero when
# any step fails (a kernel that does not compile, a failing test or property, a timeout).
#
# Usage: benchmarks/gpu_check.sh [--dry-run] [--out DIR]
#   --dry-run  any machine, CPU included: print the plan, run the tiny interpreted bench
#              shape and a tiny CPU fused-bench shape with the current python, write the
#              reports; installs nothing.
#   --out DIR  where logs and reports go (default build/gpu-check).
# Environment: PYTHON (default python3); GPU_CHECK_VENV (default DIR/venv, created with
#   --system-site-packages so a preinstalled GPU torch is reused); TORCH_INDEX_URL (where a
#   ROCm torch comes from; default https://download.pytorch.org/whl/rocm6.4); GPU_CHECK_JOBS
#   (pytest and compile workers, default 8).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
OUT=build/gpu-check
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --out) OUT="$2"; shift ;;
        *) echo "usage: $0 [--dry-run] [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
STEPS="$OUT/steps.tsv"
: >"$STEPS"
JOBS="${GPU_CHECK_JOBS:-8}"
PYTHON="${PYTHON:-python3}"
VENV="${GPU_CHECK_VENV:-$OUT/venv}"
# Triton 3.9 warns when this is unset (the tests turn warnings into errors); 1 is its default.
export TRITON_DEFAULT_FP_FUSION=1

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    PLATFORM=cuda
elif command -v rocminfo >/dev/null 2>&1 && rocminfo 2>/dev/null | grep -q 'gfx'; then
    PLATFORM=rocm
else
    PLATFORM=none
fi

# step NAME SECONDS COMMAND...: run with a time limit, tee the log, record the outcome.
step() {
    local name="$1" limit="$2"
    shift 2
    echo "==> $name (limit ${limit}s): $*"
    if [ "$DRY_RUN" = 1 ]; then
        printf '%s\t%s\t%s\t%s\n' "$name" "planned" "0" "$*" >>"$STEPS"
        return 0
    fi
    local start=$SECONDS rc
    if declare -F "$1" >/dev/null; then
        "$@" 2>&1 | tee "$OUT/$name.log"  # a shell function (the install): no timeout(1)
    else
        timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    fi
    rc=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" "$*" >>"$STEPS"
    [ "$rc" = 0 ] || echo "!!! $name FAILED (exit $rc; 124 is a timeout): see $OUT/$name.log"
    return 0
}

install() {
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv --system-site-packages "$VENV" || return 1
    local py="$VENV/bin/python"
    if ! "$py" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        if [ "$PLATFORM" = rocm ]; then
            "$py" -m pip install torch --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/rocm6.4}" || return 1
        else
            "$py" -m pip install torch || return 1  # PyPI's Linux torch is the CUDA build
        fi
    fi
    # ROCm torch brings its own Triton (pytorch-triton-rocm): do not add PyPI's CUDA Triton.
    local extras=torch,test
    [ "$PLATFORM" = cuda ] && extras=torch,triton,test
    "$py" -m pip install -e ".[$extras]" || return 1
    "$py" -c 'import torch, triton, tp_logprob; assert torch.cuda.is_available(), "no GPU torch"; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
}

PY="$VENV/bin/python"
if [ "$DRY_RUN" = 1 ]; then
    echo "gpu_check dry run (platform detected: $PLATFORM); the plan on a GPU machine:"
    echo "    install: $PYTHON -m venv --system-site-packages $VENV; unless a GPU torch imports:"
    echo "             pip install torch (CUDA: PyPI; ROCm: --index-url ${TORCH_INDEX_URL:-https://download.pytorch.org/whl/rocm6.4});"
    echo "             pip install -e '.[torch,triton,test]' (ROCm: '.[torch,test]')"
    [ "$PLATFORM" = none ] && PLATFORM=cuda && echo "    (shown for cuda; rocm on an AMD machine)"
else
    if [ "$PLATFORM" = none ]; then
        echo "gpu_check: no CUDA or ROCm GPU found (nvidia-smi / rocminfo); use --dry-run on CPU" >&2
        exit 1
    fi
fi

step install 420 install
if [ "$DRY_RUN" = 0 ] && ! grep -q $'^install\t0\t' "$STEPS"; then
    "$PYTHON" benchmarks/gpu_check_report.py --out "$OUT" --platform "$PLATFORM" || true
    echo "gpu_check: the install failed; nothing else ran" >&2
    exit 1
fi
step compile 240 env -u TRITON_INTERPRET "$PY" -m tools.gpu_readiness --matrix ci \
    --jobs "$JOBS" --json "$OUT/compile.json"
step kernel-tests 300 env -u TRITON_INTERPRET "$PY" -m pytest tests/kernels -q -p no:cacheprovider \
    -n "$JOBS" --ignore=tests/kernels/test_compile.py
step properties 300 env -u TRITON_INTERPRET "$PY" -m pytest --pyargs tp_logprob.properties -q \
    -p no:cacheprovider -n "$JOBS" "--tp-logprob-platform=$PLATFORM" --tp-logprob-profile=ci \
    "--tp-logprob-artifacts=$OUT/failures"
# The suite on a real process group: NCCL (RCCL on ROCm), one rank per GPU, device LOCAL_RANK.
GPUS=N  # the dry run shows the plan; a real run counts the GPUs torch sees
[ "$DRY_RUN" = 0 ] && GPUS="$("$PY" -c 'import torch; print(max(1, torch.cuda.device_count()))' || echo 1)"
step real-group 600 env -u TRITON_INTERPRET "$PY" -m torch.distributed.run --standalone \
    --nproc-per-node "$GPUS" -m pytest --pyargs tp_logprob.properties -q -p no:cacheprovider \
    "--tp-logprob-platform=$PLATFORM" --tp-logprob-profile=ci --tp-logprob-backend=torch_native \
    --tp-logprob-backend=triton_online "--tp-logprob-artifacts=$OUT/failures-real-group" \
    "--tp-logprob-rank-logs=$OUT/ranks"
step bench 300 env -u TRITON_INTERPRET "$PY" benchmarks/bench_kernels.py --json "$OUT/bench.json"
# Fused LM head vs logits path, N 4096 and 32768 x infer/train: about 2 min on an H100-class GPU
# (estimated, not measured; N=32768 train is the long one): --budget-s skips a shape that would
# overrun, and the JSON is written after every shape.
step bench-fused 300 env -u TRITON_INTERPRET "$PY" benchmarks/bench_fused.py --gpu-shapes --reps 3 \
    --budget-s 240 --json "$OUT/bench-fused.json"
# Processed (sampling-support) over raw logprobs for every backend: logits backends at
# 8192 x 152064, fused ones at 1024 x 4096 x 152064, infer and train, 3 repeats each; the
# JSON is written after every backend and role.
step bench-processed 600 env -u TRITON_INTERPRET "$PY" benchmarks/bench_processed.py --gpu-shapes \
    --repeats 3 --json "$OUT/bench-processed.json"
# Cross-platform bits on the fixed corpus (tools/platform_bits.py): this GPU's bits for every
# backend claiming cross_platform_bitwise here (cross_tp_bitwise until one does), to commit to
# benchmarks/platform_corpus/bits/ (CPU CI then compares its own with them:
# tests/test_platform_bits.py); and the committed CPU bits rerun here, which fails where a
# backend claims the same bits on both platforms.
step platform-bits 300 env -u TRITON_INTERPRET "$PY" -m tools.platform_bits write \
    --platform "$PLATFORM" --out "$OUT/platform-bits"
step platform-bits-vs-cpu 300 env -u TRITON_INTERPRET "$PY" -m tools.platform_bits compare \
    --platform "$PLATFORM" benchmarks/platform_corpus/bits/cpu-*.json

if [ "$DRY_RUN" = 1 ]; then
    echo "==> dry run: the tiny interpreted bench shape, with $PYTHON"
    start=$SECONDS
    TRITON_INTERPRET=1 "$PYTHON" benchmarks/bench_kernels.py --json "$OUT/bench.json"
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "bench (interpreted)" "$rc" "$((SECONDS - start))" \
        "TRITON_INTERPRET=1 $PYTHON benchmarks/bench_kernels.py" >>"$STEPS"
    echo "==> dry run: the fused LM-head bench at a tiny CPU shape, with $PYTHON"
    start=$SECONDS
    "$PYTHON" benchmarks/bench_fused.py --rows 256 --reps 1 --json "$OUT/bench-fused.json"
    rc=$?
    printf '%s\t%s\t%s\t%s\n' "bench-fused (cpu)" "$rc" "$((SECONDS - start))" \
        "$PYTHON benchmarks/bench_fused.py --rows 256 --reps 1" >>"$STEPS"
fi

if [ "$DRY_RUN" = 1 ]; then
    "$PYTHON" benchmarks/gpu_check_report.py --out "$OUT" --platform "$PLATFORM" --dry-run
else
    "$PY" benchmarks/gpu_check_report.py --out "$OUT" --platform "$PLATFORM"
fi
