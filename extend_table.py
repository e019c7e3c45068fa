"""
RoPE context extension on the default char model, as one table:

  python extend_table.py

Trains what is missing (the RoPE model of config/rope.py at L = 128, then the
PI and YaRN fine-tunes to 4L of config/extend_pi.py and config/extend_yarn.py,
and as a control the same fine-tune without scaling), then prints val loss at
L, 2L, 4L and 8L for RoPE without scaling, with each scaling method applied at
evaluation only (s = 4, no training), and for the fine-tuned models (evaluated
with the scaling they were fine-tuned with).
Same windows as train.py's evaluation (evaluation.eval_loss), so numbers compare.
Options: --device, --dtype (as train.py; auto = CUDA + bf16 where available).
"""
import os
import subprocess
import sys

import numpy as np

import runtime
from checkpoint import data_dir, load_model
from configurator import configure
from console import exit_on_ctrl_c
from evaluation import eval_loss

S, MULTS, TOKENS = 4, (1, 2, 4, 8), 32768
RUNS = {'out-rope': ['config/rope.py'], 'out-extend-pi': ['config/extend_pi.py'],
        'out-extend-yarn': ['config/extend_yarn.py'],  # in this order: the fine-tunes start from out-rope
        'out-extend-plain': ['config/extend_pi.py', '--rope_scaling=None', '--out_dir=out-extend-plain']}


def rows(L):
    ln = {'original_max_len': L}
    return [
        ('RoPE, no scaling', 'out-rope', None),
        ('PI (linear)', 'out-rope', {'type': 'linear', 'factor': S}),
        ('NTK-aware', 'out-rope', {'type': 'ntk', 'factor': S}),
        ('dynamic NTK', 'out-rope', {'type': 'dynamic', 'factor': S, **ln}),
        ('YaRN', 'out-rope', {'type': 'yarn', 'factor': S, **ln}),
        ('Llama 3.1', 'out-rope', {'type': 'llama3', 'factor': S, **ln}),
        ('PI + fine-tune at 4L', 'out-extend-pi', 'as trained'),
        ('YaRN + fine-tune at 4L', 'out-extend-yarn', 'as trained'),
        ('control: fine-tune at 4L, no scaling', 'out-extend-plain', 'as trained'),
    ]


if __name__ == '__main__':
    device, dtype = 'auto', 'auto'
    configure(globals(), sys.argv[1:], keys=['device', 'dtype'])
    exit_on_ctrl_c('extend_table.py')
    rt = runtime.setup(device, dtype)
    for out_dir, args in RUNS.items():
        if not os.path.exists(os.path.join(out_dir, 'ckpt.pt')):
            cmd = [sys.executable, 'train.py', *args, '--wandb_log=False']
            print(f"{out_dir}/ckpt.pt missing: {' '.join(cmd[1:])}", flush=True)
            subprocess.run(cmd, check=True)
    base, ckpt = load_model('out-rope/ckpt.pt', rt.device)
    L = base.config.block_size
    data = np.memmap(os.path.join(data_dir(ckpt), 'val.bin'), dtype=np.uint16, mode='r')
    print(f"\nval loss (nats/char), {TOKENS} tokens per length, non-overlapping windows; L = {L}, s = {S}\n")
    print('| method | rope_scaling | ' + ' | '.join(f'{m}L = {m * L}' for m in MULTS) + ' |')
    print('| --- | --- |' + ' --- |' * len(MULTS))
    for name, out_dir, scaling in rows(L):
        if scaling == 'as trained':
            model, ck = load_model(os.path.join(out_dir, 'ckpt.pt'), rt.device)
            scaling = ck['model_args']['rope_scaling']
        else:
            model, _ = load_model('out-rope/ckpt.pt', rt.device, rope_scaling=scaling)
        res = [eval_loss(model, data, m * L, tokens=TOKENS, device=rt.device, ctx=rt.autocast) for m in MULTS]
        print(f"| {name} | `{scaling}` | " + ' | '.join(f'{v:.4f}' for v in res) + ' |', flush=True)
