"""
Train a nanoPE GPT. Single process:
  python train.py config/rope.py
DDP (gloo on CPU, nccl on CUDA):
  torchrun --standalone --nproc_per_node=2 train.py config/rope.py
Any global below can be set by a config file or `--key=value` (nanoGPT style);
unknown keys and values of the wrong type are errors.
"""
import ast
import gc
import json
import math
import os
import subprocess
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import GPT, GPTConfig
from eval import eval_lengths, evaluate, flat_metrics, log_wandb

# -----------------------------------------------------------------------------
# defaults: the small CPU model; config/*.py files only change the scheme
out_dir = 'out'
eval_interval = 250
log_interval = 10
eval_only = False
always_save_checkpoint = True
init_from = 'scratch'     # 'scratch' | 'resume' (from out_dir) | path to a ckpt.pt to fine-tune from
# logging
wandb_log = True          # offline mode automatically when there is no login
wandb_project = 'nanoPE'
wandb_run_name = ''       # default: the scheme name
# data
dataset = 'shakespeare_char'
data_dir = ''             # default: data/<dataset>
gradient_accumulation_steps = 1  # total over all ranks
batch_size = 32           # per micro-step per rank
block_size = 128          # the training length L
# model
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False
pos_encoding = 'rope'
pos_options = {}
rope_scaling = None
attn_backend = 'auto'
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
# system
device = 'auto'           # 'auto' | 'cpu' | 'cuda' | 'cuda:0' ...
dtype = 'auto'            # 'auto' (bf16 on CUDA if supported, else float32) | 'float32' | 'bfloat16' | 'float16'
compile = True
seed = 1337
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, bool, str, list, dict, type(None)))]


def apply_overrides(argv, g, keys):
    """nanoGPT-style configurator with checks: config files are exec'd, --key=value
    literals are parsed; a key that is not a global above, or a value of another
    type than its default, is an error that names the valid keys."""
    def check(k, v):
        if k not in keys:
            import difflib
            close = difflib.get_close_matches(k, keys, n=3)
            sys.exit(f"unknown config key {k!r}" + (f"; did you mean {', '.join(close)}?" if close else "")
                     + f"\nvalid keys: {', '.join(sorted(keys))}")
        old = g[k]
        if old is not None and v is not None and type(v) is not type(old):
            if not (isinstance(old, float) and type(v) is int):
                sys.exit(f"config key {k!r} expects {type(old).__name__} (default {old!r}), got {v!r} "
                         f"({type(v).__name__})")
            v = float(v)
        g[k] = v
    for arg in argv:
        if not arg.startswith('--'):
            if not os.path.exists(arg):
                sys.exit(f"config file {arg!r} not found; see config/ for the available ones")
            scope = {}
            exec(open(arg).read(), {}, scope)
            for k, v in scope.items():
                if not k.startswith('_'):
                    check(k, v)
        else:
            if '=' not in arg:
                sys.exit(f"bad argument {arg!r}: use --key=value")
            k, val = arg[2:].split('=', 1)
            try:
                v = ast.literal_eval(val)
            except (ValueError, SyntaxError):
                v = val  # a bare string
            check(k, v)


apply_overrides(sys.argv[1:], globals(), config_keys)
config = {k: globals()[k] for k in config_keys}
# -----------------------------------------------------------------------------

# DDP setup: torchrun sets RANK/WORLD_SIZE
ddp = int(os.environ.get('RANK', -1)) != -1
if device == 'auto':
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
if ddp:
    if device.startswith('cuda'):
        device = f'cuda:{int(os.environ["LOCAL_RANK"])}'
        torch.cuda.set_device(device)
    dist.init_process_group(backend='nccl' if device.startswith('cuda') else 'gloo')
    rank, world_size = dist.get_rank(), dist.get_world_size()
else:
    rank, world_size = 0, 1
master = rank == 0
if gradient_accumulation_steps % world_size:
    sys.exit(f"gradient_accumulation_steps={gradient_accumulation_steps} must be divisible by the "
             f"number of ranks ({world_size})")
accum = gradient_accumulation_steps // world_size   # micro-steps per rank
tokens_per_iter = gradient_accumulation_steps * batch_size * block_size
device_type = 'cuda' if device.startswith('cuda') else 'cpu'
if dtype == 'auto':
    dtype = 'bfloat16' if device_type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
autocast = nullcontext() if ptdtype == torch.float32 else torch.autocast(device_type=device_type, dtype=ptdtype)
torch.manual_seed(seed)
if device_type == 'cuda':
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
if master:
    os.makedirs(out_dir, exist_ok=True)
    print(f"tokens per iteration: {tokens_per_iter:,} ({world_size} rank(s) x {accum} micro-steps x "
          f"{batch_size} x {block_size})")

