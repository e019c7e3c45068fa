"""
The kernels behind nanoPE's data-dependent schemes (positional.py): nanoPE's own chunked PyTorch computations, and
the adapters to flash-linear-attention's Triton kernels (fla-core).

nanoPE's own (the readable reference, and the path on CPU):
  cumsum_tokens(x)                 prefix sums over tokens; on CUDA one opaque op that Inductor leaves to ATen
  causal_conv(x, weight, past)     a depthwise causal convolution over time (PaTH's short convolution)
  Canon(dim, kernel, name)         a Canon layer, x + causal_conv(x), its last inputs carried in a KV cache
  path_scores(q, k, w, beta, ...)  PaTH's logits by the chunked UT transform, no d x d matrix
  wall_scores(q, k, P, ...)        Wall's logits, every exponent a difference of prefix sums <= 0

flash-linear-attention's Triton kernels (fla-core 0.6.0, imported only when a layer runs them), for a scheme
whose `fla_kernel` names one of FLA_KERNELS; each adapter takes nanoPE's layout [B, H, T, D] and conventions, the
layer's Attender (its window and sink logits) and the scheme's inputs by name, calls fla's [B, T, H, D] kernel,
and returns nanoPE's output [B, H, T, Dv]. A scheme's `attention` hook hands its inputs to
attention.Attender.run_fla, which calls the layer's adapter (fla_attention):
  fla_fox(q, k, v, att, log_f)              FoX: parallel_attn with the log forget gates, added after the scale
  fla_path(q, k, v, att, w, beta, log_f)    PaTH, PaTH-FoX: parallel_path_attn, the gate inside the scale
  fla_wall(q, k, v, att, g, g_scalar)       Wall: parallel_wall_attn, the scalar gate after the scale
  fla_stick_breaking(q, k, v, att, attend_current, remainder)  parallel_stickbreaking_attn, plus nanoPE's
                                               remainder term
Which layers run them: fla_plan (at build: attn_backend 'fla' refused in one line where the kernel cannot run the
layer; 'auto' notes why not) and runs_fla, which attention.route asks per forward (CUDA, or 'fla' under Triton's
interpreter, and no KV cache, whose decoding stays on nanoPE's path). fla_status says whether fla can run here.
Shared conventions, the same on both sides: a query head h reads key/value head h // (HQ / H); a window of W keys
includes the query's own (fla's window_size = nanoPE's sliding_window); sink logits are one logit per query head in
every row's denominator, unscaled (fla's sink_bias). Every adapter is a torch.compile graph break
(torch.compiler.disable): the rest of the layer compiles around it.

A file of its own rather than a section of positional.py: positional.py holds the schemes, the file a fork edits;
these are the computations the schemes call, shared by several of them, and the adapters carry the import and
availability logic of an outside package, which a scheme file should not.
"""

import functools
import importlib
import importlib.util
import os
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


def cumsum_tokens(x):
    """x.cumsum(2), the prefix sums over the tokens of a [B, H, T, n] tensor. On CUDA through an op that
    torch.compile leaves to ATen's kernel: Inductor's Triton split scan failed to build for Selective RoPE's
    [8, 12, 1024, 32] in a compiled training step (torch 2.11, an H200; docs/gpu.md). On CPU plain cumsum, so
    that Inductor's CPU graphs, and the numbers of the runs in results/, stay as they were."""
    return aten_cumsum_tokens(x) if x.is_cuda else x.cumsum(2)


@torch.library.custom_op('nanope::cumsum_tokens', mutates_args=())
def aten_cumsum_tokens(x: torch.Tensor) -> torch.Tensor:
    """cumsum(2) as one opaque op (its own gradient below): no scan for Inductor to generate."""
    return x.contiguous().cumsum(2)


@aten_cumsum_tokens.register_fake
def _cumsum_tokens_fake(x):
    return x.new_empty(x.shape)


def _cumsum_tokens_grad(ctx, grad):
    return aten_cumsum_tokens(grad.flip(2)).flip(2)  # d/dx_t of sum_{s >= t} grad_s: the sums from the end


