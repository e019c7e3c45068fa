#!/usr/bin/env bash
# The measurements of one lent GPU (15 minutes of device time, at most 600 s a command), in priority order: timing
# is bench.py's, correctness gpu_check.py's. Each stage is one process under its own time limit and writes its JSON
# under $OUT (the device tool's folder; out-lease/ where OUT is unset) after every model, so a stage cut short keeps
# what it measured. Two calls of the device tool, carrying .whl (fla-core and einops, which the GPU image lacks):
#
#   bash tools/gpu_lease.sh wheels    # here, once: download the wheels into .whl/ (git-ignored)
#   bash tools/gpu_lease.sh first     # call 1, timeout_s=600: mfu16, attn_time, pairs in 520 s
#   RESUME=results/gpu/DATE-COMMIT bash tools/gpu_lease.sh second
#                                     # call 2, timeout_s=240: grads_routes, correct_fla, long, pairs (on from call
#                                     # 1's) in 220 s
#   bash tools/gpu_lease.sh mfu       # where train.py's step changed: profile, mfu16, mfu64 in 400 s
#   bash tools/gpu_lease.sh STAGE...  # any stages by name, in LEASE_S seconds (default 540)
#   bash tools/gpu_lease.sh packing   # one call, timeout_s=600: runs per hour of config/sweep_gpu.py at 1, 2, 4, 8
#                                     # runs side by side, processes then MPS (RESUME=DIR goes on from DIR's JSON)
#
# Stages, in priority order (call 2 runs the checks and long before going on with the pairs, which take what is left:
# the rope they are timed against compiles again in a new process, and the pairs of every model do not fit a lease):
#   profile, mfu16, mfu64  train.py on config/gpt2_124m.py: its step's profile at 16 x 1024, its MFU at 16 x 1024
#                          (the config) and 64 x 1024 (train.jsonl, profile.json);
#   attn_time              the bias family's first layer timed by its route and on FlexAttention, frozen, as one
#                          table and without bias (bench.py --parts=attn_time);
#   grads_routes           each bias route's dq, dk, dv and parameter gradients against float64 dense, eager and
#                          with the layer compiled (gpu_check.py --parts=attn_grads: sdpa_bias, qk_lift, flex), 40 s
#                          a scheme at most;
#   pairs                  every scheme and preset against rope of its depth (bench.py --parts=pairs), the models no
#                          lease has timed first; RESUME=DIR starts from DIR/pairs.json (call 1's, copied there from
#                          the device tool's files), so that call 2 goes on with the models call 1 did not reach;
#   correct_fla            stick_breaking and wall on their fla kernels: KV cache against the full forward, each
#                          layer's dq, dk, dv against float64 dense (gpu_check.py), 60 s each at most;
#   long                   no-grad forwards at 8L and 16L (bench.py --parts=long);
#   grads_rest             (in neither call) gpu_check.py's gradient check of every scheme and preset;
#   packing                (its own call) tools/packing.py: N train.py runs of config/sweep_gpu.py side by side on
#                          GPU 0 as sweep.py --runs_per_gpu=N packs them, N = 1, 2, 4, 8, plain processes then under
#                          MPS where its daemon starts; a warm-up run first fills the compile cache; synthetic
#                          characters, no network; packing.json after every measurement (PACKING_ARGS appended).
# $OUT ends with at most 8 files, one folder deep: env.txt, lease-CALL.log, train.jsonl, profile.json and a JSON a
# bench, gpu_check or packing stage. BENCH_ARGS, GPU_CHECK_ARGS, PACKING_ARGS and TRAIN_ARGS are appended to every
# bench.py, gpu_check.py, tools/packing.py and train.py command (a CPU dry run: tiny sizes, fewer steps).
set -u
cd "$(dirname "$0")/.."

if [ "${1:-}" = wheels ]; then  # pure-Python wheels; the device has Python 3.12, torch 2.11, triton 3.6
    exec python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
        fla-core==0.6.0 einops==0.8.2
