"""
Train a nanoPE GPT. Single process:
  python train.py config/rope.py
DDP (gloo on CPU, nccl on CUDA):
  torchrun --standalone --nproc_per_node=2 train.py config/rope.py
Any global below can be set by a config file or `--key=value` (nanoGPT style, see
configurator.py); unknown keys, values of the wrong type and values out of range are errors.
"""
import gc
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import attention
import kernels
import layers
import runtime
import tasks
from checkpoint import (atomic_save, check_writable, init_model, load_shared, load_weights, lock_out_dir, name_groups,
                        read_meta, resolve_init, restore_rng, rng_states, trim_metrics)
from configurator import configure
from console import exit_on_ctrl_c
from evaluation import Interrupted, eval_lengths, final_suite
from files import link_or_copy, open_append

# -----------------------------------------------------------------------------
# defaults: the small CPU model; config/*.py files only change the scheme
out_dir = 'out'
eval_interval = 250
log_interval = 10
eval_only = False
dry_run = False           # print the resolved config as JSON and exit (how sweep.py learns the defaults)
always_save_checkpoint = True
init_from = 'scratch'     # 'scratch' | 'resume' (from out_dir) | path to a ckpt.pt to fine-tune from
                          # | 'gpt2', 'gpt2-medium', ... or a save_pretrained folder: Hugging Face GPT-2 weights
# logging
wandb_log = True          # offline mode automatically when there is no login
wandb_project = 'nanoPE'
wandb_run_name = ''       # default: the scheme name
wandb_group = ''          # a sweep's wandb group (sweep.py sets it): runs named NAME-sSEED, job type 'lm' or the task
# data
dataset = 'shakespeare_char'
data_dir = ''             # default: data/<dataset>
task = ''                 # an algorithmic task of tasks.py (e.g. 'copy') instead of the corpus: loss on the
task_n = 0                # answer only, sizes U(1..task_n) (0: tasks.DEFAULT_N), evaluated up to 4x task_n
positions = 'plain'       # task runs: 'plain' 0..T-1 | 'randomized' (a sorted random subset of [0, pos_max),
pos_max = 0               # Ruoss et al.) | 'offset' (0..T-1 + k); pos_max 0: 4x the longest evaluated sequence
gradient_accumulation_steps = 1  # global batch = gradient_accumulation_steps * batch_size sequences,
batch_size = 32           # the same on any number of ranks (split as evenly as the sizes allow);
                          # no rank runs a micro-step of more than batch_size sequences
block_size = 128          # the training length L
# model
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False
pos_encoding = 'rope'
pos_options = {}
rope_scaling = None       # run-time RoPE context extension (rope_scaling.py)
# the layer plan's per-layer keys, each a value for every layer or {layer index or layer type: value}:
# layer_types, nope_layers, layer_options, attn_scaling, sliding_window, attention_chunk_size, qk_norm,
# sink_logits, canon_set, canon_kernel (defaults and meanings: layers.PlanKeys)
globals().update(vars(layers.PlanKeys()))
attn_backend = 'auto'      # 'auto' | 'flex' | 'dense' | 'fla' (docs/speed.md#fla-kernels)
# optimizer
learning_rate = 2e-3
max_iters = 1000
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
decay_lr = True
warmup_iters = 50
lr_decay_iters = 0        # 0: = max_iters
min_lr = 2e-4
# evaluation at and past the training length
eval_mults = [1, 2, 4, 8]
eval_tokens = 32768       # tokens scored per length
final_eval = True         # at the end: eval.py's full suite (sliding, by position, last k) -> out_dir/eval.json
final_eval_mults = [1, 2, 4, 8, 16]
final_eval_tokens = 0     # tokens per length in the final suite; 0: as the periodic evaluations
# system
device = 'auto'           # 'auto' | 'cpu' | 'cuda' | 'cuda:0' ...
dtype = 'auto'            # 'auto' (bf16 on CUDA if supported, else float32) | 'float32' | 'bfloat16' | 'float16'
compile = True
seed = 1337
profile = 0               # N > 0: torch.profiler records iterations 5..4+N (compiled and warm by then; rank 0) ->
                          # out_dir/profile.json (the step's time, its kernels and host operators) and a Chrome trace