aten_cumsum_tokens.register_autograd(_cumsum_tokens_grad)


def causal_conv(x, weight, past=None):
    """y_t = sum_k weight[:, k] x_{t - W + 1 + k}: a depthwise causal convolution over time of x [B, T, C] with
    weight [C, W], no bias (the last tap multiplies the current token); past [B, W - 1, C] holds the inputs
    before x (zeros at the start of a sequence)."""
    W = weight.size(1)
    xp = torch.cat((x.new_zeros(x.size(0), W - 1, x.size(2)) if past is None else past, x), 1)
    return sum(xp[:, s:s + x.size(1)] * weight[:, s] for s in range(W))


def depthwise_conv(x, weight, past=None, conv1d=None):
    """causal_conv(x, weight, past); by torch's depthwise conv1d (groups = channels) where conv1d is True (default: on
    CUDA), one kernel rather than W products and sums."""
    if not (x.is_cuda if conv1d is None else conv1d):
        return causal_conv(x, weight, past)
    xp = torch.cat((past, x), 1) if past is not None else F.pad(x, (0, 0, weight.size(1) - 1, 0))
    return F.conv1d(xp.transpose(1, 2), weight.to(x.dtype)[:, None], groups=weight.size(0)).transpose(1, 2)


class Canon(nn.Module):
    """A Canon layer (Allen-Zhu, "Physics of Language Models: Part 4.1, Architecture Design and the Magic of Canon
    Layers", arXiv 2512.17351; facebookresearch/PhysicsLM4): h + conv(h) for h [B, T, dim], conv a depthwise causal
    convolution over time with weight [dim, kernel] (the last tap on the current token), no bias, no activation,
    init U(-1/sqrt(kernel), 1/sqrt(kernel)) as nn.Conv1d's (layers.CANON: the places and the authors' defaults).
    With a KV cache (a layer's kvcache.LayerKV) the convolution continues from the last kernel - 1 inputs, which ride
    in cache.carry[name]."""

    def __init__(self, dim, kernel, name):
        super().__init__()
        self.name = name
        self.weight = nn.Parameter(torch.empty(dim, kernel).uniform_(-kernel ** -0.5, kernel ** -0.5))

    def forward(self, x, cache=None):
        W = self.weight.size(1)
        past = cache.carry.get(self.name) if cache is not None else None
        if cache is not None and W > 1:  # the last W - 1 inputs, for the next forward
            seen = torch.cat((x.new_zeros(x.size(0), W - 1, x.size(2)) if past is None else past, x), 1)
            cache.carry[self.name] = seen[:, seen.size(1) - (W - 1):]
        return x + depthwise_conv(x, self.weight, past).to(x.dtype)

    @torch.no_grad()
    def start_fresh(self, names):
        """Added by a fine-tune to trained weights (names), it starts at zero: the identity, so the outputs stay as
        they were, and the gradient of each tap (its input) still moves it."""
        if 'weight' in names:
            self.weight.zero_()


def canons(spec, **dims):
    """A layer's Canon layers at the places named (dims: place -> width), as its LayerSpec says: None where it has
    none."""
    return [Canon(n, spec.canon_kernel, 'canon' + p) if p in spec.canon_set else None for p, n in dims.items()]


def _path_chunk(q, k, w, beta):
    """One chunk of PaTH's UT transform (queries = keys = the chunk's tokens) -> (its logits
    q_i^T H_i .. H_{j+1} k_j for j <= i, the queries moved to the chunk's start (H_a .. H_i q_i), the keys moved to
    its end (H_{b-1} .. H_{j+1} k_j), and its product I - W^T T diag(beta) W as (W, T, diag(beta) W))."""
    n = q.size(2)
    wb = beta[..., None] * w
    eye = torch.eye(n, dtype=q.dtype, device=q.device)
    T = torch.linalg.solve_triangular(eye + torch.tril(wb @ w.transpose(-1, -2), -1), eye.expand(q.shape[:2] + (n, n)),
                                      upper=False, unitriangular=True)  # (I + StrictLower(diag(beta) W W^T))^-1
    qw = torch.tril(q @ w.transpose(-1, -2))  # q_i . w_s for s <= i
    Twbk = T @ torch.tril(wb @ k.transpose(-1, -2), -1)  # from beta_t w_t . k_j for t > j
    A = torch.tril(q @ k.transpose(-1, -2)) - qw @ Twbk
    return A, q - qw @ (T @ wb), k - Twbk.transpose(-1, -2) @ w, (w, T, wb)


