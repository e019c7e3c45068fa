"""
Length-extrapolation evaluation for nanoPE: the protocols, the suite that runs them (evaluate), LongPPL, the
numbers for metrics.jsonl and wandb, train.py's periodic and final evaluations (eval_lengths, final_suite), and
the file-name tag of a rope_scaling (scaling_tag). eval.py runs the suite on a checkpoint from the command line.

Protocols, on the val split, at each length T = m*L (L = the training block_size):
  - non-overlapping windows (the ALiBi paper's default, arXiv 2108.12409): every
    token of a T-window is scored with the context it has inside its window, so the
    mean mixes tokens with 0..T-1 tokens of context;
  - sliding windows (HF "perplexity of fixed-length models"; PI arXiv 2306.15595 and
    YaRN arXiv 2309.00071 use stride 256): windows of T advance by `stride` and only
    the last `stride` tokens of each are scored, so every scored token has T-stride..T-1
    tokens of context. stride = T is exactly the non-overlapping protocol. A scheme with
    a finite position table (learned, GPT-2) uses its longest window past the table
    (the sliding-window fallback; res['sliding_window'] says which window each length used);
  - loss by position inside the window (mean over the non-overlapping windows): shows
    where a scheme breaks down, e.g. right after position L;
  - loss on the last k tokens as the context before them grows: the same k target
    tokens, scored with windows of growing length;
  - LongPPL (Fang et al., arXiv 2410.23771) at each length past L: the loss on the key tokens of the
    non-overlapping windows' last L/4 targets, those the long context makes much more likely than the
    window's last L tokens alone do (key_tokens; the evaluated model is its own evaluator).
Windows come in `runs` contiguous runs spread evenly over the split, identical for
every scheme. Inside a run windows advance by the stride, so every token of a run
after its first T-stride is scored exactly once. Batches hold about `batch_tokens`
tokens, so memory stays bounded at any length, and logits are made only for the
positions a protocol scores, a chunk at a time (model.forward(last=, reduction='none')).
"""
import math
import os
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch

import attention
import tasks
from console import progress
from data.common import document_windows
from files import atomic_json, read_json


# --- windows --------------------------------------------------------------------

