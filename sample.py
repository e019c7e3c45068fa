"""
Sample from a trained nanoPE model, as far past the training length as you like.

  python sample.py --out_dir=out-rope --max_new_tokens=2000
  python sample.py --out_dir=out-rope --rope_scaling="{'type':'dynamic','factor':4,'original_max_len':128}"
  python sample.py --out_dir=out-rope --max_new_tokens=5000 --window=124 --sink=4   # StreamingLLM sinks

Decoding uses a KV cache: each new token costs one position. A scheme with a
finite position table (learned) cannot address positions past it: it falls back
to a sliding window over its last max_len tokens, and says so. Progress goes to
stderr (a bar on a terminal, a line every 30 s in a log); the samples to stdout.
"""
import sys

import torch

import checkpoint
import runtime
from configurator import configure
from console import end_on_closed_pipe, exit_on_ctrl_c, progress


def generate(model, x, max_new_tokens, desc, **kw):
    """model.generate with progress over its new tokens, counted by a forward hook that reads and draws nothing."""
    with progress(max_new_tokens, desc, 'token', every=30) as bar:
        def count(module, args, kwargs, out):
            # a KV cache's length says how many tokens are drawn (a long prompt may take several forwards); without
            # one (learned past its table), each forward draws one
            cache = kwargs.get('cache')
            done = cache.length - x.size(1) + 1 if cache is not None else bar.n + 1
            bar.update(max(0, done - bar.n))
        hook = model.register_forward_hook(count, with_kwargs=True)
        try:
            return model.generate(x, max_new_tokens, **kw)
        finally:
            hook.remove()


out_dir = 'out'
init_from = 'resume'      # 'resume' (out_dir/ckpt.pt) | path to a .pt | 'gpt2', 'gpt2-medium', ... (Hugging Face)
start = '\n'              # prompt text, or FILE:path
num_samples = 1
max_new_tokens = 500
temperature = 0.8
top_k = 200
seed = 1337
device = 'auto'           # 'auto' (CUDA if available) | 'cpu' | 'cuda' | 'cuda:1' ...
dtype = 'auto'            # 'auto' (bf16 autocast on CUDA) | 'float32' | 'bfloat16'
data_dir = ''             # only for checkpoints without a saved vocabulary: where its meta.json is
rope_scaling = None       # run-time RoPE context extension, e.g. {'type': 'ntk', 'factor': 4}
attn_scaling = None       # run-time logit scaling, e.g. {'type': 'logn', 'original_max_len': 128}
attn_backend = 'auto'     # given: replaces the checkpoint's ('auto' | 'flex' | 'dense' | 'fla')
use_cache = True
window = 0                # > 0: StreamingLLM attention sinks, a KV cache of `sink` first tokens + `window` recent ones
sink = 4
explicit = configure(globals(), sys.argv[1:], dict(num_samples='>0', max_new_tokens='>=0', temperature='>0',
                                                   top_k='>0', window='>=0', sink='>=0'))

if start.startswith('FILE:'):
    try:
        with open(start[5:], encoding='utf-8') as f:
            start = f.read()
    except OSError as e:
        sys.exit(f"--start=FILE:{start[5:]}: cannot read it ({e.strerror})")
    except UnicodeDecodeError:
        sys.exit(f"--start=FILE:{start[5:]}: not UTF-8 text")
if not start:
    sys.exit("--start is empty: give at least one character of prompt (the default is a newline)")
exit_on_ctrl_c('sample.py')
end_on_closed_pipe()
rt = runtime.setup(device, dtype)
torch.manual_seed(seed)
# run-time choices as given on the command line (--rope_scaling=None turns a fine-tuned model's off)
model, ckpt = checkpoint.load(init_from, out_dir, rt.device,
                              **{k: globals()[k] for k in ('rope_scaling', 'attn_scaling', 'attn_backend')
                                 if k in explicit})
cfg = model.config
print(f"scheme {cfg.pos_encoding}, trained at block_size={cfg.block_size} with "
      f"rope_scaling={ckpt['model_args'].get('rope_scaling')}; sampling with rope_scaling="
      f"{getattr(model.pe, 'scaling', None)} on {rt.device} ({rt.dtype})")
encode, decode = checkpoint.tokenizer(ckpt, data_dir)
try:
    ids = encode(start)
except ValueError as e:  # a character the char vocabulary does not have
    sys.exit(f"prompt {e}")
total = len(ids) + max_new_tokens
max_len = model.pe.max_len
if not model.pe.addresses(total):
    print(f"note: {cfg.pos_encoding} has {max_len} positions; past them sampling uses a sliding window "
          f"of the last {max_len} tokens, recomputed each step (no KV cache there)")
elif window:
    print(f"note: attention sinks: every token sees the first {sink} tokens and the {window} before it "
          f"(positions by place in the cache), memory bounded for any length")
elif total > cfg.block_size:
    print(f"note: generating {total} positions, {total / cfg.block_size:.1f}x the training length "
          f"{cfg.block_size}" + (", with a KV cache" if use_cache else ""))
x = torch.tensor(ids, dtype=torch.long, device=rt.device)[None, ...]
for i in range(num_samples):
    with rt.autocast:
        try:
            y = generate(model, x, max_new_tokens, f"sample {i + 1}/{num_samples}", temperature=temperature,
                         top_k=top_k, use_cache=use_cache, recent=window or None, sink_tokens=sink)
        except ValueError as e:  # e.g. sinks asked of a scheme with absolute positions
            sys.exit(str(e))
    print(decode(y[0].tolist()))
    print('---------------')
