"""
The one-command GPU check: does nanoPE work on this GPU, and roughly how fast.

  python gpu_check.py                              # every scheme -> gpu_check.json
  python gpu_check.py --schemes=rope,alibi --json=check.json
  python gpu_check.py --schemes=rope --presets=gemma3,gpt_oss
  python gpu_check.py --schemes=rope --presets=gpt_oss --compile=False   # train eagerly

In the device's dtype (bf16 autocast on CUDA), at config/bench_gpt2.py on CUDA (config/bench_default.py on CPU;
--preset=, --n_layer= ... change it), every scheme, the main five first: correct (flex == dense logits and KV cache ==
full forward as relative max errors at T = 256, flex == dense gradients as the whole gradient's relative error at
T = L, the training length, where windows and chunks cut the block mask as in training), train (compiled steps on
one batch: ms/iter, tokens/s, MFU, peak memory, first and last loss; --compile=False: eager), long (no-grad forwards
at 8L and 16L: tokens/s, and peak memory, O(T)). Then the attention stacks of config/ (--presets, all by default):
windows, chunks, QK-norm and sink logits on the same checks, long forwards included. Writes --json after each check
and starts no scheme after --budget seconds; exit status 1 if any failed a check or to train.
"""
import json
import sys
import time

import torch

import positional
import runtime
from configurator import options
from console import exit_on_ctrl_c
from files import atomic_write
from model import GPT, GPTConfig
from presets import model_size, preset_plans, scheme_names

MAIN_SCHEMES = ['rope', 'alibi', 't5', 'fire', 'learned']  # checked first; the first four also at 8L and 16L
# The training check's learning rate, constant: at GPT-2's 6e-4 with no warm-up, the 124M model's first steps spike
# (gradient norms of 25-113 before clipping, on an H200 in float32, for rope too), so the last of seven losses is
# noise; at 1e-4 every model tried fell at every step (docs/gpu.md, fourth check).
CHECK_LR = 1e-4


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


def check_train(model, size, B, L, a, rt, peak, r):
    """Compiled training steps on one repeated batch: compile time, ms/iter, tokens/s, peak memory, MFU, and the
    loss of the first and the last step (it falls as the batch is learned). --compile=False runs the model eagerly
    (FlexAttention stays compiled), which tells a fault of the whole-model graph from one of the kernel;
    --backend=dense trains without FlexAttention, which tells a fault of the kernel from one of the optimisation."""
    sync = torch.cuda.synchronize if rt.device_type == 'cuda' else (lambda: None)
    model.train()
    opt = model.configure_optimizers(0.1, CHECK_LR, (0.9, 0.95), rt.device_type)
    step = torch.compile(model) if a.compile else model
    xy = torch.randint(size['vocab_size'], (B, L + 1), device=rt.device)

    def train_step():
        with rt.autocast, model.attention_backend(a.backend):
            _, loss = step(xy[:, :-1], xy[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
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


def main(argv):
    a = options(dict(schemes='all', preset='', n_layer=0, n_head=0, n_embd=0, block_size=0, vocab_size=0, batch_size=0,
                     device='auto', dtype='auto', warmup=2, iters=5, eval_batch_tokens=16384, json='gpu_check.json',
                     seed=0, budget=540.0, presets='all', compile=True, backend='auto'),
                argv, rules=dict(warmup='>0', iters='>0', eval_batch_tokens='>0', budget='>0',
                           backend=(lambda b: b in ('auto', 'flex', 'dense'), "one of 'auto', 'flex', 'dense'")))
    names = sorted(set(scheme_names(a.schemes) + ['rope']),
                   key=lambda n: (MAIN_SCHEMES.index(n) if n in MAIN_SCHEMES else 99, n))
    plans = preset_plans(a.presets, twins=False)
    exit_on_ctrl_c('gpu_check.py', f'{a.json} holds the schemes checked so far')
    rt = runtime.setup(a.device, a.dtype)
    preset = a.preset or ('gpt2' if rt.device_type == 'cuda' else 'default')
    size = model_size(a, preset)
    B, L = size.pop('batch_size'), size['block_size']
    peak, peak_label = runtime.peak_flops(rt.device_type)
    out = {'meta': dict(torch=torch.__version__, device=runtime.device_name(rt), dtype=rt.dtype, preset=preset,
                        model=size, batch_size=B, peak=peak_label, argv=sys.argv), 'results': {}}
    path, t_start, tol = a.json or 'gpu_check.json', time.perf_counter(), tolerance(rt)

    def save():
        atomic_write(path, lambda f: json.dump(out, f, indent=1), binary=False)
    print(f"gpu check: {out['meta']['device']}, torch {torch.__version__}, {rt.dtype}, {size}, batch {B}")
    for name in names + list(plans):
        if time.perf_counter() - t_start > a.budget:
            out['skipped'] = out.get('skipped', []) + [name]
            continue
        r = out['results'][name] = {}
        torch.manual_seed(a.seed)
        model = GPT(GPTConfig(**{**size, **plans[name]}) if name in plans else
                    GPTConfig(**size, pos_encoding=name)).to(rt.device)
        x = torch.randint(size['vocab_size'], (2, min(256, L) + 1), device=rt.device)
        xl = torch.randint(size['vocab_size'], (2, L + 1), device=rt.device)  # gradients at the training length
        try:
            check_correct(model, x[:, :-1], rt, r)
            check_grads(model, xl, rt, r)
        except Exception as e:  # noqa: BLE001 - a kernel that fails to build fails this scheme, not the check
            r['correct_error'] = f"{type(e).__name__}: {str(e)[:500]}"
        r['correct'] = 'correct_error' not in r and \
            all(r.get(k, 0) < tol for k in ('flex_vs_dense', 'kv_vs_full', 'grad_flex_vs_dense'))
        save()
        try:
            check_train(model, size, B, L, a, rt, peak, r)  # its optimizer and compiled graph are freed on return
        except Exception as e:  # noqa: BLE001 - report the failure, go on with the next scheme
            r['train_error'] = f"{type(e).__name__}: {str(e)[:500]}"
        save()  # a long forward's FlexAttention compile can take minutes (fire's did, on an H200): keep what it has
        if name in MAIN_SCHEMES[:4] or name in plans:
            check_long(model, size, L, a, rt, r)
        model = None
        torch.cuda.empty_cache()  # (a no-op off CUDA)
        ref = out['results'].get('rope', {})
        if 'train_tok_s' in r and 'train_tok_s' in ref:
            r['train_vs_rope'] = r['train_tok_s'] / ref['train_tok_s']
            if r.get('train_peak_MiB') and ref.get('train_peak_MiB'):
                r['peak_vs_rope'] = r['train_peak_MiB'] / ref['train_peak_MiB']
        print(f"{name}: " + ', '.join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()),
              flush=True)
        save()
    bad = [n for n, r in out['results'].items() if not r.get('correct') or 'train_error' in r]
    print(f"gpu check: {len(out['results'])} schemes in {time.perf_counter() - t_start:.0f}s -> {path}; "
          + (f"FAILED: {', '.join(bad)}" if bad else 'all correct and trained')
          + (f"; skipped (time budget): {', '.join(out['skipped'])}" if out.get('skipped') else ''))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