ddp_timeout = 600.0       # DDP: seconds a rank waits in a collective before it gives up on the others; must
                          # outlast rank 0's longest solo phase (an evaluation plus a save), see docs/reliability.md
# -----------------------------------------------------------------------------
RULES = dict(batch_size='>0', block_size='>0', task_n='>=0', pos_max='>=0',
             positions=(lambda v: v in ('plain', 'randomized', 'offset'), "'plain', 'randomized' or 'offset'"),
             gradient_accumulation_steps='>0', n_layer='>0', n_head='>0',
             n_embd='>0', max_iters='>=0', eval_interval='>0', log_interval='>0', eval_tokens='>0',
             final_eval_tokens='>=0', learning_rate='>0', min_lr='>=0', warmup_iters='>=0', lr_decay_iters='>=0',
             weight_decay='>=0', grad_clip='>=0', dropout='[0,1)', beta1='[0,1)', beta2='[0,1)', ddp_timeout='>0',
             profile='>=0',
             attn_backend=(lambda v: v in attention.BACKENDS, "'auto', 'flex', 'dense' or 'fla'"))
config_keys = [k for k, v in globals().items() if not k.startswith('_') and k != 'RULES'
               and isinstance(v, (int, float, bool, str, list, dict, type(None)))]
explicit_keys = configure(globals(), sys.argv[1:], RULES, keys=config_keys)
config = {k: globals()[k] for k in config_keys}
if dry_run:
    print(json.dumps({k: v for k, v in config.items() if k != 'dry_run'}))
    sys.exit(0)
exit_on_ctrl_c('train.py', 'it had not started training; run it again')  # until RunControl takes the signals
master = int(os.environ.get('RANK', 0)) == 0  # rank 0 (torchrun sets RANK) writes, saves and prints
# one writer per out_dir (rank 0 holds the lock; a killed run releases it), and a place we can write to
if master:
    check_writable(out_dir)
    lock_out_dir(out_dir, 'train.py')
# init_from: 'resume' continues the run in out_dir (every key not set explicitly comes from its
# checkpoint); a path to a .pt fine-tunes its weights; 'gpt2'... starts from Hugging Face GPT-2
ckpt, ckpt_path = resolve_init(config, explicit_keys, master)
globals().update(config)
if task:  # an algorithmic task instead of a corpus: the model's L is its longest training sequence
    if task not in tasks.TASKS:
        sys.exit(f"unknown task {task!r}; tasks: {', '.join(tasks.TASKS)}")
    if task_n > tasks.MAX_N:
        sys.exit(f"task_n={task_n} is too large: runs are evaluated up to 4 x task_n, and past task_n="
                 f"{tasks.MAX_N} that is sequences no CPU or GPU memory holds; use task_n <= {tasks.MAX_N}")
    task_n = config['task_n'] = task_n or tasks.DEFAULT_N[task]
    block_size = config['block_size'] = tasks.max_len(task, task_n) - 1
    pos_max = config['pos_max'] = pos_max or 4 * tasks.max_len(task, 4 * task_n)
elif positions != 'plain':
    sys.exit(f"positions={positions!r} is a training option of the algorithmic tasks (set task=...)")
# -----------------------------------------------------------------------------
# DDP setup: torchrun sets RANK/WORLD_SIZE
ddp = int(os.environ.get('RANK', -1)) != -1
if ddp and device in ('auto', 'cuda') and torch.cuda.is_available():
    device = f'cuda:{int(os.environ["LOCAL_RANK"])}'
    torch.cuda.set_device(device)
try:
    rt = runtime.setup(device, dtype)
except ValueError as e:
    sys.exit(f"bad device/dtype: {e}")
device, device_type, dtype, autocast = rt.device, rt.device_type, rt.dtype, rt.autocast
ptdtype = rt.ptdtype
# under DDP: the process group (ddp_timeout per collective), and a lost rank ends the others with one line
control = runtime.RunControl(ddp, device_type, ddp_timeout, out_dir, saved=lambda: globals().get('last_saved'))
rank, world_size = control.rank, control.world_size
config['world_size'] = world_size  # saved in each checkpoint's config, so a resume can tell a changed world size
# The global batch (rows of block_size tokens) is split over the ranks as evenly as the sizes allow,
# and each rank's share into micro-steps of at most batch_size rows. Each micro-step's mean loss is
# weighted by its share of the global batch's targets (x world_size, since DDP averages gradients
# over ranks), so any number of ranks computes the single-process gradient of the same batch.
rows = gradient_accumulation_steps * batch_size
try:
    row0, micro = runtime.split_batch(rows, world_size, rank, batch_size)  # this rank's first row, micro-step sizes
