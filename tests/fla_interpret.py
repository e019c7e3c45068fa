"""fla's Triton kernels under Triton's interpreter, against nanoPE's own PyTorch path: run by tests/test_kernels.py
in a subprocess whose environment has TRITON_INTERPRET=1 (triton reads it when it is imported, so it cannot be
turned on inside a pytest process that has imported torch). Prints one JSON object: for each case, the largest
error of every output and gradient relative to the largest reference value ('checks', each with its tolerance),
and for a mapping changed on purpose the error it then makes ('far', each with the floor it must clear: a test
that a wrong mapping would fail). float32 throughout, small sizes: the interpreter runs kernels in NumPy.

    TRITON_INTERPRET=1 python tests/fla_interpret.py [case ...]
"""
import json
import math
import os
import sys
import time
import warnings
from contextlib import contextmanager
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import kernels  # noqa: E402
import positional  # noqa: E402
from attention import Attender, Mask  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402

TOL = 2e-5       # kernels that compute in float32 (the interpreter's dots are float32 matmuls)
TOL_PATH = 1e-3  # parallel_path_attn: Householder vectors in float16 across its 64-query blocks (forward and backward)
FAR = 1e-2       # what a wrong mapping must miss by, relative


def rel(a, b):
    return (a.detach().double() - b.detach().double()).abs().max().item() / max(b.detach().abs().max().item(), 1e-6)


def scheme_and_layer(name, n_head, head_dim, seed, weights=0.5, biases=(-1.0, 1.0), **opts):
    """A scheme instance and one layer's parameters, moved away from their init so that every gate matters (the
    gradients of the scheme's parameters are compared too): weights N(0, weights^2), biases U(biases)."""
    torch.manual_seed(seed)
    cfg = SimpleNamespace(n_embd=n_head * head_dim, n_head=n_head, block_size=64, dropout=0.0)
    scheme = positional.REGISTRY[name](cfg, **opts)
    layer = scheme.new_layer() or torch.nn.Module()  # stick-breaking has no parameters
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * weights if p.dim() > 1 else torch.empty_like(p).uniform_(*biases))
    return scheme, layer


@contextmanager
def mapping(kernel, change):
    """Within: FLA_KERNELS[kernel]'s function called with change(args, kwargs) -> (args, kwargs), a mapping made
    wrong on purpose."""
    real = kernels.fla_op

    def op(k):
        f = real(k)

        def changed(*a, **kw):
            a, kw = change(list(a), dict(kw))
            return f(*a, **kw)
        return f if k != kernel else changed
    kernels.fla_op = op
    try:
        yield
    finally:
        kernels.fla_op = real


def run_hook(scheme, layer, q, k, v, x, attend, leaves):
    """The scheme's attention hook, its output and the gradients of a fixed random loss with respect to `leaves`
    (the inputs before any repeat of k and v, the sink logits) and every layer parameter."""
    leaves = {**leaves, **{f'layer.{n}': p for n, p in layer.named_parameters()}}
    for t in leaves.values():
        t.grad = None
    y = scheme.attention(q, k, v, x, None, layer, None, attend)
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(7))
    (y * w).sum().backward()
    return y.detach(), {n: t.grad.clone() for n, t in leaves.items() if t.grad is not None}  # x: not all read it


