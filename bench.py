"""
Speed and memory of every positional scheme, as ratios to rope measured in the same run.

  python bench.py                                  # every registered scheme, train.py's default model
  python bench.py --schemes=rope,alibi --json=bench.json
  python bench.py --threads=1                      # CPU shared with others: see "clocks" below
  python bench.py --device=cuda --compile=True     # GPU: bf16 autocast, TF32, fused AdamW, torch.compile
  python bench.py --device=cuda --compile=True --preset=gpt2 --schemes=rope,alibi --parts=train
  python bench.py --gpu_check=True                 # the one-command GPU check (see gpu_check below)
  python bench.py --parts=evalcost --threads=1     # evaluation cost: scored-positions-only logits vs full logits
  python bench.py --parts=smoke                    # 4-iteration train.py run of every scheme, wall time each
  python bench.py --parts=attnpath --schemes=alibi,fire  # no-grad attention: dense path vs compiled flex

What is measured (all models are built once and measured round-robin, so slow
drift in machine load hits every scheme alike; ratios to rope are taken per round
and the median is reported):
  train    fwd+bwd+clip+AdamW step at train.py's defaults (B=32, T=L=128, 4x128, 4 heads,
           vocab 84): ms/iter, tokens/s, MFU (6N + 12*l*h*q*T FLOPs per token, PaLM App. B).
           Includes `nanogpt`, a plain nanoGPT-equivalent model (learned PE, SDPA) written
           below, to price the positional plumbing of model.py.
  memory   peak bytes of one training step, and of one no-grad forward at 8L (eval.py's
           batching: 16384 tokens per batch), each = params/buffers/optimizer state + the
           peak of what the step allocates on top (CUDA: max_memory_allocated; CPU: the
           profiler's record of every allocation through torch's CPU allocator, summed in
           order -- exact for tensors, blind to non-tensor memory such as oneDNN scratch).
           For schemes that bias the logits, also the same forward forced onto the dense path
           ("dense path": the T x T additive mask that FlexAttention avoids).
  eval     tokens/s of that forward at 8L (eval.py's path: FlexAttention for bias schemes on
           CUDA, the dense path in query chunks on CPU; the first call, which compiles where
           anything is compiled, is reported apart as eval_first_s).
  sample   1000 new tokens from a 1-token prompt with the KV cache (model.generate) against
           recomputing the full context for every token (model.generate(use_cache=False) one
           token at a time). The recompute cost is summed over every `--sample_stride`-th
           length and scaled up (midpoint rule; --sample_stride 1 runs all 1000).
Parts outside the scheme round-robin, run only when asked for (--parts=evalcost,smoke,attnpath):
  evalcost eval.py's protocols at 8L (sliding windows, non-overlapping, last-k; evaluate()'s
           default layouts) with today's eval.window_losses (logits only for the scored
           positions, in chunks) against the previous path written below (full logits for
           every position, then cross-entropy on the scored ones), for a GPT-2-BPE-sized model
           (vocab 50257 padded to 50304) and the char model (vocab 84), both train.py's 4x128
           at L = 128, rope, on random tokens: time (round-robin, median of per-round ratios)
           and peak memory. Issue 13's targets: BPE sliding >= 3x faster and peak <= 1/4;
           char no slower.
  smoke    `python train.py config/<scheme>.py --max_iters=4 --wandb_log=False --out_dir=TMP`
           as a subprocess for every registered scheme, as a user runs it (data prepared,
           final evaluation included, torch.compile's on-disk cache empty as on a first run:
           --smoke_cache=user keeps yours): wall time per scheme and where it went (read
           from the log lines as they arrive); issue 13's bound is <= 90 s each on a 2-core CPU.
           Such a run trains uncompiled; --smoke_args=--compile=True times it compiled.
  attnpath one no-grad forward (wall clock) of train.py's model, random weights and tokens,
           at eval.py's batching (16384 tokens per batch) for T = 16L, 32L, 64L, of each
           asked-for scheme with a score bias: the dense path (query chunks of 16 MiB, and of
           256 MiB as before) against compiled FlexAttention (first call: compile included,
           then warm), on a cold compile cache. Why model.py's 'auto' runs dense on CPU.

Clocks: `--clock cpu` (the default on CPU) times with process CPU time, which does not
count the time the OS gives to other people's processes on a shared machine. With one
thread that equals wall time on an idle core; with more threads it also counts OpenMP
spin-waiting, so use --threads 1 with it. `--clock wall` is the default on CUDA.
"""
import glob
import json
import math
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

import eval as evaluation
import positional
import runtime
from configurator import options
from console import exit_on_ctrl_c
from model import GPT, GPTConfig
PRESETS = {  # 'default' = train.py's defaults; 'gpt2' = GPT-2 124M at T=1024 (GPU only)
    'default': dict(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=84, batch_size=32),
    'gpt2': dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, batch_size=8),
}
BASELINE = 'nanogpt'
SCHEME_PARTS = {'train', 'memory', 'eval', 'sample'}  # the round-robin over schemes


# --- the reference: nanoGPT's model, same sizes, written compactly -------------------

class NanoBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c.n_head
        self.ln_1, self.ln_2 = nn.LayerNorm(c.n_embd, bias=c.bias), nn.LayerNorm(c.n_embd, bias=c.bias)
        self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias)
        self.attn_proj = nn.Linear(c.n_embd, c.n_embd, bias=c.bias)
        self.c_fc = nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias)
        self.mlp_proj = nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias)
        self.drop1, self.drop2 = nn.Dropout(c.dropout), nn.Dropout(c.dropout)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop1(self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C)))
        return x + self.drop2(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)))))


class NanoGPT(nn.Module):
    """nanoGPT (github.com/karpathy/nanoGPT model.py) minus its extras: learned absolute
    positions, pre-LN, SDPA is_causal, tied embeddings. No positional hooks at all."""

    def __init__(self, c):
        super().__init__()
        self.config = c
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.n_embd), nn.Embedding(c.block_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        self.h = nn.ModuleList([NanoBlock(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd, bias=c.bias)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight
        for p in self.parameters():
            nn.init.normal_(p, std=0.02) if p.dim() > 1 else None

    def forward(self, idx, targets=None, reduction='mean'):
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device)))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1, reduction=reduction)
        return logits, loss

    configure_optimizers = GPT.configure_optimizers  # the same AdamW (fused where available)