except ValueError as e:
    sys.exit(f"{e} (gradient_accumulation_steps={gradient_accumulation_steps} x batch_size={batch_size}): "
             f"raise one of them")
accum = len(micro)
tokens_per_iter = rows * block_size
torch.manual_seed(seed)
if master:
    os.makedirs(out_dir, exist_ok=True)
    print(f"tokens per iteration: {tokens_per_iter:,} (global batch {rows} x {block_size}; "
          + (f"{world_size} ranks of {rows // world_size}-{-(-rows // world_size)} rows, rank 0 in "
             f"{accum} micro-step(s) of {micro[0]})" if ddp else f"{accum} micro-step(s) of {micro[0]} rows)")
          + f"; {device}, {dtype}")
# A smoke run (max_iters < eval_interval: evaluated only at the start and the end) checks that things run:
# its barely trained model needs no precise numbers, nor do its few steps repay torch.compile (12-60 s per
# scheme on a cold CPU cache, for a step 0.5-1.3x the eager one: docs/speed.md). It says what it changes.
smoke = []
if max_iters < eval_interval and not task and 'eval_tokens' not in explicit_keys and eval_tokens > 2048:
    smoke.append(f"evaluations on 2048 tokens per length instead of {eval_tokens} (--eval_tokens=N to choose)")
    eval_tokens = 2048
if max_iters < eval_interval and 'compile' not in explicit_keys and compile:
    smoke.append("not compiled (--compile=True to compile)")
    compile = False
if smoke and master:
    print(f"smoke run (max_iters={max_iters} < eval_interval={eval_interval}): " + '; '.join(smoke))

# data: the default corpus is prepared on first use
default_data_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', dataset)
data_dir = '' if task else (data_dir or default_data_dir)
config['data_dir'] = data_dir
missing = [f for f in ('train.bin', 'val.bin') if not task and not os.path.exists(os.path.join(data_dir, f))]
if missing:
    prep = os.path.join(default_data_dir, 'prepare.py')
    # auto-prepare only where the script writes (its own folder), never into a user's data_dir
    if not os.path.exists(prep) or os.path.abspath(data_dir) != default_data_dir:
        sys.exit(f"no {' or '.join(missing)} in {data_dir}; prepare the data first"
                 + (f": python {os.path.relpath(prep)} (writes {os.path.relpath(default_data_dir)}), or"
                    if os.path.exists(prep) else ';')
                 + f" for your own text: python data/shakespeare_char/prepare.py --input FILE --out_dir {data_dir}")
    if master:
        print(f"{data_dir}/train.bin missing: running {prep}")
        subprocess.run([sys.executable, prep], check=True)
    if ddp:
        dist.barrier()
# the vocabulary (char) or tiktoken encoding: saved in every checkpoint
meta = {'vocab_size': tasks.vocab_size, 'stoi': tasks.stoi, 'itos': tasks.itos} if task else read_meta(data_dir)
vocab_size = meta['vocab_size'] if meta else None
for f in [] if task else ['train.bin', 'val.bin']:  # np.memmap cannot map these; say what is wrong
    size = os.path.getsize(os.path.join(data_dir, f))
    if size == 0 or size % 2:
        sys.exit(f"{data_dir}/{f} " + ("is empty" if size == 0 else f"has {size} bytes, not a whole number of uint16 "
                 f"tokens (cut short or not a token file)") + ": re-run the prepare script that made it "
                 f"(for your own text: python data/shakespeare_char/prepare.py --input FILE --out_dir {data_dir})")
train_data = None if task else np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')
val_data = None if task else np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')
if val_data is not None and vocab_size and len(val_data) and val_data.max() >= vocab_size:
    sys.exit(f"{data_dir}/val.bin holds token id {int(val_data.max())}, past the vocabulary of {vocab_size} in "
             f"{data_dir}/meta.json: the two files come from different preparations; re-run the prepare script")