def hook_case(name, opts=None, B=2, T=40, H=2, d=16, window=None, sink_logits=False, gqa=1, tol=TOL, wrong=(),
              params=None):
    """One scheme's attention hook on fla's kernel (attn_backend 'fla') against the same hook on nanoPE's dense path
    ('dense'): the output and every gradient. gqa > 1: k and v have H / gqa heads, which the reference repeats
    (query head h reads key/value head h // gqa, attention.attend's rule) and the kernel reads itself. wrong:
    (label, kernel, change) mappings that must then miss."""
    scheme, layer = scheme_and_layer(name, H, d, 0, **(params or {}), **(opts or {}))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H // (gqa if i else 1), T, d, generator=g).requires_grad_() for i in range(3))
    x = torch.randn(B, T, H * d, generator=g).requires_grad_()
    sink_logits = torch.randn(H, generator=g).requires_grad_() if sink_logits else None
    mask = Mask(window)
    leaves = {'q': q, 'k': k, 'v': v, 'x': x, **({'sink_logits': sink_logits} if sink_logits is not None else {})}
    per_key = gqa > 1 and hasattr(scheme, 'gates')  # PaTH's w and beta: per key head, the kernel's convention
    if per_key:
        real = scheme.gates

        def gates(xf, lay, cache, expand=True):
            w, beta = real(xf, lay, cache)
            w, beta = w[:, ::gqa], beta[:, ::gqa]  # one Householder per key head
            return (w.repeat_interleave(gqa, 1), beta.repeat_interleave(gqa, 1)) if expand else (w, beta)
    ref_attend = Attender(mask, 'dense', 0.0, sink_logits)
    fla_attend = Attender(mask, 'fla', 0.0, sink_logits, fla=scheme.fla_kernel)

    def reference(repeat):
        if per_key:
            scheme.gates = gates
        kk, vv = (repeat(t) for t in (k, v)) if gqa > 1 else (k, v)
        return run_hook(scheme, layer, q, kk, vv, x, ref_attend, leaves)

    y_ref, g_ref = reference(lambda t: t.repeat_interleave(gqa, 1))
    if per_key:
        scheme.gates = lambda xf, lay, cache: gates(xf, lay, cache, expand=False)
    y, grads = run_hook(scheme, layer, q, k, v, x, fla_attend, leaves)
    assert grads.keys() == g_ref.keys(), (sorted(grads), sorted(g_ref))
    checks = {'y': [rel(y, y_ref), tol], **{f'd{n}': [rel(grads[n], g_ref[n]), tol] for n in g_ref}}
    far = {}
    with torch.no_grad():
        for label, kernel, change in wrong:
            if kernel is None:  # the scheme's own option flipped on the kernel's side only
                old = getattr(scheme, change)
                setattr(scheme, change, not old)
                far[label] = [rel(scheme.attention(q, k, v, x, None, layer, None, fla_attend), y_ref), FAR]
                setattr(scheme, change, old)
            else:
                with mapping(kernel, change):
                    far[label] = [rel(scheme.attention(q, k, v, x, None, layer, None, fla_attend), y_ref), FAR]
        if gqa > 1:  # query head h reading key/value head h % (H / gqa) instead: the reference must tell them apart
            kk, vv = (t.repeat(1, gqa, 1, 1) for t in (k, v))
            if per_key:
                scheme.gates = gates
            far['gqa: head h reads h % H'] = [rel(scheme.attention(q, kk, vv, x, None, layer, None, ref_attend), y),
                                              FAR]
    return {'checks': checks, 'far': far}


def scaled(i, factor):
    """A change of mapping: the positional argument i times factor."""
    def change(a, kw):
        a[i] = a[i] * factor
        return a, kw
    return change


def scaled_kw(key, factor):
    def change(a, kw):
        kw[key] = kw[key] * factor
        return a, kw
    return change


def window_plus_one(a, kw):  # FlashAttention's window_size=(W, 0): W + 1 keys
    kw['window_size'] += 1
    return a, kw


R = math.sqrt(16)  # sqrt(head_dim) of the cases below
# Wall's gates log sigmoid(z), z about U(-1, 3): decays up to 1.5 nats a token. fla's kernel clamps the exponent of
# its diagonal tiles at 2^110, so a channel that decays by more than about 76 nats within one 32-token tile is
# computed wrong there (docs/speed.md#fla-kernels); nanoPE's wall_scores has no such limit.
WALL = dict(weights=0.05, biases=(-1.0, 3.0))
CASES = {
    'fox': lambda: hook_case('fox', T=72, wrong=[('gate passed as if fla scaled it', 'attn', scaled(3, R))]),
    'fox_window_sinks_gqa': lambda: hook_case(
        'fox', B=1, H=4, window=8, sink_logits=True, gqa=2,
        wrong=[('window of W + 1 keys', 'attn', window_plus_one),
               ('sink logits passed as if fla scaled them', 'attn', scaled_kw('sink_bias', R))]),
    'path': lambda: hook_case('path', T=72, tol=TOL_PATH, wrong=[('beta passed as if fla doubled it', 'path',
                                                              scaled(4, 0.5))]),
    'path_fox': lambda: hook_case('path_fox', tol=TOL_PATH,
                                  wrong=[('gate passed as if fla added it after the scale', 'path',
                                          scaled(5, 1 / R))]),
    'path_gqa': lambda: hook_case('path', B=1, H=4, gqa=2, tol=TOL_PATH),
    'wall': lambda: hook_case('wall', T=72, params=WALL),
    'wall_scalar_window_sinks_gqa': lambda: hook_case(
        'wall', {'scalar_gate': True}, B=1, H=4, window=12, sink_logits=True, gqa=2, params=WALL,
        wrong=[('scalar gate passed as if fla scaled it', 'wall', scaled_kw('g_scalar', R)),
               ('window of W + 1 keys', 'wall', window_plus_one)]),
    'stick_breaking': lambda: hook_case(
        'stick_breaking', B=1, T=72, wrong=[('attend_current flipped', None, 'attend_current'),
                                 ('remainder dropped', None, 'remainder')]),
    'stick_breaking_current_gqa': lambda: hook_case(
        'stick_breaking', {'attend_current': True, 'remainder': False}, B=1, H=4, gqa=2,
        wrong=[('attend_current flipped', None, 'attend_current')]),
}