def path_scores(q, k, w, beta, prev=None, chunk=64, keys=False):
    """PaTH's logits before the scale: A[i, j] = q_i^T H_i H_{i-1} .. H_{j+1} k_j (j <= i; 0 above), H_t = I -
    beta_t w_t w_t^T, q, k, w [B, H, T, d] and beta [B, H, T] of T new tokens, after `prev` [B, H, m, d]: earlier keys
    already moved through the last earlier token's H. -> (A [B, H, T, m + T], and with keys=True every key moved
    through the last new token's H: what a KV cache keeps). Chunks of `chunk` tokens (the algorithm of
    flash-linear-attention's naive reference): within a chunk the UT transform; a query moves across each earlier
    chunk by that chunk's product, applied in WY form (no d x d matrix is formed), and keys move forward alike."""
    B, H, T, d = q.shape
    m = 0 if prev is None else prev.size(2)
    edges = list(range(0, T, chunk)) + [T]
    span = list(zip(edges, edges[1:]))
    parts = [_path_chunk(q[:, :, a:b], k[:, :, a:b], w[:, :, a:b], beta[:, :, a:b]) for a, b in span]

    def moved_query(x, prod):  # rows x^T (I - W^T T diag(beta) W)
        W, Tm, wb = prod
        return x - ((x @ W.transpose(-1, -2)) @ Tm) @ wb

    def moved_key(x, prod):  # rows of (I - W^T T diag(beta) W) x
        W, Tm, wb = prod
        return x - ((x @ wb.transpose(-1, -2)) @ Tm.transpose(-1, -2)) @ W
    rows = []
    for c, (a, b) in enumerate(span):
        blocks, qc = [parts[c][0]], parts[c][1]
        for j in range(c - 1, -1, -1):  # earlier chunks, nearest first
            blocks.insert(0, qc @ parts[j][2].transpose(-1, -2))
            qc = moved_query(qc, parts[j][3])
        if m:
            blocks.insert(0, qc @ prev.transpose(-1, -2))
        rows.append(F.pad(torch.cat(blocks, -1), (0, T - b)))
    if not keys:
        return torch.cat(rows, 2), None
    moved = []
    for c, part in enumerate(parts):  # a chunk's keys, at its end, cross the chunks after it
        kc = part[2]
        for later in parts[c + 1:]:
            kc = moved_key(kc, later[3])
        moved.append(kc)
    if m:  # the earlier keys cross every new chunk
        for part in parts:
            prev = moved_key(prev, part[3])
        moved.insert(0, prev)
    return torch.cat(rows, 2), torch.cat(moved, 2)


