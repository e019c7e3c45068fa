"""
The one-command GPU check: does nanoPE work on this GPU, and roughly how fast.

  python gpu_check.py                              # every scheme -> gpu_check.json
  python gpu_check.py --schemes=rope,alibi --json=check.json
  python gpu_check.py --schemes=rope --presets=gemma3,gpt_oss
  python gpu_check.py --schemes=rope --presets=gpt_oss --compile=False   # train eagerly
  python gpu_check.py --schemes=fox,path --presets= --parts=correct,attn_grads   # correctness only
  python gpu_check.py --pairs=True --schemes=all --classes=fla --presets= --steps=20   # rope/scheme step pairs

In the device's dtype (bf16 autocast on CUDA), at config/bench_gpt2.py on CUDA (config/bench_default.py on CPU;
--preset=, --n_layer= ... change it), every scheme, the main five first: correct (flex == dense logits and KV cache ==
full forward as relative max errors at T = 256, flex == dense gradients as the whole gradient's relative error at
T = L, the training length, where windows and chunks cut the block mask as in training), train (compiled steps on
one batch: ms/iter, tokens/s, MFU, peak memory, first and last loss; --compile=False: eager), long (no-grad forwards
at 8L and 16L: tokens/s, and peak memory, O(T)). Then the attention stacks of config/ (--presets, all by default):
windows, chunks, QK-norm and sink logits on the same checks, long forwards included. Writes --json after each check
and starts no scheme after --budget seconds; exit status 1 if any failed a check or to train.
--parts: correct (the logits and whole-gradient checks), attn_grads (each kind of layer's attention alone: dq, dk
and dv on the model's own backend against the dense path in float64, check_attn_grads), train, long, attn_time
(a bias scheme's first layer timed as built, with its parameters frozen, with its bias as one table, and without
it: where the time goes, check_attn_time).
--pairs=True times instead (time_pairs): rope built once and each scheme or preset in turn, compiled, their steps
alternated, --steps of each after --warmup; per model the median step and its spread, rope's median step in the
same pairs over its own (vs_rope: training throughput relative to rope's), compile time, peak memory, each layer's
backend, and the goal of its class (GOALS; goal_class reads its hooks); rope's MFU at the batch run. --classes keeps
the schemes and presets of those classes; --scheme_limit stops a scheme after that many seconds and goes on. A
scheme whose fla kernel 'auto' does not take (Wall) runs on that kernel, so that every kernel is measured;
--auto_only=True runs it on 'auto' instead, the path of a default config. Each model's numbers go to --json as
soon as they exist.
"""
import copy
import dataclasses
import json
import signal
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext

import torch

import attention
import kernels
import positional
import runtime
from configurator import options
from console import exit_on_ctrl_c
from files import atomic_write
from model import GPT, GPTConfig, is_positional
from presets import model_size, preset_plans, scheme_names

MAIN_SCHEMES = ['rope', 'alibi', 't5', 'fire', 'learned']  # checked first; the first four also at 8L and 16L
# The training check's learning rate, constant: at GPT-2's 6e-4 with no warm-up, the 124M model's first steps spike
# (gradient norms of 25-113 before clipping, on an H200 in float32, for rope too), so the last of seven losses is
# noise; at 1e-4 every model tried fell at every step (docs/gpu.md, fourth check).
CHECK_LR = 1e-4
# Goals for training throughput relative to rope in the same process, by how a model's attention runs (goal_class):
# key -> (what the class is, the goal). A model with layers of several classes takes the lowest goal among them.
GOALS = {'no_bias': ('no logit bias: rotary, embedded or no positions (SDPA)', 0.9),
         'score_mod': ('a score_mod bias, a value term or sink logits (FlexAttention on CUDA)', 0.7),
         'fla': ("a scheme with an fla kernel (attn_backend 'fla' where 'auto' does not take it)", 0.6),
         'own_attention': ('its own attention, with no fla kernel', 0.4)}
MFU_GOAL = (0.40, 16, 1024)  # rope's MFU at gpt2_124m's micro-batch, 16 x 1024, against the device's bf16 peak
PARTS = ('correct', 'attn_grads', 'train', 'long', 'attn_time')