# data: the default corpus is prepared on first use
data_dir = data_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', dataset)
config['data_dir'] = data_dir
if not os.path.exists(os.path.join(data_dir, 'train.bin')):
    prep = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data', dataset, 'prepare.py')
    if not os.path.exists(prep):
        sys.exit(f"no {data_dir}/train.bin and no prepare script {prep}; prepare your data first "
                 f"(e.g. python data/shakespeare_char/prepare.py --input FILE --out_dir {data_dir})")
    if master:
        print(f"{data_dir}/train.bin missing: running {prep}")
        subprocess.run([sys.executable, prep], check=True)
    if ddp:
        dist.barrier()
meta_path = os.path.join(data_dir, 'meta.pkl')
vocab_size = None
if os.path.exists(meta_path):
    import pickle
    with open(meta_path, 'rb') as f:
        vocab_size = pickle.load(f)['vocab_size']
train_data = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')
val_data = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')


def get_batch(it):
    """This rank's micro-batches for iteration `it`. The global batch is drawn from a
    generator seeded by (seed, it) and split across ranks and micro-steps, so any
    number of ranks sees the same global batch (DDP == single process) and a resumed
    run sees the same data as an uninterrupted one."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + it)
    ix = torch.randint(len(train_data) - block_size - 1, (gradient_accumulation_steps * batch_size,), generator=g)
    for m in range(accum):
        rows = ix[(m * world_size + rank) * batch_size:(m * world_size + rank + 1) * batch_size].tolist()
        x = torch.stack([torch.from_numpy(train_data[i:i + block_size].astype(np.int64)) for i in rows])
        y = torch.stack([torch.from_numpy(train_data[i + 1:i + 1 + block_size].astype(np.int64)) for i in rows])
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


# model
model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=bias,
                  vocab_size=vocab_size or 50304, dropout=dropout, pos_encoding=pos_encoding,
                  pos_options=pos_options, rope_scaling=rope_scaling, attn_backend=attn_backend)
iter_num, best_val_loss, ckpt = 0, 1e9, None
if init_from == 'resume' or init_from.endswith('.pt'):
    path = os.path.join(out_dir, 'ckpt.pt') if init_from == 'resume' else init_from
    if not os.path.exists(path):
        sys.exit(f"init_from={init_from!r}: no checkpoint at {path}")
    ckpt = torch.load(path, map_location=device, weights_only=False)
    if init_from == 'resume':   # same run: the architecture comes from the checkpoint
        model_args.update(ckpt['model_args'])
        iter_num, best_val_loss = ckpt['iter_num'], ckpt['best_val_loss']
    else:                       # fine-tune: same weights, this config's length/scaling
        keep = ('block_size', 'rope_scaling', 'attn_backend', 'dropout')
        model_args.update({k: v for k, v in ckpt['model_args'].items() if k not in keep})
        if master:
            print(f"fine-tuning from {path} (trained with block_size={ckpt['model_args']['block_size']}, "
                  f"rope_scaling={ckpt['model_args'].get('rope_scaling')}) at block_size={block_size}, "
                  f"rope_scaling={rope_scaling}")
model = GPT(GPTConfig(**model_args))
if ckpt is not None:
    model.load_state_dict(ckpt['model'])
model.to(device)
if master:
    print(f"scheme {pos_encoding}: {model.get_num_params() / 1e6:.2f}M parameters, "
          f"rope_scaling={model_args['rope_scaling']}")
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
if init_from == 'resume':
    optimizer.load_state_dict(ckpt['optimizer'])
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


def save_checkpoint(path):
    """Atomic: write a temp file, then rename over the old one."""
    ckpt = {'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(), 'model_args': model_args,
            'iter_num': iter_num, 'best_val_loss': best_val_loss, 'config': config}
    tmp = path + '.tmp'
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


def setup_wandb():
    import wandb
    mode = os.environ.get('WANDB_MODE')
    if mode is None:
        logged_in = bool(os.environ.get('WANDB_API_KEY'))
        netrc = os.path.expanduser('~/.netrc')
        logged_in = logged_in or (os.path.exists(netrc) and 'api.wandb.ai' in open(netrc).read())
        mode = 'online' if logged_in else 'offline'
    try:
        run = wandb.init(project=wandb_project, name=wandb_run_name or pos_encoding, config=config,
                         mode=mode, dir=out_dir)
    except Exception as e:  # no network: keep the run, log offline
        print(f"wandb online init failed ({e}); logging offline")
        run = wandb.init(project=wandb_project, name=wandb_run_name or pos_encoding, config=config,
                         mode='offline', dir=out_dir)
    print(f"wandb: {mode} mode" + (f" (sync later with `wandb sync {out_dir}/wandb/latest-run`)" if mode == 'offline' else ''))
    return run


def log_metrics(d):
    with open(os.path.join(out_dir, 'metrics.jsonl'), 'a') as f:
        f.write(json.dumps(d) + '\n')
    if wandb_run is not None:
        wandb_run.log(d, step=d['iter'])


wandb_run = setup_wandb() if (wandb_log and master) else None
PEAK_FLOPS = {'H100': 989e12, 'H200': 989e12, 'A100': 312e12}  # dense bf16
peak_flops = None
if device_type == 'cuda':
    name = torch.cuda.get_device_name()
    peak_flops = next((v for k, v in PEAK_FLOPS.items() if k in name), None)

# -----------------------------------------------------------------------------
t0 = time.time()
running_tps = -1.0
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for group in optimizer.param_groups:
        group['lr'] = lr

    if iter_num % eval_interval == 0 or iter_num == max_iters or eval_only:
        if master:
            raw_model.eval()
            te = time.time()
            res = eval_lengths(raw_model, val_data, block_size, tuple(eval_mults), tokens=eval_tokens,
                               device=device, ctx=autocast)
            raw_model.train()
            print(f"eval @ iter {iter_num}: " + ', '.join(f"{k.split('@')[1]} {v:.4f}" for k, v in res.items())
                  + f"  ({time.time() - te:.1f}s)")
            log_metrics({'iter': iter_num, 'lr': lr, **res})
            val_loss = res['val/loss@1L']
            if iter_num > 0 and (val_loss < best_val_loss or always_save_checkpoint):
                best_val_loss = min(best_val_loss, val_loss)
                save_checkpoint(os.path.join(out_dir, 'ckpt.pt'))
                print(f"saved checkpoint to {out_dir}/ckpt.pt")
        if eval_only or iter_num >= max_iters:
            break
        t0 = time.time()

    loss_sum = torch.zeros((), device=device)
    for micro_step, (X, Y) in enumerate(get_batch(iter_num)):
        if ddp:  # all-reduce gradients only on the last micro-step (forward and backward)
            model.require_backward_grad_sync = micro_step == accum - 1
        with autocast:
            _, loss = model(X, Y)
            loss = loss / accum
        loss.backward()
        loss_sum += loss.detach()
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    iter_num += 1
    if iter_num % log_interval == 0:
        if ddp:  # the global mean loss, identical to a single process on the same batch
            dist.all_reduce(loss_sum, op=dist.ReduceOp.AVG)
        t1 = time.time()
        dt = (t1 - t0) / log_interval
        t0 = t1
        if master:
            tps = tokens_per_iter / dt
            mfu = raw_model.estimate_mfu(batch_size * gradient_accumulation_steps, dt, peak_flops) if peak_flops else None
            print(f"iter {iter_num}: loss {loss_sum.item():.4f}, {dt * 1000:.1f} ms/iter, {tps:,.0f} tok/s"
                  + (f", mfu {mfu * 100:.1f}%" if mfu else ''))
            log_metrics({'iter': iter_num, 'train/loss': loss_sum.item(), 'lr': lr, 'ms_per_iter': dt * 1000,
                         'tokens_per_s': tps, **({'mfu': mfu} if mfu else {})})

if master and final_eval:
    te = time.time()
    res = evaluate(raw_model, val_data, block_size, tuple(final_eval_mults), tokens=eval_tokens, device=device,
                   ctx=autocast, progress=True)
    res = {'scheme': pos_encoding, 'rope_scaling': rope_scaling, 'iter': iter_num, 'out_dir': out_dir, **res}
    with open(os.path.join(out_dir, 'eval.json'), 'w') as f:
        json.dump(res, f)
    print(f"final eval ({time.time() - te:.0f}s) -> {out_dir}/eval.json: "
          + ', '.join(f"{k[4:]} {v:.4f}" for k, v in flat_metrics(res).items()))
    if wandb_run is not None:
        log_wandb(wandb_run, res, step=iter_num)
if wandb_run is not None:
    wandb_run.finish()
if ddp:
    # Tear down in this order: with the DDP wrapper alive at interpreter exit, gloo
    # aborted one rank in 3-30% of runs ("terminate called without an active exception").
    del model, raw_model, optimizer
    gc.collect()
    dist.destroy_process_group()
