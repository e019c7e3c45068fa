#!/usr/bin/env bash
# The measurements of docs/gpu.md's "Next lease", in priority order, for one lent GPU (15 minutes of device time,
# at most 600 s a command): each stage is one gpu_check.py process under its own time limit, and writes its JSON
# under $OUT (the device tool's folder; out-lease/ where OUT is unset) after every model, so a stage cut short keeps
# what it measured. Two calls of the device tool, carrying .whl (fla-core and einops, which the GPU image lacks):
#
#   bash docs/gpu_lease.sh wheels    # here, once: download the wheels into .whl/ (git-ignored)
#   bash docs/gpu_lease.sh first     # call 1, timeout_s=600: correct_fla, pairs_fla, pairs_bias in 540 s
#   bash docs/gpu_lease.sh second    # call 2, timeout_s=240: pairs_rest, mfu in 170 s
#   bash docs/gpu_lease.sh STAGE...  # any stages by name, in LEASE_S seconds (default 540)
#
# Stages: correct_fla (fla-routed schemes: KV cache vs full forward, each layer's dq, dk, dv against float64 dense),
# pairs_fla, pairs_bias, pairs_rest (rope/model step pairs by goal class, presets included: gpu_check.py --pairs;
# pairs_fla with each model on 'auto', its default: wall on nanoPE's wall_scores, the others on fla's kernels),
# mfu (rope alone at gpt2_124m's micro-batch, 16 x 1024); in neither call: grads_rest (the gradient check of the
# other classes), long (rope's and fire's no-grad forwards at 8L and 16L: fire's bias as a table per query chunk),
# attn_time (each bias scheme's first layer timed as built, frozen, as one table and without its bias).
# GPU_CHECK_ARGS is appended to every gpu_check.py command (a CPU dry run: tiny sizes, fewer steps).
set -u
cd "$(dirname "$0")/.."

if [ "${1:-}" = wheels ]; then  # pure-Python wheels; the device has Python 3.12, torch 2.11, triton 3.6
    exec python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
        fla-core==0.6.0 einops==0.8.2
fi
case "${1:-}" in
    first) STAGES="correct_fla pairs_fla pairs_bias"; LEASE_S=${LEASE_S:-540} ;;
    second) STAGES="pairs_rest mfu"; LEASE_S=${LEASE_S:-170} ;;
    '') echo "usage: bash docs/gpu_lease.sh wheels | first | second | STAGE..." >&2; exit 2 ;;
    *) STAGES="$*"; LEASE_S=${LEASE_S:-540} ;;
esac
OUT=${OUT:-out-lease}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/lease.log") 2>&1
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
    python3 -c 'import torch; b = torch.backends; print("cudnn", b.cudnn.version(), "sdpa flash", b.cuda.flash_sdp_enabled(),
"cudnn", b.cuda.cudnn_sdp_enabled(), "efficient", b.cuda.mem_efficient_sdp_enabled())'
    echo "commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' + uncommitted changes')"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

stage() {  # NAME LIMIT BUDGET ARGS...: gpu_check.py within LIMIT s (capped by the time left), no model started
           # after BUDGET s, its JSON $OUT/NAME.json
    local name=$1 limit=$2 budget=$3 left=$((LEASE_S - SECONDS)) t0=$SECONDS
    shift 3
    [ "$limit" -gt "$left" ] && limit=$left
    [ "$budget" -gt $((limit - 20)) ] && budget=$((limit - 20))
    if [ "$budget" -lt 10 ]; then
        echo "== $name: not run, ${left} s left of ${LEASE_S}"
        return
    fi
    echo "== $name: up to ${limit} s, from $(date -u +%T)"
    timeout -s INT -k 10 "$limit" python3 gpu_check.py --json="$OUT/$name.json" --budget="$budget" "$@" \
        ${GPU_CHECK_ARGS:-}
    echo "== $name: exit $? after $((SECONDS - t0)) s"
}

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
        --out_dir="/tmp/run-$name" --wandb_log=False --final_eval=False --eval_tokens=8192 --eval_mults=[1] --compile=True "$@" ${TRAIN_ARGS:-}
    echo "== $name: exit $? after $((SECONDS - t0)) s"
    python3 -c "import json, sys
for line in open('/tmp/run-$name/metrics.jsonl'):
    print(json.dumps({'stage': '$name', 'args': sys.argv[1:], **json.loads(line)}))" "$@" >> "$OUT/train.jsonl"
    [ -f "/tmp/run-$name/profile.json" ] && cp "/tmp/run-$name/profile.json" "$OUT/$name.json"
}

PAIRS="--pairs=True --schemes=all --steps=20 --warmup=2"
# the schemes no lease has timed against rope yet, the relative-position family first
MISSING=t5,kerple_power,sandwich,shaw,xl,cope,learned,none,xpos,sinusoidal,fope,mrope,pope,rope2d,ropepp,selective_rope
MISSING=$MISSING,grape_m
for s in $STAGES; do
    case $s in
        correct_fla) stage correct_fla 130 100 --schemes=all --classes=fla --presets= --parts=correct,attn_grads \
                         --scheme_limit=60 ;;
        pairs_fla) stage pairs_fla 240 170 $PAIRS --schemes=path,wall,fox,path_fox,stick_breaking --presets= \
                       --auto_only=True --scheme_limit=110 ;;
        pairs_bias) stage pairs_bias 400 $((LEASE_S - SECONDS - 60)) $PAIRS --classes=score_mod --presets=all \
                        --scheme_limit=60 ;;
        pairs_rest) stage pairs_rest $((LEASE_S - SECONDS - 60)) $((LEASE_S - SECONDS - 90)) $PAIRS \
                        --classes=no_bias,own_attention --presets=all --scheme_limit=40 ;;
        mfu) stage mfu 60 50 --pairs=True --schemes=rope --presets= --batch_size=16 --steps=30 --warmup=2 ;;
        grads_rest) stage grads_rest 300 270 --schemes=all --classes=no_bias,score_mod,own_attention --presets=all \
                        --parts=correct,attn_grads --scheme_limit=40 ;;
        attn_time) stage attn_time 300 270 --schemes=grape_a,t5,kerple_log,kerple_power,deberta,shaw,fire --presets= \
                       --parts=attn_time --scheme_limit=45 ;;
        profile) train profile 150 --batch_size=16 --gradient_accumulation_steps=1 --max_iters=9 --profile=3 \
                     --log_interval=1 ;;
        mfu16) train mfu16 110 --max_iters=10 --log_interval=5 ;;
        mfu64) train mfu64 120 --batch_size=64 --gradient_accumulation_steps=8 --max_iters=10 --log_interval=5 ;;
        pairs_missing) stage pairs_missing $((LEASE_S - SECONDS - 10)) $((LEASE_S - SECONDS - 40)) $PAIRS \
                           --schemes=$MISSING --scheme_limit=45 \
                           --presets=gpt_oss,gemma3,irope,rnope_swa,sssl ;;
        pairs_main) stage pairs_main $((LEASE_S - SECONDS - 10)) $((LEASE_S - SECONDS - 40)) $PAIRS \
                        --schemes=alibi,t5,kerple_log,fire,shaw,deberta,xl,cope,sandwich,fox,path,stick_breaking \
                        --presets= --auto_only=True --scheme_limit=45 ;;
        long) stage long 200 170 --schemes=rope,fire --presets= --parts=long --scheme_limit=120 ;;
        *) echo "unknown stage $s" ;;
    esac
done
echo "== lease stages done after $SECONDS s; files: $(ls "$OUT" | tr '\n' ' ')"