def tolerance(rt):
    """Relative error that passes a correctness check: bf16's, TF32's (float32 matmuls on CUDA keep 10 mantissa
    bits: rope's KV cache differed from its full forward by 5e-4 on an H200), or plain float32's."""
    if rt.dtype != 'float32':
        return 5e-2
    return 5e-3 if rt.device_type == 'cuda' and torch.backends.cuda.matmul.allow_tf32 else 1e-4


def peak_mem(fn, rt):
    """(peak MiB allocated during fn(), or None off CUDA; fn's result)."""
    if rt.device_type != 'cuda':
        return None, fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    r = fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20, r


def runs_on_flex(model):
    """Whether the model's attention needs FlexAttention on CUDA: a score bias or sink logits."""
    return any(type(s).score_mod is not positional.PositionalEncoding.score_mod for s in model.pe.schemes) or \
        any(b.attn.sink_logits is not None for b in model.transformer.h)


def model_config(name, size, plans, auto_only=False):
    """The GPTConfig of a scheme or preset at `size`. A layer whose fla kernel 'auto' does not take (Wall's: exact
    only in a range, kernels.FLA_KERNELS) gets attn_backend='fla' where fla can run here, so that every scheme
    with a kernel is measured on it; elsewhere, or with auto_only (the path a default config runs), 'auto'."""
    cfg = {**size, **plans[name]} if name in plans else dict(size, pos_encoding=name)
    kernel = positional.REGISTRY[cfg.get('pos_encoding', 'rope')].fla_kernel
    if kernel and kernels.FLA_KERNELS[kernel].not_auto and kernels.fla_status()[0] and not auto_only:
        cfg['attn_backend'] = 'fla'
    return GPTConfig(**cfg)


def goal_class(config):
    """The key of GOALS for a model's attention, from its layers' hooks in training: an fla kernel; else its own
    attention; else a score_mod or value term that the layer's scheme returns for training (xPos's, say, only
    when evaluating blockwise), or sink logits; else none. The hooks are asked on CPU, of a copy of the model 16
    channels a head wide with a 64-token vocabulary (the plan and the schemes as they are): milliseconds."""
    model = GPT(dataclasses.replace(config, n_embd=16 * config.n_head, vocab_size=64)).train()
    T = 8
    pos, x = torch.arange(T), torch.zeros(1, T, model.config.n_embd)
    found = []
    with torch.no_grad():
        for i, block in enumerate(model.transformer.h):
            s, attn = model.pe.at(i), block.attn
            if s.fla_kernel is not None:
                found.append('fla')
            elif s.owns_attention:
                found.append('own_attention')
            else:
                ctx = s.layer_context(x, s.context(pos, pos, T), attn.pe_layer, None)
                q, k = torch.zeros(1, attn.q_heads, T, attn.hd), torch.zeros(1, attn.kv_heads, T, attn.hd)
                biased = s.score_mod(q, k, ctx, attn.pe_layer) is not None or attn.sink_logits is not None or \
                    type(s).value_mod is not positional.PositionalEncoding.value_mod
                found.append('score_mod' if biased else 'no_bias')
    return min(found, key=lambda c: GOALS[c][1])


class SchemeTimeout(BaseException):
    """--scheme_limit ran out: not an Exception, so that the handlers that let a failed part go on to the next
    part of the same scheme let it through."""


@contextmanager
def time_limit(seconds):
    """Raise SchemeTimeout in this (the main) thread after `seconds` (0: no limit): a compile that would take the
    rest of a lease ends as that scheme's error, and the next scheme starts."""
    if not seconds:
        yield
        return

    def expired(signum, frame):
        raise SchemeTimeout(f'stopped after --scheme_limit={seconds:g} s')
    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except SchemeTimeout:
        torch.set_grad_enabled(True)  # the alarm can land inside no_grad's __enter__, whose __exit__ then never runs
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def rel_err(got, want):
    """||got - want|| / ||want||, in float64."""
    want = want.double()
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-300)).item()


