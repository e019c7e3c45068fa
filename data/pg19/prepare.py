"""
Prepare PG-19 (Rae et al., arXiv 1911.05507), the standard long-context corpus:
28,602 train / 50 validation / 100 test books from Project Gutenberg published
before 1919, ~69k words per book. In GPT-2 BPE tokens, each book followed by EOT.

Streams the Hub's parquet copy emozilla/pg19 (same splits and `text` field as
deepmind/pg19, whose loading script recent `datasets` no longer runs), so it needs
a network and `pip install datasets`. Writes val.bin (validation split),
test.bin (test split), train.bin (train split, ~3B tokens; skip it with
--splits validation test) and meta.json.

For evaluation on whole books use document-aware windows (data/common.py,
document_windows): each window stays inside one book and starts at its beginning.

  python data/pg19/prepare.py --splits validation test   # eval books only (~60 MB of text)
  python data/pg19/prepare.py                            # + the 11 GB train split
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from data.common import get_encoding, load_hf_stream, num_examples, tokenize_to_bin, write_meta  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
HF_PATH = 'emozilla/pg19'
FILES = {'validation': 'val.bin', 'test': 'test.bin', 'train': 'train.bin'}  # train.py reads train/val.bin


def prepare(splits, out_dir, num_proc=None, encoding='gpt2', totals=None):
    """splits: {'validation'|'test'|'train': iterable of book texts}. Books are big,
    so they go to the workers a few at a time. Returns {split: (books, tokens)}."""
    os.makedirs(out_dir, exist_ok=True)
    num_proc = num_proc or max(1, (os.cpu_count() or 2) - 1)
    out = {}
    for split, texts in splits.items():
        if split not in FILES:
            sys.exit(f"unknown PG-19 split {split!r}; valid: {', '.join(FILES)}")
        out[split] = tokenize_to_bin(texts, os.path.join(out_dir, FILES[split]), encoding, num_proc,
                                     total=(totals or {}).get(split), desc=split, chunk_docs=4 * num_proc)
        print(f"{split}: {out[split][0]:,} books, {out[split][1]:,} tokens -> {FILES[split]}")
    write_meta(out_dir, get_encoding(encoding))
    return out


if __name__ == '__main__':
    from console import exit_on_ctrl_c
    exit_on_ctrl_c(os.path.relpath(__file__), 'run it again: its files appear only when complete')
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--splits', nargs='+', default=['validation', 'test', 'train'], choices=list(FILES))
    ap.add_argument('--hf_path', default=HF_PATH, help='a Hub dataset with PG-19 splits and a `text` field')
    ap.add_argument('--num_proc', type=int, default=None, help='tokenizer processes (default: CPUs - 1)')
    ap.add_argument('--out_dir', default=HERE)
    args = ap.parse_args()
    streams, totals = {}, {}
    for split in args.splits:
        ds = load_hf_stream(args.hf_path, None, split)
        streams[split] = (row['text'] for row in ds)
        totals[split] = num_examples(ds, split)
    prepare(streams, args.out_dir, args.num_proc, totals=totals)
