"""
Prepare FineWeb-Edu (arXiv 2406.17557) in GPT-2 BPE tokens, for the GPU-scale runs.

Streams HuggingFaceFW/fineweb-edu (default config sample-10BT: ~9.7M web pages,
~10B GPT-2 tokens) from the Hugging Face Hub, so it needs a network and the
`datasets` package (pip install datasets). Documents are tokenized by worker
processes and written in stream order, each followed by EOT (50256):
the first --val_docs documents -> val.bin, the rest -> train.bin (uint16,
~20 GB for sample-10BT), plus meta.json. Nothing is kept but the token files.

  python data/fineweb_edu/prepare.py                           # all of sample-10BT
  python data/fineweb_edu/prepare.py --max_tokens=500_000_000  # a 0.5B-token slice
  torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py --pos_encoding=rope --out_dir=out-gpt2-rope
"""
import argparse
import itertools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from data.common import get_encoding, load_hf_stream, num_examples, tokenize_to_bin, write_meta  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
HF_PATH = 'HuggingFaceFW/fineweb-edu'


def prepare(texts, out_dir, val_docs=10_000, max_tokens=None, num_proc=None, total=None, encoding='gpt2'):
    """texts: an iterable (a stream) of document strings. Returns {split: (docs, tokens)}."""
    os.makedirs(out_dir, exist_ok=True)
    texts = iter(texts)
    out = {'val': tokenize_to_bin(itertools.islice(texts, val_docs), os.path.join(out_dir, 'val.bin'),
                                  encoding, num_proc, total=val_docs, desc='val')}
    out['train'] = tokenize_to_bin(texts, os.path.join(out_dir, 'train.bin'), encoding, num_proc,
                                   max_tokens=max_tokens, total=total and total - val_docs, desc='train')
    write_meta(out_dir, get_encoding(encoding))
    for split, (d, t) in out.items():
        print(f"{split}: {d:,} documents, {t:,} tokens -> {os.path.join(out_dir, split + '.bin')}")
    return out


if __name__ == '__main__':
    from console import exit_on_ctrl_c
    exit_on_ctrl_c(os.path.relpath(__file__), 'run it again: its files appear only when complete')
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--hf_path', default=HF_PATH, help='the Hub dataset (or a local copy with the same configs)')
    ap.add_argument('--name', default='sample-10BT', help='fineweb-edu config: sample-10BT, sample-100BT, ...')
    ap.add_argument('--val_docs', type=int, default=10_000, help='first N documents are the val split')
    ap.add_argument('--max_tokens', type=int, default=None, help='stop the train split after this many tokens')
    ap.add_argument('--num_proc', type=int, default=None, help='tokenizer processes (default: CPUs - 1)')
    ap.add_argument('--out_dir', default=HERE)
    args = ap.parse_args()
    ds = load_hf_stream(args.hf_path, args.name, 'train')
    prepare((row['text'] for row in ds), args.out_dir, args.val_docs, args.max_tokens, args.num_proc,
            total=num_examples(ds, 'train'))
