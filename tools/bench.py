"""
Speed and memory of every positional scheme, as ratios to rope measured in the same run. How each
number is measured: docs/speed.md.

  python tools/bench.py                                  # every registered scheme, config/bench_default.py
  python tools/bench.py --threads=1 --schemes=rope,alibi --json=bench.json
  python tools/bench.py --device=cuda --compile=True     # GPU: bf16 autocast, TF32, fused AdamW, torch.compile
  python tools/bench.py --device=cuda --compile=True --preset=gpt2 --schemes=rope,alibi --parts=train
  python tools/bench.py --parts=smoke                    # a 4-iteration train.py run of every scheme, wall time each
  python tools/bench.py --threads=1 --schemes=rope --presets=all --eval_mult=16   # the attention stacks of config/
  python tools/bench.py --threads=1 --schemes=rope --windowed=32 --parts=eval --eval_mult=64   # rope in a 32-key window
  python tools/bench.py --parts=pairs,attn_time,long     # on a GPU: every scheme and preset against rope, one at a time
  python tools/bench.py --parts=pairs --schemes=alibi,t5 --presets= --budget=120 --json=pairs.json   # again: goes on
  python tools/bench.py --table=results/gpu/2026-11-28-9bb9952/pairs_missing.json,results/gpu/DATE-COMMIT/bench.json

Parts, round-robin over the schemes and `nanogpt` (a plain nanoGPT model, below): train (ms/iter,
tokens/s, MFU), memory (peak of a training step, and of a no-grad forward at 8L), eval (tokens/s of
that forward), sample (KV cache against recomputing the context), decode (one token after a 1k and a 4k
prompt in the KV cache: per-token cost, and how it grows). smoke: train.py run as a user runs
it, each run's time as it reports it. The model is config/bench_<preset>.py. --clock=cpu (the default
on CPU) is process CPU time, blind to other processes on a shared machine: use it with --threads=1
(more threads also count OpenMP spin-waiting). The GPU's correctness check is gpu_check.py.
--presets: the layer plans of config/<preset>.py (presets.PRESETS) on the bench model, each beside its twin
without windows or chunks (NAME-full); the '× full' columns are a preset's eval tok/s and forward peak
over its twin's, measured in the same run. --windowed=W adds rope-windowW: rope with a W-key sliding window on
every layer.

Parts that build, measure and free one model at a time (MODEL_PARTS; the GPU's timing, docs/gpu.md), each model a
registered scheme or a preset at its own depth, into one JSON, written after every model:
  pairs      training steps against rope of the model's depth, compiled, in alternate blocks: rope, the model,
             rope, ... rope (--blocks of the model's), each block --block_steps timed steps after an untimed one,
             the device synchronized and its cached memory handed back between blocks, so that the model before
             leaves nothing in the steps timed (time_blocks). vs_rope: the median over the model's blocks of
             rope's median step in the two blocks beside each over the model's (pair_stats). Per model: its
             steps (median, min, max, quartiles, every one), compile time, peak memory, each layer's route
             (GPT.routes), its goal class and goal (GOALS); per rope: its blocks alone, its MFU at
             this batch, its median step beside each partner (by_partner, partner_spread: whether a partner
             moves it), and its blocks alone again after the partners this process timed (alone_after_ms: beside
             ms_median, whether its step moved with the time in the process rather than with a partner);
  attn_time  a bias scheme's first layer, forward and backward, as built (its route), on FlexAttention, frozen, as one
             table, without bias;
  long       no-grad forwards at 8L and 16L: tokens/s and peak memory.
--json (default results/gpu/<today>-<commit>/bench.json) is resumed where it exists: a model whose entry holds a
part's result or error is not measured again, and a JSON of another setup (device, size, batch, blocks ...) is
refused; a model a dead process was measuring (its entry still says `measuring`: a crash) gets that as its error;
--retry=True measures again the models whose entry holds an error. No model starts after --budget
seconds (the rest are listed as `skipped`); --scheme_limit stops one model after that many seconds and goes on;
--classes keeps the models of those GOALS classes; --auto_only runs wall on 'auto' rather than its fla kernel. On
CUDA these parts default to --preset=gpt2 and --compile=True, and anywhere to --presets=all. --table=A.json,B.json
prints their markdown table (a later file's entry over an earlier one's).
"""
import dataclasses
import itertools
import json
import math
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from contextlib import contextmanager, nullcontext

import torch
import torch.nn as nn
from torch.nn import functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the library is the repo root's modules: python tools/bench.py imports them from there

import attention  # noqa: E402
import positional  # noqa: E402
import runtime  # noqa: E402
from configurator import options  # noqa: E402
from console import exit_on_ctrl_c, progress  # noqa: E402
from files import atomic_write, read_json  # noqa: E402
from model import GPT, GPTConfig, is_positional  # noqa: E402
from presets import PRESETS, model_config, model_size, preset_config, preset_plans, scheme_names  # noqa: E402

import harness  # noqa: E402  (tools/harness.py: this benchmark's and gpu_check.py's training step and layer pass)

BASELINE = 'nanogpt'
SCHEME_PARTS = {'train', 'memory', 'eval', 'sample', 'decode'}  # the round-robin over schemes


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


# --- the round-robin over schemes (parts train, memory, eval, sample) ------------------