def window_layout(n_data, T, stride, n_windows, runs=16):
    """Starts of ~n_windows windows of T tokens (plus one target): `runs` contiguous runs
    spread evenly over the data, windows `stride` apart inside a run. Each window scores
    its last `stride` tokens, so inside a run every token after the first T-stride is
    scored exactly once (and stride = T tiles the run with non-overlapping windows)."""
    if not 0 < stride <= T:
        raise ValueError(f"stride must be in 1..T={T}, got {stride}")
    if n_data < T + 1:
        raise ValueError(f"the eval data has {n_data} tokens, too few for one window of {T} (+1 target); "
                         f"evaluate shorter lengths (--mults) or use a bigger val split")
    runs = max(1, min(runs, n_windows))
    per_run = -(-n_windows // runs)
    span = T + (per_run - 1) * stride + 1  # tokens one run reads
    if runs * span > n_data:  # small data: a single run over as much as fits
        runs, per_run = 1, min(runs * per_run, (n_data - T - 1) // stride + 1)
        span = T + (per_run - 1) * stride + 1
    gap = (n_data - span) // (runs - 1) if runs > 1 else 0  # >= span, so runs never overlap
    return [r * gap + j * stride for r in range(runs) for j in range(per_run)]


class Interrupted(Exception):
    """A stop was asked for (train.py's signal handler) between two batches of an evaluation."""


@torch.no_grad()
def window_losses(model, data, T, starts, n_score, batch_tokens=2**14, device='cpu', ctx=None, label=None,
                  stop=None, per_window=None, longppl=None):
    """Per-position loss of the last n_score tokens of the windows x = data[s:s+T],
    y = data[s+1:s+T+1], summed over windows -> (float64 tensor [n_score], n_windows).
    Batches of max(1, batch_tokens // T) windows; a short last batch is padded to the
    same shape so compiled attention kernels are reused rather than recompiled. Only
    the scored positions get logits. stop(): checked before every batch; True raises Interrupted.
    per_window: a list to which each window's mean scored loss is appended (for standard_error).
    longppl: {'short': S, 'k': k, 'long': [], 'short_loss': []}: each window's last k targets also get
    their loss from the window's last S inputs alone (a forward of S tokens, positions 0..S-1, so each of
    them keeps S - k .. S - 1 tokens of context); the two [windows, k] loss tensors of each batch are
    appended to 'long' and 'short_loss' (LongPPL's long and short contexts, key_tokens)."""
    bs = max(1, batch_tokens // T)
    sums = torch.zeros(n_score, dtype=torch.float64)
    with progress(-(-len(starts) // bs), label, 'batch') as bar:
        for i in range(0, len(starts), bs):
            if stop is not None and stop():
                raise Interrupted
            chunk = starts[i:i + bs]
            rows = chunk + [chunk[0]] * (bs - len(chunk)) if len(starts) > bs else chunk
            win = torch.from_numpy(np.stack([data[s:s + T + 1].astype(np.int64) for s in rows])).to(device)
            x, y = win[:, :-1], win[:, T - n_score + 1:]
            with ctx or nullcontext():
                loss = model(x, y, reduction='none', last=n_score)[1]
            if longppl is not None:
                S, k = longppl['short'], longppl['k']
                if not (k <= n_score and k <= S <= T):
                    raise ValueError(f"LongPPL needs k <= the scored tokens and k <= short <= T, got k={k}, "
                                     f"short={S}, {n_score} scored of T={T}")
                with ctx or nullcontext():
                    short = model(x[:, T - S:], y[:, n_score - k:], reduction='none', last=k)[1]
                longppl['long'].append(loss[:len(chunk), n_score - k:].double().cpu())
                longppl['short_loss'].append(short[:len(chunk)].double().cpu())
            sums += loss[:len(chunk)].sum(0).double().cpu()
            if per_window is not None:
                per_window += loss[:len(chunk)].double().mean(1).cpu().tolist()
            bar.update()
    return sums, len(starts)


def nonoverlap_loss(model, data, T, tokens=32768, runs=16, eot=None, **kw):
    """Non-overlapping windows -> (mean loss, per-position mean loss [T]). With `eot`
    (document-aware, for whole books): windows tile each document from its start and
    never cross an EOT, so position p of a window is position p of the document."""
    if eot is None:
        starts = window_layout(len(data), T, T, max(1, tokens // T), runs)
    else:
        starts = document_windows(data, T, eot, max(1, tokens // T)).tolist()
    sums, n = window_losses(model, data, T, starts, T, **kw)
    curve = sums / n
    return curve.mean().item(), curve


def sliding_loss(model, data, T, stride, tokens=8192, runs=16, **kw):
    """Sliding windows of T advancing by `stride`, scoring only each window's new tokens."""
    stride = min(stride, T)
    starts = window_layout(len(data), T, stride, max(1, tokens // stride), runs)
    sums, n = window_losses(model, data, T, starts, stride, **kw)
    return (sums.sum() / (n * stride)).item()


def standard_error(per_window):
    """The standard error of a mean loss over windows: sample sd of the per-window mean losses /
    sqrt(windows); None for fewer than 2 windows. Windows far apart are close to independent;
    neighbouring ones share text, so this is the noise of one run's number, not of a seed."""
    n = len(per_window)
    if n < 2:
        return None
    m = sum(per_window) / n
    return math.sqrt(sum((x - m) ** 2 for x in per_window) / (n - 1) / n)


# LongPPL (Fang et al., arXiv 2410.23771): a key token gains more than ALPHA nats of log-probability from the
# long context over the short one (LSD) and has a long-context log-probability above BETA (LCL); the
# authors' code (github.com/BlackieFang/LongPPL, LongPPL/longppl.py, find_key_token) keeps a token where
# loss_short - loss_full > 2 and loss_full < 2.
LONGPPL_ALPHA, LONGPPL_BETA = 2.0, -2.0


def key_tokens(long_loss, short_loss, alpha=LONGPPL_ALPHA, beta=LONGPPL_BETA):
    """LongPPL's key tokens from per-token losses (nats) with the long and the short context -> bool mask:
    LSD = log p(x | long) - log p(x | short) = short_loss - long_loss > alpha and
    LCL = log p(x | long) = -long_loss > beta, both strict, as the authors' code."""
    return (short_loss - long_loss > alpha) & (-long_loss > beta)


def longppl(long_loss, short_loss, alpha=LONGPPL_ALPHA, beta=LONGPPL_BETA):
    """(LongPPL's loss: the mean long-context loss over the key tokens, None where there are none; the
    number of key tokens). LongPPL itself is exp of the loss, as perplexity is of the ordinary loss."""
    long_loss, short_loss = torch.as_tensor(long_loss, dtype=torch.float64), torch.as_tensor(short_loss,
                                                                                            dtype=torch.float64)
    key = key_tokens(long_loss, short_loss, alpha, beta)
    n = int(key.sum())
    return (long_loss[key].mean().item() if n else None), n


def last_k_loss(model, data, k, lengths, spans=64, ses=None, **kw):
    """The same `spans` targets of k tokens (ends spread evenly over the data) scored with
    windows of each length T in `lengths` (context T - k) -> list of mean losses (and, into
    `ses` if given, each one's standard error over the spans)."""
    T_max = max(lengths)
    if len(data) < T_max + 1:
        raise ValueError(f"the eval data has {len(data)} tokens, too few for a window of {T_max}")
    ends = np.linspace(T_max, len(data) - 1, spans).astype(np.int64)  # one past each window's last input
    label, out = kw.pop('label', None), []
    for T in lengths:
        pw = []
        sums, n = window_losses(model, data, T, [int(e) - T for e in ends], k,
                                label=label and f"{label} (window {T})", per_window=pw, **kw)
        out.append((sums.sum() / (n * k)).item())
        if ses is not None:
            ses.append(standard_error(pw))
    return out


# --- the suite ------------------------------------------------------------------

def length_of(m, L):
    """m * L as a whole number of tokens (fractional m allowed: a fine-tuned model's original L)."""
    T = int(m * L)
    if T != m * L or T < 1:
        raise ValueError(f"eval length {m}*{L} is not a positive whole number of tokens; pick multiples "
                         f"of 1/{L}")
    return T


def available_bytes(device):
    """Memory free for an evaluation: the GPU's free memory, or Linux's MemAvailable (else None)."""
    if torch.device(device).type == 'cuda':
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open('/proc/meminfo') as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith('MemAvailable'))
    except (OSError, StopIteration):
        return None


def peak_bytes(model, T, batch_tokens, device):
    """A rough upper estimate of one no-grad batch at length T: ~16 floats of activations per
    token and width, a 64 MB logit chunk, and the attention: O(T) on FlexAttention / SDPA, a
    T-wide float32 bias chunk (about 3 copies of attention.dense_chunk_bytes) where it runs dense."""
    c, dev = model.config, torch.device(device).type
    B = max(1, batch_tokens // T)
    dense = c.attn_backend == 'dense' or (dev == 'cpu' and c.attn_backend != 'flex')
    attn = 3 * min(attention.dense_chunk_bytes(dev), B * c.n_head * T * T * 4) if dense else 4 * B * T * c.n_embd * 4
    return 16 * B * T * c.n_embd * 4 + attn + 64 * 2**20


def evaluate(model, data, L, mults=(1, 2, 4, 8, 16), tokens=32768, stride=0, sliding_tokens=0,
             last_k=0, last_k_spans=0, quick=False, batch_tokens=2**14, device='cpu', ctx=None,
             progress=False, doc_eot=None, stop=None, longppl_short=0, longppl_k=0):
    """The evaluation suite -> a JSON-able dict of lists aligned with `mults` (None where the
    scheme cannot address the length, or the length would not fit in memory: res['skipped']
    says which and why). quick=True: non-overlapping loss only (cheap, for periodic evals
    during training). stride=0 -> L // 2; sliding_tokens=0 -> tokens // 4 (each scored token
    costs T / stride tokens of forward); last_k=0 -> L // 4; last_k_spans=0 -> tokens // 512
    (64 by default). doc_eot: the EOT token id, to make the non-overlapping windows
    document-aware (see nonoverlap_loss). stop(): checked between batches; if it says stop,
    the suite ends there and res['complete'] is False (what was computed is kept).
    LongPPL (res['longppl'], not with quick): at each length T > longppl_short (0 -> L), the last longppl_k
    (0 -> L // 4) targets of every non-overlapping window are scored again from the window's last
    longppl_short inputs alone (one extra forward of longppl_short tokens per window); key_tokens picks the
    tokens the long context helps, and 'loss' is the mean long-context loss over them (longppl). The
    evaluator is the evaluated model itself."""
    was_training = model.training
    model.eval()
    stride, last_k = stride or max(1, L // 2), last_k or max(1, L // 4)
    sliding_tokens = sliding_tokens or max(stride, tokens // 4)
    last_k_spans = last_k_spans or max(8, tokens // 512)
    kw = dict(batch_tokens=batch_tokens, device=device, ctx=ctx, stop=stop)
    lengths = [length_of(m, L) for m in mults]
    res = {'block_size': L, 'mults': list(mults), 'lengths': lengths, 'tokens': tokens, 'complete': False,
           'nonoverlap': [], 'nonoverlap_se': [], 'nonoverlap_windows': [], 'position': [], 'skipped': {}}
    short, k_lp = longppl_short or L, longppl_k or max(1, L // 4)
    if not quick:
        res['longppl'] = {'alpha': LONGPPL_ALPHA, 'beta': LONGPPL_BETA, 'short': short, 'k': k_lp,
                          'evaluator': 'self', 'loss': [], 'key_tokens': [], 'candidates': [], 'candidates_loss': []}
    free = available_bytes(device)
    for m, T in zip(mults, lengths):
        need = peak_bytes(model, T, batch_tokens, device)
        if free is not None and need > 0.8 * free:
            res['skipped'][str(m)] = f"needs about {need / 2**30:.1f} GB, {free / 2**30:.1f} GB available"
            print(f"eval: skipping {m}L ({T} tokens): it {res['skipped'][str(m)]}; run it alone on a machine with "
                  f"more memory (eval.py --mults=[{m}])", file=sys.stderr)
        elif progress and T >= batch_tokens:
            print(f"eval: {m}L is one window of {T:,} tokens per batch", file=sys.stderr)
    ok = [model.pe.addresses(T) and str(m) not in res['skipped'] for m, T in zip(mults, lengths)]
    try:
        for m, T, go in zip(mults, lengths, ok):
            pw = []
            lp = {'short': short, 'k': k_lp, 'long': [], 'short_loss': []} if not quick and go and T > short else None
            label = f"non-overlapping @{m}L" if progress else None
            loss, curve = nonoverlap_loss(model, data, T, tokens, eot=doc_eot, per_window=pw, longppl=lp,
                                          label=label, **kw) if go else (None, None)
            if 'longppl' in res:
                long_l = torch.cat(lp['long']).flatten() if lp else None
                short_l = torch.cat(lp['short_loss']).flatten() if lp else None
                v, n_key = longppl(long_l, short_l) if lp else (None, None)
                r = res['longppl']
                r['loss'].append(v)
                r['key_tokens'].append(n_key)
                r['candidates'].append(long_l.numel() if lp else None)
                r['candidates_loss'].append(long_l.mean().item() if lp else None)
            res['nonoverlap'].append(loss)
            res['nonoverlap_se'].append(standard_error(pw))
            res['nonoverlap_windows'].append(len(pw))
            res['position'].append(None if curve is None else [round(v, 4) for v in curve.tolist()])
        if quick:
            del res['position']
        else:
            # a finite position table (learned, GPT-2) scores lengths past it with its longest window:
            # every scored token then has max_len - stride .. max_len - 1 tokens of context
            windows = [T if model.pe.addresses(T) else model.pe.max_len for T in lengths]
            res.update(stride=stride, sliding_tokens=sliding_tokens, sliding=[], sliding_se=[], sliding_window=windows)
            for m, T in zip(mults, windows):
                pw = []
                res['sliding'].append(sliding_loss(model, data, T, stride, sliding_tokens, per_window=pw,
                                                   label=f"sliding @{m}L" if progress else None, **kw)
                                      if str(m) not in res['skipped'] else None)
                res['sliding_se'].append(standard_error(pw))
            ks = sorted({T for T, go in zip([L // 4, L // 2] + lengths, [True, True] + ok) if T > last_k and go
                         and model.pe.addresses(T)})
            ses = []
            losses = last_k_loss(model, data, last_k, ks, last_k_spans, ses=ses, label="last-k" if progress else None,
                                 **kw)
            res['last_k'] = {'k': last_k, 'spans': last_k_spans, 'context': [T - last_k for T in ks], 'loss': losses,
                             'se': ses}
        res['complete'] = True
    except Interrupted:  # keep what is done; lists stay aligned with mults
        for key in ('nonoverlap', 'nonoverlap_se', 'nonoverlap_windows', 'position', 'sliding', 'sliding_se'):
            if key in res:
                res[key] += [None] * (len(mults) - len(res[key]))
        for key in ('loss', 'key_tokens', 'candidates', 'candidates_loss'):
            if 'longppl' in res:
                res['longppl'][key] += [None] * (len(mults) - len(res['longppl'][key]))
    finally:
        model.train(was_training)
    return res


def flat_metrics(res):
    """Scalars for metrics.jsonl / wandb: val/loss@mL, val/sliding@mL, val/longppl@mL (LongPPL's loss),
    val/lastk@ctxN."""
    out = {}
    for i, m in enumerate(res['mults']):
        if res['nonoverlap'][i] is not None:
            out[f'val/loss@{m}L'] = res['nonoverlap'][i]
        if res.get('sliding') and res['sliding'][i] is not None:
            out[f'val/sliding@{m}L'] = res['sliding'][i]
        if res.get('longppl') and res['longppl']['loss'][i] is not None:
            out[f'val/longppl@{m}L'] = res['longppl']['loss'][i]
    if 'last_k' in res:
        for c, v in zip(res['last_k']['context'], res['last_k']['loss']):
            out[f"val/lastk{res['last_k']['k']}@ctx{c}"] = v
    return out


def bin_curve(curve, n_bins=64):
    """Means over geometrically growing bins of positions -> (bin centres, means). Late
    positions get wide bins: with few long windows the raw per-position curve is noisy."""
    c = np.asarray(curve, dtype=np.float64)
    edges = np.unique(np.concatenate([[0], np.geomspace(1, len(c), n_bins).astype(int)]))
    xs = [(lo + hi - 1) / 2 for lo, hi in zip(edges[:-1], edges[1:])]
    return np.array(xs), np.array([c[lo:hi].mean() for lo, hi in zip(edges[:-1], edges[1:])])


def log_wandb(run, res, step=None):
    """Scalars plus line plots: loss vs eval length, vs position, last-k vs context."""
    import wandb  # here, not at the head: wandb is optional and slow to import
    run.log(flat_metrics(res), step=step)
    if 'sliding' not in res:
        return
    ok = [i for i, v in enumerate(res['nonoverlap']) if v is not None]
    plots = {'eval/loss_vs_length': wandb.plot.line_series(
        xs=[res['lengths'][i] for i in ok], ys=[[res['nonoverlap'][i] for i in ok], [res['sliding'][i] for i in ok]],
        keys=['non-overlapping', f"sliding (stride {res['stride']})"], title='val loss vs eval length',
        xname='eval length (tokens)')}
    T_i = ok[-1]
    xs, ys = bin_curve(res['position'][T_i])
    plots['eval/loss_vs_position'] = wandb.plot.line(
        wandb.Table(data=[[float(a), float(b)] for a, b in zip(xs, ys)], columns=['position', 'loss']),
        'position', 'loss', title=f"val loss by position in {res['lengths'][T_i]}-token windows")
    lk = res['last_k']
    plots['eval/last_k'] = wandb.plot.line(
        wandb.Table(data=[[c, v] for c, v in zip(lk['context'], lk['loss'])], columns=['context', 'loss']),
        'context', 'loss', title=f"loss on the last {lk['k']} tokens vs context before them")
    run.log(plots, step=step)


# --- what train.py uses ---------------------------------------------------------

def eval_loss(model, data, T, tokens=32768, batch_tokens=2**14, device='cpu', ctx=None, stop=None):
    """Mean next-token loss over ~`tokens` tokens in non-overlapping windows of T."""
    return nonoverlap_loss(model, data, T, tokens, batch_tokens=batch_tokens, device=device, ctx=ctx, stop=stop)[0]


def eval_lengths(model, data, L, mults=(1, 2, 4, 8), **kw):
    """{'val/loss@1L': .., 'val/loss@2L': ..}; lengths a scheme cannot address are skipped."""
    return {f'val/loss@{m}L': eval_loss(model, data, length_of(m, L), **kw) for m in mults
            if model.pe.addresses(length_of(m, L))}


def final_suite(model, out_dir, head, data=None, L=0, mults=(), tokens=0, task='', task_n=0, positions='plain',
                pos_max=0, device='cpu', ctx=None, stop=None, wandb_run=None, timing=None):
    """train.py's last step: the full suite (evaluate) on a corpus, or for a task exact match per
    length bin, 1..4 task_n, with plain positions (and, as Ruoss et al. evaluate, random ones for
    a run trained on them), and the same for each of its test splits (tasks.SPLITS, under 'splits')
    -> out_dir/eval.json, written whole, with `head` (scheme, name, ...)
    first, 'complete' (false if stop() ended it early: it keeps what it had) and `timing` plus
    final_eval_s. stop(): the name of the signal that asks to stop, or None. Prints one summary
    line and logs to wandb_run if given. Returns None, or why eval.json could not be written."""
    te = time.time()
    if task:
        splits = tasks.SPLITS.get(task, ())
        print(f"final eval: {task}" + (f" and its test splits {', '.join(splits)}" if splits else '')
              + f", sizes 1..{4 * task_n}, exact match per length bin", flush=True)

        def one(name):  # plain positions; for a run trained on random ones, also random ones (Ruoss et al.)
            r = tasks.evaluate(model, name, task_n, device, ctx, stop=stop)
            if positions == 'randomized':
                q = tasks.evaluate(model, name, task_n, device, ctx, 'randomized', pos_max, stop=stop)
                r.update(bins_randomized=q['bins'], exact_id_randomized=q['exact_id'],
                         exact_ood_randomized=q['exact_ood'], complete=r['complete'] and q['complete'])
            return r
        res = dict(one(task), train_positions=positions)
        if splits:  # the same sizes; each split's results under its own name, as the task's are at the top
            res['splits'] = {name: {k: v for k, v in one(name).items() if k not in ('N', 'mult', 'reps')}
                             for name in splits}
            res['complete'] = res['complete'] and all(r['complete'] for r in res['splits'].values())
    else:
        print(f"final eval: {', '.join(f'{m}L' for m in mults)} x (non-overlapping, sliding, last-k) on "
              f"{tokens} tokens per length (Ctrl-C stops it and keeps what it has)", flush=True)
        res = evaluate(model, data, L, tuple(mults), tokens=tokens, device=device, ctx=ctx, progress=True, stop=stop)
    res = {**head, **res}
    if timing is not None:
        res['timing'] = {**timing, 'final_eval_s': round(time.time() - te, 3)}
    failure, old = None, read_json(os.path.join(out_dir, 'eval.json'))[0]
    # a stopped suite never replaces a complete one (a finished run resumed to evaluate it again)
    keep = not res['complete'] and isinstance(old, dict) and old.get('complete') is not False
    try:
        if not keep:
            atomic_json(res, os.path.join(out_dir, 'eval.json'))
    except OSError as e:
        failure = f"writing {out_dir}/eval.json failed: {e.strerror}"
    if keep:
        print(f"final eval interrupted by {stop()} ({time.time() - te:.0f}s): {out_dir}/eval.json keeps the complete "
              f"evaluation it had, and this one is not saved", flush=True)
    elif not res['complete']:
        print(f"final eval interrupted by {stop()} ({time.time() - te:.0f}s): what it had computed is in "
              f"{out_dir}/eval.json (complete: false); python train.py --out_dir={out_dir} --init_from=resume runs it "
              f"again", flush=True)
    elif not failure and task:
        keys = ('exact_id', 'exact_ood', 'exact_id_randomized', 'exact_ood_randomized')
        summary = {k: res[k] for k in keys if res.get(k) is not None}
        summary.update({f"{name}/{k}": r[k] for name, r in res.get('splits', {}).items() for k in keys
                        if r.get(k) is not None})
        print(f"final eval ({time.time() - te:.0f}s) -> {out_dir}/eval.json: "
              + ', '.join(f"{k} {v:.3f}" for k, v in summary.items()))
        if wandb_run is not None:
            wandb_run.log({f'val/{k}': v for k, v in summary.items()}, step=head['iter'])
    elif not failure:
        print(f"final eval ({time.time() - te:.0f}s) -> {out_dir}/eval.json: "
              + ', '.join(f"{k[4:]} {v:.4f}" for k, v in flat_metrics(res).items()))
        if wandb_run is not None:
            log_wandb(wandb_run, res, step=head['iter'])
    return failure


def scaling_tag(rope_scaling):
    """File-name tag of a rope_scaling dict: {'type': 'yarn', 'factor': 16} -> 'yarn_x16';
    yarn with mscale -> 'yarn_mscale1_x16'; self_extend window 32 group 32 -> 'self_extend_w32_g32';
    string shift 42 local 4 -> 'string_s42_l4'."""
    if not rope_scaling:
        return ''
    sc = rope_scaling
    f = sc.get('factor')
    extra = ''.join(f"_{k[0] if k != 'mscale' else 'mscale'}{sc[k]:g}"
                    for k in ('mscale', 'window', 'group', 'k', 'shift', 'local')
                    if isinstance(sc.get(k), (int, float)) and not isinstance(sc.get(k), bool))
    return f"{sc.get('type', 'scaled')}{extra}" + (f"_x{f:g}" if f is not None else '')

