"""
Speed and memory of every positional scheme, as ratios to rope measured in the same run. How each
number is measured: docs/speed.md.

  python bench.py                                  # every registered scheme, config/bench_default.py
  python bench.py --threads=1 --schemes=rope,alibi --json=bench.json
  python bench.py --device=cuda --compile=True     # GPU: bf16 autocast, TF32, fused AdamW, torch.compile
  python bench.py --device=cuda --compile=True --preset=gpt2 --schemes=rope,alibi --parts=train
  python bench.py --parts=smoke                    # a 4-iteration train.py run of every scheme, wall time each
  python bench.py --threads=1 --schemes=rope --presets=all --eval_mult=16   # the attention stacks of config/
  python bench.py --threads=1 --schemes=rope --windowed=32 --parts=eval --eval_mult=64   # rope in a 32-key window

Parts, round-robin over the schemes and `nanogpt` (a plain nanoGPT model, below): train (ms/iter,
tokens/s, MFU), memory (peak of a training step, and of a no-grad forward at 8L), eval (tokens/s of
that forward), sample (KV cache against recomputing the context), decode (one token after a 1k and a 4k
prompt in the KV cache: per-token cost, and how it grows). smoke: train.py run as a user runs
it, each run's time as it reports it. The model is config/bench_<preset>.py. --clock=cpu (the default
on CPU) is process CPU time, blind to other processes on a shared machine: use it with --threads=1
(more threads also count OpenMP spin-waiting). The GPU check is gpu_check.py.
--presets: the layer plans of config/<preset>.py (presets.PRESETS) on the bench model, each beside its twin
without windows or chunks (NAME-full); the '× full' columns are a preset's eval tok/s and forward peak
over its twin's, measured in the same run. --windowed=W adds rope-windowW: rope with a W-key sliding window on
every layer.
"""
import json
import math
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

import positional
import runtime
from configurator import options
from console import exit_on_ctrl_c, progress
from files import atomic_write, read_json
from model import GPT, GPTConfig
from presets import model_size, preset_plans, scheme_names

HERE = os.path.dirname(os.path.abspath(__file__))
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
    with its optimizer and the batches: B x L for training, eval.py's batching at 8L for eval."""

    def __init__(self, names, size, a, rt, clock, plans=None):
        self.a, self.rt, self.clock, self.size = a, rt, clock, dict(size)
        self.B, self.L = self.size.pop('batch_size'), size['block_size']
        self.models, self.opts, self.runs, plans = {}, {}, {}, plans or {}
        for name in [BASELINE] + names + list(plans):
            torch.manual_seed(a.seed)
            cfg = GPTConfig(**self.size) if name == BASELINE else GPTConfig(**{**self.size, **plans[name]}) \
                if name in plans else GPTConfig(**self.size, pos_encoding=name)
            m = self.models[name] = (NanoGPT(cfg) if name == BASELINE else GPT(cfg)).to(rt.device)
            self.opts[name] = m.configure_optimizers(0.1, 1e-3, (0.9, 0.99), rt.device_type)
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
        torch.nn.utils.clip_grad_norm_(self.models[name].parameters(), 1.0)  # train.py's grad_clip
        self.opts[name].step()
        self.opts[name].zero_grad(set_to_none=True)

    @torch.no_grad()
    def eval_fwd(self, name):
        with self.rt.autocast:
            self.runs[name](self.xe[:, :-1], self.xe[:, 1:], reduction='sum')

    def peak_MiB(self, fn, *held):
        """params/buffers/optimizer state of `held` + the peak fn() allocates on top, in MiB."""
        return (runtime.static_bytes(*held) + runtime.peak_extra_bytes(fn, self.rt.device_type)) / 2**20

    def train(self, parts, peak):
        a, B, L, res = self.a, self.B, self.L, self.res
        for name in self.order:
            t0 = self.clock.now()
            for _ in range(a.warmup):
                self.train_step(name)
            res[name]['train_warmup_s'] = self.clock.now() - t0
        if 'train' in parts:
            times = runtime.round_robin(self.order, a.rounds, lambda n: [self.train_step(n) for _ in range(a.iters)],
                                self.clock, 'train rounds')
            times = {n: [t / a.iters for t in ts] for n, ts in times.items()}
            for name in self.order:
                dt = statistics.median(times[name])
                res[name].update(train_ms=dt * 1e3, train_tok_s=B * L / dt, train_vs_rope=runtime.median_ratio(
                    times['rope'], times[name]), train_vs_nanogpt=runtime.median_ratio(times[BASELINE], times[name]),
                    train_ms_all=[t * 1e3 for t in times[name]])
                if peak:
                    res[name]['mfu'] = runtime.mfu(self.models[name], L, B, dt, peak)
        for name in self.order if 'memory' in parts else []:
            m, opt = self.models[name], self.opts[name]
            res[name]['train_peak_MiB'] = self.peak_MiB(lambda: self.train_step(name), m, opt)

    def eval(self, parts):
        res = self.res
        for name in self.can_eval:
            self.models[name].eval()
            t0 = self.clock.now()
            self.eval_fwd(name)  # FlexAttention / torch.compile compile here
            res[name]['eval_first_s'] = self.clock.now() - t0
        if 'eval' in parts:
            label = f'eval@{self.a.eval_mult}L rounds'
            times = runtime.round_robin(self.can_eval, self.a.rounds, self.eval_fwd, self.clock, label)
            for name in self.can_eval:
                res[name].update(eval_tok_s=self.xe[:, :-1].numel() / statistics.median(times[name]),
                                 eval_vs_rope=runtime.median_ratio(times['rope'], times[name]))
        for name in self.can_eval if 'memory' in parts else []:
            m = self.models[name]
            res[name]['fwd8L_peak_MiB'] = self.peak_MiB(lambda: self.eval_fwd(name), m)
            if any(type(s).score_mod is not positional.PositionalEncoding.score_mod for s in m.pe.schemes):
                with m.attention_backend('dense'):  # a bias scheme: the same forward with T x T biases
                    res[name]['fwd8L_dense_peak_MiB'] = self.peak_MiB(lambda: self.eval_fwd(name), m)

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
    cfg = cfg if os.path.exists(os.path.join(HERE, cfg)) else None
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
    if not os.path.exists(os.path.join(HERE, 'data', 'shakespeare_char', 'train.bin')):
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

