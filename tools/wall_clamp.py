"""fla 0.6.0's Wall kernel against fla's own eager reference, as the per-token decay grows: a reproduction of the
clamp docs/speed.md describes ("Wall's kernel has a range"). The kernel exponentiates prefix-sum differences of the
log decays within its diagonal tiles with a clamp at 2^110; once a channel decays by more than about 76 nats within
one key tile, near-diagonal logits come out too small, where naive_wall_attn (fla.ops.wall_attn.naive) stays exact.

    TRITON_INTERPRET=1 python tools/wall_clamp.py    # on a CPU (Triton's interpreter, a few seconds)
    python tools/wall_clamp.py                       # on a CUDA GPU

Prints, for each mean decay m (nats per token, each token's decay uniform in [0, 2m]), the largest error of the
kernel's output, and of nanoPE's own path (kernels.wall_scores), relative to the largest output of the reference:
float32, B = 1, T = 40, 2 heads of 16 dims. Needs triton and fla-core (requirements.txt).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root's modules: the library
import kernels  # noqa: E402  (fla's kernel as nanoPE calls it: under the interpreter, its first config, untimed)

ok, why = kernels.fla_status()
if not ok:
    sys.exit(f"tools/wall_clamp.py: {why}")
from fla.ops.wall_attn.naive import naive_wall_attn  # noqa: E402

kernel = kernels.fla_op('wall')
device = 'cuda' if torch.cuda.is_available() else 'cpu'
g = torch.Generator().manual_seed(0)
B, T, H, D = 1, 40, 2, 16
q, k, v = (torch.randn(B, T, H, D, generator=g).to(device) for _ in range(3))  # fla's layout [B, T, H, D]
for m in (0.5, 2.0, 5.0):
    decay = -2 * m * torch.rand(B, T, H, D, generator=g).to(device)  # log f per token and channel, in [-2m, 0]
    want = naive_wall_attn(q, k, v, decay, scale=D ** -0.5)
    got = kernel(q, k, v, decay, scale=D ** -0.5)
    # nanoPE's path: wall_scores (every exponent a difference <= 0), the causal softmax, in nanoPE's layout
    qh, kh, vh, P = (t.transpose(1, 2) for t in (q, k, v, decay.cumsum(1)))
    A = kernels.wall_scores(qh, kh, P) * D ** -0.5
    A = A.masked_fill(torch.ones(T, T, dtype=torch.bool, device=device).triu(1), float('-inf'))
    ours = (A.softmax(-1) @ vh).transpose(1, 2)
    rel = [((y.float() - want.float()).abs().max() / want.float().abs().max()).item() for y in (got, ours)]
    print(f"m = {m:3.1f} nats per token: fla's kernel off by {rel[0]:.2g} of the largest output, nanoPE's "
          f"wall_scores by {rel[1]:.2g}")
