"""
Passkey retrieval (Mohtashami & Jaggi, arXiv 2305.16300): a synthetic long-context probe.
A random 5-digit key is hidden in repetitive filler at some depth; at the end the model
is asked for it. Fine-tune a trained checkpoint on short prompts (length L), then measure
retrieval accuracy over a grid of lengths (L .. 16L) x key depths.

  python passkey.py --out_dir=out-rope          # fine-tune, evaluate, heat map
  python passkey.py --out_dir=out-rope --iters=0 --rope_scaling="{'type':'yarn','factor':16,'original_max_len':128}"

Writes out_dir/passkey_ckpt.pt (the fine-tuned model; reused when it was fine-tuned from
the same ckpt.pt with the same iters/lr/batch_size/train_len/seed, else fine-tuned again),
out_dir/passkey[_tag].json and out_dir/passkey[_tag].png.

The prompt, for a character vocabulary (every character below is in the Shakespeare
vocab; digits included), at total length T + 1 = prompt + answer:
  <filler ending at a word boundary> The pass key is 48213. <filler of whole
  sentences> What is the pass key? The pass key is |48213
The paper's filler sentences are kept; its long preamble is dropped, since at L = 128
characters it would not fit. The question repeats the key sentence's words, so the
model can answer by copying what followed "The pass key is" last time (an induction
pattern), which the paper's prompt also allows. Depth = the fraction of the filler
that comes before the key sentence (0 = start, far from the question; 1 = right before it).
Accuracy = all 5 digits right under greedy decoding: the argmax at every answer
position, given the correct digits before it (teacher forcing is exactly greedy
decoding as long as every earlier digit is right).
"""
import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

import checkpoint
import console
import runtime
import tasks
from configurator import options
from evaluation import length_of, scaling_tag
from report import plot_heatmap

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
KEY = "The pass key is {}. "
QUESTION = "What is the pass key? The pass key is "
N_DIGITS = 5
MIN_LEN = len(KEY.format('0' * N_DIGITS)) + len(QUESTION) + N_DIGITS - 1  # the shortest prompt: no filler at all


def _cycle(text, n, end):
    """The n characters of `text` repeated cyclically that end at offset `end` of a cycle."""
    reps = n // len(text) + 2
    s = text * reps
    stop = (reps - 1) * len(text) + end
    return s[stop - n:stop]


def make_prompt(T, depth, rng):
    """One sample of total length T + 1 characters -> (prompt, answer): the model reads
    the first T characters of prompt + answer. The key sentence sits after a filler of
    round(depth * n_filler) characters, to the nearest word start (within one word)."""
    key = ''.join(str(d) for d in rng.integers(0, 10, N_DIGITS))
    key_sent = KEY.format(key)
    n_f = T + 1 - len(key_sent) - len(QUESTION) - N_DIGITS
    if n_f < 0:
        raise ValueError(f"passkey prompt needs length >= {T + 1 - n_f - 1}, got {T}; use a longer "
                         f"train/eval length")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be in [0, 1], got {depth}")
    # the filler after the key: whole words ending with a sentence, its length snapped to a word start
    sents = [s + '. ' for s in FILLER.split('. ') if s.strip()]
    sent_ends = np.cumsum([len(s) for s in sents])
    end = int(sent_ends[rng.integers(len(sents))]) % len(FILLER)
    tail = _cycle(FILLER, n_f + 1, end)  # one extra char to see what precedes a cut
    starts = [n for n in range(n_f + 1) if n == 0 or tail[len(tail) - n - 1] == ' ']  # valid suffix lengths
    target = (1.0 - depth) * n_f
    n_suf = min(starts, key=lambda n: (abs(n - target), n))
    suffix = tail[len(tail) - n_suf:] if n_suf else ''
    # the filler before the key: any cut at its start, ending at a word boundary
    words = [i + 1 for i, c in enumerate(FILLER) if c == ' ']
    prefix = _cycle(FILLER, n_f - n_suf, int(words[rng.integers(len(words))]))
    prompt = prefix + key_sent + suffix + QUESTION
    return prompt, key


def key_depth(prompt):
    """The depth at which the key sentence actually sits in a prompt (for tests and checks)."""
    i = prompt.index(KEY.split('{}')[0])
    n_f = len(prompt) - len(QUESTION) - len(KEY.format('0' * N_DIGITS))
    return i / n_f if n_f else 0.0


def get_codec(ckpt, data_dir=''):
    """encode for the run's vocabulary. Character level only: the prompt's length in
    tokens is its length in characters, so prompts hit the eval lengths exactly."""
    folder = checkpoint.data_dir(ckpt, data_dir) if data_dir or not ckpt.get('meta') else None  # (refuses a misfit)
    meta = ckpt.get('meta') or checkpoint.read_meta(folder) or {}
    if 'stoi' not in meta:
        raise ValueError("passkey.py needs a character-level model (BPE is not supported: train on "
                         "data/shakespeare_char or another char corpus)")
    need = sorted(set(FILLER + KEY + QUESTION + '0123456789') - set(meta['stoi']))
    if need:
        raise ValueError(f"the model's vocabulary lacks {need!r}, which the passkey prompt uses; "
                         f"edit FILLER/KEY/QUESTION in passkey.py to use characters it has")
    return lambda s: [meta['stoi'][c] for c in s]


