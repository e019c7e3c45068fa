"""
The kernels behind nanoPE's data-dependent schemes (positional.py): nanoPE's own chunked PyTorch computations, and
the adapters to flash-linear-attention's Triton kernels (fla-core).

nanoPE's own (the readable reference, and the path on CPU):
  cumsum_tokens(x)                 prefix sums over tokens; on CUDA one opaque op that Inductor leaves to ATen
  causal_conv(x, weight, past)     a depthwise causal convolution over time (PaTH's short convolution)
  path_scores(q, k, w, beta, ...)  PaTH's logits by the chunked UT transform, no d x d matrix
  wall_scores(q, k, P, ...)        Wall's logits, every exponent a difference of prefix sums <= 0

A file of its own rather than a section of positional.py: positional.py holds the schemes, the file a fork edits;
these are the computations the schemes call, shared by several of them.
"""

import torch
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
    """The lower triangle of Wall's logits (0 above it) for n = 2^m tokens that are both queries and keys
    -> [B, H, n, n]. A binary tree: the diagonal is q_i . k_i (exp(0) = 1); at each level, every block's
    lower-left quadrant (its second half's queries R against its first half's keys L) is one matmul through
    R's first token m: exp(P_i - P_j) = exp(P_i - P_m) exp(P_m - P_j), both factors <= 1. No [n, n, d] tensor."""
    B, H, n, d = q.shape
    A = (q * k).sum(-1)[..., None, None]  # (B, H, n, 1, 1): blocks of 1
    s = 1
    while s < n:
        q2, k2, P2 = (t.view(B, H, n // (2 * s), 2, s, d) for t in (q, k, P))  # pairs of blocks of s
        Pm = P2[:, :, :, 1, :1]  # the reference: the right block's first P
        cross = (q2[:, :, :, 1] * torch.exp(P2[:, :, :, 1] - Pm)) @ \
            (k2[:, :, :, 0] * torch.exp(Pm - P2[:, :, :, 0])).transpose(-1, -2)  # (B, H, n/2s, s, s)
        left, right = A[:, :, 0::2], A[:, :, 1::2]
        A = torch.cat((torch.cat((left, torch.zeros_like(left)), -1), torch.cat((cross, right), -1)), -2)
        s *= 2
    return A.view(B, H, n, n)


def wall_scores(q, k, P, run=128):
    """Wall's logits before the scale: A[i, j] = sum_n q_in k_jn exp(P_in - P_jn) for key j at or before query i
    (0 above), the queries being the last Tq of the Tk keys and P [B, H, Tk, d] the keys' prefix sums of log gates
    <= 0. Every exponent used is a difference <= 0, so nothing overflows however long the sequence. The queries
    go in runs of 2^m, at most `run` (the binary digits of Tq, largest first): the keys before a run's first query
    r through r (exp(P_i - P_r) exp(P_r - P_j), one matmul), the run's own keys by _wall_block; each written into
    the output in place, so a long forward holds little more than the output. -> [B, H, Tq, Tk]."""
    Tq, Tk = q.size(2), k.size(2)
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
