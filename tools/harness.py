"""
What the tools run a model in, so that bench.py's timings and gpu_check.py's checks run it the same way: a training
step as train.py takes it (its optimizer settings read from train.py's config), one layer's attention alone, forward
and backward; and what they measure with: the step timer, steps timed in rotating order, peak memory, the checks'
relative error and a time limit on a block of work.

  settings = harness.train_settings('gpt2')      # AdamW's weight decay and betas, the gradient clip
  step, opt = harness.train_stepper(model, xy, rt, lr, settings, compile=True)
  attn, scheme = harness.layer(model, 0)
  y = harness.layer_pass(attn, scheme, x, g, rt.autocast)   # forward, and the backward of (y * g).sum()
"""
import ast
import itertools
import os
import signal
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext

import torch

from configurator import read_config_file
from console import progress

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# --- a training step, as train.py takes it --------------------------------------------------------------------

# The train.py config whose model each bench preset (config/bench_<preset>.py) is; any other preset is the model of
# train.py's defaults (config/bench_default.py's).
TRAIN_CONFIGS = {'gpt2': 'config/gpt2_124m.py'}
OPTIMIZER_KEYS = ('weight_decay', 'beta1', 'beta2', 'grad_clip')


def train_settings(preset):
    """AdamW's weight decay and betas and the gradient clip as train.py trains bench preset `preset`'s model:
    {key of OPTIMIZER_KEYS: value}, its config file's (TRAIN_CONFIGS) over train.py's defaults. The defaults are read
    from train.py's source, its top-level assignments (globals as config): importing a script would run it."""
    tree = ast.parse(open(os.path.join(ROOT, 'train.py'), encoding='utf-8').read())
    out = {t.id: ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
           for t in node.targets if isinstance(t, ast.Name) and t.id in OPTIMIZER_KEYS}
    if preset in TRAIN_CONFIGS:
        config = read_config_file(os.path.join(ROOT, TRAIN_CONFIGS[preset]))
        out.update({k: v for k, v in config.items() if k in OPTIMIZER_KEYS})
    return out


def train_stepper(model, xy, rt, lr, settings, compile, backend=None):
    """(a function that takes one training step of `model` on the batch xy [B, L + 1] and returns its loss, the
    optimizer): AdamW at lr with train_settings' weight decay and betas, the gradients clipped at its grad_clip (0:
    not clipped, as in train.py), the model compiled if asked, every layer on `backend` where one is given."""
    model.train()
    opt = model.configure_optimizers(settings['weight_decay'], lr, (settings['beta1'], settings['beta2']),
                                     rt.device_type)
    run = torch.compile(model) if compile else model

    def step():
        with rt.autocast, (model.attention_backend(backend) if backend else nullcontext()):
            _, loss = run(xy[:, :-1], xy[:, 1:])
        loss.backward()
        if settings['grad_clip']:
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings['grad_clip'])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step, opt


# --- one layer alone ------------------------------------------------------------------------------------------

def layer(model, i):
    """Layer i's attention (projections included) and its scheme instance: what layer_pass runs."""
    return model.transformer.h[i].attn, model.pe.at(i)


def layer_pass(attn, scheme, x, g, autocast=nullcontext(), compile=False):
    """One layer's attention `attn` alone, as in training: on x [B, T, C] at positions 0..T-1 with no cache, its
    hooks asked of `scheme` (the layer's own, or one that stands in for it), under `autocast`, compiled if asked (as
    train.py compiles the model: Inductor writes the backward of a bias table's layout); then the backward of y
    against g [B, T, C] (the gradient of (y * g).sum(), in y's dtype), which accumulates into the layer's
    parameters and x's .grad -> y, detached. The layer's backend is the one it has: GPT.attention_backend sets
    another."""
    run = torch.compile(attn) if compile else attn
    with autocast:
        y = run(x, scheme, scheme.training_context(x.size(1), x.device))
    y.backward(g.to(y.dtype))
    return y.detach()


# --- timing, memory and errors of steps -----------------------------------------------------------------------

class Clock:
    """Seconds for timing steps: 'wall' (perf_counter) or 'cpu' (this process's CPU time, blind to other
    processes); on CUDA each reading waits for the GPU's queued work first."""

    def __init__(self, kind, device_type):
        self.kind, self.cuda = kind, device_type == 'cuda'

    def now(self):
        if self.cuda:
            torch.cuda.synchronize()
        return time.process_time() if self.kind == 'cpu' else time.perf_counter()


def round_robin(names, rounds, fn, clock, desc):
    """{name: [clock seconds of fn(name), one per round]}; the order rotates every round, so
    that slow drift in machine load hits every name alike."""
    times = {n: [] for n in names}
    with progress(total=rounds, desc=desc, unit='round') as bar:
        for r in range(rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                t0 = clock.now()
                fn(n)
                times[n].append(clock.now() - t0)
            bar.update()
    return times


def median_ratio(xs, refs):
    """Median over rounds of x/ref, each ratio taken within one round."""
    return statistics.median(x / r for x, r in zip(xs, refs))


def static_bytes(*objs):
    """Bytes of distinct tensor storages held by modules (params, buffers) and optimizers (state)."""
    ts = [t for o in objs for t in ([*o.parameters(), *o.buffers()] if isinstance(o, torch.nn.Module) else
                                   [t for st in o.state.values() for t in st.values() if torch.is_tensor(t)])]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in ts}.values())


def peak_extra_bytes(fn, device_type):
    """Peak bytes allocated by fn() on top of what was live before it."""
    if device_type == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    from torch.profiler import ProfilerActivity, profile  # here: only the CPU's count needs it
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)  # the profiler's C++ side prints start/stop banners to fd 2
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == '[memory]' and e.device_type() == torch.autograd.DeviceType.CPU)
    # running total of allocations in order; frees of blocks allocated before fn() are not reported: no negative drift
    return max([0, *itertools.accumulate(n for _, n in events)])


def peak_MiB(fn, device_type, *held):
    """The peak memory of a step: the tensors `held` keeps (modules, optimizers: static_bytes) and the peak fn()
    allocates on top of what was live before it, in MiB."""
    return (static_bytes(*held) + peak_extra_bytes(fn, device_type)) / 2**20


def rel_err(got, want):
    """||got - want|| / ||want||, in float64: the one relative error of the checks (logits, KV cache, gradients)."""
    want = want.double()
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-300)).item()


class SchemeTimeout(BaseException):
    """time_limit ran out: not an Exception, so that the handlers that let a failed part go on to the next part
    of the same model let it through."""


@contextmanager
def time_limit(seconds, what='--scheme_limit'):
    """Raise SchemeTimeout in this (the main) thread after `seconds` (0: no limit): a compile that would take the
    rest of a lease ends as that model's error, and the next model starts."""
    if not seconds:
        yield
        return

    def expired(signum, frame):
        raise SchemeTimeout(f'stopped after {what}={seconds:g} s')
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