def layer_grads(attn, scheme, x, g, autocast, backend=None):
    """One layer's attention of x [B, T, C] (no cache, positions 0..T-1) on `backend` (None: the layer's own), and
    the gradients of (y * g).sum() -> ({'q', 'k', 'v': with respect to the layer's projected queries, keys and
    values, c_attn's output before QK-norm and the scheme's hooks}, {name: each parameter's of the layer and its
    scheme}), float64."""
    seen = []

    def keep(module, inputs, out):
        out.retain_grad()
        seen.append(out)
    params = {**{f'attn.{n}': p for n, p in attn.named_parameters()},
              **{f'pe.{n}': p for n, p in scheme.named_parameters()}}
    hook, saved, T = attn.c_attn.register_forward_hook(keep), attn.backend, x.size(1)
    attn.backend = backend or saved
    try:
        pos = torch.arange(T, device=x.device)
        with autocast:
            y = attn(x, scheme, scheme.context(pos, pos, T))
        (y.double() * g).sum().backward()
    finally:
        hook.remove()
        attn.backend = saved
    kv = attn.kv_heads * attn.hd
    d = dict(zip('qkv', seen[0].grad.double().split((attn.q_heads * attn.hd, kv, kv), dim=-1)))
    grads = {n: p.grad.double() for n, p in params.items() if p.grad is not None}
    for p in params.values():
        p.grad = None
    return d, grads


def check_attn_grads(model, T, rt, r, rows=2):
    """Each kind of layer in the plan (its first layer), alone, at length T (the training length): dq, dk and dv
    (layer_grads) on the model's own backend on this device (fla, FlexAttention or SDPA; in its dtype) against a
    float64 copy of the layer on the dense path, as relative errors (rel_err), in r['attn_grads']['layer i'];
    beside them (`_dense`) the dense path in the device's dtype against the same reference, the error that
    precision alone gives. A lost gradient term shows in dq and dk at its own size, where a whole model's gradient
    dilutes it: with the logsumexp's gradient dropped (CPU, float32, 2 layers x 32 wide, T = 32), the whole
    gradient moved by 3.6e-4 (gpt_oss) and 5.1e-4 (Shaw), dq and dk by 0.14-0.30 and 0.21 (tests/test_scripts.py).
    The scheme's own parameters stay float32 in the copy, as do the tables and gates its hooks compute in float32
    on every path; the attention around them is float64. `param_worst`: the layer's parameter whose gradient is
    furthest from the reference's, and by how much."""
    model.train()
    kinds = [line.split(': ', 1)[1] for line in model.plan_lines()]  # a layer's plan without its index
    out = r['attn_grads'] = {}
    routes = model.attention_backends(rt.device)
    gen = torch.Generator(device=rt.device).manual_seed(1)
    for i in sorted({kinds.index(kind) for kind in kinds}):
        attn, scheme = model.transformer.h[i].attn, model.pe.at(i)
        ref = copy.deepcopy(attn).double()
        if ref.pe_layer is not None:
            ref.pe_layer.float()
        x = torch.randn(rows, T, model.config.n_embd, device=rt.device, generator=gen)
        g = torch.randn(rows, T, model.config.n_embd, device=rt.device, generator=gen, dtype=torch.float64)
        want, want_p = layer_grads(ref, copy.deepcopy(scheme), x.double(), g, nullcontext(), 'dense')
        got, got_p = layer_grads(attn, scheme, x, g, rt.autocast)
        floor, _ = layer_grads(attn, scheme, x, g, rt.autocast, 'dense')
        e = out[f'layer {i}'] = {f'd{n}': rel_err(got[n], want[n]) for n in 'qkv'}
        e.update({f'd{n}_dense': rel_err(floor[n], want[n]) for n in 'qkv'})
        e['backend'] = routes[i]
        # a gradient that cancels (a bias every logit of a row shares: FIRE's last bias) is rounding on both sides
        top = max((w.norm().item() for w in want_p.values()), default=0.0)
        errs = {n: rel_err(got_p[n], w) for n, w in want_p.items() if n in got_p and w.norm() > 1e-6 * top}
        if errs:
            e['param_worst'], e['param_worst_err'] = max(errs.items(), key=lambda kv: kv[1])


