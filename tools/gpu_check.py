"""
The one-command GPU check: does nanoPE work on this GPU. Correctness only; how fast is bench.py's
(`python tools/bench.py --parts=pairs,attn_time,long`, docs/gpu.md).

  python tools/gpu_check.py                              # every scheme and preset -> gpu_check.json
  python tools/gpu_check.py --schemes=rope,alibi --json=check.json
  python tools/gpu_check.py --schemes=rope --presets=gemma3,gpt_oss
  python tools/gpu_check.py --schemes=rope --presets=gpt_oss --compile=False   # train eagerly
  python tools/gpu_check.py --schemes=stick_breaking,wall --presets= --parts=correct,attn_grads   # fla's gradients

In the device's dtype (bf16 autocast on CUDA), at config/bench_gpt2.py on CUDA (config/bench_default.py on CPU;
--preset=, --n_layer= ... change it), every scheme, the main five first, then the attention stacks of config/
(--presets, all by default), each with its parts (--parts, all by default):
  correct     flex == dense logits and KV cache == full forward at T = 256, flex == dense gradients of the whole
              model at T = L, the training length, where windows and chunks cut the block mask as in training
              (CUDA only), each as harness.rel_err against a tolerance (tolerance: bf16's, TF32's or float32's);
  attn_grads  each kind of layer's attention alone: dq, dk, dv and its parameters' gradients on the model's own
              route against the dense path in float64, eager and (--compile) compiled (check_attn_grads);
  train       --steps compiled training steps on one repeated batch at CHECK_LR (--compile=False: eager): the
              loss of the first and the last, which must fall as the batch is learned (`learns`).
Writes --json after each check and starts no scheme after --budget seconds; --scheme_limit stops one scheme
after that many seconds and goes on. fla's kernels run their first autotune candidate untimed (--autotune=True:
tune them as training does; kernels.AUTOTUNE). Exit status 1 if any failed a check, to train or to learn.
"""
import copy
import json
import os
import sys
import time
from contextlib import nullcontext

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root's modules: the library

import kernels  # noqa: E402
import positional  # noqa: E402
import runtime  # noqa: E402
from configurator import options  # noqa: E402
from console import exit_on_ctrl_c  # noqa: E402
from files import atomic_write  # noqa: E402
from model import GPT  # noqa: E402
from presets import model_config, model_size, preset_plans, scheme_names  # noqa: E402

import harness  # noqa: E402  (tools/harness.py: bench.py's and this check's training step and layer pass)

MAIN_SCHEMES = ['rope', 'alibi', 't5', 'fire', 'learned']  # checked first
# The training check's learning rate, constant: at GPT-2's 6e-4 with no warm-up, the 124M model's first steps spike
# (gradient norms of 25-113 before clipping, on an H200 in float32, for rope too), so the last of seven losses is
# noise; at 1e-4 every model tried fell at every step (results/gpu/history.md, fourth check).
CHECK_LR = 1e-4
PARTS = ('correct', 'attn_grads', 'train')


def tolerance(rt):
    """Relative error that passes a correctness check: bf16's, TF32's (float32 matmuls on CUDA keep 10 mantissa
    bits: rope's KV cache differed from its full forward by 5e-4 on an H200), or plain float32's."""
    if rt.dtype != 'float32':
        return 5e-2
    return 5e-3 if rt.device_type == 'cuda' and torch.backends.cuda.matmul.allow_tf32 else 1e-4


def runs_on_flex(model):
    """Whether the model's attention needs FlexAttention on CUDA: a score bias or sink logits."""
    return any(type(s).score_mod is not positional.PositionalEncoding.score_mod for s in model.pe.schemes) or \
        any(b.attn.sink_logits is not None for b in model.transformer.h)


def layer_grads(attn, scheme, x, g, autocast, compile=False):
    """One layer's attention alone on x [B, T, C], forward and backward (harness.layer_pass: the backward of
    (y * g).sum()) -> ({'q', 'k', 'v': the gradients with respect to the layer's projected queries, keys and values,
    c_attn's output before QK-norm and the scheme's hooks}, {name: each parameter's of the layer and its scheme}),
    float64."""
    seen = []

    def keep(module, inputs, out):
        out.retain_grad()
        seen.append(out)
    params = {**{f'attn.{n}': p for n, p in attn.named_parameters()},
              **{f'pe.{n}': p for n, p in scheme.named_parameters()}}
    hook = attn.c_attn.register_forward_hook(keep)
    try:
        harness.layer_pass(attn, scheme, x, g, autocast, compile)
    finally:
        hook.remove()
    kv = attn.kv_heads * attn.hd
    d = dict(zip('qkv', seen[0].grad.double().split((attn.q_heads * attn.hd, kv, kv), dim=-1)))
    grads = {n: p.grad.double() for n, p in params.items() if p.grad is not None}
    for p in params.values():
        p.grad = None
    return d, grads


