"""
Checkpoints: data, not code. Written atomically, read with weights-only loading and clear
errors, loaded into a model, and portable (an out_dir copied elsewhere still finds its data
and its tokenizer).

A checkpoint (train.py writes it) is a dict of tensors and plain Python values only: model,
optimizer, scaler, model_args, iter_num, best_val_loss, config, rng, wandb_id, and meta (the
dataset's meta.json: its vocabulary or tiktoken encoding, so decoding never depends on where
the data is). Every load is torch.load(weights_only=True) with no extra allowed classes, so a
file that would need unpickling of anything else -- a checkpoint from before this format, or
one crafted to run code -- is refused; convert.py converts a file you trust.
"""
import errno
import fcntl
import json
import os
import random
import sys
import time

import numpy as np
import torch

import layers
from data.common import get_encoding  # works offline (vocabulary from PyPI)
from files import (LinkRefused, atomic_json, atomic_write, open_append,  # noqa: F401 (atomic_json: re-exported)
                   open_no_follow)
from model import GPT, GPTConfig, changeable

HERE = os.path.dirname(os.path.abspath(__file__))


def atomic_save(obj, path):
    """torch.save through files.atomic_write: a kill (or a node crash) mid-save leaves the
    previous file whole, and a link planted at the temporary name is never followed. A
    failed write (disk full) removes the temporary file and says how much space it needed."""
    try:
        atomic_write(path, lambda f: torch.save(obj, f))
    except LinkRefused:
        raise
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise _no_space(obj, path) from None
        raise
    except RuntimeError as e:  # torch's zip writer reports a full disk this way
        if 'enforce fail at inline_container' in str(e):
            raise _no_space(obj, path) from None
        raise


def _no_space(obj, path):
    return OSError(errno.ENOSPC, f"no space left on device: {path} needs about {state_mb(obj):.0f} MB; "
                                 f"free some space, the previous {os.path.basename(path)} is unchanged")


def state_mb(obj):
    """Approximate size of the tensors in a (nested) checkpoint dict, in MB."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size() / 2**20
    if isinstance(obj, dict):
        return sum(state_mb(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_mb(v) for v in obj)
    return 0.0


def rng_states(device_type):
    """The torch (and CUDA), numpy and Python RNG states as tensors and plain values (numpy's
    own state holds an ndarray, which weights-only loading does not accept)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {'torch': torch.get_rng_state(), 'python': random.getstate(),
            'numpy': {'kind': kind, 'keys': torch.from_numpy(keys.astype(np.int64)), 'pos': int(pos),
                      'has_gauss': int(has_gauss), 'cached_gaussian': float(gauss)},
            'cuda': torch.cuda.get_rng_state() if device_type == 'cuda' else None}


def restore_rng(rng, device_type):
    """Undo rng_states: every generator continues exactly where the saved run stopped."""
    torch.set_rng_state(rng['torch'].cpu())
    if rng.get('cuda') is not None and device_type == 'cuda':
        torch.cuda.set_rng_state(rng['cuda'].cpu())
    n = rng['numpy']
    np.random.set_state((n['kind'], n['keys'].numpy().astype(np.uint32), n['pos'], n['has_gauss'],
                         n['cached_gaussian']))
    random.setstate(rng['python'])


def read_checkpoint(path, device='cpu'):
    """torch.load(weights_only=True) with one clear line for a missing, truncated, foreign or
    unsafe file. Nothing in the file can run code: a pickled object other than tensors and
    plain values makes torch refuse it, and so do we."""
    if not os.path.exists(path):
        sys.exit(f"no checkpoint at {path}: train first (python train.py config/rope.py), or fix out_dir")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any loading error ends in one line
        if 'Weights only load failed' in str(e):
            sys.exit(f"{path} holds pickled Python objects, which could run code when loaded (a checkpoint from "
                     f"an older nanoPE, or a crafted file): refusing it. If you trust where it came from, convert "
                     f"it once with `python convert.py {path}`")
        best = os.path.join(os.path.dirname(path), 'ckpt_best.pt')
        other = os.path.exists(best) and not os.path.samefile(best, path)  # a hard link would be damaged too
        sys.exit(f"checkpoint {path} is unreadable ({type(e).__name__}: {str(e).splitlines()[0][:200]}). It is "
                 f"corrupt or truncated (train.py's own saves are atomic, so it was damaged or written elsewhere): "
                 + (f"use {best}, " if other else '') + "restore a backup, or retrain")
    if not isinstance(ckpt, dict) or not {'model', 'model_args'} <= ckpt.keys():
        sys.exit(f"{path} is not a nanoPE checkpoint (no 'model'/'model_args'); pass a ckpt.pt written by train.py")
    if isinstance(ckpt['model'], dict):
        ckpt['model'] = upgrade_keys(ckpt['model'])
    return ckpt


