"""
DroPE (Gelberg et al., "Extending the Context of Pretrained LLMs by Dropping Their Positional
Embeddings", arXiv 2512.12167): train with RoPE, drop every positional encoding, recalibrate briefly at
the training length L, then evaluate past L with every logit scaled by 1 + c ln(s), s = n / L
(attn_scaling {'type': 'drope', 'c': c}). This script fits c and evaluates with it:

  python train.py config/rope.py          # RoPE at L = 128 -> out-rope
  python train.py config/drope.py         # drop it and recalibrate -> out-drope
  python drope.py --out_dir=out-drope     # fit c -> out-drope/drope.json; eval.py's suite -> eval_drope.json

c minimises the mean loss over 2L..16L on the train split (text the model trained on, at lengths it never
saw; the evaluation reads the val split), over a grid of c = 0, 0.05, ..., 1; drope.json keeps every
grid point. The paper fits its c the same way, on held-out text, one c for all lengths.
"""
import os
import subprocess
import sys

import numpy as np

import checkpoint
import runtime
from configurator import options
from evaluation import length_of, nonoverlap_loss

GRID = [round(0.05 * i, 2) for i in range(21)]


def fit_c(path, data, L, mults, tokens, device, ctx):
    """{c: mean loss over the lengths mults x L} for every c of GRID, and the best c."""
    losses = {}
    for c in GRID:
        model, _ = checkpoint.load_model(path, device, attn_scaling={'type': 'drope', 'c': c, 'original_max_len': L})
        losses[c] = float(np.mean([nonoverlap_loss(model, data, length_of(m, L), tokens, device=device, ctx=ctx)[0]
                                   for m in mults]))
        print(f"c = {c:.2f}: mean loss over {', '.join(f'{m}L' for m in mults)} = {losses[c]:.4f}", flush=True)
    return losses, min(losses, key=losses.get)


if __name__ == '__main__':
    o = options(dict(out_dir='out-drope', device='auto', dtype='auto', mults=[2, 4, 8, 16], fit_tokens=8192,
                     tokens=32768, evaluate=True, label='drope'), sys.argv[1:],
                rules=dict(fit_tokens='>0', tokens='>0'))
    rt = runtime.setup(o.device, o.dtype)
    path = os.path.join(o.out_dir, 'ckpt.pt')
    ckpt = checkpoint.read_checkpoint(path)
    if ckpt['model_args']['pos_encoding'] != 'none':
        sys.exit(f"{path} runs {ckpt['model_args']['pos_encoding']!r}: DroPE's scaling is for a model whose positional "
                 f"encoding was dropped; recalibrate it first (python train.py config/drope.py)")
    L = ckpt['model_args']['block_size']
    train = np.memmap(os.path.join(checkpoint.data_dir(ckpt), 'train.bin'), dtype=np.uint16, mode='r')
    losses, c = fit_c(path, train, L, o.mults, o.fit_tokens, rt.device, rt.autocast)
    fit = {'c': c, 'loss': losses, 'lengths': [length_of(m, L) for m in o.mults], 'tokens_per_length': o.fit_tokens,
           'split': 'train', 'grid': GRID}
    checkpoint.atomic_json(fit, os.path.join(o.out_dir, 'drope.json'))
    print(f"c = {c} (mean loss {losses[c]:.4f}; c = 0, no scaling: {losses[0.0]:.4f}) -> {o.out_dir}/drope.json")
    if o.evaluate:  # eval.py's suite on the val split with the fitted scaling -> eval_drope.json
        sc = {'type': 'drope', 'c': c, 'original_max_len': L}
        sys.exit(subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'eval.py'),
                                 f'--out_dir={o.out_dir}', f'--attn_scaling={sc!r}', f'--tokens={o.tokens}',
                                 f'--label={o.label}',
                                 f'--device={o.device}', f'--dtype={o.dtype}']).returncode)
