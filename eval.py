"""
Length-extrapolation evaluation for nanoPE.

  python eval.py --out_dir=out-rope                     # val loss at L, 2L, 4L, 8L, 16L
  python eval.py --out_dir=out-rope --rope_scaling="{'type':'yarn','factor':4}"

Non-overlapping windows (the ALiBi paper's protocol, arXiv 2108.12409): the val
split is cut into windows of T tokens, every token of a window is scored with
the context it has inside that window. Windows are spread evenly over the split
and the same for every scheme, so runs compare.
"""
import json
import math
import os
import pickle
import sys

import numpy as np
import torch


def window_starts(n_data, T, n_windows):
    """n_windows non-overlapping window starts spread evenly over the data."""
    n_windows = max(1, min(n_windows, (n_data - 1) // T))
    stride = (n_data - 1 - T) // max(1, n_windows - 1) if n_windows > 1 else 0
    stride = max(stride, T)
    return [i * stride for i in range(n_windows)]


@torch.no_grad()
def eval_loss(model, data, T, tokens=32768, batch_tokens=16384, device='cpu', ctx=None):
    """Mean next-token loss over ~`tokens` tokens in non-overlapping windows of T."""
    starts = window_starts(len(data), T, max(1, tokens // T))
    bs = max(1, batch_tokens // T)
    total, count = 0.0, 0
    for i in range(0, len(starts), bs):
        chunk = starts[i:i + bs]
        x = torch.stack([torch.from_numpy(data[s:s + T].astype(np.int64)) for s in chunk]).to(device)
        y = torch.stack([torch.from_numpy(data[s + 1:s + 1 + T].astype(np.int64)) for s in chunk]).to(device)
        with ctx if ctx is not None else torch.autocast(device_type='cpu', enabled=False):
            _, loss = model(x, y, reduction='sum')
        total += loss.item()
        count += y.numel()
    return total / count


def eval_lengths(model, data, L, mults=(1, 2, 4, 8), **kw):
    """{'val/loss@1L': .., 'val/loss@2L': ..}; lengths a scheme cannot address are skipped."""
    max_len = model.pe.max_len
    out = {}
    for m in mults:
        T = int(m * L)  # fractional multiples allowed (a fine-tuned model's original L)
        if T != m * L or T < 1:
            raise ValueError(f"eval length {m}*{L} is not a positive whole number of tokens; pick eval_mults "
                             f"that are multiples of 1/{L}")
        if max_len is not None and T > max_len:
            continue
        out[f'val/loss@{m}L'] = eval_loss(model, data, T, **kw)
    return out


def load_checkpoint(path, device='cpu', **overrides):
    from model import GPT, GPTConfig
    ckpt = torch.load(path, map_location=device, weights_only=False)
    args = dict(ckpt['model_args'])
    args.update({k: v for k, v in overrides.items() if v is not None})
    model = GPT(GPTConfig(**args))
    model.load_state_dict(ckpt['model'])
    return model.to(device).eval(), ckpt


if __name__ == '__main__':
    out_dir, device, rope_scaling, mults, tokens = 'out', 'cpu', None, '1,2,4,8,16', 32768
    for arg in sys.argv[1:]:
        k, v = arg.lstrip('-').split('=', 1)
        if k == 'out_dir': out_dir = v
        elif k == 'device': device = v
        elif k == 'rope_scaling': rope_scaling = eval(v)
        elif k == 'mults': mults = v
        elif k == 'tokens': tokens = int(v)
        else: sys.exit(f"unknown option {k}; valid: out_dir, device, rope_scaling, mults, tokens")
    model, ckpt = load_checkpoint(os.path.join(out_dir, 'ckpt.pt'), device, rope_scaling=rope_scaling)
    cfg = ckpt['config']
    data = np.memmap(os.path.join(cfg['data_dir'], 'val.bin'), dtype=np.uint16, mode='r')
    L = model.config.block_size
    print(f"scheme {model.config.pos_encoding}, trained with rope_scaling={ckpt['model_args'].get('rope_scaling')}, "
          f"evaluating with rope_scaling={getattr(model.pe, 'scaling', None)}")
    res = eval_lengths(model, data, L, tuple(float(m) if '.' in m else int(m) for m in mults.split(',')), tokens=tokens, device=device)
    for k, v in res.items():
        print(f"{k:14s} {v:.4f}  (ppl {math.exp(v):.2f})")
    with open(os.path.join(out_dir, 'eval.json'), 'w') as f:
        json.dump({'rope_scaling': model.config.rope_scaling, **res}, f, indent=1)