def load_model(path, device='cpu', **overrides):
    """(model in eval mode on device, checkpoint). overrides: model_args to change at run
    time (rope_scaling, attn_scaling, attn_backend, ...), applied as given: rope_scaling=None
    turns a fine-tuned model's scaling off."""
    ckpt = read_checkpoint(path, device)
    args = dict(ckpt['model_args'])
    args.update(overrides)
    try:
        model = GPT(GPTConfig(**args))
    except (TypeError, ValueError) as e:
        sys.exit(f"{path}: cannot build its model ({e})")
    load_weights(model, ckpt['model'], path)
    return model.to(device).eval(), ckpt


def load_weights(model, have, path):
    """model.load_state_dict, or exit naming the first weight that does not fit."""
    want = model.state_dict()
    bad = [k for k in want if k not in have] + [k for k in have if k not in want] + \
          [k for k in want if k in have and want[k].shape != have[k].shape]
    if bad:
        k = bad[0]
        sys.exit(f"{path}: its weights do not match its model_args, first at {k!r} (model "
                 f"{tuple(want[k].shape) if k in want else 'has no such weight'}, checkpoint "
                 f"{tuple(have[k].shape) if k in have else 'has no such weight'}); it was not written by this "
                 f"train.py, or was edited")
    model.load_state_dict(have)


def load_shared(model, have, path):
    """A fine-tune's load, which may change the scheme or the layer plan: every weight the model and the
    checkpoint share (same name and shape) loads; the model's other weights start fresh (the new scheme's
    own, or what the new plan adds: model.start_fresh) and the checkpoint's others are dropped. Only
    weights a change of scheme or plan may touch (model.changeable) may differ. -> (kept, dropped, fresh)."""
    want = model.state_dict()
    kept = [k for k in want if k in have and have[k].shape == want[k].shape]
    fresh = [k for k in want if k not in kept]
    dropped = [k for k in have if k not in kept]
    bad = [k for k in fresh + dropped if not changeable(k)]
    if bad:
        k = bad[0]
        sys.exit(f"{path}: cannot fine-tune from it: weight {k!r} differs between the model "
                 f"{tuple(want[k].shape) if k in want else '(no such weight)'} and the checkpoint "
                 f"{tuple(have[k].shape) if k in have else '(no such weight)'}, and only positional and per-layer "
                 f"attention weights may change with pos_encoding, pos_options or the layer plan")
    model.load_state_dict({k: have[k] for k in kept}, strict=False)
    model.start_fresh(fresh)
    return kept, dropped, fresh


def name_groups(names):
    """Weight names with the layer index folded: 'transformer.h.{0,1,3}.attn.sink_logits'."""
    groups = {}
    for n in names:
        parts = n.split('.')
        i = next((j for j in range(len(parts) - 1) if parts[j] == 'h' and parts[j + 1].isdigit()), None)
        key = n if i is None else '.'.join(parts[:i + 1] + ['{}'] + parts[i + 2:])
        groups.setdefault(key, []).append(parts[i + 1] if i is not None else None)
    return [k if idx == [None] else k.replace('{}', idx[0] if len(idx) == 1 else '{' + ','.join(idx) + '}')
            for k, idx in groups.items()]


def upgrade_keys(sd):
    """A checkpoint's weights under today's names: SSMax's scales moved from a layer's positional module
    (attn.pe_layer.ssmax) to its attention (attn.ssmax); sink logits were attn.sinks."""
    return {k.replace('.attn.pe_layer.ssmax', '.attn.ssmax').replace('.attn.sinks', '.attn.sink_logits'): v
            for k, v in sd.items()}


HF_GPT2 = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')