fi
CALL=${1:-}
case "$CALL" in
    first) STAGES="mfu16 attn_time pairs"; LEASE_S=${LEASE_S:-520} ;;
    mfu) STAGES="profile mfu16 mfu64"; LEASE_S=${LEASE_S:-400} ;;
    second) STAGES="grads_routes correct_fla long pairs"; LEASE_S=${LEASE_S:-220} ;;
    '') echo "usage: bash tools/gpu_lease.sh wheels | first | second | mfu | STAGE..." >&2; exit 2 ;;
    *) STAGES="$*"; LEASE_S=${LEASE_S:-540}; CALL=stages ;;
esac
OUT=${OUT:-out-lease}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/lease-$CALL.log") 2>&1
export PYTHONUNBUFFERED=1

if compgen -G '.whl/*.whl' > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
{
    date -u '+%F %T UTC'
    nvidia-smi -L 2>/dev/null || echo 'no nvidia-smi'
    python3 -c 'import torch, kernels; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
"fla", kernels.fla_status())'
    python3 -c 'import triton; print("triton", triton.__version__)' 2>&1 | tail -1
    python3 -c 'import torch; b = torch.backends; print("cudnn", b.cudnn.version(),
"sdpa flash", b.cuda.flash_sdp_enabled(), "cudnn", b.cuda.cudnn_sdp_enabled(),
"efficient", b.cuda.mem_efficient_sdp_enabled())'
    echo "commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null \
        || echo ' + uncommitted changes')"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

limits() {  # LIMIT BUDGET: the stage's limit capped by the time left, and its budget 20 s inside it
    local left=$((LEASE_S - SECONDS))
    LIMIT=$1 BUDGET=$2
    [ "$LIMIT" -gt "$left" ] && LIMIT=$left
    [ "$BUDGET" -gt $((LIMIT - 20)) ] && BUDGET=$((LIMIT - 20))
}

stage() {  # SCRIPT NAME LIMIT BUDGET ARGS...: bench.py, gpu_check.py or tools/packing.py within LIMIT s, nothing
           # started after BUDGET s, into $OUT/NAME.json (bench.py's and packing's resumed: from themselves, or from
           # $RESUME/NAME.json)
    local script=$1 name=$2 t0=$SECONDS extra=${GPU_CHECK_ARGS:-}
    limits "$3" "$4"
    shift 4
    if [ "$BUDGET" -lt 10 ]; then
        echo "== $name: not run, $((LEASE_S - SECONDS)) s left of ${LEASE_S}"
        return
    fi
    case $script in
        tools/bench.py) extra=${BENCH_ARGS:-} ;;
        tools/packing.py) extra=${PACKING_ARGS:-} ;;
    esac
    if [ "$script" != tools/gpu_check.py ] && [ -n "${RESUME:-}" ] && [ -f "$RESUME/$name.json" ] \
            && [ ! -f "$OUT/$name.json" ]; then
        cp "$RESUME/$name.json" "$OUT/$name.json" && echo "== $name: on from $RESUME/$name.json"
    fi
    echo "== $name: up to ${LIMIT} s, from $(date -u +%T)"
    timeout -s INT -k 10 "$LIMIT" python3 "$script" --json="$OUT/$name.json" --budget="$BUDGET" "$@" $extra
    echo "== $name: exit $? after $((SECONDS - t0)) s"
}
check() { stage tools/gpu_check.py "$@"; }
bench() { stage tools/bench.py "$@"; }

synth() {  # GPT-2-sized random tokens for train.py (the GPU machine reaches no corpus): /tmp/synth
    [ -f /tmp/synth/val.bin ] || python3 -c "import numpy as np, os; os.makedirs('/tmp/synth', exist_ok=True)
g = np.random.default_rng(0)
for f, n in (('train.bin', 2**25), ('val.bin', 2**20)):
    g.integers(0, 50257, n, dtype=np.uint16).tofile(f'/tmp/synth/{f}')"
}