def make_batch(encode, T, depths, rng):
    """Token windows [B, T+1] (prompt + answer), one per depth, and where each answer starts."""
    rows = []
    for d in depths:
        prompt, key = make_prompt(T, d, rng)
        rows.append(encode(prompt + key))
    return torch.tensor(rows), [T + 1 - N_DIGITS] * len(rows)


def answer_targets(ids, answer_at):
    """Targets for inputs ids[:, :-1]: the answer tokens ids[b, answer_at[b]:] at the positions
    before them, -1 (not scored) everywhere else -- the loss of the fine-tune and the rows that
    tasks.score grades."""
    y = torch.full_like(ids[:, 1:], -1)
    for b, a in enumerate(answer_at):
        y[b, a - 1:] = ids[b, a:]
    return y


def answer_correct(logits, ids, answer_at):
    """Per row: are all answer tokens the argmax at the position before them (tasks.score's
    exact match)? logits [B, T, V] for inputs ids[:, :T]; ids [B, T+1]."""
    return tasks.score(logits, answer_targets(ids, answer_at))[0].tolist()


def digit_correct(logits, ids, answer_at):
    """Per row: the fraction of answer tokens that are the argmax."""
    _, correct, total = tasks.score(logits, answer_targets(ids, answer_at))
    return (correct.float() / total.float()).tolist()


def answer_loss(logits, ids, answer_at):
    """Per row: mean cross-entropy of the answer tokens (ln 10 = 2.30 is a uniform guess
    among digits): a graded signal where accuracy is all or nothing."""
    return [F.cross_entropy(logits[b, a - 1:].float(), ids[b, a:]).item() for b, a in enumerate(answer_at)]