def load(init_from, out_dir, device='cpu', **overrides):
    """The model a script works on: init_from='resume' -> out_dir/ckpt.pt; a path to a .pt;
    or Hugging Face GPT-2 weights ('gpt2', ..., or a save_pretrained folder), with a
    checkpoint-like dict describing them (GPT-2 BPE vocabulary, no data folder)."""
    if init_from in HF_GPT2 or os.path.isdir(init_from):
        try:
            model = GPT.from_pretrained(init_from, **overrides)
        except (ImportError, ValueError) as e:
            sys.exit(str(e))
        ckpt = {'model_args': {k: getattr(model.config, k) for k in model.config.__dataclass_fields__},
                'config': {'init_from': init_from}, 'meta': {'vocab_size': model.config.vocab_size, 'encoding': 'gpt2'}}
        return model.to(device).eval(), ckpt
    return load_model(os.path.join(out_dir, 'ckpt.pt') if init_from == 'resume' else init_from, device, **overrides)


def resolve_init(config, explicit, master=True):
    """train.py's init_from -> (checkpoint, its path), or (None, None) for 'scratch' and GPT-2
    weights; refuses, in one line each, an unknown init_from, a new run over an existing run, a
    missing checkpoint, and a resume from one that lacks the parts an exact continuation needs.
    A resume continues the run as it was: every key not set explicitly (`explicit`: by a config
    file or --key=value) comes from the checkpoint, updated in `config`; explicit keys change the
    run, except model keys, which must match the checkpoint (dropout and attn_backend may change):
    we refuse rather than silently train something else."""
    init_from, out_dir = config['init_from'], config['out_dir']
    hf = init_from in HF_GPT2 or os.path.isdir(init_from)
    if init_from not in ('scratch', 'resume') and not init_from.endswith('.pt') and not hf:
        sys.exit(f"init_from={init_from!r}: use 'scratch', 'resume' (continue the run in out_dir), a path to a .pt, "
                 f"or 'gpt2' / 'gpt2-medium' / 'gpt2-large' / 'gpt2-xl' / a Hugging Face GPT-2 folder")
    if init_from != 'resume' and os.path.exists(os.path.join(out_dir, 'ckpt.pt')):
        # never overwrite a run by accident: its checkpoint would be replaced at the first eval
        sys.exit(f"{out_dir}/ckpt.pt exists: --init_from=resume continues that run; to start a new one use "
                 f"another --out_dir or delete {out_dir}/")
    if init_from == 'scratch' or hf:
        return None, None
    path = os.path.join(out_dir, 'ckpt.pt') if init_from == 'resume' else init_from
    if not os.path.exists(path):
        sys.exit(f"init_from={init_from!r}: no checkpoint at {path}")
    ckpt = read_checkpoint(path, 'cpu')
    if init_from != 'resume':
        return ckpt, path
    lacking = [k for k in ('optimizer', 'config', 'iter_num', 'best_val_loss') if ckpt.get(k) is None]
    if lacking:  # e.g. a checkpoint shared as weights only: it can seed a fine-tune, not continue a run
        sys.exit(f"cannot resume {path}: it has no {', '.join(lacking)} (a checkpoint shared as weights only?), so "
                 f"the run cannot continue exactly; fine-tune from it instead: --init_from={path} "
                 f"--out_dir=ANOTHER_DIR")
    ck, free = ckpt['model_args'], ('dropout', 'attn_backend')
    differ = [k for k in ck if k in config and k in explicit and k not in free and config[k] != ck[k]]
    if differ:
        sys.exit(f"cannot resume {path}: it was trained with " + ', '.join(f"{k}={ck[k]!r}" for k in differ)
                 + " but this run asks for " + ', '.join(f"{k}={config[k]!r}" for k in differ) + ". Drop those "
                 "settings to resume it, or start a new run in another out_dir (init_from=PATH.pt fine-tunes it).")
    inherit = {k: v for k, v in {**ckpt['config'], **ck}.items()
               if k in config and k not in explicit and k not in ('init_from', 'out_dir', 'eval_only')}
    old_iters = ckpt['config'].get('max_iters')
    if 'max_iters' in explicit and config['max_iters'] != old_iters and not ckpt['config'].get('lr_decay_iters') \
            and 'lr_decay_iters' not in explicit and master:
        print(f"resuming with max_iters {old_iters} -> {config['max_iters']}: lr_decay_iters=0 follows max_iters, so "
              f"the cosine now reaches min_lr at iter {config['max_iters']} instead of {old_iters} (the learning rate "
              f"goes back up); pass --lr_decay_iters={old_iters} to keep the old schedule")
    config.update(inherit)
    changed = [k for k in config if k not in ('init_from', 'out_dir') and config[k] != ckpt['config'].get(k, config[k])]
    if changed and master:
        print("resuming with changed settings: " + ', '.join(f"{k} {ckpt['config'][k]!r} -> {config[k]!r}"
                                                             for k in changed))
    return ckpt, path