train() {  # NAME LIMIT ARGS...: train.py config/gpt2_124m.py on /tmp/synth within LIMIT s (capped by the time left);
           # its metrics.jsonl lines go to $OUT/train.jsonl under "stage": NAME, its profile.json to $OUT/NAME.json
    local name=$1 limit=$2 left=$((LEASE_S - SECONDS)) t0=$SECONDS
    shift 2
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 40 ]; then
        echo "== $name: not run, ${left} s left of ${LEASE_S}"
        return
    fi
    synth
    echo "== $name: up to ${limit} s, from $(date -u +%T)"
    rm -rf "/tmp/run-$name"
    timeout -s INT -k 20 "$limit" python3 train.py config/gpt2_124m.py --data_dir=/tmp/synth \
        --out_dir="/tmp/run-$name" --wandb_log=False --final_eval=False --eval_tokens=8192 --eval_mults=[1] \
        --compile=True "$@" ${TRAIN_ARGS:-}
    echo "== $name: exit $? after $((SECONDS - t0)) s"
    python3 -c "import json, sys
for line in open('/tmp/run-$name/metrics.jsonl'):
    print(json.dumps({'stage': '$name', 'args': sys.argv[1:], **json.loads(line)}))" "$@" >> "$OUT/train.jsonl"
    [ -f "/tmp/run-$name/profile.json" ] && cp "/tmp/run-$name/profile.json" "$OUT/$name.json"
}

# the bias family (attn_time, with the gpt_oss preset; xl has no bias to time there), and the order of the schemes'
# pairs (bench.py times the presets after them): those whose route no lease has timed first (grape_a, fire, xl,
# deberta, shaw and cope on sdpa_bias), then the fla schemes (never timed in one graph), then the rest of the bias
# family, then every other scheme
BIAS=deberta,shaw,grape_a,fire,sandwich,t5,kerple_log,kerple_power,alibi
FIRST=grape_a,fire,xl,deberta,shaw,cope,fox,path,path_fox,stick_breaking,wall,$BIAS
ORDER=$(python3 -c "import sys, positional; first = sys.argv[1].split(',')
print(','.join(dict.fromkeys(first + sorted(positional.REGISTRY))))" "$FIRST")
for s in $STAGES; do
    case $s in
        profile) train profile 150 --batch_size=16 --gradient_accumulation_steps=1 --max_iters=9 --profile=3 \
                     --log_interval=1 ;;
        mfu16) train mfu16 110 --max_iters=10 --log_interval=5 ;;
        mfu64) train mfu64 120 --batch_size=64 --gradient_accumulation_steps=8 --max_iters=10 --log_interval=5 ;;
        attn_time) bench attn_time 150 120 --parts=attn_time --schemes=$BIAS --presets=gpt_oss --scheme_limit=40 ;;
        pairs) bench pairs $((LEASE_S - SECONDS)) $((LEASE_S - SECONDS - 60)) --parts=pairs --schemes=$ORDER \
                   --presets=all --scheme_limit=75 ;;
        grads_routes) check grads_routes 150 130 --schemes=shaw,t5,deberta,cope,grape_a,fire,xl,alibi \
                          --presets= --parts=attn_grads --scheme_limit=40 ;;
        correct_fla) check correct_fla 130 110 --schemes=stick_breaking,wall --presets= --parts=correct,attn_grads \
                         --scheme_limit=60 ;;
        long) bench long 100 80 --parts=long --schemes=rope,xl,fire --presets= --scheme_limit=40 ;;
        grads_rest) check grads_rest 300 270 --schemes=all --presets=all --parts=correct,attn_grads --scheme_limit=40 ;;
        packing) stage tools/packing.py packing $((LEASE_S - SECONDS)) $((LEASE_S - SECONDS - 30)) --limit=150 ;;
        *) echo "unknown stage $s" ;;
    esac
done
echo "== lease stages done after $SECONDS s; files: $(ls "$OUT" | tr '\n' ' ')"
