"""
Convert a nanoPE file you trust from a pickle-based format to the data-only one. This is
the one place in nanoPE that unpickles arbitrary objects (which can run code), so run it
only on files whose origin you trust:

  python convert.py out-rope/ckpt.pt          # a checkpoint from before weights-only loading
  python convert.py data/mytext/meta.pkl      # a data folder's pickled metadata -> meta.json

A checkpoint is rewritten in place (atomically) with its numpy RNG state as tensors and plain
values, and the original is kept beside it as ckpt.pt.pickle; a meta.pkl gets a meta.json next
to it. Either result is then checked by loading it the safe way.
"""
import os
import pickle
import sys

import numpy as np
import torch

from checkpoint import atomic_save, read_checkpoint, read_meta
from files import atomic_json


def plain(obj):
    """obj with numpy arrays as tensors and numpy scalars as Python numbers, recursively."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(obj.astype(np.int64) if obj.dtype == np.uint32 else obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    return obj


def convert_checkpoint(path):
    ckpt = torch.load(path, map_location='cpu', weights_only=False)  # unsafe by design: see the docstring
    rng = ckpt.get('rng') or {}
    if isinstance(rng.get('numpy'), tuple):  # np.random.get_state() -> checkpoint.rng_states' form
        kind, keys, pos, has_gauss, gauss = rng['numpy']
        rng['numpy'] = {'kind': kind, 'keys': keys, 'pos': pos, 'has_gauss': has_gauss, 'cached_gaussian': gauss}
    ckpt = plain(ckpt)
    os.replace(path, path + '.pickle')
    atomic_save(ckpt, path)
    read_checkpoint(path)  # exits naming the problem if something unsafe is left
    print(f"converted {path} (the original is {path}.pickle; delete it once you are satisfied)")


def convert_meta(path):
    with open(path, 'rb') as f:
        meta = plain(pickle.load(f))  # unsafe by design: see the docstring
    atomic_json(meta, os.path.join(os.path.dirname(path), 'meta.json'))
    read_meta(os.path.dirname(path) or '.')
    print(f"wrote {os.path.join(os.path.dirname(path), 'meta.json')} from {path}")


if __name__ == '__main__':
    if len(sys.argv) < 2 or any(a.startswith('-') for a in sys.argv[1:]):
        sys.exit("usage: python convert.py FILE [FILE ...]  (a ckpt.pt / *.pt or a meta.pkl you trust)")
    for p in sys.argv[1:]:
        if not os.path.isfile(p):
            sys.exit(f"no file {p}")
        convert_meta(p) if p.endswith('.pkl') else convert_checkpoint(p)