# the keys that say where positions enter and how each layer attends: a fine-tune may change them
# (another scheme, another layer plan; checkpoint.load_shared says what was kept, dropped and started fresh)
PLAN_KEYS = ('pos_encoding', 'pos_options') + layers.PLAN_KEYS


def init_model(ckpt, path, model_args, vocab_size, config, explicit, master=True):
    """The model train.py starts from -> (model, model_args), weights not loaded yet. From scratch:
    `model_args`. A resume: the checkpoint's vocabulary, which must be the data's. A fine-tune
    (init_from a .pt): the checkpoint's shape and vocabulary, with this run's block_size,
    rope_scaling, attn_scaling, attn_backend and dropout, and its scheme and layer plan (PLAN_KEYS)
    where this run sets them explicitly. GPT-2 weights: GPT-2's shape (learned positions, tanh
    GELU, biases) and BPE vocabulary. Any other model key set explicitly that the checkpoint
    overrides is refused: the saved config must describe the saved model, and so is a
    model whose position table is shorter than block_size (or a task's pos_max)."""
    init_from, data, model_args = config['init_from'], config['data_dir'], dict(model_args)
    ck = ckpt['model_args'] if ckpt is not None else None
    if init_from == 'resume':
        if vocab_size and vocab_size != ck['vocab_size']:
            sys.exit(f"cannot resume {path}: it was trained with vocab_size={ck['vocab_size']}, "
                     f"but {data} has {vocab_size}; resume on the run's own data (drop --data_dir/--dataset)")
        model_args['vocab_size'] = ck['vocab_size']
        model_args['vocab_multiple'] = ck.get('vocab_multiple', 1)  # (older checkpoints: unpadded)
        world_size = config['world_size']
        if master and ckpt['config'].get('world_size', world_size) != world_size:
            print(f"resuming with world size {ckpt['config']['world_size']} -> {world_size}: the run continues with "
                  f"the same global batches (a pure function of seed and iteration), so its losses differ only in "
                  f"float rounding")
    elif ckpt is not None:
        if vocab_size and vocab_size != ck['vocab_size']:
            sys.exit(f"cannot fine-tune {path}: it has vocab_size={ck['vocab_size']}, but "
                     f"{data or config['task']} has {vocab_size}; fine-tune it on a corpus with its vocabulary "
                     f"(--data_dir)")
        keep = ('block_size', 'rope_scaling', 'attn_scaling', 'attn_backend', 'dropout')
        new = [k for k in PLAN_KEYS if k in explicit and k in ck and config[k] != ck[k]]
        model_args.update({k: v for k, v in ck.items() if k not in keep and k not in new})
        model_args['vocab_multiple'] = ck.get('vocab_multiple', 1)  # (older checkpoints: unpadded)
        if master:
            print(f"fine-tuning from {path} (trained with block_size={ck['block_size']}, "
                  f"rope_scaling={ck.get('rope_scaling')}) at block_size={config['block_size']}, "
                  f"rope_scaling={config['rope_scaling']}"
                  + ''.join(f"; {k} {ck[k]!r} -> {config[k]!r}" for k in new))
    try:
        if init_from in HF_GPT2 or os.path.isdir(init_from):
            model = GPT.from_pretrained(init_from, block_size=config['block_size'], dropout=config['dropout'],
                                        attn_backend=config['attn_backend'])
            model_args = {k: getattr(model.config, k) for k in GPTConfig.__dataclass_fields__}
            if vocab_size != model_args['vocab_size']:
                sys.exit(f"init_from={init_from!r} has {model_args['vocab_size']} tokens but {data} has {vocab_size}: "
                         f"train it on a GPT-2 BPE corpus (e.g. --dataset=shakespeare)")
        else:
            model = GPT(GPTConfig(**model_args))
    except (ValueError, ImportError) as e:  # bad scheme, options, n_embd/n_head, rotary dim, no transformers: say how
        sys.exit(f"bad model config: {e}")
    ignored = [k for k in model_args if k in explicit and config.get(k) != model_args[k] and init_from != 'resume']
    if ignored:
        sys.exit(f"init_from={init_from!r} fixes the model, so " + ', '.join(f"{k}={config[k]!r}" for k in ignored)
                 + " cannot apply (it has " + ', '.join(f"{k}={model_args[k]!r}" for k in ignored) + "); drop "
                 + ('it' if len(ignored) == 1 else 'them') + ", or train from scratch (init_from='scratch')")
    max_len, pos_max, scheme, block_size = model.pe.max_len, config['pos_max'], model_args['pos_encoding'], \
        model_args['block_size']
    if max_len is not None and config['positions'] != 'plain' and max_len < pos_max:
        sys.exit(f"positions={config['positions']!r} draws positions up to pos_max={pos_max}, but {scheme} addresses "
                 f"{max_len}: give it a table that long (pos_options={{'max_len': {pos_max}}}) or a smaller pos_max")
    if max_len is not None and max_len < block_size:
        sys.exit(f"{scheme} addresses {max_len} positions, fewer than block_size={block_size}: lower "
                 f"block_size or enlarge its table in pos_options (see its docstring in positional.py)")
    return model, model_args


