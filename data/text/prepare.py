"""
Prepare your own text for nanoPE: one or more UTF-8 files, char-level or GPT-2 BPE.

  python data/text/prepare.py --input book.txt                     # char level -> data/text/
  python data/text/prepare.py --input a.txt b.txt --tokenizer gpt2 --out_dir data/mytext
  python train.py --data_dir=data/mytext --wandb_log=False

char: the files are concatenated and go through data/shakespeare_char's prepare()
      (vocabulary = the characters that occur; meta.json carries stoi/itos).
gpt2: tiktoken's GPT-2 BPE (works offline, see data/common.py); an EOT token
      follows each file, so files are separate documents.
Either way the last --val_frac of the tokens is the validation split.
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from data.common import encode_doc, get_encoding, write_bin, write_meta  # noqa: E402
from data.shakespeare_char.prepare import prepare as prepare_char  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def read_texts(paths):
    texts = []
    for p in paths:
        if not os.path.isfile(p):
            sys.exit(f"--input {p!r}: no such file")
        try:
            with open(p, encoding='utf-8') as f:
                texts.append(f.read())
        except UnicodeDecodeError as e:
            sys.exit(f"--input {p!r} is not UTF-8 text ({e}); convert it first, e.g. iconv -t utf-8")
    return texts


def prepare(texts, out_dir, tokenizer='char', val_frac=0.1, encoding='gpt2'):
    if not 0 < val_frac < 1:
        sys.exit(f"--val_frac must be between 0 and 1, got {val_frac}")
    if tokenizer == 'char':
        return prepare_char(''.join(texts), out_dir, val_frac=val_frac)
    enc = get_encoding(encoding)
    ids = np.concatenate([encode_doc(t, enc) for t in texts])  # each file ends with EOT
    split = int(len(ids) * (1 - val_frac))
    if split < 1 or len(ids) - split < 2:
        sys.exit(f"too little text: {len(ids)} tokens; give at least a few thousand")
    os.makedirs(out_dir, exist_ok=True)
    write_bin(ids[:split], os.path.join(out_dir, 'train.bin'))
    write_bin(ids[split:], os.path.join(out_dir, 'val.bin'))
    write_meta(out_dir, enc)
    print(f"{len(texts)} file(s), {len(ids):,} {encoding} tokens: train {split:,} / val {len(ids) - split:,} "
          f"-> {out_dir}")


if __name__ == '__main__':
    from console import exit_on_ctrl_c
    exit_on_ctrl_c(os.path.relpath(__file__), 'run it again: its files appear only when complete')
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--input', nargs='+', metavar='FILE', help='UTF-8 text file(s)')
    ap.add_argument('--tokenizer', choices=('char', 'gpt2'), default='char')
    ap.add_argument('--out_dir', default=HERE)
    ap.add_argument('--val_frac', type=float, default=0.1)
    args = ap.parse_args()
    if not args.input:  # e.g. train.py --dataset=text ran us without arguments
        sys.exit("data/text/prepare.py needs your text: python data/text/prepare.py --input FILE... "
                 "[--tokenizer char|gpt2] [--out_dir DIR]")
    prepare(read_texts(args.input), args.out_dir, args.tokenizer, args.val_frac)