def check_attn_time(model, B, T, rt, r, reps=10):
    """Where a bias layer's time goes: the model's first layer, its attention alone (projections included), forward
    and backward at B x T, median of `reps` calls after two, in r['attn_time'] (ms), four ways:
      built    as the model has it (FlexAttention on CUDA);
      frozen   the scheme's parameters not trained: no captured tensor made from them needs a gradient, so
               FlexAttention's backward scatters none into them (a per-head scalar, a per-distance table);
      table    the bias handed over as one float32 [B, H, T, T] tensor: its gradient leaves the kernel one logit a
               cell, and autograd carries it to the parameters (not for a value term or attention scaling);
      no_bias  the same layer with no score_mod or value term (SDPA): what attention without the bias costs.
    `table_err`: the table's output against built's, relative (the same bias: rounding only)."""
    attn, scheme = model.transformer.h[0].attn, model.pe.at(0)
    model.train()
    gen = torch.Generator(device=rt.device).manual_seed(2)
    x = torch.randn(B, T, model.config.n_embd, device=rt.device, generator=gen, requires_grad=True)
    g = torch.randn(B, T, model.config.n_embd, device=rt.device, generator=gen)
    pos = torch.arange(T, device=rt.device)
    clock = runtime.Clock('wall', rt.device_type)
    built = scheme.score_mod

    def tabled(q, k, ctx, params):
        mod = built(q, k, ctx, params)
        if mod is None:
            return None
        with torch.autocast(q.device.type, enabled=False):
            bias = attention.dense_bias(mod, q.size(0), q.size(1), q.size(2), k.size(2), q.device)
        return bias.expand(q.size(0), -1, -1, -1).contiguous()  # one batch row each: FlexAttention indexes b

    def run():
        with rt.autocast:
            y = attn(x, scheme, scheme.context(pos, pos, T))
        y.backward(g)
        return y.detach().float()

    def timed():
        out = run()
        run()
        ts = []
        for _ in range(reps):
            t0 = clock.now()
            run()
            ts.append(clock.now() - t0)
        attn.zero_grad(set_to_none=True)
        return statistics.median(ts) * 1e3, out
    out = r['attn_time'] = {}
    out['built'], y = timed()
    frozen = [p for n, p in model.named_parameters() if is_positional(n) and p.requires_grad]
    try:
        for p in frozen:
            p.requires_grad_(False)
        out['frozen'], _ = timed()
    finally:
        for p in frozen:
            p.requires_grad_(True)
    plain = type(scheme).value_mod is positional.PositionalEncoding.value_mod and attn.scaling is None
    none = (lambda *args: None)
    for way, hooks in (('table', dict(score_mod=tabled) if plain else None),
                       ('no_bias', dict(score_mod=none, value_mod=none))):
        if hooks is None:
            out[way] = None
            continue
        vars(scheme).update(hooks)  # this instance only, until the finally below
        try:
            out[way], got = timed()
        finally:
            for hook in hooks:
                del vars(scheme)[hook]
        if way == 'table':
            out['table_err'] = rel_err(got, y)


@torch.no_grad()
def check_correct(model, x, rt, r):
    """Eager model: flex vs dense logits, KV cache vs full forward (relative max error)."""
    def rel(x, y):
        return ((x.float() - y.float()).abs().max() / y.float().abs().max().clamp(min=1e-6)).item()
    Tc = x.size(1)
    model.eval()
    with rt.autocast:
        full = model(x)[0]
        if runs_on_flex(model):
            with model.attention_backend('flex'):
                flex = model(x)[0]
            with model.attention_backend('dense'):
                r['flex_vs_dense'] = rel(flex, model(x)[0])
        if model.pe.addresses(Tc):
            cache = model.new_cache()
            steps = [model(x[:, :Tc - 16], cache=cache)[0]] + [model(x[:, t:t + 1], cache=cache)[0]
                                                               for t in range(Tc - 16, Tc)]
            r['kv_vs_full'] = rel(torch.cat(steps, 1), full)