def _wall_block(q, k, P):
    """The lower triangle of Wall's logits (0 above it) for n = 2^m tokens that are both queries and keys, q, k, P
    [..., n, d] -> [..., n, n]. A binary tree: the diagonal is q_i . k_i (exp(0) = 1); at each level, every block's
    lower-left quadrant (its second half's queries R against its first half's keys L) is one matmul through
    R's first token m: exp(P_i - P_j) = exp(P_i - P_m) exp(P_m - P_j), both factors <= 1. No [n, n, d] tensor."""
    *lead, n, d = q.shape
    A = (q * k).sum(-1)[..., None, None]  # (..., n, 1, 1): blocks of 1
    s = 1
    while s < n:
        q2, k2, P2 = (t.view(*lead, n // (2 * s), 2, s, d) for t in (q, k, P))  # pairs of blocks of s
        Pm = P2[..., 1, :1, :]  # the reference: the right block's first P
        cross = (q2[..., 1, :, :] * torch.exp(P2[..., 1, :, :] - Pm)) @ \
            (k2[..., 0, :, :] * torch.exp(Pm - P2[..., 0, :, :])).transpose(-1, -2)  # (..., n/2s, s, s)
        left, right = A[..., 0::2, :, :], A[..., 1::2, :, :]
        A = torch.cat((torch.cat((left, torch.zeros_like(left)), -1), torch.cat((cross, right), -1)), -2)
        s *= 2
    return A.view(*lead, n, n)


def _wall_runs(q, k, P, n):
    """wall_scores' loop for T = R n queries and keys in runs of n, all runs at once: run a's queries against each
    earlier run b's keys through a's first token r, exp(P_i - P_r) exp(P_r - P_j) (one batched matmul over the
    R (R - 1) / 2 pairs), against their own keys by one _wall_block over the runs. The same products as the loop,
    in O(log n) operations rather than O(R log n): a compiled training step's graph stays small."""
    B, H, T, d = q.shape
    R = T // n
    a, b = torch.tril_indices(R, R, -1, device=q.device)  # the pairs of runs: a's queries, b's keys, b < a
    qs, ks, Ps = (t.view(B, H, R, n, d) for t in (q, k, P))
    Pr = Ps[:, :, :, :1]  # each run's first P [B, H, R, 1, d]
    qr = qs * torch.exp(Ps - Pr)  # the queries through their run's first token
    kr = ks[:, :, b] * torch.exp(Pr[:, :, a] - Ps[:, :, b])  # [B, H, pairs, n, d]: b's keys through a's first token
    A = q.new_zeros(B, H, R, R, n, n)  # (run a, run b, query, key)
    A[:, :, a, b] = qr[:, :, a] @ kr.transpose(-1, -2)
    own = torch.arange(R, device=q.device)
    A[:, :, own, own] = _wall_block(qs, ks, Ps)
    return A.transpose(3, 4).reshape(B, H, T, T)


def wall_scores(q, k, P, run=128):
    """Wall's logits before the scale: A[i, j] = sum_n q_in k_jn exp(P_in - P_jn) for key j at or before query i
    (0 above), the queries being the last Tq of the Tk keys and P [B, H, Tk, d] the keys' prefix sums of log gates
    <= 0. Every exponent used is a difference <= 0, so nothing overflows however long the sequence. The queries
    go in runs of 2^m, at most `run` (the binary digits of Tq, largest first): the keys before a run's first query
    r through r (exp(P_i - P_r) exp(P_r - P_j), one matmul), the run's own keys by _wall_block; each written into
    the output in place, so a long forward holds little more than the output. With gradients, no cache and Tq a
    multiple of `run` (a training step), the runs go at once (_wall_runs: a compiled step's graph then grows with
    log2(run), not with Tq / run). -> [B, H, Tq, Tk]."""
    Tq, Tk = q.size(2), k.size(2)
    if torch.is_grad_enabled() and Tq == Tk and Tq > run and Tq % run == 0:
        return _wall_runs(q, k, P, run)
    A = q.new_zeros(q.size(0), q.size(1), Tq, Tk)
    a = 0
    while a < Tq:
        n = min(1 << ((Tq - a).bit_length() - 1), run)
        r = Tk - Tq + a  # the key index of the run's first query
        Pr, Pq = P[:, :, r:r + 1], P[:, :, r:r + n]
        kr = k[:, :, :r] * torch.exp(Pr - P[:, :, :r])
        A[:, :, a:a + n, :r] = (q[:, :, a:a + n] * torch.exp(Pq - Pr)) @ kr.transpose(-1, -2)
        A[:, :, a:a + n, r:r + n] = _wall_block(q[:, :, a:a + n], k[:, :, r:r + n], Pq)
        a += n
    return A


# --- flash-linear-attention's Triton kernels (fla-core): what each takes, whether it can run, and the adapters


FLA_VERSION = '0.6.0'  # the fla-core whose conventions the adapters map (read from its source and its naive_* refs)


@dataclass(frozen=True)
class FlaKernel:
    """One fla kernel as nanoPE calls it: where it lives and which of a layer's options it takes."""
    function: str            # 'module:name'
    window: bool             # a sliding window (window_size: W keys, the query's own included)
    sink_logits: bool              # sink logits (sink_bias [HQ])
    head_dims: tuple = None  # the head sizes it takes; None: 1..256
    not_auto: str = None     # why 'auto' does not take it (it is exact only in a range nanoPE's path has no limit
                             # on); None: 'auto' takes it on CUDA

    @property
    def name(self):
        return self.function.split(':')[1]

    def refusal(self, mask, sink_logits, head_dim, dropout):
        """Why a layer with these options cannot run on this kernel (a phrase naming the fix), or None."""
        if mask.chunk is not None:
            return f"{self.name} has no chunked attention: drop attention_chunk_size on this layer"
        if mask.window is not None and not self.window:
            return f"{self.name} has no sliding window: drop sliding_window on this layer"
        if sink_logits and not self.sink_logits:
            return f"{self.name} takes no sink logits: drop sink_logits on this layer"
        if head_dim not in (self.head_dims or range(1, 257)):
            dims = ', '.join(map(str, self.head_dims)) if self.head_dims else 'at most 256'
            return f"{self.name} takes head sizes {dims}, not n_embd / n_head = {head_dim}: change n_embd or n_head"
        if dropout:
            return f"{self.name} has no attention dropout: set dropout=0"
        return None


FLA_KERNELS = {
    'attn': FlaKernel('fla.ops.attn.parallel:parallel_attn', window=True, sink_logits=True),
    'path': FlaKernel('fla.ops.path_attn.parallel:parallel_path_attn', window=False, sink_logits=False,
                      head_dims=(16, 32, 64, 128)),
    'wall': FlaKernel('fla.ops.wall_attn.parallel:parallel_wall_attn', window=True, sink_logits=True,
                      not_auto="parallel_wall_attn is exact only while no channel decays by more than about 76 nats "
                               "within one of its key tiles (fla_wall), which a trained gate can pass: "
                               "attn_backend='fla' takes it"),
    'stickbreaking': FlaKernel('fla.ops.stickbreaking_attn.parallel:parallel_stickbreaking_attn', window=False,
                               sink_logits=False),
}


def interpreting():
    """True when Triton's interpreter is on (TRITON_INTERPRET=1, read by triton when it is imported): its kernels
    then run on CPU tensors, slowly (NumPy)."""
    return os.environ.get('TRITON_INTERPRET') == '1'


# Whether fla's autotuned kernels time their candidate configs on first use (per input-size bucket) and keep the
# fastest; False runs the first candidate untimed. tools/gpu_check.py sets False: a correctness check needs a kernel,
# not the fastest; Wall's three kernels tune 24 candidates each, each compiled, and its check, tuning included, ran
# past 60 s on an H200.
AUTOTUNE = True


def _first_config_only():
    """From here on, an autotuned kernel runs its first candidate config without timing it: under the interpreter
    (choosing among several benchmarks each on a GPU, which the interpreter has not: "0 active drivers", and triton
    before 3.9 benchmarks even a single candidate), and where AUTOTUNE is False."""
    from triton.runtime.autotuner import Autotuner
    if getattr(Autotuner.prune_configs, 'first_only', False):
        return
    prune = Autotuner.prune_configs

    def first(self, kwargs):
        return prune(self, kwargs)[:1]
    first.first_only = True
    Autotuner.prune_configs = first
    Autotuner._bench = lambda self, *args, config, **meta: [0.0, 0.0, 0.0]  # (median, 20%, 80%) of no run


@functools.cache
def fla_op(kernel):
    """The fla function of FLA_KERNELS[kernel], imported once (triton with it)."""
    if interpreting() or not AUTOTUNE:
        _first_config_only()
    module, name = FLA_KERNELS[kernel].function.split(':')
    return getattr(importlib.import_module(module), name)


@functools.cache
def fla_status():
    """(True, None) when fla's kernels can run in this process, else (False, why: one line naming the fix)."""
    for module, package, fix in (('triton', 'triton', 'pip install triton (Linux wheels only)'),
                                 ('einops', 'einops', 'pip install einops'),
                                 ('fla', 'fla-core', f'pip install fla-core=={FLA_VERSION}')):
        if importlib.util.find_spec(module) is None:
            return False, f"{package} is not installed: {fix}"
    if not torch.cuda.is_available() and not interpreting():
        return False, ("there is no CUDA GPU, and Triton's interpreter is off (TRITON_INTERPRET=1 in the environment "
                       "runs fla's kernels on a CPU, slowly)")
    try:
        for kernel in FLA_KERNELS:
            fla_op(kernel)
    except Exception as e:  # a broken install: say what failed, in one line
        return False, f"importing fla's kernels failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return True, None


def fla_plan(backend, scheme, index, mask, sink_logits, head_dim, dropout):
    """The fla kernel a layer may run (a key of FLA_KERNELS) and, under 'auto', why it runs none: (kernel or None,
    note or None). scheme: the layer's PositionalEncoding, whose `fla_kernel` names its kernel (None: none).
    attn_backend='fla' where the layer cannot run on fla is a ValueError of one line; 'auto' considers fla only
    where there is a CUDA GPU (on CPU it is nanoPE's path, as before); 'flex' and 'dense' never use it."""
    kernel = scheme.fla_kernel
    if backend not in ('auto', 'fla') or kernel is None and backend == 'auto':
        return None, None
    where = f"{scheme.name} on layer {index}"
    if kernel is None:
        raise ValueError(f"attn_backend='fla': {where} has no flash-linear-attention kernel (schemes with one: "
                         f"{', '.join(scheme.fla_schemes())}); use attn_backend='auto', which runs fla where it can")
    why = FLA_KERNELS[kernel].refusal(mask, sink_logits, head_dim, dropout)
    if why is None and backend == 'auto':
        why = FLA_KERNELS[kernel].not_auto
    if why is None and (backend == 'fla' or torch.cuda.is_available()):
        why = fla_status()[1]
    if why is None:
        return kernel, None
    if backend == 'fla':
        raise ValueError(f"attn_backend='fla' cannot run {where}: {why}; or use attn_backend='auto'")
    return None, (why if torch.cuda.is_available() else None)


def fla_notes(notes, device):
    """Under attn_backend='auto' on CUDA: why layers whose scheme has an fla kernel run nanoPE's path instead, one line
    per reason with its layers (train.py prints them once). notes: each layer's fla_plan note (None: none)."""
    if torch.device(device).type != 'cuda':
        return []
    layers = {}
    for i, why in enumerate(notes):
        if why:
            layers.setdefault(why, []).append(str(i))
    return [f"attn_backend='auto': layers {', '.join(ix)} run nanoPE's PyTorch attention, not fla's kernel: {why}"
            for why, ix in layers.items()]


def runs_fla(kernel, backend, device_type):
    """Whether a layer whose fla_plan gave `kernel` runs it on this device without a KV cache under `backend`:
    'fla' anywhere (on CPU under Triton's interpreter), 'auto' on CUDA; never 'flex' or 'dense', which a script may
    set on a built model (tools/bench.py, tools/gpu_check.py)."""
    return kernel is not None and (backend == 'fla' or backend == 'auto' and device_type == 'cuda')


def _fla_layout(x):
    """nanoPE's [B, H, T, ...] <-> fla's [B, T, H, ...] (fla's kernels make their inputs contiguous)."""
    return x.transpose(1, 2)


@torch.compiler.disable
def fla_fox(q, k, v, att, log_f):
    """FoX through parallel_attn: softmax_j(q_i . k_j / sqrt(d) + c_i - c_j), c the prefix sums of log_f [B, HQ, T]
    (the log forget gates per query head; fla's g, summed by the kernel and added unscaled, as nanoPE's FoX adds
    them), over the keys of att's window, with att's sink logits. -> [B, HQ, T, Dv]."""
    y = fla_op('attn')(_fla_layout(q), _fla_layout(k), _fla_layout(v), _fla_layout(log_f), scale=q.size(-1) ** -0.5,
                       window_size=att.mask.window, sink_bias=att.sink_logits)
    return _fla_layout(y).to(q.dtype)


@torch.compiler.disable
def fla_path(q, k, v, att, w, beta, log_f):
    """PaTH through parallel_path_attn: softmax_j((q_i^T H_i .. H_{j+1} k_j + G_i - G_j) / sqrt(d)), H_t = I - beta_t
    w_t w_t^T; w [B, H, T, d] and beta [B, H, T] per key head, float32, beta as it is (nanoPE's 2 sigmoid, in
    (0, 2)); log_f [B, HQ, T] PaTH-FoX's log gates (None for PaTH), whose prefix sums G fla puts inside the scale,
    as nanoPE. att: unused (the kernel has no window and no sink logits). -> [B, HQ, T, Dv]."""
    y, _ = fla_op('path')(_fla_layout(q), _fla_layout(k), _fla_layout(v), _fla_layout(w.float()),
                          _fla_layout(beta.float()), None if log_f is None else _fla_layout(log_f.float()),
                          scale=q.size(-1) ** -0.5)
    return _fla_layout(y).to(q.dtype)


@torch.compiler.disable
def fla_wall(q, k, v, att, g, g_scalar):
    """Wall through parallel_wall_attn: softmax_j(sum_n q_in k_jn exp(P_in - P_jn) / sqrt(d) + C_i - C_j), P the
    prefix sums of g [B, HQ, T, d] (log gates per query head and channel, <= 0) and C those of g_scalar [B, HQ, T]
    or None (FoX's gate, added after the scale by fla and nanoPE alike), over att's window, with its sink
    logits. fla returns float32 whatever the input: cast to q's dtype. -> [B, HQ, T, Dv].
    Exact while no channel decays by more than about 76 nats (2^110, where fla 0.6.0 clamps the exponent of its
    diagonal tiles) within one of the kernel's key tiles (32 or 64 tokens); past that, near-diagonal logits of that
    channel come out too small. nanoPE's wall_scores has no such limit."""
    y = fla_op('wall')(_fla_layout(q), _fla_layout(k), _fla_layout(v), _fla_layout(g),
                       g_scalar=None if g_scalar is None else _fla_layout(g_scalar), sink_bias=att.sink_logits,
                       scale=q.size(-1) ** -0.5, window_size=att.mask.window)
    return _fla_layout(y).to(q.dtype)


@torch.compiler.disable
def fla_stick_breaking(q, k, v, att, attend_current, remainder):
    """Stick-breaking through parallel_stickbreaking_attn: A_ij = beta_ij prod_{j<l<i} (1 - beta_il) over keys
    j < i (attend_current: j <= i, the product over j < l <= i: fla's flag means what nanoPE's does), o_i =
    sum_j A_ij v_j; fla also returns the stick left over, rem_i = 1 - sum_j A_ij, which nanoPE's remainder=True
    gives to the query's own value (v_i of its key/value head; fla's layer drops it). att: unused (no window, no
    sink logits). -> [B, HQ, T, Dv]."""
    o, rem = fla_op('stickbreaking')(_fla_layout(q), _fla_layout(k), _fla_layout(v), scale=q.size(-1) ** -0.5,
                                     attend_current=attend_current)
    y = _fla_layout(o).float()
    if remainder:
        own = v.repeat_interleave(q.size(1) // v.size(1), dim=1)  # query head h's value head, h // g
        y = y + _fla_layout(rem).float().unsqueeze(-1) * own.float()
    return y.to(q.dtype)


ADAPTERS = {'attn': fla_fox, 'path': fla_path, 'wall': fla_wall, 'stickbreaking': fla_stick_breaking}


def fla_attention(kernel, q, k, v, att, **inputs):
    """The adapter of FLA_KERNELS[kernel] on q, k, v, the layer's Attender and a scheme's inputs by name."""
    return ADAPTERS[kernel](q, k, v, att, **inputs)
