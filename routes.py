"""
The route each layer's attention takes (attention.ROUTES) on a device this machine need not have: a training
config's model, its layer plan and schemes, built on the CPU and asked as on that device, in training (at the config's
batch and length, which sdpa_bias's memory budget reads) and in evaluation. A new scheme is seen to take its fast
route before any GPU is at hand.

  python routes.py config/t5.py                           # on CUDA in bfloat16 (device and dtype 'auto')
  python routes.py config/gemma3.py --device=cpu          # the CPU's routes
  python routes.py config/alibi.py --attn_scaling="{'type': 'ssmax'}" --batch_size=8 --block_size=8192

Every train.py option is taken: train.py resolves them (--dry_run=True), and its data is not read.
"""
import dataclasses
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv):
    r = subprocess.run([sys.executable, os.path.join(HERE, 'train.py'), *argv, '--dry_run=True'],
                       capture_output=True, text=True)
    if r.returncode:
        sys.exit(r.stderr.strip() or r.stdout.strip())
    cfg = json.loads(r.stdout.strip().splitlines()[-1])
    import torch  # here: train.py's checks first, which need none
    from model import GPT, GPTConfig
    device = 'cuda' if cfg['device'] == 'auto' else cfg['device']
    name = cfg['dtype'] if cfg['dtype'] != 'auto' else 'bfloat16' if device.startswith('cuda') else 'float32'
    dtype = None if name == 'float32' else getattr(torch, name)  # (float32: route's None)
    keys = {f.name for f in dataclasses.fields(GPTConfig)} - {'vocab_size'}
    try:
        model = GPT(GPTConfig(**{k: v for k, v in cfg.items() if k in keys}, vocab_size=64))
    except ValueError as e:
        sys.exit(f"routes.py: {e}")
    print(f"{cfg['pos_encoding']} on {device} ({name}), training at batch {cfg['batch_size']} x {cfg['block_size']}:")
    for line in model.plan_lines(device, dtype, cfg['batch_size'], cfg['block_size']):
        print('  ' + line)
    print(f"evaluation (no gradients): {', '.join(model.routes(device, grad=False, dtype=dtype))}")


if __name__ == '__main__':
    main(sys.argv[1:])