def trim_metrics(path, upto=None):
    """Before a run logs to metrics.jsonl: a new run (upto=None) starts a fresh file; a resumed one
    keeps the rows up to its checkpoint's iteration `upto` (a hard kill loses the iterations after
    it, and the resumed run logs them again). A damaged line (cut by a kill, or edited) is not a
    reason to refuse the resume: it moves to metrics.jsonl.damaged."""
    if not os.path.lexists(path):
        return
    keep, damaged = [], []
    try:
        with os.fdopen(open_no_follow(path, os.O_RDONLY)) as f:
            for line in f:
                try:
                    row = json.loads(line) if line.endswith('\n') else None
                except ValueError:
                    row = None
                if not isinstance(row, dict):
                    damaged.append(line if line.endswith('\n') else line + '\n')
                elif upto is not None and row.get('iter', 0) <= upto:
                    keep.append(line)
        atomic_write(path, lambda f: f.writelines(keep), binary=False)
        if damaged:
            with open_append(path + '.damaged') as f:
                f.writelines(damaged)
            print(f"{path}: {len(damaged)} damaged line(s) moved to {path}.damaged")
    except OSError as e:  # disk full, or a link: leave metrics.jsonl as it was
        sys.exit(str(e) if isinstance(e, LinkRefused) else
                 f"cannot rewrite {path}: {e.strerror}; free some space and run again")


def data_dir(ckpt, override=''):
    """The run's data folder: `override` if given (used if its vocabulary is the run's, else
    refused: never silently replaced), else the one it trained on, else data/<dataset> of this
    checkout (an out_dir copied to another machine), each only if its vocabulary is the one
    saved in the checkpoint; else an error saying what to pass."""
    cfg, meta = ckpt.get('config', {}), ckpt.get('meta')

    def unfit(d):  # why folder d cannot serve this run, or None
        if not os.path.exists(os.path.join(d, 'val.bin')):
            return f"{d}: no val.bin"
        theirs = read_meta(d)
        if meta and theirs and any(theirs.get(k) != meta.get(k) for k in ('vocab_size', 'stoi', 'encoding')):
            return (f"{d}: another vocabulary ({theirs.get('vocab_size')} tokens"
                    + (f", {theirs['encoding']}" if theirs.get('encoding') else '') + f"; the run has "
                    f"{meta.get('vocab_size')}" + (f", {meta['encoding']}" if meta.get('encoding') else '') + ")")
        return None
    if override:
        why = unfit(override)
        if why:
            sys.exit(f"--data_dir does not fit this run: {why}. Pass the folder the run was trained on "
                     f"(or one prepared with the same vocabulary), or leave --data_dir out")
        return override
    tried = [d for d in (cfg.get('data_dir'), os.path.join(HERE, 'data', cfg.get('dataset', ''))) if d]
    why = []
    for d in dict.fromkeys(tried):
        why.append(unfit(d))
        if why[-1] is None:
            return d
    sys.exit(f"no data for this run ({cfg.get('dataset', '?')}): " + '; '.join(why or ['no folder known'])
             + ". Pass --data_dir=FOLDER (the folder its prepare script wrote)")