def check_attn_grads(model, T, rt, r, rows=2, compile=False, tol=None):
    """Each kind of layer in the plan (its first layer), alone, at length T (the training length): dq, dk and dv
    (layer_grads) on the model's own backend on this device (fla, FlexAttention or SDPA; in its dtype) against a
    float64 copy of the layer on the dense path, as relative errors (harness.rel_err), in r['attn_grads']['layer i']
    beside the layer's route (`route`);
    with `compile` the same again with the layer compiled (`_compiled`, and `param_worst_compiled`), which passes
    within 2x the eager parameter error or `tol` (`compiled_ok`): torch 2.11's and 2.13's Inductor on the CPU
    miscompile T5's table gradient on route sdpa_bias (its vectorised C++; right with
    torch._inductor.config.cpp.simdlen = 1), which a falling loss does not show;
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
    routes = model.routes(rt.device, dtype=rt.ptdtype)
    gen = torch.Generator(device=rt.device).manual_seed(1)
    for i in sorted({kinds.index(kind) for kind in kinds}):
        attn, scheme = harness.layer(model, i)
        ref = copy.deepcopy(attn).double()
        ref.backend = 'dense'  # (a copy of its own: the reference's path)
        if ref.pe_layer is not None:
            ref.pe_layer.float()
        x = torch.randn(rows, T, model.config.n_embd, device=rt.device, generator=gen)
        g = torch.randn(rows, T, model.config.n_embd, device=rt.device, generator=gen, dtype=torch.float64)
        want, want_p = layer_grads(ref, copy.deepcopy(scheme), x.double(), g, nullcontext())
        got, got_p = layer_grads(attn, scheme, x, g, rt.autocast)
        with model.attention_backend('dense'):
            floor, _ = layer_grads(attn, scheme, x, g, rt.autocast)
        e = out[f'layer {i}'] = {f'd{n}': harness.rel_err(got[n], want[n]) for n in 'qkv'}
        e.update({f'd{n}_dense': harness.rel_err(floor[n], want[n]) for n in 'qkv'})
        e['route'] = routes[i]
        # a gradient that cancels (a bias every logit of a row shares: FIRE's last bias) is rounding on both sides
        top = max((w.norm().item() for w in want_p.values()), default=0.0)
        errs = {n: harness.rel_err(got_p[n], w) for n, w in want_p.items() if n in got_p and w.norm() > 1e-6 * top}
        if errs:
            e['param_worst'], e['param_worst_err'] = max(errs.items(), key=lambda kv: kv[1])
        if compile:
            got, got_p = layer_grads(attn, scheme, x, g, rt.autocast, compile=True)
            e.update({f'd{n}_compiled': harness.rel_err(got[n], want[n]) for n in 'qkv'})
            errs = {n: harness.rel_err(got_p[n], want_p[n]) if n in got_p else 1.0 for n in errs}  # lost: 1
            if errs:
                e['param_worst_compiled'], e['param_worst_compiled_err'] = max(errs.items(), key=lambda kv: kv[1])
                e['compiled_ok'] = e['param_worst_compiled_err'] <= max(tol or 0.0, 2 * e['param_worst_err'])


@torch.no_grad()
def check_correct(model, x, rt, r):
    """Eager model: flex vs dense logits, KV cache vs full forward (harness.rel_err)."""
    rel = harness.rel_err
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
    r['grad_flex_vs_dense'] = harness.rel_err(f, d)
    # the whole gradient's error can hide a wrong gradient of a few parameters (a sink logit per head)
    err = {n: harness.rel_err(grads['flex'][n], g) for n, g in grads['dense'].items()}
    r['grad_worst_param'], r['grad_worst_err'] = max(err.items(), key=lambda kv: kv[1])


def check_train(model, size, B, L, a, rt, r):
    """--steps training steps on one repeated batch at CHECK_LR, with the optimizer train.py trains the preset's model
    with (harness.train_settings): the loss of the first and of the last, and whether it fell (the batch is learned:
    `learns`). --compile=False runs the model eagerly (FlexAttention stays compiled), which tells
    a fault of the whole-model graph from one of the kernel; --backend=dense trains without FlexAttention, which
    tells a fault of the kernel from one of the optimisation."""
    xy = torch.randint(size['vocab_size'], (B, L + 1), device=rt.device)
    train_step, _ = harness.train_stepper(model, xy, rt, CHECK_LR, harness.train_settings(a.preset), a.compile,
                                          a.backend)
    r['loss_first'] = train_step().item()
    for _ in range(a.steps - 1):
        loss = train_step()
    r['loss'] = loss.item()
    r['learns'] = r['loss'] < r['loss_first']


def check_scheme(name, a, parts, size, plans, B, rt, tol, r, save):
    """The check (--parts) of one scheme or preset at `size` and batch B, into its entry r; its model is freed on
    return."""
    L = size['block_size']
    torch.manual_seed(a.seed)
    model = GPT(model_config(name, size, plans, a.auto_only)).to(rt.device)
    r['routes'] = model.routes(rt.device, dtype=rt.ptdtype)
    x = torch.randint(size['vocab_size'], (2, min(256, L) + 1), device=rt.device)
    xl = torch.randint(size['vocab_size'], (2, L + 1), device=rt.device)  # gradients at the training length
    try:
        if 'correct' in parts:
            check_correct(model, x[:, :-1], rt, r)
            check_grads(model, xl, rt, r)
        if 'attn_grads' in parts:
            check_attn_grads(model, L, rt, r, compile=a.compile, tol=tol)
    except Exception as e:  # noqa: BLE001 - a kernel that fails to build fails this scheme, not the check
        r['correct_error'] = f"{type(e).__name__}: {str(e)[:500]}"
    if parts & {'correct', 'attn_grads'}:
        errs = [r.get(k, 0) for k in ('flex_vs_dense', 'kv_vs_full', 'grad_flex_vs_dense')] + \
            [e[k] for e in r.get('attn_grads', {}).values() for k in ('dq', 'dk', 'dv', 'dq_compiled', 'dk_compiled',
                                                                      'dv_compiled') if k in e]
        r['correct'] = 'correct_error' not in r and all(e < tol for e in errs) and \
            all(e.get('compiled_ok', True) for e in r.get('attn_grads', {}).values())
    save()
    if 'train' in parts:
        try:
            check_train(model, size, B, L, a, rt, r)  # its optimizer and compiled graph are freed on return
        except Exception as e:  # noqa: BLE001 - report the failure, go on with the next scheme
            r['train_error'] = f"{type(e).__name__}: {str(e)[:500]}"
        save()


def line(name, r):
    """One result as a line of the log."""
    return f"{name}: " + ', '.join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items())


def main(argv):
    a = options(dict(schemes='all', preset='', n_layer=0, n_head=0, n_embd=0, block_size=0, vocab_size=0, batch_size=0,
                     device='auto', dtype='auto', steps=7, json='gpu_check.json', seed=0, budget=540.0,
                     presets='all', compile=True, backend='auto', parts=','.join(PARTS), scheme_limit=0.0,
                     auto_only=False, autotune=False),
                argv, rules=dict(steps=(lambda v: v > 1, 'at least 2: a first loss and a later one'), budget='>0',
                                 scheme_limit='>=0',
                                 backend=(lambda b: b in ('auto', 'flex', 'dense'), "one of 'auto', 'flex', 'dense'"),
                                 parts=(lambda v: set(v.split(',')) <= set(PARTS), f"a comma list of {PARTS}")))
    parts = set(a.parts.split(','))
    plans = preset_plans(a.presets, twins=False)
    exit_on_ctrl_c('gpu_check.py', f'{a.json} holds the schemes checked so far')
    rt = runtime.setup(a.device, a.dtype)
    kernels.AUTOTUNE = a.autotune  # fla's kernels: the first candidate config, untimed (kernels.AUTOTUNE)
    preset = a.preset = a.preset or ('gpt2' if rt.device_type == 'cuda' else 'default')
    size = model_size(a, preset)
    B = size.pop('batch_size')
    names = sorted(set(scheme_names(a.schemes) + ['rope']),
                   key=lambda n: (MAIN_SCHEMES.index(n) if n in MAIN_SCHEMES else 99, n)) + list(plans)
    out = {'meta': dict(torch=torch.__version__, device=runtime.device_name(rt), dtype=rt.dtype, preset=preset,
                        model=size, batch_size=B, argv=sys.argv, compile=a.compile, parts=sorted(parts),
                        tolerance=tolerance(rt), autotune=a.autotune), 'results': {}}
    path, t_start, tol = a.json or 'gpu_check.json', time.perf_counter(), tolerance(rt)

    def save():
        atomic_write(path, lambda f: json.dump(out, f, indent=1), binary=False)
    print(f"gpu check: {out['meta']['device']}, torch {torch.__version__}, {rt.dtype}, {size}, batch {B}")
    for name in names:
        if time.perf_counter() - t_start > a.budget:
            out['skipped'] = out.get('skipped', []) + [name]
            continue
        r = out['results'][name] = {}
        try:
            with harness.time_limit(a.scheme_limit):
                check_scheme(name, a, parts, size, plans, B, rt, tol, r, save)
        except harness.SchemeTimeout as e:
            r['error'] = f"SchemeTimeout: {e}"
        torch.cuda.empty_cache()  # (a no-op off CUDA)
        print(line(name, r), flush=True)
        save()
    bad = [n for n, r in out['results'].items() if r.get('correct') is False or r.get('learns') is False
           or 'train_error' in r or 'error' in r]
    print(f"gpu check: {len(out['results'])} schemes in {time.perf_counter() - t_start:.0f}s -> {path}; "
          + (f"FAILED: {', '.join(bad)}" if bad else 'none failed')
          + (f"; skipped (time budget): {', '.join(out['skipped'])}" if out.get('skipped') else ''))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
