"""
Sample from a trained nanoPE model, as far past the training length as you like.

  python sample.py --out_dir=out-rope --max_new_tokens=2000
  python sample.py --out_dir=out-rope --rope_scaling="{'type':'dynamic','factor':4,'original_max_len':128}"

Decoding uses a KV cache: each new token costs one position. A scheme with a
finite position table (learned) cannot address positions past it: it falls back
to a sliding window over its last max_len tokens, and says so.
"""
import os
import pickle
import sys

import torch

from eval import load_checkpoint, parse_options

out_dir = 'out'
start = '\n'              # prompt text, or FILE:path
num_samples = 1
max_new_tokens = 500
temperature = 0.8
top_k = 200
seed = 1337
device = 'cpu'
rope_scaling = None       # run-time RoPE context extension, e.g. {'type': 'ntk', 'factor': 4}
use_cache = True
opts = dict(out_dir=out_dir, start=start, num_samples=num_samples, max_new_tokens=max_new_tokens,
            temperature=temperature, top_k=top_k, seed=seed, device=device, rope_scaling=rope_scaling,
            use_cache=use_cache)
globals().update(parse_options(sys.argv[1:], opts))

torch.manual_seed(seed)
ckpt_path = os.path.join(out_dir, 'ckpt.pt')
if not os.path.exists(ckpt_path):
    sys.exit(f"no checkpoint at {ckpt_path}: train first, e.g. python train.py config/rope.py")
model, ckpt = load_checkpoint(ckpt_path, device, rope_scaling=rope_scaling)
cfg = model.config
print(f"scheme {cfg.pos_encoding}, trained at block_size={cfg.block_size} with "
      f"rope_scaling={ckpt['model_args'].get('rope_scaling')}; sampling with rope_scaling={getattr(model.pe, 'scaling', None)}")

# tokenizer: a char vocabulary from meta.pkl, else the tiktoken encoding it names (GPT-2 BPE by default)
meta_path = os.path.join(ckpt['config']['data_dir'], 'meta.pkl')
meta = {}
if os.path.exists(meta_path):
    with open(meta_path, 'rb') as f:
        meta = pickle.load(f)
if 'stoi' in meta:
    stoi, itos = meta['stoi'], meta['itos']

    def encode(s):
        bad = sorted(set(c for c in s if c not in stoi))
        if bad:
            sys.exit(f"prompt has characters outside the model's vocabulary: {bad!r}; "
                     f"use only these: {''.join(sorted(stoi))!r}")
        return [stoi[c] for c in s]

    def decode(ids):
        return ''.join(itos[i] for i in ids)
else:
    from data.common import get_encoding  # works offline (vocabulary from PyPI)
    enc = get_encoding(meta.get('encoding', 'gpt2'))
    encode = lambda s: enc.encode(s, allowed_special={'<|endoftext|>'})  # noqa: E731
    decode = enc.decode

if start.startswith('FILE:'):
    with open(start[5:], encoding='utf-8') as f:
        start = f.read()
ids = encode(start)
total = len(ids) + max_new_tokens
max_len = model.pe.max_len
if max_len is not None and total > max_len:
    print(f"note: {cfg.pos_encoding} has {max_len} positions; past them sampling uses a sliding window "
          f"of the last {max_len} tokens, recomputed each step (no KV cache there)")
elif total > cfg.block_size:
    print(f"note: generating {total} positions, {total / cfg.block_size:.1f}x the training length "
          f"{cfg.block_size}" + (", with a KV cache" if use_cache else ""))
x = torch.tensor(ids, dtype=torch.long, device=device)[None, ...]
for _ in range(num_samples):
    y = model.generate(x, max_new_tokens, temperature=temperature, top_k=top_k, use_cache=use_cache)
    print(decode(y[0].tolist()))
    print('---------------')