def read_meta(folder):
    """The data folder's meta.json (vocabulary or tiktoken encoding), or None if it has none.
    A meta.pkl alone (older prepare scripts) is refused: unpickling it could run code."""
    path = os.path.join(folder, 'meta.json')
    if not os.path.exists(path):
        if os.path.exists(os.path.join(folder, 'meta.pkl')):
            sys.exit(f"{folder} has a meta.pkl but no meta.json: a pickle could run code when loaded, so nanoPE "
                     f"reads JSON only. Re-run the prepare script that made it, or, if you trust it, convert it "
                     f"with `python convert.py {os.path.join(folder, 'meta.pkl')}`")
        return None
    try:
        with open(path) as f:
            meta = json.load(f)
        if not isinstance(meta, dict) or not isinstance(meta.get('vocab_size'), int):
            raise ValueError("no integer 'vocab_size'")
    except (OSError, ValueError) as e:
        sys.exit(f"{path} is damaged ({e}); re-run the prepare script that wrote {folder}")
    if 'itos' in meta:  # JSON keys are strings; the vocabulary maps token ids (ints)
        meta['itos'] = {int(i): c for i, c in meta['itos'].items()}
    return meta


def tokenizer(ckpt, folder=''):
    """(encode, decode) for the run's vocabulary: the meta saved in the checkpoint, else the
    data folder's meta.json. A char vocabulary is never decoded as BPE."""
    meta = ckpt.get('meta') or read_meta(folder or data_dir(ckpt)) or {}
    if 'stoi' in meta:
        stoi, itos = meta['stoi'], meta['itos']

        def encode(s):
            bad = sorted(set(c for c in s if c not in stoi))
            if bad:
                raise ValueError(f"has characters outside the model's vocabulary: {bad!r}; use only these: "
                                 f"{''.join(sorted(stoi))!r}")
            return [stoi[c] for c in s]
        return encode, lambda ids: ''.join(itos[i] for i in ids)
    vocab = ckpt['model_args']['vocab_size']
    if 'encoding' not in meta and vocab < 50257:
        sys.exit(f"the run's vocabulary ({vocab} tokens) is not in its checkpoint and no meta.json was found; "
                 f"pass --data_dir=FOLDER with the meta.json it was trained with")
    enc = get_encoding(meta.get('encoding', 'gpt2'))
    return (lambda s: enc.encode(s, allowed_special={'<|endoftext|>'})), enc.decode


def check_writable(folder):
    """Fail before the work, not after it, when results could not be written: create (never
    through a link) and remove a file there (os.access is fooled by root and read-only mounts)."""
    probe = os.path.join(folder, f'.write_test.{os.getpid()}')
    try:
        os.makedirs(folder, exist_ok=True)
        os.close(open_no_follow(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        os.remove(probe)
    except OSError as e:
        sys.exit(f"cannot write to out_dir {folder}: {e.strerror}; pass another --out_dir")


_locks = []  # open lock files: the OS lock lasts as long as the process (a kill -9 releases it)


def lock_out_dir(folder, what, hint=''):
    """One writer per out_dir: an exclusive flock on out_dir/.lock, or exit naming the process
    that holds it. `what` (e.g. 'train.py') is written into the file for that message. A .lock
    that is a symbolic link is refused, not followed (truncating it would truncate its target)."""
    path = os.path.join(folder, '.lock')
    try:
        os.makedirs(folder, exist_ok=True)
        f = os.fdopen(open_no_follow(path, os.O_RDWR | os.O_CREAT), 'r+')
    except OSError as e:
        sys.exit(str(e) if isinstance(e, LinkRefused) else
                 f"cannot write to out_dir {folder}: {e.strerror}; pass another --out_dir")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = f.read().strip() or 'another process'
        sys.exit(f"out_dir {folder} is in use by {holder}: one writer at a time. Wait for it to finish (or "
                 f"stop it), or use another --out_dir" + (f" ({hint})" if hint else ''))
    f.seek(0)
    f.truncate()
    f.write(f"PID {os.getpid()} ({what}, started {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
    f.flush()
    _locks.append(f)