class Bench:
    """Every model built once from the same init seed and kept alive (the round-robin needs them all),
    with its optimizer (train.py's for the preset's model: harness.train_settings) and the batches: B x L for
    training, eval.py's batching at 8L for eval."""

    def __init__(self, names, size, a, rt, clock, plans=None):
        self.a, self.rt, self.clock, self.size = a, rt, clock, dict(size)
        self.B, self.L = self.size.pop('batch_size'), size['block_size']
        self.models, self.opts, self.runs, plans = {}, {}, {}, plans or {}
        self.settings = s = harness.train_settings(a.preset)
        for name in [BASELINE] + names + list(plans):
            torch.manual_seed(a.seed)
            cfg = GPTConfig(**self.size) if name == BASELINE else GPTConfig(**{**self.size, **plans[name]}) \
                if name in plans else GPTConfig(**self.size, pos_encoding=name)
            m = self.models[name] = (NanoGPT(cfg) if name == BASELINE else GPT(cfg)).to(rt.device)
            self.opts[name] = m.configure_optimizers(s['weight_decay'], 1e-3, (s['beta1'], s['beta2']), rt.device_type)
            self.runs[name] = torch.compile(m) if a.compile else m
        g = torch.Generator().manual_seed(a.seed)
        xy = torch.randint(size['vocab_size'], (self.B, self.L + 1), generator=g).to(rt.device)
        self.x, self.y, self.T8 = xy[:, :-1], xy[:, 1:], a.eval_mult * self.L
        self.xe = torch.randint(size['vocab_size'], (max(1, a.eval_batch_tokens // self.T8), self.T8 + 1),
                                generator=g).to(rt.device)
        self.order, ms = list(self.models), self.models
        self.can_eval = [n for n in self.order if n != BASELINE and ms[n].pe.addresses(self.T8)]
        self.res = {n: {} if n in self.can_eval else {'eval_note': f'no positions past {ms[n].config.block_size}'}
                    for n in self.order}

    def train_step(self, name):
        with self.rt.autocast:
            _, loss = self.runs[name](self.x, self.y)
        loss.backward()
        if self.settings['grad_clip']:
            torch.nn.utils.clip_grad_norm_(self.models[name].parameters(), self.settings['grad_clip'])
        self.opts[name].step()
        self.opts[name].zero_grad(set_to_none=True)

    @torch.no_grad()
    def eval_fwd(self, name):
        with self.rt.autocast:
            self.runs[name](self.xe[:, :-1], self.xe[:, 1:], reduction='sum')

    def train(self, parts, peak):
        a, B, L, res = self.a, self.B, self.L, self.res
        for name in self.order:
            t0 = self.clock.now()
            for _ in range(a.warmup):
                self.train_step(name)
            res[name]['train_warmup_s'] = self.clock.now() - t0
        if 'train' in parts:
            times = harness.round_robin(self.order, a.rounds, lambda n: [self.train_step(n) for _ in range(a.iters)],
                                self.clock, 'train rounds')
            times = {n: [t / a.iters for t in ts] for n, ts in times.items()}
            for name in self.order:
                dt = statistics.median(times[name])
                res[name].update(train_ms=dt * 1e3, train_tok_s=B * L / dt, train_vs_rope=harness.median_ratio(
                    times['rope'], times[name]), train_vs_nanogpt=harness.median_ratio(times[BASELINE], times[name]),
                    train_ms_all=[t * 1e3 for t in times[name]])
                if peak:
                    res[name]['mfu'] = runtime.mfu(self.models[name], L, B, dt, peak)
        for name in self.order if 'memory' in parts else []:
            m, opt = self.models[name], self.opts[name]
            res[name]['train_peak_MiB'] = harness.peak_MiB(lambda: self.train_step(name), self.rt.device_type, m, opt)

    def eval(self, parts):
        res = self.res
        for name in self.can_eval:
            self.models[name].eval()
            t0 = self.clock.now()
            self.eval_fwd(name)  # FlexAttention / torch.compile compile here
            res[name]['eval_first_s'] = self.clock.now() - t0
        if 'eval' in parts:
            label = f'eval@{self.a.eval_mult}L rounds'
            times = harness.round_robin(self.can_eval, self.a.rounds, self.eval_fwd, self.clock, label)
            for name in self.can_eval:
                res[name].update(eval_tok_s=self.xe[:, :-1].numel() / statistics.median(times[name]),
                                 eval_vs_rope=harness.median_ratio(times['rope'], times[name]))
        for name in self.can_eval if 'memory' in parts else []:
            m = self.models[name]
            res[name]['fwd8L_peak_MiB'] = harness.peak_MiB(lambda: self.eval_fwd(name), self.rt.device_type, m)
            if any(type(s).score_mod is not positional.PositionalEncoding.score_mod for s in m.pe.schemes):
                with m.attention_backend('dense'):  # a bias scheme: the same forward with T x T biases
                    res[name]['fwd8L_dense_peak_MiB'] = harness.peak_MiB(lambda: self.eval_fwd(name),
                                                                         self.rt.device_type, m)

    def sample(self):
        prompt = torch.zeros((1, 1), dtype=torch.long, device=self.rt.device)
        n_new, stride, clock, res = self.a.new_tokens, max(1, self.a.sample_stride), self.clock, self.res
        names = [n for n in self.order if n != BASELINE]
        with progress(total=len(names), desc='sample', unit='scheme') as bar:
            for name in names:
                m = self.models[name].eval()
                torch.manual_seed(self.a.seed)
                with self.rt.autocast:
                    m.generate(prompt, 8, top_k=200)  # warm up
                    t0 = clock.now()
                    seq = m.generate(prompt, n_new, top_k=200, use_cache=True)
                    t_kv = clock.now() - t0
                    lengths = range(1 + stride // 2, n_new + 1, stride)  # context lengths 1..n_new, midpoints
                    t0 = clock.now()
                    for t in lengths:
                        m.generate(seq[:, :t], 1, top_k=200, use_cache=False)
                    t_re = (clock.now() - t0) * n_new / len(lengths)
                res[name].update(sample_kv_tok_s=n_new / t_kv, sample_recompute_tok_s=n_new / t_re,
                                 kv_speedup=t_re / t_kv)
                if not m.pe.addresses(n_new + 1):
                    res[name]['sample_note'] = f'sliding window of {m.pe.max_len} past its table, both ways'
                bar.set_postfix_str(f"{name} KV cache {t_re / t_kv:.1f}x")
                bar.update()
        for name in names:
            res[name]['sample_kv_vs_rope'] = res[name]['sample_kv_tok_s'] / res['rope']['sample_kv_tok_s']

    @torch.no_grad()
    def decode(self):
        """Decoding with a KV cache after a prompt of 1k and of 4k tokens: clock time per new token (median
        of decode_steps single-token forwards), and its ratio 4k / 1k: 4 where the per-token cost is linear in
        the cache (the attention over it dominating), 16 were it quadratic."""
        names = [n for n in self.order if n != BASELINE and self.models[n].pe.addresses(4096 + self.a.decode_steps)]
        with progress(total=len(names), desc='decode', unit='scheme') as bar:
            for name in names:
                m = self.models[name].eval()
                for n in (1024, 4096):
                    x = torch.randint(self.size['vocab_size'], (1, n + self.a.decode_steps), device=self.rt.device)
                    with self.rt.autocast:
                        cache = m.new_cache()
                        m(x[:, :n], cache=cache, last=1)
                        times = []
                        for t in range(n, n + self.a.decode_steps):
                            t0 = self.clock.now()
                            m(x[:, t:t + 1], cache=cache)
                            times.append(self.clock.now() - t0)
                    self.res[name][f'decode{n // 1024}k_ms'] = statistics.median(times) * 1e3
                self.res[name]['decode_4k_over_1k'] = self.res[name]['decode4k_ms'] / self.res[name]['decode1k_ms']
                bar.update()


TABLE = [  # (column, result key, format); 'key/' is the ratio of key to rope's; 8L reads --eval_mult
    ('train tok/s', 'train_tok_s', ',.0f'), ('ms/iter', 'train_ms', '.1f'), ('× rope', 'train_vs_rope', '.2f'),
    ('MFU', 'mfu', '.1%'), ('train peak MiB', 'train_peak_MiB', '.0f'), ('× rope', 'train_peak_MiB/', '.2f'),
    ('fwd@8L peak MiB', 'fwd8L_peak_MiB', '.0f'), ('× rope', 'fwd8L_peak_MiB/', '.2f'),
    ('dense path', 'fwd8L_dense_peak_MiB', '.0f'), ('eval@8L tok/s', 'eval_tok_s', ',.0f'),
    ('× rope', 'eval_vs_rope', '.2f'), ('sample KV tok/s', 'sample_kv_tok_s', ',.0f'),
    ('recompute tok/s', 'sample_recompute_tok_s', ',.0f'), ('KV speedup', 'kv_speedup', '.1f×'),
    ('eval × full', 'eval_tok_s%', '.2f'), ('fwd peak × full', 'fwd8L_peak_MiB%', '.2f'),
    ('decode@1k ms/tok', 'decode1k_ms', '.2f'), ('decode@4k ms/tok', 'decode4k_ms', '.2f'),
    ('4k / 1k', 'decode_4k_over_1k', '.2f')]


def report(res, order, a, B, L, T8, clock, dev_name, dtype):
    def cell(n, key, fmt):
        r, twin = res[n], res.get(f"{n}-full", {})  # a preset's twin without windows or chunks ('%': ratio to it)
        v = r.get(key[:-1], math.nan) / res['rope'].get(key[:-1], math.nan) if key.endswith('/') else \
            r.get(key[:-1], math.nan) / twin.get(key[:-1], math.nan) if key.endswith('%') else r.get(key)
        ok = isinstance(v, (int, float)) and math.isfinite(v)
        return format(v, fmt.rstrip('×')) + '×' * fmt.endswith('×') if ok else '—'
    unit = 'CPU-time' if clock.kind == 'cpu' else 'wall'
    print(f"\n{dev_name}, torch {torch.__version__}, {dtype}, compile={a.compile}; {unit} clock; "
          f"train B={B} T={L}; eval/memory at {a.eval_mult}L = {T8}; x rope = ratio to rope, same run")
    cols = [c.replace('@8L', f'@{a.eval_mult}L') for c, _, _ in TABLE]
    print('| scheme | ' + ' | '.join(cols) + ' |\n|' + ' --- |' * (len(TABLE) + 1))
    for n in order:
        print(f"| {n} | " + ' | '.join(cell(n, k, fmt) for _, k, fmt in TABLE) + ' |')
    r0 = res['rope']
    if 'train_tok_s' in r0:
        over = [f"{n} {(1 / res[n]['train_vs_nanogpt'] - 1) * 100:+.1f}%"
                for n in ('none', 'learned', 'rope') if 'train_vs_nanogpt' in res.get(n, {})]
        print("\nplumbing overhead vs the nanoGPT baseline (time per training step, median of per-round "
              "ratios, target < 5%): " + ', '.join(over))
    if 'kv_speedup' in r0:
        print(f"KV-cache sampling speedup at {a.new_tokens} new tokens, rope: {r0['kv_speedup']:.1f}x (target >= 5x)")


# --- one model at a time against rope (parts pairs, attn_time, long): the GPU's timing -------------

MODEL_PARTS = ('pairs', 'attn_time', 'long')  # each model built, measured and freed in turn; a JSON to resume from
# Goals for training throughput relative to rope of the same depth, by how a model's attention runs (goal_class):
# key -> (what the class is, the goal). A model with layers of several classes takes the lowest goal among them.
GOALS = {'no_bias': ('no logit bias: rotary, embedded or no positions (SDPA)', 0.9),
         'score_mod': ('a bias of the positions alone, or sink logits (qk_lift, sdpa_bias or FlexAttention)', 0.7),
         'content_position': ('a position term that meets the content (Shaw, XL, DeBERTa, CoPE)', 0.5),
         'fla': ("a scheme with an fla kernel (attn_backend 'fla' where 'auto' does not take it)", 0.6),
         'own_attention': ('its own attention, with no fla kernel', 0.4)}
MFU_GOAL = (0.40, 16, 1024)  # rope's MFU at gpt2_124m's micro-batch, 16 x 1024, against the device's bf16 peak
ATTN_GOAL = 2.0  # at most: a position-only bias layer's attention (fwd + bwd) over the same layer's without bias
PAIR_LR = 1e-4  # AdamW's rate in the timed steps: gpu_check's CHECK_LR, at which every model tried stays finite


def layer_hooks(config):
    """What each layer's scheme brings to its attention in training, from its hooks: [(an fla kernel, its own
    attention, a bias: a score_mod or value term the scheme returns for training, or sink logits, a position term
    that meets the content)], whatever route
    the layer takes on a device (GPT.routes says which). The hooks are asked on CPU, of a copy of the
    model 16 channels a head wide with a 64-token vocabulary (the plan and the schemes as they are): milliseconds."""
    model = GPT(dataclasses.replace(config, n_embd=16 * config.n_head, vocab_size=64)).train()
    T = 8
    x = torch.zeros(1, T, model.config.n_embd)
    hooks = []
    with torch.no_grad():
        for i, block in enumerate(model.transformer.h):
            s, attn = model.pe.at(i), block.attn
            ctx = s.layer_context(x, s.training_context(T), attn.pe_layer, None)
            q, k = torch.zeros(1, attn.q_heads, T, attn.hd), torch.zeros(1, attn.kv_heads, T, attn.hd)
            biased = not s.owns_attention and (s.score_mod(q, k, ctx, attn.pe_layer) is not None or
                                               attn.sink_logits is not None or
                                               type(s).value_mod is not positional.PositionalEncoding.value_mod)
            hooks.append((s.fla_kernel is not None, s.owns_attention, biased, s.content_position))
    return hooks


def goal_class(hooks):
    """The key of GOALS for a model's attention (layer_hooks): an fla kernel; else a position term that meets the
    content; else its own attention; else a bias in training (xPos's score_mod only evaluates blockwise: not one);
    else none. The lowest goal of its layers."""
    kinds = ['fla' if fla else 'content_position' if content else 'own_attention' if own else
             'score_mod' if biased else 'no_bias' for fla, own, biased, content in hooks]
    return min(kinds, key=lambda c: GOALS[c][1])


def time_blocks(order, steps, block_steps, clock, between=lambda: None):
    """Blocks of consecutive steps, one model a block, in `order` (names of `steps`, functions): before each block
    between() (on CUDA: wait for the device, hand the cached memory back), then one untimed step, which takes what
    the model before left behind (the allocator's blocks, caches, a queue), then `block_steps` steps, each on
    `clock`. -> [(name, [seconds of each timed step])], one per block, in order."""
    out = []
    for name in order:
        between()
        steps[name]()
        ts = []
        for _ in range(block_steps):
            t0 = clock.now()
            steps[name]()
            ts.append(clock.now() - t0)
        out.append((name, ts))
    return out


def pair_order(ref, name, blocks):
    """The reference and the model in alternate blocks, the reference first and last: each of the model's blocks
    lies between two of the reference's."""
    return [ref, name] * blocks + [ref]


def quartiles(xs):
    """(first quartile, median, third quartile) of xs, the quartiles within the range of xs."""
    return tuple(statistics.quantiles(xs, n=4, method='inclusive')) if len(xs) > 1 else tuple(xs) * 3


def step_stats(blocks, prefix=''):
    """Blocks of step times (s) -> the median, min, max and quartiles of all their steps in ms, and the steps of
    each block (ms_blocks)."""
    ms = [t * 1e3 for ts in blocks for t in ts]
    q1, median, q3 = quartiles(ms)
    return {f'{prefix}ms_median': median, f'{prefix}ms_min': min(ms), f'{prefix}ms_max': max(ms),
            f'{prefix}ms_q1': q1, f'{prefix}ms_q3': q3, f'{prefix}ms_blocks': [[t * 1e3 for t in ts] for ts in blocks]}


def pair_stats(timed, ref, name):
    """time_blocks over pair_order -> the model's entry: its steps (step_stats), the reference's steps in the same
    pairs (rope_ms_...), and vs_rope, the median over the model's blocks of the reference's median step in the
    two blocks beside it over the model's median step in it, with the quartiles of those quotients (vs_rope_q1,
    vs_rope_q3, all of them in vs_rope_blocks): each quotient is of steps a block apart, so that drift in the
    device (its clocks, its load) cancels."""
    mine = [ts for n, ts in timed if n == name]
    refs = [ts for n, ts in timed if n == ref]
    med = [statistics.median(ts) for ts in refs]
    ratios = [(med[i] + med[i + 1]) / 2 / statistics.median(ts) for i, ts in enumerate(mine)]
    q1, vs, q3 = quartiles(ratios)
    return {**step_stats(mine), **step_stats(refs, 'rope_'), 'vs_rope': vs, 'vs_rope_q1': q1, 'vs_rope_q3': q3,
            'vs_rope_blocks': ratios}


def ref_summary(results, ref):
    """Whether the reference's step depends on its partner: its median step in each partner's pairs (by_partner),
    their range (partner_spread_ms) and its max over min (partner_spread), from the partners' entries."""
    by = {n: r['rope_ms_median'] for n, r in results.items() if r.get('ref') == ref and 'rope_ms_median' in r}
    if not by:
        return {}
    lo, hi = min(by.values()), max(by.values())
    return dict(by_partner=by, partner_spread_ms=[lo, hi], partner_spread=hi / lo)


def goal_rows(results):
    """The goals as rows (figure, goal, measured or None, met or None): the JSON's and docs/gpu.md's table."""
    rows = []
    for name, r in results.items():
        if 'goal' in r and r.get('ref', name) != name:
            v = r.get('vs_rope')
            rows.append(dict(figure=f"{name}: training throughput / {r['ref']}'s ({r['goal_class']})",
                             goal=r['goal'], measured=v, met=None if v is None else v >= r['goal']))
        v = (r.get('attn_time') or {}).get('built_vs_no_bias')
        if v is not None and r.get('goal_class') == 'score_mod':
            rows.append(dict(figure=f"{name}: layer 0's attention / without bias, at most", goal=ATTN_GOAL,
                             measured=v, met=v <= ATTN_GOAL))
    goal, B, T = MFU_GOAL
    rope = results.get('rope', {})
    v = rope.get('mfu') if rope.get('mfu_at') == [B, T] else None  # measured at that batch, or not at all
    rows.append(dict(figure=f"rope's MFU at {B} x {T}", goal=goal, measured=v, met=None if v is None else v >= goal))
    return rows


def error_text(e):
    return f"{type(e).__name__}: {str(e)[:500]}"


class ReferenceFailed(Exception):
    """The rope a model is paired with could not be built or timed: the model is left unmeasured, not failed, so
    that a later run measures it."""


class Models:
    """The parts that measure one model at a time (MODEL_PARTS), each model built from the same init seed at the
    bench size (a preset keeps its own n_layer), measured, and freed before the next; their entries go into
    out['results'] and the JSON is written after every model. A model whose entry already holds a part's
    result, or its error, is not measured again: a run cut short goes on where it stopped."""

    def __init__(self, a, size, plans, rt, clock, peak, out, save):
        self.a, self.plans, self.rt, self.clock, self.peak, self.out, self.save = a, plans, rt, clock, peak, out, save
        self.size = dict(size)
        self.B, self.L = self.size.pop('batch_size'), size['block_size']
        self.res = out['results']
        self.refs = {}  # reference name -> its step function, or the exception that stopped its build
        g = torch.Generator().manual_seed(a.seed)
        self.xy = torch.randint(size['vocab_size'], (self.B, self.L + 1), generator=g).to(rt.device)
        # every model compiles its own graphs; past dynamo's default of 8 per function a model would run eagerly
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)

    def config(self, name):
        return model_config(name, self.size, self.plans, self.a.auto_only)

    def ref_name(self, cfg):
        """rope at the model's depth: 'rope' at the bench size's, 'rope-6L' beside a 6-layer preset."""
        return 'rope' if cfg.n_layer == self.size['n_layer'] else f'rope-{cfg.n_layer}L'

    def model(self, name, cfg):
        """`name`'s model built from the bench's seed on the device, and its entry (describe)."""
        torch.manual_seed(self.a.seed)
        model = GPT(cfg).to(self.rt.device)
        return model, self.describe(name, cfg, model)

    def describe(self, name, cfg, model):
        """A model's entry before it is measured: its class and goal, depth and each layer's route."""
        hooks = layer_hooks(cfg)
        c = goal_class(hooks)
        r = self.res.setdefault(name, {})
        routes = model.routes(self.rt.device, dtype=self.rt.ptdtype)
        r.update(goal_class=c, goal=GOALS[c][1], n_layer=cfg.n_layer, routes=routes,
                 run=len(self.out['meta']['runs']) - 1)
        return r

    def build(self, name, cfg):
        """Build, compile and warm up a model for training; its entry gets compile_s (the first step), loss_first
        and peak_MiB -> (its step function, the model)."""
        model, r = self.model(name, cfg)
        step, opt = harness.train_stepper(model, self.xy, self.rt, PAIR_LR, harness.train_settings(self.a.preset),
                                          self.a.compile)
        t0 = self.clock.now()
        r['loss_first'] = step().item()
        r['compile_s'] = self.clock.now() - t0
        for _ in range(self.a.warmup - 1):
            step()
        r['peak_MiB'] = harness.peak_MiB(step, self.rt.device_type, model, opt)
        self.save()
        return step, model

    def between(self):
        if self.rt.device_type == 'cuda':
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def reference(self, ref, n_layer):
        """The step function of rope at n_layer, built once: its entry gets its own blocks of steps alone (the
        protocol of the pairs, no partner) and its MFU at this batch."""
        if ref not in self.refs:
            try:
                cfg = dataclasses.replace(self.config('rope'), n_layer=n_layer)
                step, model = self.build(ref, cfg)
                timed = time_blocks([ref] * (self.a.blocks + 1), {ref: step}, self.a.block_steps, self.clock,
                                    self.between)
                r = self.res[ref]
                r.update(step_stats([ts for _, ts in timed]), ref=ref, vs_rope=1.0)
                r.pop('error', None)
                if self.peak:
                    r['mfu'] = runtime.mfu(model, self.L, self.B, r['ms_median'] / 1e3, self.peak)
                    r['mfu_at'] = [self.B, self.L]
                self.refs[ref] = step
            except Exception as e:  # noqa: BLE001 - without it no model of this depth can be timed
                self.res.setdefault(ref, {})['error'] = error_text(e)
                self.refs[ref] = e
            self.save()
        if isinstance(self.refs[ref], Exception):
            raise ReferenceFailed(f"its reference {ref} failed: {self.res[ref]['error'][:200]}")
        return self.refs[ref]

    def retime_references(self):
        """Each reference that timed a partner in this process, alone again in as many blocks as at its build: its
        entry's alone_after_ms, the median step, beside ms_median from before its partners."""
        partnered = {r['ref'] for n, r in self.res.items() if r.get('ref') not in (None, n) and 'rope_ms_median' in r}
        for ref, step in self.refs.items():
            if ref in partnered and not isinstance(step, Exception):
                timed = time_blocks([ref] * (self.a.blocks + 1), {ref: step}, self.a.block_steps, self.clock,
                                    self.between)
                self.res[ref]['alone_after_ms'] = step_stats([ts for _, ts in timed])['ms_median']
                print(f"{ref}: alone again after its partners, ms_median {self.res[ref]['alone_after_ms']:.4g} "
                      f"(before them {self.res[ref]['ms_median']:.4g})", flush=True)

    def summarize(self):
        """The references' spreads over their partners, and the goals' rows, into the JSON."""
        for ref in [n for n, r in self.res.items() if r.get('ref') == n]:
            self.res[ref].update(ref_summary(self.res, ref))
        self.out['goals'] = goal_rows(self.res)

    def pairs(self, name):
        """Part pairs: the model against rope of its depth in alternate blocks (pair_order, time_blocks), after its
        compile and --warmup steps."""
        cfg = self.config(name)
        ref = self.ref_name(cfg)
        r = self.res.setdefault(name, {})
        r['ref'] = ref
        steps = {ref: self.reference(ref, cfg.n_layer)}
        if name == ref:  # rope asked for itself: its blocks alone are its entry
            return
        with harness.time_limit(self.a.scheme_limit):
            steps[name], _ = self.build(name, cfg)
            timed = time_blocks(pair_order(ref, name, self.a.blocks), steps, self.a.block_steps, self.clock,
                                self.between)
        r.update(pair_stats(timed, ref, name))

    def attn_time(self, name):
        """Part attn_time: the model's first layer timed several ways (check_attn_time)."""
        self.measure(name, lambda model, r: check_attn_time(model, self.B, self.L, self.rt, self.clock, r))

    def long(self, name):
        """Part long: no-grad forwards at 8L and 16L (check_long)."""
        self.measure(name, lambda model, r: check_long(model, self.L, self.a, self.rt, self.clock, r))

    def measure(self, name, check):
        """check(model, r) of `name`'s model, built at the bench's seed on the device, into its entry r (describe),
        within --scheme_limit."""
        model, r = self.model(name, self.config(name))
        with harness.time_limit(self.a.scheme_limit):
            check(model, r)

    DONE = {'pairs': ('vs_rope', 'error'), 'attn_time': ('attn_time', 'attn_time_error'),
            'long': ('long', 'long_error')}  # a part's result and its error: either ends a model's part

    def run(self, part, names, over_budget):
        """`part` of each of `names` in turn that its entry lacks (or, with --retry, holds as an error); none started
        once over_budget() -> the names that failed."""
        failed, result_key, error_key = [], *self.DONE[part]
        for name in names:
            r = self.res.get(name, {})
            if r.get('measuring') == part:  # saved before it started and never cleared: the process died on it
                del r['measuring']
                r[error_key] = "the process died measuring it (a crash, or killed): --retry=True measures it again"
                print(line(name, r, part), flush=True)
            if result_key in r or (error_key in r and not self.a.retry):
                continue
            if over_budget():
                self.out.setdefault('skipped', {}).setdefault(part, []).append(name)
                continue
            r.pop(error_key, None)
            self.res.setdefault(name, r)['measuring'] = part  # on disk while it runs: a crash leaves it there
            self.save()
            try:
                getattr(self, part)(name)
            except ReferenceFailed:
                failed.append(name)
            except (Exception, harness.SchemeTimeout) as e:  # noqa: BLE001 - a model that fails to build, compile,
                self.res.setdefault(name, {})[error_key] = error_text(e)  # fit or finish: the next one goes on
                failed.append(name)
            finally:  # (Ctrl-C and `timeout -s INT` pass here too: a run cut short is no crash)
                self.res[name].pop('measuring', None)
                self.summarize()
                self.save()
                if self.rt.device_type == 'cuda':
                    torch.cuda.empty_cache()
            print(line(name, self.res[name], part), flush=True)
        if part == 'pairs':
            self.retime_references()
        self.save()  # the skipped
        return failed


class Rebiased:
    """A scheme as a layer's forward sees it with its bias replaced: its score_mod (and value_mod, where given) these
    functions, every other hook and attribute the scheme's own. The forward asks the scheme it is handed for its
    hooks, so a probe hands it this in the scheme's place and the scheme stays as it is."""

    def __init__(self, scheme, score_mod, value_mod=None):
        self.scheme, self.score_mod = scheme, score_mod
        if value_mod is not None:
            self.value_mod = value_mod

    def __getattr__(self, name):
        return getattr(self.scheme, name)


def no_bias(*args):
    """A hook that adds nothing (score_mod, value_mod)."""
    return None


def one_table(bias, q, k):
    """A bias (what a score_mod returns, or None) of the queries q over the keys k as one float32 [B, H, Tq, Tk]
    tensor, a row per batch row (FlexAttention indexes b), or None."""
    if bias is None:
        return None
    with torch.autocast(q.device.type, enabled=False):
        t = attention.dense_bias(bias, q.size(0), q.size(1), q.size(2), k.size(2), q.device)
    return t.expand(q.size(0), -1, -1, -1).contiguous()


def tabled(score_mod, whole):
    """score_mod with its bias handed over as one table (one_table): read at each logit, its mod alone (whole=False),
    or the tensor whole (Bias.tensor: route sdpa_bias where the layer is on CUDA)."""
    def mod(q, k, ctx, params):
        t = one_table(score_mod(q, k, ctx, params), q, k)
        if t is None:
            return None
        return attention.Bias(tensor=t) if whole else attention.Bias(attention.Bias(tensor=t).mod, reads_table=True)
    return mod


@contextmanager
def frozen(model):
    """The model's positional parameters not trained inside the block, trained again after it."""
    ps = [p for n, p in model.named_parameters() if is_positional(n) and p.requires_grad]
    try:
        for p in ps:
            p.requires_grad_(False)
        yield
    finally:
        for p in ps:
            p.requires_grad_(True)


def attn_ways(model, route, cuda):
    """check_attn_time's ways for the model's first layer, whose route in training is `route`: {way: (the scheme the
    layer is handed, a function that returns the context the way runs in)}, None for a way that does not apply (a
    backend the layer takes anyway, or off CUDA; a table where a value term or attention scaling joins the bias)."""
    attn, scheme = harness.layer(model, 0)
    plain = type(scheme).value_mod is positional.PositionalEncoding.value_mod and attn.scaling is None
    return {'built': (scheme, nullcontext),
            'flex': cuda and route != 'flex' and (scheme, lambda: model.attention_backend('flex')),
            'dense': cuda and route != 'dense' and (scheme, lambda: model.attention_backend('dense')),
            'frozen': (scheme, lambda: frozen(model)),
            'table': plain and (Rebiased(scheme, tabled(scheme.score_mod, whole=False)), nullcontext),
            'table_sdpa': plain and cuda and (Rebiased(scheme, tabled(scheme.score_mod, whole=True)), nullcontext),
            'no_bias': (Rebiased(scheme, no_bias, no_bias), nullcontext)}


def time_ways(ways, run, reps, clock):
    """Each way's run(scheme) inside its context: two untimed calls each (the first's output kept), then `reps` rounds
    of one timed call each, the ways in turn -> ({way: the first output}, {way: [seconds of each round]})."""
    ys, ts = {}, {w: [] for w in ways}
    for w, (scheme, context) in ways.items():
        with context():
            ys[w] = run(scheme)
            run(scheme)
    for _ in range(reps):
        for w, (scheme, context) in ways.items():
            with context():
                t0 = clock.now()
                run(scheme)
                ts[w].append(clock.now() - t0)
    return ys, ts


def check_attn_time(model, B, T, rt, clock, r, reps=10):
    """Where a bias layer's time goes: the model's first layer, its attention alone (projections included), forward
    and backward at B x T (harness.layer_pass), in r['attn_time'] (ms), these ways (attn_ways), timed in `reps`
    rounds of one call each, the ways in turn (after two calls each), so that a drift of the device's speed reaches
    every way alike (time_ways); each way's median:
      built    as the model has it in training, by the route it takes there (r['attn_time']['route']);
      flex, dense  under attn_backend 'flex' or 'dense', on CUDA where built's route is another: what it saves;
      frozen   the scheme's parameters not trained: no captured tensor made from them needs a gradient, so
               FlexAttention's backward scatters none into them (a per-head scalar, a per-distance table);
      table    the bias handed over as one float32 [B, H, T, T] tensor: its gradient leaves the kernel one logit a
               cell, and autograd carries it to the parameters (not for a value term or attention scaling);
      table_sdpa  that tensor handed whole (Bias.tensor), on CUDA: route sdpa_bias, SDPA's memory-efficient kernel
               with the table as its bias, the materialised-bias route for any bias (DeBERTa's too);
      no_bias  the same layer with no score_mod or value term (SDPA): what attention without the bias costs.
    `built_vs_no_bias` [q1, q3]: the median (quartiles) over rounds of built's time over no_bias's in that round.
    `table_err`, `table_sdpa_err`: their outputs against built's (harness.rel_err: the same bias, rounding only)."""
    attn, _ = harness.layer(model, 0)
    model.train()
    gen = torch.Generator(device=rt.device).manual_seed(2)
    x = torch.randn(B, T, model.config.n_embd, device=rt.device, generator=gen, requires_grad=True)
    g = torch.randn(B, T, model.config.n_embd, device=rt.device, generator=gen)
    routes = r.get('routes') or model.routes(rt.device, dtype=rt.ptdtype)
    out = r['attn_time'] = {'route': routes[0]}
    ways = attn_ways(model, out['route'], torch.device(rt.device).type == 'cuda')
    out.update({w: None for w, way in ways.items() if not way})  # a way that does not apply here
    ways = {w: way for w, way in ways.items() if way}
    ys, ts = time_ways(ways, lambda scheme: harness.layer_pass(attn, scheme, x, g, rt.autocast), reps, clock)
    attn.zero_grad(set_to_none=True)
    x.grad = None
    out.update({w: statistics.median(t) * 1e3 for w, t in ts.items()})
    ratios = [a / b for a, b in zip(ts['built'], ts['no_bias'])]
    out['built_vs_no_bias'] = statistics.median(ratios)
    if len(ratios) > 1:
        out['built_vs_no_bias_q1'], _, out['built_vs_no_bias_q3'] = statistics.quantiles(ratios, n=4)
    for w in ('table', 'table_sdpa'):
        if w in ys:
            out[f'{w}_err'] = harness.rel_err(ys[w], ys['built'])


@torch.no_grad()
def check_long(model, L, a, rt, clock, r, reps=3):
    """No-grad forwards at 8L and 16L (the last position's logits, as a long prompt's): the first call (it compiles),
    then the peak memory of one (harness.peak_MiB: O(T) where nothing T x T is held), then the median of `reps`,
    as tokens/s, in r['long'][f'{m}L']. A length the model does not address, or whose forward fails, says so."""
    model.eval()
    out = r['long'] = {}
    for m in (8, 16):
        T = m * L
        if not model.pe.addresses(T):
            out[f'{m}L'] = dict(error=f'no positions past {model.pe.max_len}')
            continue
        xe = torch.randint(model.config.vocab_size, (max(1, a.eval_batch_tokens // T), T), device=rt.device)

        def fwd():
            with rt.autocast:
                model(xe, last=1)
        try:
            t0 = clock.now()
            fwd()
            first = clock.now() - t0
            peak = harness.peak_MiB(fwd, rt.device_type, model)
            ts = []
            for _ in range(reps):
                t0 = clock.now()
                fwd()
                ts.append(clock.now() - t0)
            out[f'{m}L'] = dict(T=T, rows=xe.size(0), first_s=first, tok_s=xe.numel() / statistics.median(ts),
                                peak_MiB=peak)
        except Exception as e:  # noqa: BLE001 - report the failure, go on with the next length
            out[f'{m}L'] = dict(error=error_text(e))


LOG_KEYS = {'pairs': ('error', 'ref', 'goal_class', 'vs_rope', 'vs_rope_q1', 'vs_rope_q3', 'ms_median',
                     'rope_ms_median', 'compile_s', 'peak_MiB', 'partner_spread', 'mfu'),
            'attn_time': ('attn_time_error', 'attn_time'), 'long': ('long_error', 'long')}


def line(name, r, part):
    """One model's part as a line of the log (every step stays in the JSON)."""
    keys = [k for k in LOG_KEYS[part] if k in r] + ['routes'] * ('routes' in r)
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else runs_text(v) if isinstance(v, list) else \
        '{' + ', '.join(f"{k}: {fmt(x)}" for k, x in v.items()) + '}' if isinstance(v, dict) else str(v)  # noqa: E731
    return f"{name}: " + ', '.join(f"{k} {fmt(r[k])}" for k in keys)


def git_commit():
    """This tree's commit, short, '+' where it has uncommitted changes; '' outside git."""
    def git(*args):
        return subprocess.run(['git', *args], cwd=ROOT, capture_output=True, text=True)
    head = git('rev-parse', '--short', 'HEAD')
    if head.returncode != 0:
        return ''
    return head.stdout.strip() + ('+' if git('diff', '--quiet', 'HEAD').returncode else '')


def default_json():
    """results/gpu/<today>-<commit>/bench.json, where a run's raw JSON is committed."""
    return os.path.join(ROOT, 'results', 'gpu', f"{time.strftime('%Y-%m-%d')}-{git_commit().rstrip('+') or 'nogit'}",
                        'bench.json')


# the meta a resumed JSON must share with this run: its numbers are only comparable within one setup
SAME_SETUP = ('device', 'torch', 'dtype', 'preset', 'model', 'batch_size', 'compile', 'clock', 'blocks', 'block_steps',
              'warmup', 'auto_only')


def model_parts(a, parts, names, plans, size, rt, clock, peak, peak_label):
    """The parts of MODEL_PARTS asked, in order, each over the models it applies to, into --json (resumed if it
    exists) -> exit status: 1 if a model failed."""
    path = a.json or default_json()
    meta = dict(device=runtime.device_name(rt), torch=torch.__version__, dtype=rt.dtype, preset=a.preset,
                model={k: v for k, v in size.items() if k != 'batch_size'}, batch_size=size['batch_size'],
                compile=a.compile, clock=clock.kind, blocks=a.blocks, block_steps=a.block_steps, warmup=a.warmup,
                auto_only=a.auto_only, peak=peak_label,
                goals={k: dict(what=w, goal=g) for k, (w, g) in GOALS.items()}, runs=[])
    out, why = read_json(path)
    if why:
        sys.exit(f"--json={path}: {why}; move it away or name another file")
    if out is None:
        out = {'meta': meta, 'results': {}}
    else:
        diff = [k for k in SAME_SETUP if out['meta'].get(k) != meta[k]]
        if diff:
            there = out['meta']
            sys.exit(f"--json={path} holds a run of another setup ("
                     + ', '.join(f'{k} {there.get(k)!r} there, {meta[k]!r} here' for k in diff)
                     + "); name another --json")
        print(f"resuming {path}: {len(out['results'])} models in it")
    out.pop('skipped', None)  # the skipped of this run
    out['meta']['runs'].append(dict(time=time.strftime('%Y-%m-%d %H:%M:%S'), commit=git_commit(), argv=sys.argv,
                                    parts=parts))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    def save():
        atomic_write(path, lambda f: json.dump(out, f, indent=1), binary=False)
    save()
    m, t0, failed = Models(a, size, plans, rt, clock, peak, out, save), time.perf_counter(), []
    for part in parts:
        print(f"part {part}: {len(names[part])} models", flush=True)
        failed += m.run(part, names[part], lambda: time.perf_counter() - t0 > a.budget)
    print(f"bench, {', '.join(parts)}: {time.perf_counter() - t0:.0f}s -> {path}"
          + (f"; FAILED: {', '.join(failed)}" if failed else '')
          + ''.join(f"; {p} skipped (time budget): {', '.join(s)}" for p, s in out.get('skipped', {}).items()))
    return 1 if failed else 0


# --- the table of docs/gpu.md, from the raw JSON of model parts (--table) ---------------------------

def run_label(path, meta):
    """Which run a JSON holds, as `date-commit`: its folder's name under results/gpu/, else its last run's."""
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    if re.fullmatch(r'\d{4}-\d{2}-\d{2}-[0-9a-f]{7,40}', folder):
        return folder
    last = (meta.get('runs') or [{}])[-1]
    return f"{last.get('time', '?')[:10]}-{last.get('commit') or '?'}"


def runs_text(xs):
    """['sdpa', 'sdpa', 'flex'] -> 'sdpa ×2, flex': a layer's route in runs of equal layers."""
    out = []
    for x, group in itertools.groupby(xs):
        n = len(list(group))
        out.append(f"{x} ×{n}" if n > 1 else x)
    return ', '.join(out)


PART_KEYS = {'pairs': ('vs_rope', 'error', 'ms_median'), 'attn_time': ('attn_time', 'attn_time_error'),
             'long': ('long', 'long_error')}  # an entry holds a part's row where it holds one of these


def run_setup(m):
    """A JSON's meta as a line: the device, torch, the model, the batch and how the pairs were timed."""
    how = f"blocks of {m['block_steps']} steps, {m['blocks']} a model" if 'blocks' in m else \
        f"{m['steps']} steps each, alternated (gpu_check.py)" if 'steps' in m else ''
    size = m['model']
    model = f"{m.get('preset')} ({size['n_layer']} × {size['n_embd']}, T = {size['block_size']})"
    return ', '.join(x for x in (m.get('device'), f"torch {m.get('torch')}", m.get('dtype'), model,
                                 f"batch {m.get('batch_size')}", 'compiled' if m.get('compile') else 'eager', how) if x)


def cell(v, fmt):
    """A value as a table cell, '—' for none."""
    return '—' if v is None else format(v, fmt)


def failed(error):
    """An error as a table cell: its start, on one line, without the table's bars."""
    return 'failed: ' + error[:60].replace('|', '/').replace('\n', ' ')


def bullets(texts):
    """Markdown bullets, each folded at 120 characters."""
    return [textwrap.fill(t, 120, initial_indent='- ', subsequent_indent='  ') for t in texts]


def read_parts(paths):
    """The model parts' JSON files `paths` -> ({part: {model: (its entry, the run it comes from)}}, {run: its meta},
    {(part, model): a note of it skipped}); a later file's entry over an earlier one's, in the order each ran."""
    rows, metas, skipped = {p: {} for p in PART_KEYS}, {}, {}
    for path in paths:
        out, why = read_json(path)
        if out is None:
            sys.exit(f"--table: {path}: {why or 'no such file'}")
        label = run_label(path, out['meta'])
        metas[label] = out['meta']
        for name, r in out['results'].items():
            for part, keys in PART_KEYS.items():
                if any(k in r for k in keys):
                    rows[part].pop(name, None)  # a later file's entry goes where it ran, after the earlier ones
                    rows[part][name] = (r, label)
        sk = out.get('skipped') or {}
        sk = {'pairs': sk} if isinstance(sk, list) else sk  # gpu_check's pairs wrote a list
        skipped.update({(p, n): f"{n} ({p}, {label})" for p, ns in sk.items() for n in ns})
    return rows, metas, skipped


def pair_row(name, r, label, n_layer, is_ref):
    """One model's row of the pairs' table; n_layer: the depth of its run's bench model."""
    depth = r.get('n_layer', (preset_config(name).get('n_layer', n_layer) if name in PRESETS else n_layer))
    route = runs_text(r.get('routes') or r.get('attention_backends') or [])  # (older files: the old key)
    ms = '—' if 'ms_median' not in r else \
        f"{r['ms_median']:.1f} [{cell(r.get('ms_q1'), '.1f')}, {cell(r.get('ms_q3'), '.1f')}]"
    if is_ref:
        spread = r.get('partner_spread_ms')
        vs = failed(r['error']) if 'error' in r else '1 (the reference)'
        same = f"{spread[0]:.1f}–{spread[1]:.1f} over {len(r['by_partner'])}" if spread else '—'
        goal, met = '—', ''
    else:
        goal, same = cell(r.get('goal'), 'g'), cell(r.get('rope_ms_median'), '.1f')
        v = r.get('vs_rope')
        met = '' if v is None else 'yes' if v >= r['goal'] else 'no'
        if 'error' in r:
            vs, met = failed(r['error']), ''
        elif 'ref' not in r and depth != n_layer:  # a file of before the same-depth reference
            vs, met = f"not a ratio: {depth} layers against rope's {n_layer}", ''
        else:
            vs = f"{v:.3f} [{cell(r.get('vs_rope_q1'), '.3f')}, {cell(r.get('vs_rope_q3'), '.3f')}]"
    return (f"| {name} | {r.get('goal_class', '—')} | {goal} | {vs} | {met} | {ms} | {same} | "
            f"{cell(r.get('compile_s'), '.1f')} | {cell(r.get('peak_MiB'), ',.0f')} | {route} | {label} |")


def ref_notes(name, r, label):
    """A reference's notes after the pairs' table: its MFU, and its median step beside each partner."""
    notes = []
    if 'mfu' in r:
        goal, B, T = MFU_GOAL
        notes.append(f"{name}'s MFU: {r['mfu']:.3f} at {r['mfu_at'][0]} × {r['mfu_at'][1]} ({label}; the goal: "
                     f"{goal:.2f} at {B} × {T})")
    if 'by_partner' in r:
        after = f"; alone {r['ms_median']:.1f} before its partners, {r['alone_after_ms']:.1f} after them" \
            if 'alone_after_ms' in r else ''
        notes.append(f"{name}'s median step beside each partner, ms: " + ', '.join(
            f"{p} {v:.1f}" for p, v in r['by_partner'].items()) + f" (max / min {r['partner_spread']:.3f}{after})")
    return notes


def pairs_lines(rows, metas, skipped):
    """The pairs' table, references first, then its notes: the references' (ref_notes) and the models no run
    reached."""
    pairs, lines = rows['pairs'], []
    refs = [n for n, (r, _) in pairs.items() if r.get('ref', 'rope' if n == 'rope' else None) == n]
    if pairs:
        lines += ['', '| model | class | goal | vs rope [q1, q3] | met | ms [q1, q3] | rope ms, same pairs | compile s '
                  '| peak MiB | route per layer | run |', '|' + ' --- |' * 11]
    for name in refs + [n for n in pairs if n not in refs]:
        r, label = pairs[name]
        lines.append(pair_row(name, r, label, metas[label]['model']['n_layer'], name in refs))
    notes = [note for name in refs for note in ref_notes(name, *pairs[name])]
    missed = [text for (p, n), text in skipped.items() if n not in rows[p]]
    if missed:
        notes.append(f"not reached (time budget): {', '.join(missed)}")
    return lines + ([''] + bullets(notes) if notes else [])


def attn_time_lines(rows):
    """The attention times' table (check_attn_time), one row a model."""
    lines = ['', "| model | layer 0's route | as built, ms | on flex | on dense | frozen | as one table | "
             "the table whole (sdpa_bias) | without bias | as built / without, by round [q1, q3] | "
             "errors of the tables | run |", '|' + ' --- |' * 12] if rows else []
    for n, (r, label) in rows.items():
        t = r.get('attn_time')
        if not t:
            lines.append(f"| {n} | " + ' | '.join([failed(r['attn_time_error'])] + [''] * 10) + f" | {label} |")
            continue
        ways = [cell(t.get(k), '.2f') for k in ('built', 'flex', 'dense', 'frozen', 'table', 'table_sdpa', 'no_bias')]
        paired = f"{t['built_vs_no_bias']:.2f} [{cell(t.get('built_vs_no_bias_q1'), '.2f')}, " \
            f"{cell(t.get('built_vs_no_bias_q3'), '.2f')}]" if 'built_vs_no_bias' in t else '—'
        errs = ', '.join(cell(t.get(k), '.1e') for k in ('table_err', 'table_sdpa_err') if k in t)
        lines.append(f"| {n} | " + ' | '.join([t.get('route', '—'), *ways, paired, errs or '—']) + f" | {label} |")
    return lines


def long_lines(rows):
    """The long forwards' table (check_long), one row a model."""
    lines = ['', '| model | 8L tokens/s | 8L peak MiB | 16L tokens/s | 16L peak MiB | run |', '|' + ' --- |' * 6] \
        if rows else []
    for n, (r, label) in rows.items():
        d = r.get('long')
        cells = [failed(r['long_error'])] + [''] * 3 if not d else [
            failed(d[m]['error']) if 'error' in d[m] else cell(d[m][k], ',.0f') for m in ('8L', '16L')
            for k in ('tok_s', 'peak_MiB')]
        lines.append(f"| {n} | " + ' | '.join(cells) + f" | {label} |")
    return lines


def table(paths):
    """Markdown of the model parts' JSON files `paths`: per part, one row a model, a later file's entry over an
    earlier one's, each with the run it comes from. The pairs: each figure beside its goal, then rope's MFU and its
    step beside each partner; then the attention times and the long forwards, where the files hold them."""
    rows, metas, skipped = read_parts(paths)
    lines = bullets(f"{label}: {run_setup(m)}" for label, m in metas.items())
    lines += pairs_lines(rows, metas, skipped) + attn_time_lines(rows['attn_time']) + long_lines(rows['long'])
    return '\n'.join(lines)


# --- smoke runs (part smoke) -------------------------------------------------------

SMOKE_ARGS = ['--max_iters=4', '--wandb_log=False']
SMOKE_BOUND_S = 90  # seconds a smoke run of any scheme may take on a 2-core CPU
TIMING = ('startup_s', 'train_s', 'final_eval_s')  # train.py's eval.json 'timing': where the run's time went


def smoke_timing(out_dir):
    """A finished train.py run's own account of its time, eval.json's `timing` (TIMING, floats); {} if missing."""
    res, _ = read_json(os.path.join(out_dir, 'eval.json'))
    t = res.get('timing') if isinstance(res, dict) else None
    if not isinstance(t, dict) or not all(isinstance(t.get(k), (int, float)) for k in TIMING):
        return {}
    return {k: float(t[k]) for k in TIMING}


def smoke_run(name, args, a):
    """One `python train.py config/<name>.py ARGS --smoke_args` into a fresh out_dir -> its numbers; its
    output goes to its log, kept in --smoke_logs if given. --smoke_cache: 'cold' (an empty torch.compile
    cache) or 'user' (yours). Past --smoke_timeout, or when bench stops, its process group is killed."""
    cfg = f"config/{'nope' if name == 'none' else name}.py"  # the scheme's own config file, if it has one
    cfg = cfg if os.path.exists(os.path.join(ROOT, cfg)) else None
    with tempfile.TemporaryDirectory(prefix=f'nanope-smoke-{name}-') as tmp:
        first = [cfg] if cfg else [f'--pos_encoding={name}']
        cmd = [sys.executable, 'train.py'] + first + args + [f'--out_dir={tmp}']
        # cold: torch.compile's on-disk caches start empty, as on a user's first run, not as earlier runs left them
        env = {'TORCHINDUCTOR_CACHE_DIR': os.path.join(tmp, 'inductor-cache')} if a.smoke_cache == 'cold' else {}
        log, load = os.path.join(a.smoke_logs or tmp, f'{name}.log'), os.getloadavg()[0]
        ru0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        with open(log, 'w') as f:
            p = runtime.spawn(cmd, f, env)
        try:
            rc = p.wait(a.smoke_timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        wall, ru1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
        r = dict(config=cfg, command=' '.join(cmd[1:-1] + ['--out_dir=TMP']), rc=rc, wall_s=wall,
                 child_cpu_s=(ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime), loadavg_before=load,
                 **smoke_timing(tmp))
        if 'train_s' in r:
            r['other_s'] = wall - sum(r[k] for k in TIMING)
        if rc != 0:
            r['tail'] = open(log, errors='replace').read().splitlines()[-15:]
    return r


def smoke(a, names):
    """Part smoke (see the top of the file) -> {scheme: numbers}, and their table."""
    if not os.path.exists(os.path.join(ROOT, 'data', 'shakespeare_char', 'train.bin')):
        sys.exit("part smoke: data/shakespeare_char/train.bin is missing; prepare it first "
                 "(python data/shakespeare_char/prepare.py) so that the runs time training, not the download")
    if a.smoke_logs:
        os.makedirs(a.smoke_logs, exist_ok=True)
    args, res = SMOKE_ARGS + a.smoke_args.split(), {}
    with progress(total=len(names), desc='smoke', unit='run') as bar:
        for name in names:
            r = res[name] = smoke_run(name, args, a)
            if r['rc'] != 0:
                print(f"smoke {name}: " + ('TIMED OUT' if r['rc'] is None else f"FAILED rc={r['rc']}")
                      + '\n  ' + '\n  '.join(r['tail']), file=sys.stderr, flush=True)
            bar.set_postfix_str(f"{name} {r['wall_s']:.1f} s")
            bar.update()
    print(f"\n`python train.py config/<scheme>.py {' '.join(args)} --out_dir=<fresh dir>`: {runtime.cpu_name()}, "
          f"{os.cpu_count()} CPU(s), torch {torch.__version__}, torch default threads, {a.smoke_cache} torch.compile "
          f"cache; wall seconds per run (startup, train and final eval as the run reports them in eval.json's "
          f"`timing`; other = the rest: interpreter start and exit; — where a run reports none)")
    print(f"| scheme | config | wall s | startup | train | final eval | other | CPU s | ≤ {SMOKE_BOUND_S} s |\n|"
          + ' --- |' * 9)
    f = lambda v: '—' if v is None else f'{v:.1f}'  # noqa: E731
    for name, r in res.items():
        ok = r['rc'] == 0 and r['wall_s'] <= SMOKE_BOUND_S
        print(f"| {name} | {r['config'] or '(none)'} | {r['wall_s']:.1f} | " + ' | '.join(
            f(r.get(c)) for c in TIMING + ('other_s',)) + f" | {r['child_cpu_s']:.0f} | "
            + ('yes' if ok else 'NO' + ('' if r['rc'] == 0 else ' (failed)')) + ' |')
    if res:
        worst = max(res, key=lambda s: res[s]['wall_s'])
        over = [s for s, r in res.items() if r['rc'] != 0 or r['wall_s'] > SMOKE_BOUND_S]
        print(f"max {res[worst]['wall_s']:.1f} s ({worst}); bound {SMOKE_BOUND_S} s each: "
              + (f"MISSED by {', '.join(over)}" if over else 'met by every scheme'))
    return res


# --- main ---------------------------------------------------------------------------

OPTIONS = dict(
    schemes='all',                     # comma list of positional.REGISTRY names; rope is always added
    presets='',                        # comma list of presets.PRESETS (config/<preset>.py), or 'all'
    windowed=0,                        # W > 0: also rope with a W-key sliding window on every layer
    parts='train,memory,eval,sample',  # which measurements to run, or smoke, or of MODEL_PARTS
    preset='',                         # the model: config/bench_<preset>.py ('default' | 'gpt2'; '': default)
    n_layer=0, n_head=0, n_embd=0, block_size=0, vocab_size=0, batch_size=0,  # 0: the preset's
    device='auto', dtype='auto',       # auto: CUDA + bf16 autocast where available, else CPU float32
    compile=False,                     # torch.compile train and eval (not sampling: the KV cache changes shape)
    threads=0, clock='',               # torch CPU threads (0: its default); 'cpu' | 'wall' ('': cpu on CPU)
    rounds=5, iters=2, warmup=2,       # round-robin rounds; timed and untimed train iterations per round
    eval_mult=8, eval_batch_tokens=16384, new_tokens=1000, sample_stride=10, json='', seed=0, decode_steps=16,
    smoke_timeout=900, smoke_logs='', smoke_cache='cold', smoke_args='',  # part smoke: see smoke_run
    blocks=5, block_steps=5,           # MODEL_PARTS: a model's blocks in its pairs, timed steps a block
    budget=540.0, scheme_limit=0.0,    # no model started after budget s; one model stopped after scheme_limit s
    classes='all', auto_only=False,    # the models of these GOALS classes; wall on 'auto', not fla
    retry=False,                       # measure again the models whose entry holds an error
    table='',                          # comma list of MODEL_PARTS JSON files: print their markdown table, exit
)
RULES = dict(rounds='>0', iters='>0', warmup='>=0', eval_mult='>0', eval_batch_tokens='>0', windowed='>=0',
             new_tokens='>0', sample_stride='>0', threads='>=0', smoke_timeout='>0', blocks='>0', block_steps='>0',
             budget='>0', scheme_limit='>=0', clock=(lambda v: v in ('', 'cpu', 'wall'), "'cpu' or 'wall'"),
             smoke_cache=(lambda v: v in ('cold', 'user'), "'cold' or 'user'"),
             classes=(lambda v: v == 'all' or set(v.split(',')) <= set(GOALS),
                      f"'all' or a comma list of {tuple(GOALS)}"))


def parts_asked(a):
    """--parts -> (the set of parts, the MODEL_PARTS among them in order); exits where it names an unknown part, or
    mixes MODEL_PARTS with the others."""
    parts = a.parts.split(',')
    if set(parts) - SCHEME_PARTS - {'smoke'} - set(MODEL_PARTS):
        sys.exit(f"--parts takes a comma list of train, memory, eval, sample, decode, smoke, or of "
                 f"{', '.join(MODEL_PARTS)}; got {a.parts!r}")
    one_model = [p for p in parts if p in MODEL_PARTS]
    if one_model and len(one_model) < len(parts):
        sys.exit(f"--parts: {', '.join(MODEL_PARTS)} measure one model at a time into a JSON to resume from; run "
                 f"them apart from {', '.join(p for p in parts if p not in MODEL_PARTS)}")
    return set(parts), one_model


def model_names(a, asked, size):
    """The models MODEL_PARTS measure: the schemes asked (rope first) and the presets of --presets, those of the
    --classes kept -> ({part: its models}, the presets' plans). attn_time takes those with a bias in layer 0."""
    plans = preset_plans(a.presets, twins=False)
    keep = a.classes.split(',') if a.classes != 'all' else list(GOALS)
    shape, hooks = {k: v for k, v in size.items() if k != 'batch_size'}, {}
    for n in asked + list(plans):
        try:
            hooks[n] = layer_hooks(model_config(n, shape, plans, a.auto_only))
        except Exception:  # noqa: BLE001 - a plan that does not fit this size: its entry will say why
            hooks[n] = None
    models = [n for n in dict.fromkeys(['rope'] * ('rope' in asked) + asked + list(plans))  # rope first
              if hooks[n] is None or goal_class(hooks[n]) in keep]
    per_part = {'pairs': models, 'long': models,
                'attn_time': [n for n in models if hooks[n] is None or hooks[n][0][2]]}  # a bias in layer 0
    return per_part, plans


def scheme_parts(a, names, parts, size, rt, clock, peak, peak_label, dev_name):
    """The round-robin parts (SCHEME_PARTS) over `names`, the presets of --presets and rope in a --windowed window,
    and their table -> (the results, the JSON's meta of them)."""
    plans = {**preset_plans(a.presets), **({f'rope-window{a.windowed}': {'sliding_window': a.windowed}}
                                            if a.windowed else {})}
    b = Bench(names, size, a, rt, clock, plans)
    if parts & {'train', 'memory'}:
        b.train(parts, peak)
    if parts & {'eval', 'memory'}:
        b.eval(parts)
    if 'sample' in parts:
        b.sample()
    if 'decode' in parts:
        b.decode()
    report(b.res, b.order, a, b.B, b.L, b.T8, clock, dev_name, rt.dtype)
    return b.res, dict(model=b.size, batch_size=b.B, peak_flops=peak_label)


def main(argv):
    if '--gpu_check=True' in argv:  # the GPU check's former command: gpu_check.py in this process's place
        os.execv(sys.executable, [sys.executable, os.path.join(ROOT, 'tools', 'gpu_check.py')]
                 + [x for x in argv if x != '--gpu_check=True'])
    a = options(OPTIONS, argv, rules=RULES)
    if a.table:
        print(table(a.table.split(',')))
        return 0
    started = (time.perf_counter(), time.process_time())
    asked = scheme_names(a.schemes)
    names = asked + ['rope'] * ('rope' not in asked)  # rope: the reference every ratio is taken against
    parts, one_model = parts_asked(a)
    if a.threads:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    exit_on_ctrl_c('bench.py', 'the JSON holds the models measured so far; the same command goes on from there'
                   if one_model else '')
    rt = runtime.setup(a.device, a.dtype)
    clock = harness.Clock(a.clock or ('cpu' if rt.device_type == 'cpu' else 'wall'), rt.device_type)
    if one_model:  # on CUDA, as a GPU trains: GPT-2 124M compiled; every preset
        gpu = rt.device_type == 'cuda'
        a.preset = a.preset or ('gpt2' if gpu else 'default')
        a.compile = a.compile if 'compile' in a.explicit else gpu
        a.presets = a.presets if 'presets' in a.explicit else 'all'
    a.preset = a.preset or 'default'
    size = model_size(a, a.preset)
    out, meta, smoked = {}, {}, smoke(a, asked) if 'smoke' in parts else None
    if parts & (SCHEME_PARTS | set(MODEL_PARTS)):  # the CPU clock sums every thread's time: per core, as its peak
        peak, peak_label = runtime.peak_flops(rt.device_type, 1 if clock.kind == 'cpu' else threads)
        cpu = f'{runtime.cpu_name()}, {threads} thread(s)'
        dev_name = torch.cuda.get_device_name() if rt.device_type == 'cuda' else cpu
        shape = {k: v for k, v in size.items() if k != 'batch_size'}
        print(f"nanoPE bench: torch {torch.__version__}, {dev_name}, dtype {rt.dtype}, compile {a.compile}, clock "
              f"{clock.kind}\nmodel {shape}, batch {size['batch_size']}; MFU peak: {peak_label}")
    if one_model:
        per_part, plans = model_names(a, asked, size)
        return model_parts(a, one_model, per_part, plans, size, rt, clock, peak, peak_label)
    if parts & SCHEME_PARTS:
        out['results'], meta = scheme_parts(a, names, parts, size, rt, clock, peak, peak_label, dev_name)
    if a.json:
        meta = dict(argv=sys.argv, torch=torch.__version__, device=runtime.device_name(rt), dtype=rt.dtype,
                    compile=a.compile, clock=clock.kind, threads=threads, **meta, time=time.strftime(
                        '%Y-%m-%d %H:%M:%S'), elapsed_wall_s=time.perf_counter() - started[0],
                    elapsed_cpu_s=time.process_time() - started[1])
        out = {'meta': meta, **out, **({'smoke': smoked} if smoked is not None else {})}
        atomic_write(a.json, lambda f: json.dump(out, f, indent=1), binary=False)
        print(f"wrote {a.json}")


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