# --- measuring ----------------------------------------------------------------------

class Clock:
    def __init__(self, kind, device_type):
        self.kind, self.cuda = kind, device_type == 'cuda'

    def now(self):
        if self.cuda:
            torch.cuda.synchronize()
        return time.process_time() if self.kind == 'cpu' else time.perf_counter()


@contextmanager
def attention_backend(model, backend):
    """Every attention layer on `backend` ('flex' | 'dense') inside the block, as before after it."""
    attns = [blk.attn for blk in model.transformer.h]
    saved = [m.backend for m in attns]
    for m in attns:
        m.backend = backend
    try:
        yield
    finally:
        for m, b in zip(attns, saved):
            m.backend = b


@contextmanager
def quiet_stderr():
    """The profiler's C++ side prints start/stop banners and a warning to fd 2."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def static_bytes(*objs):
    """Bytes of distinct tensor storages held by modules (params, buffers) and optimizers (state)."""
    seen = {}
    for o in objs:
        if isinstance(o, nn.Module):
            ts = list(o.parameters()) + list(o.buffers())
        else:
            ts = [t for st in o.state.values() for t in st.values() if torch.is_tensor(t)]
        for t in ts:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def peak_extra_bytes(fn, device_type):
    """Peak bytes allocated by fn() on top of what was live before it."""
    if device_type == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == '[memory]' and e.device_type() == torch.autograd.DeviceType.CPU)
    cur = peak = 0
    for _, n in events:  # frees of blocks allocated before fn() are not reported: no negative drift
        cur += n
        peak = max(peak, cur)
    return peak


def peak_flops(device_type, cores):
    """(peak FLOP/s, label). CPU: cores x clock x fp32 FLOPs/cycle from the ISA flags, an estimate."""
    if device_type == 'cuda':
        name = torch.cuda.get_device_name()
        v = runtime.peak_flops(name)
        return v, (f'{name} bf16 dense {v / 1e12:.0f} TFLOP/s' if v else f'{name}: not in runtime.PEAK_BF16_FLOPS, no MFU')
    try:
        info = open('/proc/cpuinfo').read()
        mhz = float(next(l for l in info.splitlines() if l.startswith('cpu MHz')).split(':')[1])
    except (OSError, StopIteration, ValueError):
        return None, 'CPU clock unknown, no MFU'
    flags = info.split('flags', 1)[1].split('\n', 1)[0].split() if 'flags' in info else []
    per_cycle = 64 if 'avx512f' in flags else 32 if 'fma' in flags else 8  # 2 FMA pipes x lanes x 2
    v = cores * mhz * 1e6 * per_cycle
    return v, f'ESTIMATE: {cores} core(s) x {mhz / 1e3:.2f} GHz x {per_cycle} fp32 FLOP/cycle = {v / 1e9:.0f} GFLOP/s'


def cpu_name():
    try:
        return next(l for l in open('/proc/cpuinfo') if l.startswith('model name')).split(':')[1].strip()
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def flops_per_token(model, cfg, T):
    """Same formula as GPT.estimate_mfu: 6N + 12 * n_layer * n_head * head_dim * T."""
    N = sum(p.numel() for p in model.parameters())
    return 6 * N + 12 * cfg.n_layer * cfg.n_head * (cfg.n_embd // cfg.n_head) * T


def median_ratio(xs, refs):
    """Median over rounds of x/ref, each ratio taken within one round."""
    return statistics.median(x / r for x, r in zip(xs, refs))


# --- main ---------------------------------------------------------------------------

def main():
    a = options(dict(
        schemes='all',                   # comma list of positional.REGISTRY names; rope is always added as the reference
        parts='train,memory,eval,sample',  # which measurements to run
        preset='default',                # 'default' (train.py's model) | 'gpt2' (124M at T=1024)
        n_layer=0, n_head=0, n_embd=0, block_size=0, vocab_size=0, batch_size=0,  # 0: the preset's
        device='auto', dtype='auto',     # auto: CUDA + bf16 autocast where available, else CPU float32
        compile=False,                   # torch.compile train and eval (not sampling: the KV cache changes shape)
        threads=0,                       # torch CPU threads (0: torch default)
        clock='',                        # 'cpu' | 'wall'; default cpu on CPU, wall on CUDA
        rounds=5, iters=2, warmup=2,     # round-robin rounds; timed and untimed train iterations per round
        eval_mult=8, eval_batch_tokens=16384, new_tokens=1000, sample_stride=10,
        json='',                         # write all numbers here
        seed=0,
        gpu_check=False,                 # the one-command GPU check instead of the round-robin (see gpu_check)
        evalcost_tokens=32768,           # part evalcost: evaluate()'s `tokens` (sliding scores a quarter of them)
        evalcost_data=2**19,             # part evalcost: length of the random token data
        smoke_timeout=900,               # part smoke: seconds before a train.py run is stopped
        smoke_logs='',                   # part smoke: keep each run's log here (default: not kept)
        smoke_cache='cold',              # part smoke: 'cold' (an empty torch.compile cache per run) | 'user' (yours)
        smoke_args='',                   # part smoke: more train.py arguments for every run, space-separated
    ), sys.argv[1:], rules=dict(rounds='>0', iters='>0', warmup='>=0', eval_mult='>0', eval_batch_tokens='>0',
                                new_tokens='>0', sample_stride='>0', threads='>=0', evalcost_tokens='>0',
                                evalcost_data='>0', smoke_timeout='>0'))
    if a.preset not in PRESETS:
        sys.exit(f"--preset={a.preset!r}: use one of {', '.join(PRESETS)}")
    if a.clock not in ('', 'cpu', 'wall'):
        sys.exit(f"--clock={a.clock!r}: use 'cpu' or 'wall'")
    started = (time.perf_counter(), time.process_time())

    names = sorted(positional.REGISTRY) if a.schemes == 'all' else [s.strip() for s in a.schemes.split(',') if s.strip()]
    bad = [n for n in names if n not in positional.REGISTRY]
    if bad:
        sys.exit(f"unknown scheme(s) {bad}; valid: {', '.join(sorted(positional.REGISTRY))} (or 'all')")
    asked = list(names)
    if 'rope' not in names:
        names.append('rope')  # the reference every ratio is taken against
    parts = set(a.parts.split(','))
    if parts - SCHEME_PARTS - {'evalcost', 'smoke', 'attnpath'}:
        sys.exit(f"--parts takes a comma list of train, memory, eval, sample, evalcost, smoke, attnpath; "
                 f"got {a.parts!r}")

    if a.threads:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    exit_on_ctrl_c('bench.py')
    rt = runtime.setup(a.device, a.dtype)
    device, device_type, dtype, amp = rt.device, rt.device_type, rt.dtype, rt.autocast
    if a.gpu_check:
        return gpu_check(a, names, rt)
    clock = Clock(a.clock or ('cpu' if device_type == 'cpu' else 'wall'), device_type)
    extra = {}
    if 'evalcost' in parts:
        extra['evalcost'] = evalcost(a, rt, clock, threads)
    if 'smoke' in parts:
        extra['smoke'] = smoke(a, asked)
    if 'attnpath' in parts:
        extra['attnpath'] = attnpath(a, asked, rt)
    if not parts & SCHEME_PARTS:
        return write_json(a, extra, started, rt, clock, threads)
    size = dict(PRESETS[a.preset])
    size.update({k: getattr(a, k) for k in size if getattr(a, k)})
    B, L = size.pop('batch_size'), size['block_size']
    # the CPU clock sums the time of every thread, so its throughput is per core: compare with one core's peak
    peak, peak_label = peak_flops(device_type, 1 if clock.kind == 'cpu' else threads)
    dev_name = torch.cuda.get_device_name() if device_type == 'cuda' else f'{cpu_name()}, {threads} thread(s)'
    print(f"nanoPE bench: torch {torch.__version__}, {dev_name}, dtype {dtype}, compile {a.compile}, "
          f"clock {clock.kind}\nmodel {size}, batch {B}; MFU peak: {peak_label}")

    # build everything once, same init seed, and keep it (round-robin needs all models alive)
    models, opts, runs = {}, {}, {}
    for name in [BASELINE] + names:
        torch.manual_seed(a.seed)
        cfg = GPTConfig(**size, pos_encoding=name) if name != BASELINE else GPTConfig(**size)
        m = (NanoGPT(cfg) if name == BASELINE else GPT(cfg)).to(device)
        models[name] = m
        opts[name] = m.configure_optimizers(0.1, 1e-3, (0.9, 0.99), device_type)
        runs[name] = torch.compile(m) if a.compile else m
    res = {n: {} for n in models}
    g = torch.Generator().manual_seed(a.seed)
    xy = torch.randint(size['vocab_size'], (B, L + 1), generator=g).to(device)
    x, y = xy[:, :-1], xy[:, 1:]

    def train_step(name):
        with amp:
            _, loss = runs[name](x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(models[name].parameters(), 1.0)  # train.py's grad_clip
        opts[name].step()
        opts[name].zero_grad(set_to_none=True)

    order = list(models)
    if 'train' in parts or 'memory' in parts:
        for name in order:
            t0 = clock.now()
            for _ in range(a.warmup):
                train_step(name)
            res[name]['train_warmup_s'] = clock.now() - t0
    if 'train' in parts:
        times = {n: [] for n in order}
        for r in range(a.rounds):
            for name in order[r % len(order):] + order[:r % len(order)]:  # rotate who goes first
                t0 = clock.now()
                for _ in range(a.iters):
                    train_step(name)
                times[name].append((clock.now() - t0) / a.iters)
            print(f"train round {r + 1}/{a.rounds}: " + ', '.join(f"{n} {times[n][-1] * 1e3:.0f}" for n in order) + ' ms/iter')
        for name in order:
            dt = statistics.median(times[name])
            res[name].update(train_ms=dt * 1e3, train_tok_s=B * L / dt, train_vs_rope=median_ratio(times['rope'], times[name]),
                             train_vs_nanogpt=median_ratio(times[BASELINE], times[name]),
                             train_ms_all=[t * 1e3 for t in times[name]])
            if peak:
                res[name]['mfu'] = flops_per_token(models[name], models[name].config, L) * B * L / dt / peak

    if 'memory' in parts:
        for name in order:
            st = static_bytes(models[name], opts[name])
            res[name]['train_peak_MiB'] = (st + peak_extra_bytes(lambda: train_step(name), device_type)) / 2**20
    T8 = a.eval_mult * L
    xe = torch.randint(size['vocab_size'], (max(1, a.eval_batch_tokens // T8), T8 + 1), generator=g).to(device)
    can_eval = [n for n in order if n != BASELINE and (models[n].pe.max_len is None or models[n].pe.max_len >= T8)]
    for n in order:
        if n not in can_eval:
            res[n]['eval_note'] = f'no positions past {models[n].config.block_size}'

    @torch.no_grad()
    def eval_fwd(name):
        with amp:
            runs[name](xe[:, :-1], xe[:, 1:], reduction='sum')

    if 'eval' in parts or 'memory' in parts:
        for name in can_eval:
            models[name].eval()
            t0 = clock.now()
            eval_fwd(name)  # FlexAttention / torch.compile compile here
            res[name]['eval_first_s'] = clock.now() - t0
    if 'eval' in parts:
        times = {n: [] for n in can_eval}
        for r in range(a.rounds):
            for name in can_eval[r % len(can_eval):] + can_eval[:r % len(can_eval)]:
                t0 = clock.now()
                eval_fwd(name)
                times[name].append(clock.now() - t0)
            print(f"eval@{a.eval_mult}L round {r + 1}/{a.rounds}: " + ', '.join(f"{n} {times[n][-1]:.2f}" for n in can_eval) + ' s')
        for name in can_eval:
            res[name].update(eval_tok_s=xe[:, :-1].numel() / statistics.median(times[name]),
                             eval_vs_rope=median_ratio(times['rope'], times[name]))
    if 'memory' in parts:
        for name in can_eval:
            st = static_bytes(models[name])
            res[name]['fwd8L_peak_MiB'] = (st + peak_extra_bytes(lambda: eval_fwd(name), device_type)) / 2**20
            if type(models[name].pe).score_mod is not positional.PositionalEncoding.score_mod:
                # a bias scheme: what the same forward holds on the dense path (T x T bias per layer)
                with attention_backend(models[name], 'dense'):
                    peak = peak_extra_bytes(lambda: eval_fwd(name), device_type)
                res[name]['fwd8L_dense_peak_MiB'] = (st + peak) / 2**20
        print('memory (MiB): ' + ', '.join(f"{n} train {res[n].get('train_peak_MiB', math.nan):.0f} fwd@8L {res[n].get('fwd8L_peak_MiB', math.nan):.0f}"
                                          + (f" (dense {res[n]['fwd8L_dense_peak_MiB']:.0f})" if 'fwd8L_dense_peak_MiB' in res[n] else '') for n in order))

    if 'sample' in parts:
        prompt = torch.zeros((1, 1), dtype=torch.long, device=device)
        n_new, stride = a.new_tokens, max(1, a.sample_stride)
        for name in [n for n in order if n != BASELINE]:
            m = models[name].eval()
            torch.manual_seed(a.seed)
            with amp:
                m.generate(prompt, 8, top_k=200)  # warm up
                t0 = clock.now()
                seq = m.generate(prompt, n_new, top_k=200, use_cache=True)
                t_kv = clock.now() - t0
                lengths = range(1 + stride // 2, n_new + 1, stride)  # context lengths 1..n_new, midpoints
                t0 = clock.now()
                for t in lengths:
                    m.generate(seq[:, :t], 1, top_k=200, use_cache=False)
                t_re = (clock.now() - t0) * n_new / len(lengths)
            res[name].update(sample_kv_tok_s=n_new / t_kv, sample_recompute_tok_s=n_new / t_re, kv_speedup=t_re / t_kv)
            if m.pe.max_len is not None and m.pe.max_len < n_new + 1:
                res[name]['sample_note'] = f'sliding window of {m.pe.max_len} past its table, both ways'
            print(f"sample {name}: KV cache {n_new / t_kv:,.0f} tok/s, recompute {n_new / t_re:,.0f} tok/s, "
                  f"speedup {t_re / t_kv:.1f}x" + (f" ({res[name]['sample_note']})" if 'sample_note' in res[name] else ''))
        for name in res:
            if 'sample_kv_tok_s' in res[name]:
                res[name]['sample_kv_vs_rope'] = res[name]['sample_kv_tok_s'] / res['rope']['sample_kv_tok_s']

    report(res, order, a, B, L, T8, clock, dev_name, dtype, peak_label)
    write_json(a, {'results': res, **extra}, started, rt, clock, threads, model=size, batch_size=B,
               peak_flops=peak_label)


def write_json(a, out, started, rt, clock, threads, **meta):
    if a.json:
        meta = dict(argv=sys.argv, torch=torch.__version__, device=runtime.device_name(rt), dtype=rt.dtype,
                    compile=a.compile, clock=clock.kind, threads=threads, **meta,
                    time=time.strftime('%Y-%m-%d %H:%M:%S'), elapsed_wall_s=time.perf_counter() - started[0],
                    elapsed_cpu_s=time.process_time() - started[1])
        with open(a.json, 'w') as f:
            json.dump({'meta': meta, **out}, f, indent=1)
        print(f"wrote {a.json}")


MAIN_SCHEMES = ['rope', 'alibi', 't5', 'fire', 'learned']  # the GPU-ready issue's first five; then the rest


def gpu_check(a, names, rt, budget_s=540):
    """The one-command GPU check (python bench.py --gpu_check=True). On this device, in rt.dtype
    (bf16 autocast on CUDA), at the preset size (gpt2 -- 124M, T = 1024 -- on CUDA unless
    --preset is given), for every scheme (the main five first):
      correct  FlexAttention == dense logits (schemes with a score bias) and KV-cache decoding ==
               a full forward, at T = 256 (relative max error; bf16 tolerance 5e-2)
      train    a few torch.compile'd training steps: ms/iter, tokens/s, MFU, peak memory, x rope
      long     no-grad forwards at 8L and 16L for rope, alibi, t5, fire: tokens/s and peak memory
               (O(T) per layer: 16L's peak should be about twice 8L's, not four times)
    Writes --json (gpu_check.json) after every scheme, and stops starting new schemes after
    budget_s seconds, so a run cut short keeps what it measured."""
    preset = a.preset if (a.preset != 'default' or rt.device_type != 'cuda') else 'gpt2'
    size = dict(PRESETS[preset])
    size.update({k: getattr(a, k) for k in size if getattr(a, k)})
    B, L = size.pop('batch_size'), size['block_size']
    names = sorted(set(names), key=lambda n: (MAIN_SCHEMES.index(n) if n in MAIN_SCHEMES else 99, n))
    peak, peak_label = peak_flops(rt.device_type, 1)
    sync = torch.cuda.synchronize if rt.device_type == 'cuda' else (lambda: None)
    out = {'meta': dict(torch=torch.__version__, device=runtime.device_name(rt), dtype=rt.dtype, preset=preset,
                        model=size, batch_size=B, peak=peak_label, argv=sys.argv), 'results': {}}
    path, t_start = a.json or 'gpu_check.json', time.perf_counter()
    print(f"gpu check: {out['meta']['device']}, torch {torch.__version__}, {rt.dtype}, {size}, batch {B}")
    tol = 1e-4 if rt.dtype == 'float32' else 5e-2

    def rel(x, y):
        return ((x.float() - y.float()).abs().max() / y.float().abs().max().clamp(min=1e-6)).item()

    def peak_mem(fn):
        if rt.device_type != 'cuda':
            return None, fn()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        r = fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**20, r

    for name in names:
        if time.perf_counter() - t_start > budget_s:
            out['skipped'] = out.get('skipped', []) + [name]
            continue
        r = out['results'][name] = {}
        torch.manual_seed(a.seed)
        model = GPT(GPTConfig(**size, pos_encoding=name)).to(rt.device)
        # correctness, eager model: flex vs dense, KV cache vs full forward
        Tc = min(256, L)
        x = torch.randint(size['vocab_size'], (2, Tc), device=rt.device)
        model.eval()
        with torch.no_grad(), rt.autocast:
            full = model(x)[0]
            if type(model.pe).score_mod is not positional.PositionalEncoding.score_mod:
                backends = {}
                for be in ('flex', 'dense'):
                    with attention_backend(model, be):
                        backends[be] = model(x)[0]
                r['flex_vs_dense'] = rel(backends['flex'], backends['dense'])
            if model.pe.max_len is None or model.pe.max_len >= Tc:
                cache = model.new_cache()
                steps = [model(x[:, :Tc - 16], cache=cache)[0]] + [model(x[:, t:t + 1], cache=cache)[0]
                                                                   for t in range(Tc - 16, Tc)]
                r['kv_vs_full'] = rel(torch.cat(steps, 1), full)
        r['correct'] = all(r.get(k, 0) < tol for k in ('flex_vs_dense', 'kv_vs_full'))
        # compiled training steps
        model.train()
        opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), rt.device_type)
        step = torch.compile(model)
        xy = torch.randint(size['vocab_size'], (B, L + 1), device=rt.device)

        def train_step():
            with rt.autocast:
                _, loss = step(xy[:, :-1], xy[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss
        try:
            t0 = time.perf_counter()
            for _ in range(max(2, a.warmup)):
                loss = train_step()
            sync()
            r['compile_s'] = time.perf_counter() - t0
            n = max(5, a.iters)
            mem, _ = peak_mem(train_step)
            t0 = time.perf_counter()
            for _ in range(n):
                loss = train_step()
            sync()
            dt = (time.perf_counter() - t0) / n
            r.update(train_ms=dt * 1e3, train_tok_s=B * L / dt, train_peak_MiB=mem, loss=loss.item())
            if peak:
                r['mfu'] = flops_per_token(model, model.config, L) * B * L / dt / peak
        except Exception as e:  # noqa: BLE001 - report the failure, go on with the next scheme
            r['train_error'] = f"{type(e).__name__}: {str(e)[:500]}"
        opt = step = None  # free the optimizer state and the compiled graph before the long forwards
        # long no-grad forwards (O(T) memory)
        if name in MAIN_SCHEMES[:4]:
            model.eval()
            for m in (8, 16):
                T = m * L
                xe = torch.randint(size['vocab_size'], (max(1, a.eval_batch_tokens // T), T), device=rt.device)
                try:
                    with torch.no_grad(), rt.autocast:
                        model(xe, last=1)  # compile FlexAttention for this length first
                        t0 = time.perf_counter()
                        mem, _ = peak_mem(lambda: model(xe, last=1))
                        sync()
                    r[f'eval{m}L_tok_s'] = xe.numel() / (time.perf_counter() - t0)
                    r[f'eval{m}L_peak_MiB'] = mem
                except Exception as e:  # noqa: BLE001
                    r[f'eval{m}L_error'] = f"{type(e).__name__}: {str(e)[:300]}"
        model = None
        if rt.device_type == 'cuda':
            torch.cuda.empty_cache()
        ref = out['results'].get('rope', {})
        if 'train_tok_s' in r and 'train_tok_s' in ref:
            r['train_vs_rope'] = r['train_tok_s'] / ref['train_tok_s']
            if r.get('train_peak_MiB') and ref.get('train_peak_MiB'):
                r['peak_vs_rope'] = r['train_peak_MiB'] / ref['train_peak_MiB']
        print(f"{name}: " + ', '.join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()),
              flush=True)
        with open(path, 'w') as f:
            json.dump(out, f, indent=1)
    bad = [n for n, r in out['results'].items() if not r.get('correct') or 'train_error' in r]
    print(f"gpu check: {len(out['results'])} schemes in {time.perf_counter() - t_start:.0f}s -> {path}; "
          + (f"FAILED: {', '.join(bad)}" if bad else 'all correct and trained')
          + (f"; skipped (time budget): {', '.join(out['skipped'])}" if out.get('skipped') else ''))
    return 1 if bad else 0


# --- evaluation cost (part evalcost) ------------------------------------------------

EVALCOST_MODELS = {  # train.py's CPU model (4 x 128, 4 heads, L = 128, rope) with two vocabularies
    'gpt2-bpe': dict(vocab_size=50257, vocab_multiple=64),  # 50304 lm_head rows, as train.py pads BPE
    'char': dict(vocab_size=84),                             # shakespeare_char
}


@torch.no_grad()
def full_logits_window_losses(model, data, T, starts, n_score, batch_tokens=2**14, device='cpu', ctx=None):
    """The baseline: eval.window_losses as it was before it scored only what it needs
    (commit ef92096^): the same windows and batches, the full [batch, T, vocab] logits
    from model(x), then float32 cross-entropy on the last n_score positions."""
    bs = max(1, batch_tokens // T)
    sums = torch.zeros(n_score, dtype=torch.float64)
    for i in range(0, len(starts), bs):
        chunk = starts[i:i + bs]
        rows = chunk + [chunk[0]] * (bs - len(chunk)) if len(starts) > bs else chunk
        win = torch.from_numpy(np.stack([data[s:s + T + 1].astype(np.int64) for s in rows])).to(device)
        with ctx or nullcontext():
            logits = model(win[:, :-1])[0]
        logits, y = logits[:len(chunk), T - n_score:].float(), win[:len(chunk), T - n_score + 1:]
        sums += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1),
                                reduction='none').view(len(chunk), n_score).sum(0).double().cpu()
    return sums, len(starts)


def evalcost(a, rt, clock, threads):
    """Part evalcost (see the top of the file) -> {model: {protocol: numbers}}."""
    L, T, tokens = 128, a.eval_mult * 128, a.evalcost_tokens
    stride, k = L // 2, L // 4
    n = a.evalcost_data
    # evaluate()'s default layouts at one length T: windows advancing by L/2 over tokens/4 scored
    # tokens; `tokens` in non-overlapping windows; the last k = L/4 tokens of tokens/512 spans
    ends = np.linspace(T, n - 1, max(8, tokens // 512)).astype(np.int64)
    layouts = {'sliding': (evaluation.window_layout(n, T, stride, max(1, max(stride, tokens // 4) // stride)), stride),
               'nonoverlap': (evaluation.window_layout(n, T, T, max(1, tokens // T)), T),
               'last-k': ([int(e) - T for e in ends], k)}
    paths = {'old': full_logits_window_losses, 'new': evaluation.window_losses}
    kw = dict(batch_tokens=a.eval_batch_tokens, device=rt.device, ctx=rt.autocast)
    models, data = {}, {}
    for m, voc in EVALCOST_MODELS.items():
        torch.manual_seed(a.seed)
        models[m] = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=L, **voc)).to(rt.device).eval()
        data[m] = np.random.default_rng(a.seed).integers(0, voc['vocab_size'], n, dtype=np.uint16)
    cases = [(m, p, path) for m in models for p in layouts for path in paths]  # old, new of a protocol adjacent

    def run(c):
        starts, n_score = layouts[c[1]]
        return paths[c[2]](models[c[0]], data[c[0]], T, starts, n_score, **kw)

    print(f"evalcost: {runtime.device_name(rt)}, torch {torch.__version__}, {rt.dtype}, clock {clock.kind}; "
          f"4x128 rope at L={L}, eval at {a.eval_mult}L = {T}, batch_tokens {a.eval_batch_tokens}, "
          f"{n:,} random tokens; models: " + ', '.join(
              f"{m} ({models[m].lm_head.weight.size(0)} lm_head rows, {models[m].get_num_params() / 1e6:.2f}M params)"
              for m in models))
    first = {}
    for c in cases:  # untimed once: warm-up, and the two paths must agree
        t0 = clock.now()
        first[c] = (run(c), clock.now() - t0)
    times, mem = {c: [] for c in cases}, {}
    for r in range(a.rounds):
        for c in cases[r % len(cases):] + cases[:r % len(cases)]:
            t0 = clock.now()
            run(c)
            times[c].append(clock.now() - t0)
        print(f"evalcost round {r + 1}/{a.rounds}: " + ', '.join(f"{'/'.join(c)} {times[c][-1]:.2f}" for c in cases)
              + ' s', flush=True)
    for c in cases:
        extra_b = peak_extra_bytes(lambda: run(c), rt.device_type)
        mem[c] = (static_bytes(models[c[0]]) + extra_b, extra_b)
    res = {}
    for m in models:
        for p, (starts, n_score) in layouts.items():
            o, w = (m, p, 'old'), (m, p, 'new')
            (so, no), (sn, nn_) = first[o][0], first[w][0]
            ratios = [tn / to for tn, to in zip(times[w], times[o])]
            res.setdefault(m, {})[p] = dict(
                windows=len(starts), scored_per_window=n_score, old_s=statistics.median(times[o]),
                new_s=statistics.median(times[w]), new_vs_old_time=statistics.median(ratios),
                new_vs_old_time_rounds=ratios, old_s_all=times[o], new_s_all=times[w],
                old_peak_MiB=mem[o][0] / 2**20, new_peak_MiB=mem[w][0] / 2**20,
                old_extra_MiB=mem[o][1] / 2**20, new_extra_MiB=mem[w][1] / 2**20,
                new_vs_old_peak=mem[w][0] / mem[o][0],
                max_abs_diff=(sn / nn_ - so / no).abs().max().item(), mean_loss=(sn.sum() / (nn_ * n_score)).item())
    unit = 'CPU-time' if clock.kind == 'cpu' else 'wall'
    print(f"\n{runtime.device_name(rt)}, torch {torch.__version__}, {rt.dtype}; {unit} clock, {a.rounds} rounds "
          f"round-robin, medians; eval at {a.eval_mult}L = {T}, batch_tokens {a.eval_batch_tokens}; old = full "
          f"logits for every position (bench.full_logits_window_losses), new = eval.window_losses; peak = params "
          f"+ the largest allocation on top during the call (profiler)")
    print(f"| model | protocol @{a.eval_mult}L | windows × scored | old s | new s | new/old time (rounds min–max) | old peak MiB "
          "| new peak MiB | new/old peak | max abs Δ loss |")
    print('|' + ' --- |' * 10)
    for m in res:
        for p, r in res[m].items():
            print(f"| {m} | {p} | {r['windows']} × {r['scored_per_window']} | {r['old_s']:.2f} | {r['new_s']:.2f} "
                  f"| {r['new_vs_old_time']:.3f} ({min(r['new_vs_old_time_rounds']):.3f}–"
                  f"{max(r['new_vs_old_time_rounds']):.3f}) | {r['old_peak_MiB']:.0f} | {r['new_peak_MiB']:.0f} "
                  f"| {r['new_vs_old_peak']:.3f} | {r['max_abs_diff']:.1e} |")
    b, ch = res['gpt2-bpe']['sliding'], res['char']
    verdict = lambda ok: 'met' if ok else 'MISSED'  # noqa: E731
    print(f"targets (issue 13, at 8L): GPT-2-BPE sliding @{a.eval_mult}L speedup {1 / b['new_vs_old_time']:.1f}x (>= 3x: "
          f"{verdict(b['new_vs_old_time'] <= 1 / 3)}), peak {b['new_vs_old_peak']:.3f} of old (<= 1/4: "
          f"{verdict(b['new_vs_old_peak'] <= 0.25)}); char no slower: " + ', '.join(
              f"{p} {r['new_vs_old_time']:.3f} ({verdict(r['new_vs_old_time'] <= 1)})" for p, r in ch.items()))
    return res


# --- attention path without gradients (part attnpath) ---------------------------------

def attnpath(a, names, rt):
    """Part attnpath (see the top of the file) -> {scheme: {T: seconds}}."""
    import attention as M
    chunk = M.DENSE_CHUNK_BYTES
    os.environ.setdefault('TORCHINDUCTOR_CACHE_DIR', tempfile.mkdtemp(prefix='nanope-attnpath-'))  # cold
    L, res = 128, {}
    print(f"attnpath: {runtime.device_name(rt)}, torch {torch.__version__}, {rt.dtype}; 4x128 at L={L}, "
          f"{a.eval_batch_tokens} tokens per batch, wall s of one no-grad forward")
    print("| scheme | T x batch | dense s | dense, 256 MiB chunks s | flex first s (compile) | flex warm s "
          "| dense / flex warm |")
    print('|' + ' --- |' * 7)
    for name in names:
        torch.manual_seed(a.seed)
        m = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=L, vocab_size=84,
                          pos_encoding=name)).to(rt.device).eval()
        base = positional.PositionalEncoding
        if m.pe.max_len is not None or (type(m.pe).score_mod is base.score_mod
                                        and type(m.pe).attention is base.attention):
            continue  # no score bias: SDPA on every path
        res[name] = {}
        for T in (16 * L, 32 * L, 64 * L):
            x = torch.randint(84, (max(1, a.eval_batch_tokens // T), T), device=rt.device)
            t = {}
            for be in ('dense', 'dense 256', 'flex', 'flex warm'):
                M.DENSE_CHUNK_BYTES = 256 * 2**20 if be == 'dense 256' else chunk
                if rt.device_type == 'cuda':
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with torch.no_grad(), rt.autocast, attention_backend(m, be.split()[0]):
                    m(x, x[:, -64:], reduction='none', last=64)
                if rt.device_type == 'cuda':
                    torch.cuda.synchronize()
                t[be] = time.perf_counter() - t0
            res[name][T] = t
            print(f"| {name} | {T} x {x.size(0)} | {t['dense']:.2f} | {t['dense 256']:.2f} | {t['flex']:.1f} "
                  f"| {t['flex warm']:.2f} "
                  f"| {t['dense'] / t['flex warm']:.2f} |", flush=True)
    M.DENSE_CHUNK_BYTES = chunk
    return res


# --- smoke runs (part smoke) -------------------------------------------------------

SMOKE_ARGS = ['--max_iters=4', '--wandb_log=False']
SMOKE_BOUND_S = 90  # issue 13, on the 2-core CPU


def smoke_configs(here):
    """scheme -> config/<scheme>.py, or else the first config that trains that scheme from
    scratch on the default corpus (config/nope.py is the 'none' scheme's)."""
    from configurator import read_config_file
    found = {}
    for path in sorted(glob.glob(os.path.join(here, 'config', '*.py'))):
        c = read_config_file(path)
        if 'init_from' not in c and c.get('dataset', 'shakespeare_char') == 'shakespeare_char':
            found.setdefault(c.get('pos_encoding', 'rope'), []).append(os.path.relpath(path, here))
    return {s: (f'config/{s}.py' if f'config/{s}.py' in ps else ps[0]) for s, ps in found.items()}


def timed_run(cmd, cwd, timeout, env=None):
    """Run cmd, timestamping each line of its output as it arrives -> (rc, wall s, child CPU s,
    [(t, line)]). Past `timeout` its process group is killed (rc None)."""
    env = dict(os.environ, PYTHONUNBUFFERED='1', **(env or {}))
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    killed = []

    def kill():
        killed.append(True)
        os.killpg(proc.pid, signal.SIGKILL)
    timer = threading.Timer(timeout, kill)
    timer.start()
    lines = [(time.perf_counter() - t0, line.rstrip('\n')) for line in proc.stdout]
    rc = proc.wait()
    wall = time.perf_counter() - t0
    timer.cancel()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return (None if killed else rc), wall, cpu, lines


def smoke_phases(lines, wall):
    """Where a train.py run's time went, from its log lines' arrival times: startup (imports,
    data, model; until eval @ iter 0 starts), eval@0, the 4 steps (and any torch.compile),
    eval@4 (+ checkpoint save), final suite, the rest (exit)."""
    t = {}
    for when, line in lines:
        mt = re.match(r'eval @ iter (\d+): .*\(([\d.]+)s\)$', line)
        if mt:
            t.setdefault(f'eval{mt.group(1)}', (when, float(mt.group(2))))
        elif line.startswith('final eval: '):
            t.setdefault('final_start', (when, 0))
        elif line.startswith('final eval ('):
            t.setdefault('final_end', (when, 0))
    if 'eval0' not in t:
        return {}
    ev = sorted((k for k in t if k.startswith('eval') and k != 'eval0'), key=lambda k: int(k[4:]))
    (t0, d0) = t['eval0']
    ph = dict(startup_s=t0 - d0, eval0_s=d0)
    if ev:
        t1, d1 = t[ev[-1]]
        ph.update(steps_s=t1 - d1 - t0, eval_end_s=d1)
        if 'final_end' in t:
            start = t.get('final_start', (t1, 0))[0]
            ph.update(final_s=t['final_end'][0] - start, save_s=start - t1)
    ph['other_s'] = wall - sum(ph.values())
    return ph


def smoke(a, names):
    """Part smoke (see the top of the file) -> {scheme: numbers}."""
    here = os.path.dirname(os.path.abspath(__file__))
    if not os.path.exists(os.path.join(here, 'data', 'shakespeare_char', 'train.bin')):
        sys.exit("part smoke: data/shakespeare_char/train.bin is missing; prepare it first "
                 "(python data/shakespeare_char/prepare.py) so that the runs time training, not the download")
    cfgs = smoke_configs(here)
    missing = [s for s in names if f'config/{s}.py' not in cfgs.values()]
    args = SMOKE_ARGS + a.smoke_args.split()
    print(f"smoke: {len(names)} schemes, `python train.py config/<scheme>.py {' '.join(args)} "
          f"--out_dir=<fresh temp dir>`, {os.cpu_count()} CPU(s), torch default threads, "
          f"{a.smoke_cache} torch.compile cache"
          + ("; no config/<scheme>.py for: " + ', '.join(
              f"{s} (" + (f"uses {cfgs[s]}" if s in cfgs else 'none at all: run with --pos_encoding') + ')'
              for s in missing) if missing else ''), flush=True)
    if a.smoke_cache not in ('cold', 'user'):
        sys.exit(f"--smoke_cache={a.smoke_cache!r}: use 'cold' or 'user'")
    if a.smoke_logs:
        os.makedirs(a.smoke_logs, exist_ok=True)
    res = {}
    for name in names:
        cfg = cfgs.get(name)
        with tempfile.TemporaryDirectory(prefix=f'nanope-smoke-{name}-') as tmp:
            cmd = [sys.executable, 'train.py'] + ([cfg] if cfg else [f'--pos_encoding={name}']) + args + [
                f'--out_dir={tmp}']
            load = os.getloadavg()[0]
            # cold: torch.compile's on-disk caches (FX graph, AOTAutograd, kernels) start empty, as on a
            # user's first run, rather than holding whatever earlier runs on this machine left there
            env = {'TORCHINDUCTOR_CACHE_DIR': os.path.join(tmp, 'inductor-cache')} if a.smoke_cache == 'cold' else {}
            rc, wall, cpu, lines = timed_run(cmd, here, a.smoke_timeout, env)
        r = res[name] = dict(config=cfg, command=' '.join(cmd[1:-1] + ['--out_dir=TMP']), rc=rc, wall_s=wall,
                             child_cpu_s=cpu, loadavg_before=load, **smoke_phases(lines, wall))
        if a.smoke_logs:
            with open(os.path.join(a.smoke_logs, f'{name}.log'), 'w') as f:
                f.writelines(f"{when:8.2f}  {line}\n" for when, line in lines)
        if rc != 0:
            r['tail'] = [line for _, line in lines[-15:]]
        print(f"smoke {name}: {wall:.1f} s wall, {cpu:.1f} s CPU" + ('' if rc == 0 else (
            ' TIMED OUT' if rc is None else f' FAILED rc={rc}') + '\n  ' + '\n  '.join(r['tail'])), flush=True)
    cols = ['startup_s', 'eval0_s', 'steps_s', 'eval_end_s', 'save_s', 'final_s', 'other_s']
    print(f"\n{cpu_name()}, {os.cpu_count()} CPU(s), torch {torch.__version__}, {a.smoke_cache} torch.compile "
          f"cache; wall seconds per run "
          f"(phases from the log lines' arrival: startup = imports/data/model until eval@0 starts; steps = the 4 "
          f"training iterations and any torch.compile; eval@4 = the eval at the last iteration; save = checkpoint "
          f"write; final = the full suite; other = exit)")
    print("| scheme | config | wall s | startup | eval@0 | 4 steps | eval@4 | save | final suite | other | CPU s "
          f"| ≤ {SMOKE_BOUND_S} s |")
    print('|' + ' --- |' * 12)
    f = lambda v: '—' if v is None else f'{v:.1f}'  # noqa: E731
    for name, r in res.items():
        ok = r['rc'] == 0 and r['wall_s'] <= SMOKE_BOUND_S
        print(f"| {name} | {r['config'] or '(none)'} | {r['wall_s']:.1f} | " + ' | '.join(f(r.get(c)) for c in cols)
              + f" | {r['child_cpu_s']:.0f} | {'yes' if ok else 'NO' + ('' if r['rc'] == 0 else ' (failed)')} |")
    if res:
        worst = max(res, key=lambda s: res[s]['wall_s'])
        over = [s for s, r in res.items() if r['rc'] != 0 or r['wall_s'] > SMOKE_BOUND_S]
        print(f"max {res[worst]['wall_s']:.1f} s ({worst}); bound {SMOKE_BOUND_S} s each: "
              + (f"MISSED by {', '.join(over)}" if over else 'met by every scheme'))
    return res


def report(res, order, a, B, L, T8, clock, dev_name, dtype, peak_label):
    def f(v, fmt):
        return format(v, fmt) if isinstance(v, (int, float)) and math.isfinite(v) else '—'
    unit = 'CPU-time' if clock.kind == 'cpu' else 'wall'
    print(f"\n{dev_name}, torch {torch.__version__}, {dtype}, compile={a.compile}; {unit} clock; "
          f"train B={B} T={L}; eval/memory at {a.eval_mult}L = {T8}; x rope = ratio to rope, same run")
    print("| scheme | train tok/s | ms/iter | × rope | MFU | train peak MiB | × rope | fwd@8L peak MiB | × rope | dense path "
          "| eval@8L tok/s | × rope | sample KV tok/s | recompute tok/s | KV speedup |")
    print('|' + ' --- |' * 15)
    r0 = res['rope']
    for n in order:
        r = res[n]
        print(f"| {n} | {f(r.get('train_tok_s'), ',.0f')} | {f(r.get('train_ms'), '.1f')} | {f(r.get('train_vs_rope'), '.2f')} "
              f"| {f(r.get('mfu', float('nan')) * 100, '.1f') + '%' if 'mfu' in r else '—'} "
              f"| {f(r.get('train_peak_MiB'), '.0f')} | {f(r.get('train_peak_MiB', math.nan) / r0.get('train_peak_MiB', math.nan), '.2f')} "
              f"| {f(r.get('fwd8L_peak_MiB'), '.0f')} | {f(r.get('fwd8L_peak_MiB', math.nan) / r0.get('fwd8L_peak_MiB', math.nan), '.2f')} "
              f"| {f(r.get('fwd8L_dense_peak_MiB'), '.0f')} "
              f"| {f(r.get('eval_tok_s'), ',.0f')} | {f(r.get('eval_vs_rope'), '.2f')} "
              f"| {f(r.get('sample_kv_tok_s'), ',.0f')} | {f(r.get('sample_recompute_tok_s'), ',.0f')} | {f(r.get('kv_speedup'), '.1f') + '×' if 'kv_speedup' in r else '—'} |")
    if 'train_tok_s' in r0:
        print("\nplumbing overhead vs the nanoGPT baseline (time per training step, median of per-round "
              "ratios, target < 5%): " + ', '.join(f"{n} {(1 / res[n]['train_vs_nanogpt'] - 1) * 100:+.1f}%"
                                                  for n in ('none', 'learned', 'rope') if 'train_vs_nanogpt' in res.get(n, {})))
    if 'kv_speedup' in r0:
        print(f"KV-cache sampling speedup at {a.new_tokens} new tokens, rope: {r0['kv_speedup']:.1f}x (target >= 5x)")


if __name__ == '__main__':
    sys.exit(main())