def get_batch(it):
    """This rank's micro-batches for iteration `it` -> (x, y, weight). The global batch is
    drawn from a generator seeded by (seed, it) and split across ranks and micro-steps, so
    any number of ranks sees the same global batch (DDP == single process) and a resumed
    run sees the same data as an uninterrupted one. weight = the micro-step's share of the
    global batch's targets x world_size (exactly 1.0 for one process, one micro-step)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + it)
    if task:  # the whole global batch (cheap), padded to block_size; weights by answer tokens
        rng = np.random.default_rng([seed, it])
        X, Y, _ = tasks.make_batch(task, tasks.train_sizes(rows, task_n, rng), rng)
        X = torch.nn.functional.pad(X, (0, block_size - X.size(1)), value=tasks.PAD_ID)
        Y = torch.nn.functional.pad(Y, (0, block_size - Y.size(1)), value=-1)
        targets = int((Y != -1).sum())
    else:
        ix = torch.randint(len(train_data) - block_size - 1, (rows,), generator=g)
    start = row0
    for n in micro:
        if task:
            x, y = X[start:start + n], Y[start:start + n]
            weight = int((y != -1).sum()) * world_size / targets
        else:
            sel = ix[start:start + n].tolist()
            x = torch.stack([torch.from_numpy(train_data[i:i + block_size].astype(np.int64)) for i in sel])
            y = torch.stack([torch.from_numpy(train_data[i + 1:i + 1 + block_size].astype(np.int64)) for i in sel])
            top = max(int(x.max()), int(y.max()))
            if vocab_size and top >= vocab_size:  # checked here, on the CPU: train.bin may be too big to scan
                sys.exit(f"{data_dir}/train.bin holds token id {top}, past the vocabulary of {vocab_size} in "
                         f"{data_dir}/meta.json: the two files come from different preparations; re-run the prepare "
                         f"script")
            weight = n * world_size / rows
        start += n
        if device_type == 'cuda':  # pinned memory: the copy runs asynchronously, no host sync
            x, y = x.pin_memory(), y.pin_memory()
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True), weight


def train_positions(it):
    """Positions of iteration `it` for a task run's position trick (None: 0..T-1), the same on
    every rank and micro-step, and again on resume."""
    if positions == 'plain':
        return None
    g = torch.Generator().manual_seed(seed * 7919 + it)
    pos = (tasks.randomized_positions(block_size, pos_max, g) if positions == 'randomized'
           else tasks.random_offset(block_size, pos_max - block_size, g))
    return pos.to(device)


def run_eval():
    """The periodic evaluation (a corpus: loss at eval_mults x L; a task: answer loss and exact
    match in and out of distribution) -> {'val/loss@1L': ..., ...}."""
    if not task:
        return eval_lengths(raw_model, val_data, block_size, tuple(eval_mults), tokens=eval_tokens,
                            device=device, ctx=autocast, stop=control.stopping)
    r = tasks.evaluate(raw_model, task, task_n, device, autocast, stop=control.stopping, reps=8)
    if not r['complete']:
        raise Interrupted
    return {'val/loss@1L': r['loss_id'], 'val/exact@id': r['exact_id'], 'val/exact@ood': r['exact_ood']}


# model
# GPT-2 BPE's 50257 tokens are padded to 50304 (nanoGPT's GPU speedup); a char vocab (84) stays as it is
model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=bias,
                  vocab_size=vocab_size or 50304, vocab_multiple=64 if (vocab_size or 50304) > 1024 else 1,
                  dropout=dropout, pos_encoding=pos_encoding, pos_options=pos_options, rope_scaling=rope_scaling,
                  attn_backend=attn_backend, **{k: globals()[k] for k in layers.PLAN_KEYS})
# resume: the checkpoint's vocabulary; fine-tune: its shape at this run's length; gpt2: GPT-2's shape;
# refused if it cannot address block_size (or a task's pos_max)
model, model_args = init_model(ckpt, ckpt_path, model_args, vocab_size, config, explicit_keys, master)
for k in [k for k in model_args if k in config]:
    config[k] = globals()[k] = model_args[k]
max_len = model.pe.max_len
eval_T = max([m * block_size for m in eval_mults if max_len is None or m * block_size <= max_len] or [block_size])
for name, data, need in [] if task else (('train', train_data, block_size + 2), ('val', val_data, eval_T + 1)):
    if len(data) < need:  # too short to draw one window (train) or to evaluate at the longest length (val)
        sys.exit(f"{data_dir}/{name}.bin has {len(data)} tokens, fewer than the {need} needed for block_size="
                 f"{block_size}" + (f" and evaluation at {eval_T} tokens" if name == 'val' else '')
                 + ": use a longer corpus or a smaller block_size" + (" or eval_mults" if name == 'val' else ''))
if init_from == 'resume':
    load_weights(model, ckpt['model'], ckpt_path)
elif ckpt is not None:  # a fine-tune may change the scheme or the layer plan: say what it kept
    kept, dropped, fresh = load_shared(model, ckpt['model'], ckpt_path)
    if master:
        print(f"fine-tune weights: kept {len(kept)}" + (" (all)" if not dropped and not fresh else '')
              + (f"; dropped {', '.join(name_groups(dropped))}" if dropped else '')
              + (f"; started fresh {', '.join(name_groups(fresh))}" if fresh else ''))
model.to(device)
if master:
    print(f"scheme {pos_encoding}: {model.get_num_params() / 1e6:.2f}M parameters, "
          f"rope_scaling={model_args['rope_scaling']}; layer plan:")
    for line in model.plan_lines(device, ptdtype, batch_size, block_size):
        print('  ' + line)
    for line in kernels.fla_notes([block.attn.fla_note for block in model.transformer.h], device):
        print(line)
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
# float16 needs loss scaling against gradient underflow; a no-op for float32/bfloat16
scaler = torch.amp.GradScaler(device_type, enabled=(ptdtype == torch.float16))
iter_num, best_val_loss, resume_state = 0, 1e9, {}
if init_from == 'resume':
    optimizer.load_state_dict(ckpt['optimizer'])
    if ckpt.get('scaler'):
        scaler.load_state_dict(ckpt['scaler'])
    iter_num, best_val_loss = ckpt['iter_num'], ckpt['best_val_loss']
    resume_state = {k: ckpt.get(k) for k in ('rng', 'wandb_id')}
ckpt = None
raw_model = model
if compile:
    model = torch.compile(model)
if ddp:
    model = DDP(model, device_ids=[int(os.environ['LOCAL_RANK'])] if device_type == 'cuda' else None)


def get_lr(it):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters."""
    decay_iters = lr_decay_iters or max_iters
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / max(1, decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def save_checkpoint(best=False):
    """Write out_dir/ckpt.pt atomically with everything an exact resume needs; with best=True
    point ckpt_best.pt at it too (a hard link, so no second write; a copy where links fail).
    Refuses non-finite weights, so a diverged run never replaces the last good checkpoint.
    Returns None, or why it did not save."""
    if not all(torch.isfinite(p).all() for p in raw_model.parameters()):
        return f"non-finite weights at iter {iter_num}"
    ckpt = {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(), 'scaler': scaler.state_dict(),
            'model_args': model_args, 'iter_num': iter_num, 'best_val_loss': best_val_loss, 'config': config,
            # (training reseeds every iteration from (seed, iter, rank); the states are kept for eval-only runs)
            'rng': rng_states(device_type),
            'wandb_id': wandb_run.id if wandb_run is not None else None, 'meta': meta}
    path = os.path.join(out_dir, 'ckpt.pt')
    try:
        atomic_save(ckpt, path)  # removes its temp file if the write fails; the old ckpt.pt stays
    except OSError as e:
        return f"saving {path} failed: {e.strerror or e}"
    if best:
        link_or_copy(path, os.path.join(out_dir, 'ckpt_best.pt'))  # the next save of ckpt.pt writes a new file
    return None


def log_metrics(d):
    with open_append(os.path.join(out_dir, 'metrics.jsonl')) as f:
        f.write(json.dumps(d) + '\n')
    if wandb_run is not None:
        wandb_run.log(d, step=d['iter'])


if master:  # a new run starts a fresh metrics.jsonl; a resumed one drops what was logged after its checkpoint
    trim_metrics(os.path.join(out_dir, 'metrics.jsonl'), iter_num if init_from == 'resume' else None)
run_name = (wandb_run_name or pos_encoding) + (f'-s{seed}' if wandb_group else '')  # a sweep's runs: one per seed
wandb_run = runtime.wandb_init(wandb_project, run_name, config, out_dir, resume_state.get('wandb_id'), wandb_group,
                               task or 'lm') if wandb_log and master else None
peak_flops = runtime.peak_flops('cuda', gpu=runtime.device_name(rt))[0] if device_type == 'cuda' else None  # one GPU's

# -----------------------------------------------------------------------------
# Runs that survive: SIGTERM/SIGINT only set a flag, so the loop finishes its iteration (an evaluation
# stops at its next batch), saves ckpt.pt and exits 0; under DDP every rank stops at the same iteration.
control.catch_signals()
pending = []  # (iter, loss tensor) since the last check: read with one sync at log steps and before saves


def check_losses():
    """Global mean loss of each pending iteration (all-reduced, so every rank reaches the
    same verdict), and a message naming the first non-finite one, or None."""
    if not pending:
        return [], None
    its = [i for i, _ in pending]
    vals = torch.stack([l for _, l in pending])
    pending.clear()
    if ddp:  # the global mean loss, identical to a single process on the same batch
        dist.all_reduce(vals, op=dist.ReduceOp.AVG)
    vals = vals.tolist()
    bad = [(i, v) for i, v in zip(its, vals) if not math.isfinite(v)]
    return vals, (f"train loss is {bad[0][1]} at iter {bad[0][0]}" if bad else None)


if resume_state.get('rng'):  # restored last: building the model above drew from the RNG
    restore_rng(resume_state['rng'], device_type)
profiler = runtime.StepProfile(out_dir, iter_num + 5, profile, device_type) if profile and master else None
last_saved = resumed_at = iter_num if init_from == 'resume' else None
failure, stopped, res, t_train = None, False, None, None
t0 = time.time()
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for group in optimizer.param_groups:
        group['lr'] = lr

    bad = None
    # a resumed run skips the eval at its first step: it ran before that checkpoint was saved
    if (iter_num % eval_interval == 0 or iter_num == max_iters or eval_only) and (iter_num != resumed_at or eval_only):
        _, bad = check_losses()
        if master and bad is None:
            raw_model.eval()
            te = time.time()
            try:
                res = run_eval()
            except Interrupted:  # a signal: no numbers for this eval; the stop below saves the weights
                res = None
                print(f"eval @ iter {iter_num} interrupted", flush=True)
            raw_model.train()
        if master and bad is None and res is not None:
            print(f"eval @ iter {iter_num}: " + ', '.join(f"{k.split('/')[1]} {v:.4f}" for k, v in res.items()
                                                          if v is not None)
                  + f"  ({time.time() - te:.1f}s)")
            log_metrics({'iter': iter_num, 'lr': lr, **res})
            val_loss = res['val/loss@1L']
            if not math.isfinite(val_loss):  # (past L a scheme may blow up; that is a result, not a failure)
                bad = f"val loss is {val_loss} at iter {iter_num}"
            elif iter_num > 0 and not eval_only and (val_loss < best_val_loss or always_save_checkpoint):
                improved = val_loss < best_val_loss
                best_val_loss = min(best_val_loss, val_loss)
                bad = save_checkpoint(best=improved)
                if bad is None:
                    last_saved = iter_num
                    print(f"saved checkpoint to {out_dir}/ckpt.pt" + (" and ckpt_best.pt" if improved else ''))
        if control.any_rank(bad is not None):
            failure = bad or "non-finite loss or weights on rank 0"
            break
        t0 = time.time()
    if eval_only:
        break
    if control.stop_agreed():
        stopped = True
        _, failure = check_losses()
        if failure is None and master:
            if last_saved != iter_num:  # (else ckpt.pt already holds this state)
                failure = save_checkpoint()
            if failure is None:
                why = control.stopping() or 'a signal to another rank'
                print(f"stopped by {why} at iter {iter_num}: saved {out_dir}/ckpt.pt; continue the run with "
                      f"--init_from=resume" + (" (it runs the final evaluation)" if iter_num >= max_iters else ''),
                      flush=True)
        break
    if iter_num >= max_iters:
        break

    t_train = t_train or time.time()  # startup ends where the first training step starts
    if profiler and (p := profiler.step(iter_num)):
        print(f"profile of {p['iterations']} iterations: {p['wall_ms_per_iter']:.1f} ms each, "
              + (f"the device busy {p['device_busy_ms_per_iter']:.1f} ms of it; " if p['device_busy_ms_per_iter']
                 else '') + f"{out_dir}/profile.json, {out_dir}/profile_trace.json")
    # dropout's randomness: a seed per (run, iteration, rank), so ranks draw different masks (as
    # nanoGPT's per-rank seed offset) and a resumed run draws exactly what it would have
    torch.manual_seed(seed * 1_000_003 + iter_num * 1009 + rank)
    loss_sum = torch.zeros((), device=device)
    pos = train_positions(iter_num)
    for micro_step, (X, Y, weight) in enumerate(get_batch(iter_num)):
        if ddp:  # all-reduce gradients only on the last micro-step (forward and backward)
            model.require_backward_grad_sync = micro_step == accum - 1
        with autocast:
            _, loss = model(X, Y, pos=pos, n_pos=pos_max if pos is not None else None)
            loss = loss * weight
        scaler.scale(loss).backward()
        loss_sum += loss.detach()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    iter_num += 1
    pending.append((iter_num, loss_sum))
    if iter_num % log_interval == 0:
        vals, failure = check_losses()
        if failure:
            break
        t1 = time.time()
        dt = (t1 - t0) / log_interval
        t0 = t1
        if master:
            tps = tokens_per_iter / dt
            # per GPU: this rank's share of the global batch against one GPU's peak
            mfu = raw_model.estimate_mfu(rows / world_size, dt, peak_flops) if peak_flops else None
            print(f"iter {iter_num}: loss {vals[-1]:.4f}, {dt * 1000:.1f} ms/iter, {tps:,.0f} tok/s"
                  + (f", mfu {mfu * 100:.1f}%" if mfu else ''))
            log_metrics({'iter': iter_num, 'train/loss': vals[-1], 'lr': lr, 'ms_per_iter': dt * 1000,
                         'tokens_per_s': tps, **({'mfu': mfu} if mfu else {})})

control.finish()
t_end = time.time()
t_train = t_train or t_end  # iters_trained: by this process (a resumed run trains only the rest)
timing = {'startup_s': round(t_train - runtime.process_start(), 3), 'train_s': round(t_end - t_train, 3),
          'iters_trained': iter_num - (resumed_at or 0)}
if master and final_eval and iter_num >= max_iters and not stopped and not failure:  # the full suite, once
    # eval.json's first keys; routes: the route each layer's attention took (model.routes)
    head = dict(scheme=pos_encoding, name=wandb_run_name or pos_encoding, seed=seed, rope_scaling=rope_scaling,
                iter=iter_num, out_dir=out_dir,
                routes=raw_model.routes(device, grad=False, dtype=ptdtype))
    failure = final_suite(raw_model, out_dir, head, val_data, block_size, final_eval_mults,
                          final_eval_tokens or eval_tokens, task, task_n, positions, pos_max, device, autocast,
                          control.stopping, wandb_run, timing)
elif master and final_eval and stopped and iter_num >= max_iters:
    print(f"final eval not run (stopped): python train.py --out_dir={out_dir} --init_from=resume runs it")
if wandb_run is not None:
    wandb_run.finish()
if ddp:
    # Tear down in this order: with the DDP wrapper alive at interpreter exit, gloo
    # aborted one rank in 3-30% of runs ("terminate called without an active exception").
    del model, raw_model, optimizer
    gc.collect()
    dist.destroy_process_group()
if failure:  # every rank exits 1; rank 0 says why
    good = f": {out_dir}/ckpt.pt (iter {last_saved}) is the last good checkpoint" if last_saved is not None else ''
    sys.exit(f"stopping: {failure}. Nothing was saved after it" + good
             + ". Fix: lower learning_rate, raise warmup_iters, keep grad_clip > 0, or train in bfloat16/float32 "
               "rather than float16; then --init_from=resume" if master else 1)