def main(argv):
    if '--gpu_check=True' in argv:  # the GPU check's former command: gpu_check.py in this process's place
        os.execv(sys.executable, [sys.executable, os.path.join(HERE, 'gpu_check.py')]
                 + [x for x in argv if x != '--gpu_check=True'])
    a = options(dict(
        schemes='all',                     # comma list of positional.REGISTRY names; rope is always added
        presets='',                        # comma list of presets.PRESETS (config/<preset>.py), or 'all'
        windowed=0,                        # W > 0: also rope with a W-key sliding window on every layer
        parts='train,memory,eval,sample',  # which measurements to run, or smoke
        preset='default',                  # the model: config/bench_<preset>.py ('default' | 'gpt2')
        n_layer=0, n_head=0, n_embd=0, block_size=0, vocab_size=0, batch_size=0,  # 0: the preset's
        device='auto', dtype='auto',       # auto: CUDA + bf16 autocast where available, else CPU float32
        compile=False,                     # torch.compile train and eval (not sampling: the KV cache changes shape)
        threads=0, clock='',               # torch CPU threads (0: its default); 'cpu' | 'wall' ('': cpu on CPU)
        rounds=5, iters=2, warmup=2,       # round-robin rounds; timed and untimed train iterations per round
        eval_mult=8, eval_batch_tokens=16384, new_tokens=1000, sample_stride=10, json='', seed=0, decode_steps=16,
        smoke_timeout=900, smoke_logs='', smoke_cache='cold', smoke_args='',  # part smoke: see smoke_run
    ), argv, rules=dict(rounds='>0', iters='>0', warmup='>=0', eval_mult='>0', eval_batch_tokens='>0', windowed='>=0',
                        new_tokens='>0', sample_stride='>0', threads='>=0', smoke_timeout='>0',
                        clock=(lambda v: v in ('', 'cpu', 'wall'), "'cpu' or 'wall'"),
                        smoke_cache=(lambda v: v in ('cold', 'user'), "'cold' or 'user'")))
    started = (time.perf_counter(), time.process_time())
    asked = scheme_names(a.schemes)
    names = asked + ['rope'] * ('rope' not in asked)  # rope: the reference every ratio is taken against
    parts = set(a.parts.split(','))
    if parts - SCHEME_PARTS - {'smoke'}:
        sys.exit(f"--parts takes a comma list of train, memory, eval, sample, decode, smoke; got {a.parts!r}")
    if a.threads:
        torch.set_num_threads(a.threads)
    threads = torch.get_num_threads()
    exit_on_ctrl_c('bench.py')
    rt = runtime.setup(a.device, a.dtype)
    clock = runtime.Clock(a.clock or ('cpu' if rt.device_type == 'cpu' else 'wall'), rt.device_type)
    size = model_size(a, a.preset)
    out, meta, smoked = {}, {}, smoke(a, asked) if 'smoke' in parts else None
    if parts & SCHEME_PARTS:  # the CPU clock sums every thread's time: its throughput is per core, as its peak
        peak, peak_label = runtime.peak_flops(rt.device_type, 1 if clock.kind == 'cpu' else threads)
        cpu = f'{runtime.cpu_name()}, {threads} thread(s)'
        dev_name = torch.cuda.get_device_name() if rt.device_type == 'cuda' else cpu
        shape = {k: v for k, v in size.items() if k != 'batch_size'}
        print(f"nanoPE bench: torch {torch.__version__}, {dev_name}, dtype {rt.dtype}, compile {a.compile}, clock "
              f"{clock.kind}\nmodel {shape}, batch {size['batch_size']}; MFU peak: {peak_label}")
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
        out['results'], meta = b.res, dict(model=b.size, batch_size=b.B, peak_flops=peak_label)
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