def finetune(model, encode, T, iters, lr=1e-3, batch_size=32, seed=0, device='cpu', log_every=50, ctx=None):
    """Fine-tune on passkey prompts of length T, random depths, loss on the answer only."""
    model.train()
    opt = model.configure_optimizers(0.0, lr, (0.9, 0.99), torch.device(device).type)
    rng = np.random.default_rng(seed)
    t0, hist = time.time(), []
    for it in range(iters):
        for g in opt.param_groups:  # short warmup: a fresh optimizer on trained weights
            g['lr'] = lr * min(1.0, (it + 1) / 20)
        ids, answer_at = make_batch(encode, T, rng.uniform(0, 1, batch_size), rng)
        ids = ids.to(device)
        y = answer_targets(ids, answer_at)
        with ctx or nullcontext():
            _, loss = model(ids[:, :-1], y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        hist.append(loss.item())
        if (it + 1) % log_every == 0 or it + 1 == iters:
            print(f"passkey fine-tune {it + 1}/{iters}: answer loss {np.mean(hist[-log_every:]):.4f} "
                  f"({time.time() - t0:.0f}s)", flush=True)
    model.eval()
    return hist


@torch.no_grad()
def evaluate(model, encode, L, mults=(1, 2, 4, 8, 16), depths=(0.0, 0.25, 0.5, 0.75, 1.0), trials=20,
             seed=1234, batch_tokens=2**14, device='cpu', progress=False, ctx=None):
    """Grids [len(mults)][len(depths)] of accuracy, digit accuracy and answer loss (None
    where the scheme cannot address the length). The prompts depend only on (seed,
    length), so every scheme sees the same ones. Logits only for the answer positions."""
    model.eval()
    grids = {'acc': [], 'digit_acc': [], 'answer_loss': []}
    for m in mults:
        T = length_of(m, L)
        if not model.pe.addresses(T):
            for g in grids.values():
                g.append(None)
            continue
        rng = np.random.default_rng([seed, T])
        ids, answer_at = make_batch(encode, T, [d for d in depths for _ in range(trials)], rng)
        bs = max(1, batch_tokens // T)
        stats = {k: [] for k in grids}
        bar = console.progress(-(-len(ids) // bs), f"passkey @{m}L" if progress else None, 'batch')
        for i in range(0, len(ids), bs):
            chunk = ids[i:i + bs]
            n = len(chunk)
            if n < bs and len(ids) > bs:  # pad: reuse compiled attention for this shape
                chunk = torch.cat([chunk, chunk[:1].expand(bs - n, -1)])
            x = chunk[:, :-1].to(device)
            with ctx or nullcontext():
                tail = model(x, last=N_DIGITS)[0]
            # the answer is the last N_DIGITS tokens: logits of the positions before them, at T-N_DIGITS..T-1
            logits = torch.zeros(n, x.size(1) - N_DIGITS, tail.size(-1))
            logits = torch.cat((logits, tail[:n].float().cpu()), 1)
            for k, f in (('acc', answer_correct), ('digit_acc', digit_correct), ('answer_loss', answer_loss)):
                stats[k] += f(logits, ids[i:i + n], answer_at[i:i + n])
            bar.update()
        bar.close()
        for k, v in stats.items():
            grids[k].append(np.array(v, dtype=float).reshape(len(depths), trials).mean(1).tolist())
    return {'block_size': L, 'mults': list(mults), 'lengths': [length_of(m, L) for m in mults], 'depths': list(depths),
            'trials': trials, **grids}


if __name__ == '__main__':
    o = options(dict(out_dir='out', device='auto', dtype='auto', iters=300, lr=1e-3, batch_size=32, train_len=0,
                     retrain=False, mults=[1, 2, 4, 8, 16], depths=[0.0, 0.25, 0.5, 0.75, 1.0], trials=20, seed=0,
                     batch_tokens=2**14, rope_scaling=None, name='', data_dir=''), sys.argv[1:],
                rules=dict(iters='>=0', lr='>0', batch_size='>0', train_len='>=0', trials='>0', batch_tokens='>0'))
    console.exit_on_ctrl_c('passkey.py', 'a finished fine-tune (passkey_ckpt.pt) is reused when you run it again')
    rt = runtime.setup(o.device, o.dtype)
    checkpoint.check_writable(o.out_dir)
    checkpoint.lock_out_dir(o.out_dir, 'passkey.py')  # it writes passkey_ckpt.pt and its results there
    base, tuned = os.path.join(o.out_dir, 'ckpt.pt'), os.path.join(o.out_dir, 'passkey_ckpt.pt')
    torch.manual_seed(o.seed)
    base_ckpt = checkpoint.read_checkpoint(base)
    L = base_ckpt['model_args']['block_size']
    try:
        encode = get_codec(base_ckpt, o.data_dir)  # another vocabulary or a BPE run: refused before any work
    except ValueError as e:
        sys.exit(str(e))
    if min(o.train_len or L, L) < MIN_LEN:
        sys.exit(f"passkey.py: the prompt needs at least {MIN_LEN} tokens, but block_size is {L} and train_len "
                 f"{o.train_len or L}; train with --block_size>={MIN_LEN} or pass --train_len>={MIN_LEN}")
    # what the fine-tune depends on: reuse passkey_ckpt.pt only if it was made from this ckpt.pt with these settings
    recipe = {'iters': o.iters, 'lr': o.lr, 'batch_size': o.batch_size, 'train_len': o.train_len or L, 'seed': o.seed,
              'base_iter': base_ckpt.get('iter_num'), 'base_mtime': os.path.getmtime(base)}
    old = checkpoint.read_checkpoint(tuned).get('passkey', {}) if os.path.exists(tuned) else None
    if old is not None and not o.retrain and {k: old.get(k) for k in recipe} == recipe:
        print(f"using the fine-tuned {tuned} (same ckpt.pt and settings; --retrain=True to fine-tune again)")
    else:
        if old is not None and not o.retrain:
            print(f"{tuned} was fine-tuned from another ckpt.pt or with other settings: fine-tuning again")
        model, ckpt = checkpoint.load_model(base, rt.device)
        print(f"fine-tuning {model.config.pos_encoding} from {base} on passkey prompts of length "
              f"{o.train_len or L}, {o.iters} iters")
        hist = finetune(model, encode, o.train_len or L, o.iters, o.lr, o.batch_size, o.seed, rt.device,
                        ctx=rt.autocast)
        ckpt = {**ckpt, 'model': model.state_dict(), 'optimizer': None,
                'passkey': {**recipe, 'final_loss': float(np.mean(hist[-20:])) if hist else None}}
        checkpoint.atomic_save(ckpt, tuned)  # a kill mid-save must not leave a broken passkey_ckpt.pt to be reused
    model, ckpt = checkpoint.load_model(tuned, rt.device, **({'rope_scaling': o.rope_scaling}
                                                             if 'rope_scaling' in o.explicit else {}))
    res = evaluate(model, encode, L, tuple(o.mults), tuple(o.depths), o.trials, batch_tokens=o.batch_tokens,
                   device=rt.device, progress=True, ctx=rt.autocast)
    res = {'scheme': model.config.pos_encoding, 'rope_scaling': model.config.rope_scaling,
           'out_dir': o.out_dir, 'finetune': ckpt.get('passkey'), **res}
    for m, a, al in zip(res['mults'], res['acc'], res['answer_loss']):
        print(f"  {m:>3}L: " + ('n/a (past the position table)' if a is None else
                               '  '.join(f"depth {d:g}: {v:.2f}" for d, v in zip(res['depths'], a))
                               + f"   (answer loss {np.mean(al):.3f})"))
    tag = scaling_tag(o.rope_scaling)
    name = o.name or ('passkey' + (f'_{tag}' if tag else ''))
    checkpoint.atomic_json(res, os.path.join(o.out_dir, name + '.json'))
    plot_heatmap(res, os.path.join(o.out_dir, name + '.png'),
                 title=f"passkey: {res['scheme']}" + (f" ({tag})" if tag else ''))
    print(f"wrote {os.path.join(o.out_dir, name)}.json/.png")