def model_case(scheme, T=24, **kw):
    """A 2-layer GPT (n_embd 32, 2 heads of 16) with attn_backend='fla' against the same weights on 'dense': the loss
    and every parameter's gradient, and which backend each layer reports."""
    out = {}
    for backend in ('dense', 'fla'):
        torch.manual_seed(0)
        m = GPT(GPTConfig(vocab_size=37, block_size=T, n_layer=2, n_head=2, n_embd=32, pos_encoding=scheme,
                          attn_backend=backend, **kw))
        x = torch.randint(0, 37, (2, T + 1), generator=torch.Generator().manual_seed(0))
        _, loss = m(x[:, :-1], x[:, 1:])
        loss.backward()
        out[backend] = loss.detach(), {n: p.grad for n, p in m.named_parameters()}, m.routes('cpu')
    (l_ref, g_ref, b_ref), (loss, grads, b_fla) = out['dense'], out['fla']
    tol = TOL_PATH if scheme.startswith('path') else TOL
    checks = {'loss': [rel(loss, l_ref), tol], **{n: [rel(grads[n], g_ref[n]), tol] for n in g_ref}}
    return {'checks': checks, 'far': {}, 'backends': {'dense': b_ref, 'fla': b_fla}}


for s in ('fox', 'path', 'path_fox', 'wall', 'stick_breaking'):
    CASES[f'model_{s}'] = (lambda s: lambda: model_case(s))(s)


def explain_case(scheme):
    """torch._dynamo.explain of a training forward of a 2-layer model on fla: its graphs and graph breaks."""
    import torch._dynamo
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=32, pos_encoding=scheme,
                      attn_backend='fla'))
    x = torch.randint(0, 37, (2, 17), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    ex = torch._dynamo.explain(m)(x[:, :-1], x[:, 1:])
    torch._dynamo.reset()
    return {'checks': {}, 'far': {}, 'graphs': ex.graph_count, 'breaks': ex.graph_break_count,
            'reasons': sorted({str(b.reason).splitlines()[0][:160] for b in ex.break_reasons})}


CASES['explain_fox'] = lambda: explain_case('fox')


def interpreter_fails():
    """Why this triton's interpreter cannot run a kernel of its own (one line), or None: then every failure of
    a case is fla's or nanoPE's, not the interpreter's."""
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x, y, B: tl.constexpr):
        i = tl.arange(0, B)
        tl.store(y + i, tl.load(x + i) + 1)

    x, y = torch.arange(4.0), torch.zeros(4)
    try:
        add_one[(1,)](x, y, B=4)
    except Exception as e:
        return f"triton {triton.__version__}'s interpreter fails at a kernel of one line ({type(e).__name__}: {e})"
    return None if torch.equal(y, x + 1) else f"triton {triton.__version__}'s interpreter adds 1 wrongly"


if __name__ == '__main__':
    warnings.filterwarnings('ignore')  # fla: "Triton is not supported on current platform, roll back to CPU"
    torch.set_num_threads(min(2, torch.get_num_threads()))
    ok, why = kernels.fla_status()
    why = why or interpreter_fails()
    if why:
        print(json.dumps({'unavailable': why}))
        sys.exit(0)
    names = sys.argv[1:] or list(CASES)
    res = {}
    for name in names:
        t = time.time()
        try:
            res[name] = CASES[name]()
        except Exception as e:  # reported by the test of this case
            res[name] = {'error': f"{type(e).__name__}: {e}"}
        res[name]['seconds'] = round(time.time() - t, 2)
    print(json.dumps(res))