def check_grads(model, x, rt, r):
    """Flex vs dense gradients of one training loss, as the relative error of the whole gradient: a backward
    that loses a term (the logsumexp's, which sink logits need) leaves the forward check blind. CUDA only: CPU
    has no FlexAttention backward (tests/ check the eager one against dense)."""
    if rt.device_type != 'cuda' or not runs_on_flex(model):
        return
    grads = {}
    model.train()
    for backend in ('flex', 'dense'):
        model.zero_grad(set_to_none=True)
        with model.attention_backend(backend), rt.autocast:
            loss = model(x[:, :-1], x[:, 1:])[1]
        loss.backward()
        grads[backend] = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    f, d = (torch.cat([g.flatten() for g in grads[b].values()]) for b in ('flex', 'dense'))
    r['grad_flex_vs_dense'] = ((f - d).norm() / d.norm()).item()
    # the whole gradient's error can hide a wrong gradient of a few parameters (a sink logit per head)
    err = {n: ((grads['flex'][n] - g).norm() / g.norm().clamp_min(1e-30)).item() for n, g in grads['dense'].items()}
    r['grad_worst_param'], r['grad_worst_err'] = max(err.items(), key=lambda kv: kv[1])


def trainer(model, xy, a, rt):
    """(a function that takes one training step of `model` on the batch xy [B, L + 1] and returns its loss, the
    optimizer): AdamW at CHECK_LR, gradients clipped at 1, the model compiled unless --compile=False, every layer
    on --backend."""
    model.train()
    opt = model.configure_optimizers(0.1, CHECK_LR, (0.9, 0.95), rt.device_type)
    run = torch.compile(model) if a.compile else model

    def train_step():
        with rt.autocast, model.attention_backend(a.backend):
            _, loss = run(xy[:, :-1], xy[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return train_step, opt


def check_train(model, size, B, L, a, rt, peak, r):
    """Compiled training steps on one repeated batch: compile time, ms/iter, tokens/s, peak memory, MFU, and the
    loss of the first and the last step (it falls as the batch is learned). --compile=False runs the model eagerly
    (FlexAttention stays compiled), which tells a fault of the whole-model graph from one of the kernel;
    --backend=dense trains without FlexAttention, which tells a fault of the kernel from one of the optimisation."""
    sync = torch.cuda.synchronize if rt.device_type == 'cuda' else (lambda: None)
    train_step, _ = trainer(model, torch.randint(size['vocab_size'], (B, L + 1), device=rt.device), a, rt)
    t0 = time.perf_counter()
    for i in range(a.warmup):
        loss = train_step()
        if i == 0:
            r['loss_first'] = loss.item()
    sync()
    r['compile_s'] = time.perf_counter() - t0
    mem, _ = peak_mem(train_step, rt)
    t0 = time.perf_counter()
    for _ in range(a.iters):
        loss = train_step()
    sync()
    dt = (time.perf_counter() - t0) / a.iters
    r.update(train_ms=dt * 1e3, train_tok_s=B * L / dt, train_peak_MiB=mem, loss=loss.item())
    if peak:
        r['mfu'] = runtime.mfu(model, L, B, dt, peak)


@torch.no_grad()
def check_long(model, size, L, a, rt, r):
    """No-grad forwards at 8L and 16L: tokens/s and peak memory (O(T) memory)."""
    model.eval()
    for m, T in ((8, 8 * L), (16, 16 * L)):
        xe = torch.randint(size['vocab_size'], (max(1, a.eval_batch_tokens // T), T), device=rt.device)
        try:
            with rt.autocast:
                model(xe, last=1)  # compile FlexAttention for this length first
                t0 = time.perf_counter()
                mem, _ = peak_mem(lambda: model(xe, last=1), rt)
            r[f'eval{m}L_tok_s'] = xe.numel() / (time.perf_counter() - t0)
            r[f'eval{m}L_peak_MiB'] = mem
        except Exception as e:  # noqa: BLE001 - report the failure, go on
            r[f'eval{m}L_error'] = f"{type(e).__name__}: {str(e)[:300]}"


def quartiles(xs):
    """(first quartile, median, third quartile) of xs, the quartiles within the range of xs."""
    return tuple(statistics.quantiles(xs, n=4, method='inclusive')) if len(xs) > 1 else tuple(xs) * 3


def step_stats(seconds):
    """Step times (s, in order) -> their median, min, max and quartiles in ms, and all of them in order."""
    ms = [t * 1e3 for t in seconds]
    q1, median, q3 = quartiles(ms)
    return dict(ms_median=median, ms_min=min(ms), ms_max=max(ms), ms_q1=q1, ms_q3=q3, ms_all=ms)


def goal_rows(results):
    """The goals as rows (figure, goal, measured or None, met or None), for the JSON and docs/gpu.md's table."""
    rows = []
    for name, r in results.items():
        if name != 'rope' and 'goal' in r:
            v = r.get('vs_rope')
            rows.append(dict(figure=f"{name}: training throughput / rope's ({r['goal_class']})",
                             goal=r['goal'], measured=v, met=None if v is None else v >= r['goal']))
    goal, B, T = MFU_GOAL
    rope = results.get('rope', {})
    v = rope.get('mfu') if rope.get('mfu_at') == [B, T] else None  # measured at that batch, or not at all
    rows.append(dict(figure=f"rope's MFU at {B} x {T}", goal=goal, measured=v, met=None if v is None else v >= goal))
    return rows


def time_pairs(a, names, plans, size, B, L, rt, peak, out, save, t_start):
    """--pairs=True (see the top of the file): rope and each of `names` in turn (schemes or presets), one training
    step each, alternated in rotating order (runtime.round_robin) so that drift hits both alike; rope's model is
    built once and every other one freed after its pairs. vs_rope is rope's median step over the model's, both from
    the same pairs; vs_rope_paired and vs_rope_q1/q3 the median and quartiles of the per-pair quotients. Rope's
    entry: its steps over all pairs, and its MFU. Returns the names that failed."""
    clock = runtime.Clock('wall', rt.device_type)
    # every model compiles its own graphs; past dynamo's default of 8 per function a model would run eagerly
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)
    xy = torch.randint(size['vocab_size'], (B, L + 1), device=rt.device)
    failed, models = [], {}

    def start(name):
        """Build, compile and warm up a model; its entry in out['results'] -> its step function."""
        cfg = model_config(name, size, plans, a.auto_only)
        c = goal_class(cfg)
        r = out['results'][name] = dict(goal_class=c, goal=GOALS[c][1])
        torch.manual_seed(a.seed)
        model = models[name] = GPT(cfg).to(rt.device)
        r['attention_backends'] = model.attention_backends(rt.device)
        step, opt = trainer(model, xy, a, rt)
        t0 = clock.now()
        r['loss_first'] = step().item()
        r['compile_s'] = clock.now() - t0
        for _ in range(a.warmup - 1):
            step()
        r['peak_MiB'] = (runtime.static_bytes(model, opt) + runtime.peak_extra_bytes(step, rt.device_type)) / 2**20
        save()
        return step

    def rope_entry(seconds):
        """Rope's entry from its steps so far (statistics, MFU) and the goals' rows, saved: a run cut short keeps
        them."""
        r = out['results']['rope']
        if seconds:
            r.update(step_stats(seconds))
            if peak:
                r['mfu'], r['mfu_at'] = runtime.mfu(models['rope'], L, B, r['ms_median'] / 1e3, peak), [B, L]
        out['goals'] = goal_rows(out['results'])
        save()

    try:
        steps, rope_times = {'rope': start('rope')}, []
    except Exception as e:  # noqa: BLE001 - without the reference there is nothing to time against
        out['results'].setdefault('rope', {})['error'] = f"{type(e).__name__}: {str(e)[:500]}"
        save()
        return ['rope']
    for name in names:
        if time.perf_counter() - t_start > a.budget:
            out['skipped'] = out.get('skipped', []) + [name]
            continue
        try:
            with time_limit(a.scheme_limit):
                steps[name] = start(name)
                times = runtime.round_robin(['rope', name], a.steps, lambda n: steps[n](), clock, f'{name} pairs')
            r = out['results'][name]
            rope_ms = [t * 1e3 for t in times['rope']]
            r.update(step_stats(times[name]), rope_ms_median=statistics.median(rope_ms), rope_ms_all=rope_ms)
            r['vs_rope'] = r['rope_ms_median'] / r['ms_median']
            r['vs_rope_q1'], r['vs_rope_paired'], r['vs_rope_q3'] = quartiles([x / y for x, y in zip(
                times['rope'], times[name])])
            rope_times += times['rope']
        except (Exception, SchemeTimeout) as e:  # noqa: BLE001 - a model that fails to build, compile, fit or finish
            out['results'].setdefault(name, {})['error'] = f"{type(e).__name__}: {str(e)[:500]}"
            failed.append(name)
        finally:
            steps.pop(name, None)
            models.pop(name, None)
            if rt.device_type == 'cuda':
                torch.cuda.empty_cache()
        print(line(name, out['results'][name]), flush=True)
        rope_entry(rope_times)
    if not rope_times:  # no pairs: rope alone
        rope_times = runtime.round_robin(['rope'], a.steps, lambda n: steps[n](), clock, 'rope steps')['rope']
    rope_entry(rope_times)
    print(line('rope', out['results']['rope']), flush=True)
    return failed


def check_scheme(name, a, parts, size, plans, B, rt, peak, tol, r, save):
    """The check (--parts) of one scheme or preset at `size` and batch B, into its entry r; its model is freed on
    return."""
    L = size['block_size']
    torch.manual_seed(a.seed)
    cfg = model_config(name, size, plans, a.auto_only)
    model = GPT(cfg).to(rt.device)
    c = goal_class(cfg)
    r.update(goal_class=c, goal=GOALS[c][1], attention_backends=model.attention_backends(rt.device))
    x = torch.randint(size['vocab_size'], (2, min(256, L) + 1), device=rt.device)
    xl = torch.randint(size['vocab_size'], (2, L + 1), device=rt.device)  # gradients at the training length
    try:
        if 'correct' in parts:
            check_correct(model, x[:, :-1], rt, r)
            check_grads(model, xl, rt, r)
        if 'attn_grads' in parts:
            check_attn_grads(model, L, rt, r)
    except Exception as e:  # noqa: BLE001 - a kernel that fails to build fails this scheme, not the check
        r['correct_error'] = f"{type(e).__name__}: {str(e)[:500]}"
    if parts & {'correct', 'attn_grads'}:
        errs = [r.get(k, 0) for k in ('flex_vs_dense', 'kv_vs_full', 'grad_flex_vs_dense')] + \
            [e[k] for e in r.get('attn_grads', {}).values() for k in ('dq', 'dk', 'dv')]
        r['correct'] = 'correct_error' not in r and all(e < tol for e in errs)
    save()
    if 'train' in parts:
        try:
            check_train(model, size, B, L, a, rt, peak, r)  # its optimizer and compiled graph are freed on return
        except Exception as e:  # noqa: BLE001 - report the failure, go on with the next scheme
            r['train_error'] = f"{type(e).__name__}: {str(e)[:500]}"
        save()  # a long forward's FlexAttention compile can take minutes (fire's did, on an H200): keep what it has
    if 'long' in parts and (name in MAIN_SCHEMES[:4] or name in plans):
        check_long(model, size, L, a, rt, r)
    if 'attn_time' in parts and runs_on_flex(model):
        try:
            check_attn_time(model, B, L, rt, r)
        except Exception as e:  # noqa: BLE001 - report the failure, go on
            r['attn_time_error'] = f"{type(e).__name__}: {str(e)[:500]}"
        save()


def line(name, r):
    """One result as a line of the log (step times in full stay in the JSON)."""
    return f"{name}: " + ', '.join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()
                                   if not k.endswith('ms_all'))


def main(argv):
    a = options(dict(schemes='all', preset='', n_layer=0, n_head=0, n_embd=0, block_size=0, vocab_size=0, batch_size=0,
                     device='auto', dtype='auto', warmup=2, iters=5, eval_batch_tokens=16384, json='gpu_check.json',
                     seed=0, budget=540.0, presets='all', compile=True, backend='auto', parts=','.join(PARTS),
                     pairs=False, steps=20, classes='all', scheme_limit=0.0, auto_only=False),
                argv, rules=dict(warmup='>0', iters='>0', eval_batch_tokens='>0', budget='>0', steps='>0',
                                 scheme_limit='>=0',
                                 backend=(lambda b: b in ('auto', 'flex', 'dense'), "one of 'auto', 'flex', 'dense'"),
                                 parts=(lambda v: set(v.split(',')) <= set(PARTS), f"a comma list of {PARTS}"),
                                 classes=(lambda v: v == 'all' or set(v.split(',')) <= set(GOALS),
                                          f"'all' or a comma list of {tuple(GOALS)}")))
    parts = set(a.parts.split(','))
    plans = preset_plans(a.presets, twins=False)
    exit_on_ctrl_c('gpu_check.py', f'{a.json} holds the schemes checked so far')
    rt = runtime.setup(a.device, a.dtype)
    preset = a.preset or ('gpt2' if rt.device_type == 'cuda' else 'default')
    size = model_size(a, preset)
    B, L = size.pop('batch_size'), size['block_size']
    if a.pairs:  # in the order asked; rope is the reference
        names = [n for n in scheme_names(a.schemes) if n != 'rope'] + list(plans)
    else:
        names = sorted(set(scheme_names(a.schemes) + ['rope']),
                       key=lambda n: (MAIN_SCHEMES.index(n) if n in MAIN_SCHEMES else 99, n)) + list(plans)
    if a.classes != 'all':
        keep = a.classes.split(',')
        names = [n for n in names if n == 'rope' or goal_class(model_config(n, size, plans, a.auto_only)) in keep]
    peak, peak_label = runtime.peak_flops(rt.device_type)
    out = {'meta': dict(torch=torch.__version__, device=runtime.device_name(rt), dtype=rt.dtype, preset=preset,
                        model=size, batch_size=B, peak=peak_label, argv=sys.argv, compile=a.compile,
                        mode='pairs' if a.pairs else 'check', **(dict(steps=a.steps, warmup=a.warmup) if a.pairs else
                                                                 dict(parts=sorted(parts))),
                        goals={k: dict(what=w, goal=g) for k, (w, g) in GOALS.items()}), 'results': {}}
    path, t_start, tol = a.json or 'gpu_check.json', time.perf_counter(), tolerance(rt)

    def save():
        atomic_write(path, lambda f: json.dump(out, f, indent=1), binary=False)
    print(f"gpu check: {out['meta']['device']}, torch {torch.__version__}, {rt.dtype}, {size}, batch {B}")
    if a.pairs:
        bad = time_pairs(a, names, plans, size, B, L, rt, peak, out, save, t_start)
        print(f"gpu check, pairs: {len(out['results'])} models in {time.perf_counter() - t_start:.0f}s -> {path}"
              + (f"; FAILED: {', '.join(bad)}" if bad else '')
              + (f"; skipped (time budget): {', '.join(out['skipped'])}" if out.get('skipped') else ''))
        return 1 if bad else 0
    for name in names:
        if time.perf_counter() - t_start > a.budget:
            out['skipped'] = out.get('skipped', []) + [name]
            continue
        r = out['results'][name] = {}
        try:
            with time_limit(a.scheme_limit):
                check_scheme(name, a, parts, size, plans, B, rt, peak, tol, r, save)
        except SchemeTimeout as e:
            r['error'] = f"SchemeTimeout: {e}"
        torch.cuda.empty_cache()  # (a no-op off CUDA)
        ref = out['results'].get('rope', {})
        if 'train_tok_s' in r and 'train_tok_s' in ref:
            r['train_vs_rope'] = r['train_tok_s'] / ref['train_tok_s']
            if r.get('train_peak_MiB') and ref.get('train_peak_MiB'):
                r['peak_vs_rope'] = r['train_peak_MiB'] / ref['train_peak_MiB']
        print(line(name, r), flush=True)
        save()
    bad = [n for n, r in out['results'].items() if r.get('correct') is False or 'train_error' in r or 'error' in r]
    print(f"gpu check: {len(out['results'])} schemes in {time.perf_counter() - t_start:.0f}s -> {path}; "
          + (f"FAILED: {', '.join(bad)}" if bad else 'none failed')
          + (f"; skipped (time budget): {', '.join(out['skipped'])}" if out.get('skipped') else ''))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
