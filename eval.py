"""
Length-extrapolation evaluation of a checkpoint: evaluation.py's suite (its protocols are described there) on the
val split, printed and written to out_dir/eval[_tag].json; a quick one to eval[_tag]_quick.json, never over a full one.

  python eval.py --out_dir=out-rope              # full suite at L, 2L, 4L, 8L, 16L -> out-rope/eval.json
  python eval.py --out_dir=out-rope --rope_scaling="{'type':'yarn','factor':16,'original_max_len':128}"
  python eval.py --out_dir=out-rope --quick=True # non-overlapping loss only -> out-rope/eval_quick.json
  python eval.py --out_dir=out-rope --longppl_short=64   # LongPPL's short context (default L)
  python eval.py --init_from=gpt2 --data_dir=data/shakespeare --out_dir=out-gpt2  # Hugging Face GPT-2
"""
import math
import os
import sys

import numpy as np

import checkpoint
import runtime
from configurator import options
from console import exit_on_ctrl_c
from evaluation import evaluate, flat_metrics, log_wandb, scaling_tag
from files import read_json

# what train.py's eval.json says of the run rather than of its evaluation: a full eval.py result replacing it keeps them
RUN_RECORD = ('seed', 'name', 'timing')


if __name__ == '__main__':
    o = options(dict(out_dir='out', init_from='resume', data_dir='', device='auto', dtype='auto', rope_scaling=None,
                     attn_scaling=None, attn_backend='auto',
                     mults=[1, 2, 4, 8, 16], tokens=32768, stride=0, sliding_tokens=0, last_k=0, last_k_spans=0,
                     batch_tokens=2**14, quick=False, name='', label='', wandb_log=False, wandb_project='nanoPE',
                     doc_aware=False, longppl_short=0, longppl_k=0),
                sys.argv[1:], rules=dict(tokens='>0', stride='>=0', sliding_tokens='>=0', last_k='>=0',
                                         last_k_spans='>=0', batch_tokens='>0', longppl_short='>=0',
                                         longppl_k='>=0'))
    exit_on_ctrl_c('eval.py', 'nothing was written; run it again')
    rt = runtime.setup(o.device, o.dtype)
    # run-time choices as given on the command line (--rope_scaling=None turns a fine-tuned model's off)
    model, ckpt = checkpoint.load(o.init_from, o.out_dir, rt.device,
                                  **{k: getattr(o, k) for k in ('rope_scaling', 'attn_scaling', 'attn_backend')
                                     if k in o.explicit})
    checkpoint.check_writable(o.out_dir)  # before the work, not after it
    checkpoint.lock_out_dir(o.out_dir, 'eval.py', hint=f"to evaluate a run while it trains: "
                            f"--init_from={os.path.join(o.out_dir, 'ckpt.pt')} --out_dir=ANOTHER_DIR")
    tag = '_'.join(t for t in (scaling_tag(o.rope_scaling), (o.attn_scaling or {}).get('type')) if t)
    tag = tag or ('noscaling' if 'rope_scaling' in o.explicit and ckpt['model_args'].get('rope_scaling') else '')
    path = os.path.join(o.out_dir, (o.name or ('eval' + (f'_{tag}' if tag else '') + ('_quick' if o.quick else '')))
                        + '.json')
    old, _ = read_json(path)  # (a damaged file holds nothing to keep: it is replaced)
    if o.quick and isinstance(old, dict) and not old.get('quick'):
        sys.exit(f"eval.py: {path} holds a full evaluation, which a quick one would replace; nothing was written: "
                 f"pass another --name, or drop --quick=True")
    folder = checkpoint.data_dir(ckpt, o.data_dir)
    data = np.memmap(os.path.join(folder, 'val.bin'), dtype=np.uint16, mode='r')
    L = model.config.block_size
    doc_eot = None
    if o.doc_aware:  # whole documents (e.g. PG-19 books): needs a BPE corpus whose meta names its EOT
        doc_eot = (ckpt.get('meta') or checkpoint.read_meta(folder) or {}).get('eot_token')
        if doc_eot is None:
            sys.exit(f"--doc_aware=True needs an EOT token in {folder}/meta.json (BPE corpora from "
                     f"data/*/prepare.py have one; char corpora have no document boundaries)")
    print(f"scheme {model.config.pos_encoding} (iter {ckpt.get('iter_num')}), trained with rope_scaling="
          f"{ckpt['model_args'].get('rope_scaling')}, evaluating with rope_scaling={getattr(model.pe, 'scaling', None)}"
          f" on {rt.device} ({rt.dtype})")
    try:
        res = evaluate(model, data, L, tuple(o.mults), o.tokens, o.stride, o.sliding_tokens, o.last_k, o.last_k_spans,
                       o.quick, o.batch_tokens, rt.device, ctx=rt.autocast, progress=True, doc_eot=doc_eot,
                       longppl_short=o.longppl_short, longppl_k=o.longppl_k)
    except ValueError as e:  # e.g. a split too short for one window of the longest length
        sys.exit(f"eval.py: {e}")
    res = {'scheme': model.config.pos_encoding, 'rope_scaling': model.config.rope_scaling,
           'rope_scaling_applied': getattr(model.pe, 'scaling', None), 'attn_scaling': o.attn_scaling,
           'iter': ckpt.get('iter_num'), 'out_dir': o.out_dir, 'dtype': rt.dtype,
           'routes': model.routes(rt.device, grad=False, dtype=rt.ptdtype), **res}
    if o.label:  # the row's name in compare.py's report
        res = {'name': o.label, **res}
    for k, v in flat_metrics(res).items():
        print(f"{k:22s} {v:.4f}  (ppl {math.exp(v):.2f})")
    if o.quick:
        res['quick'] = True  # report.py labels it '+quick'; sweep.py never counts it as a run's evaluation
    elif isinstance(old, dict):
        res.update({k: old[k] for k in RUN_RECORD if k in old and k not in res})
    checkpoint.atomic_json(res, path)
    print(f"wrote {path}")
    if o.wandb_log:
        run = runtime.wandb_init(project=o.wandb_project, name=f"{res['scheme']}-eval" + (f'-{tag}' if tag else ''),
                                 config={k: v for k, v in res.items() if k != 'position'}, out_dir=o.out_dir)
        log_wandb(run, res)
        run.finish()
