"""
Compare runs: read the eval/passkey JSONs of several out_dirs and write a report folder
with a markdown table and PNG plots.

  python compare.py out-rope out-alibi out-nope --report_dir=report
  python compare.py out-sweep/*                 # what sweep.py runs at the end

Reads, in each out_dir, every eval*.json (eval.py / the end of train.py; one per
rope_scaling variant) and passkey*.json (passkey.py). Writes to report_dir:
  report.md                 tables: non-overlapping and sliding loss at each eval length,
                            loss on the last k tokens vs context, passkey accuracy
  loss_vs_length.png        loss against eval length per run (non-overlapping | sliding)
  loss_vs_position.png      loss against position inside the longest windows
  last_k.png                loss on the last k tokens against the context before them
  passkey.png               passkey heat maps, one per run
"""
import glob
import json
import math
import os
import sys

from console import exit_on_ctrl_c
from files import atomic_json, atomic_write, read_json

if __name__ == '__main__':  # Ctrl-C: one line, no traceback (every report file is replaced whole)
    exit_on_ctrl_c('compare.py', 'run it again')
import numpy as np  # noqa: E402


def label_of(res):
    from eval import scaling_tag
    tag = scaling_tag(res.get('rope_scaling'))
    attn = (res.get('attn_scaling') or {}).get('type')
    return res.get('name') or res.get('scheme', '?') + (f" +{tag}" if tag else '') + (f" +{attn}" if attn else '')


def load_runs(dirs):
    """-> (evals, passkeys): lists of result dicts with 'label' added, in a stable order
    (dirs as given, the unscaled eval first)."""
    evals, passkeys = [], []
    for d in dirs:
        for kind, out in (('eval', evals), ('passkey', passkeys)):
            files = sorted(glob.glob(os.path.join(d, f'{kind}*.json')), key=lambda p: ('_' in os.path.basename(p), p))
            for p in files:
                res = usable(p)
                if res is None:
                    continue
                res['label'] = label_of(res)
                res['path'] = p
                out.append(res)
    if not evals and not passkeys:
        raise ValueError(f"no eval*.json or passkey*.json in {dirs}: run eval.py / passkey.py (or train.py, "
                         f"which writes eval.json at the end) first")
    return evals, passkeys


def train_stats(d):
    """(final train loss, median tokens/s, median ms/iter) from a run's metrics.jsonl, or None.
    The first logged interval (compilation) is left out of the medians."""
    path = os.path.join(d, 'metrics.jsonl')
    if not os.path.exists(path):
        return None
    rows = []
    with open(path) as f:
        for line in f:
            try:  # a run killed mid-write leaves a partial last line: not a reason to lose the report
                rows.append(json.loads(line))
            except ValueError:
                pass
    rows = [r for r in rows if isinstance(r, dict) and 'train/loss' in r]
    if not rows:
        return None
    timed = rows[1:] or rows
    return (rows[-1]['train/loss'], float(np.median([r['tokens_per_s'] for r in timed])),
            float(np.median([r['ms_per_iter'] for r in timed])))


def _fmt(v, digits=3):
    return '—' if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _table(header, rows):
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(r) + ' |' for r in rows]
    return '\n'.join(lines)


def markdown_tables(evals, passkeys):
    out = []
    stats = [(r['label'], train_stats(os.path.dirname(r['path']))) for r in evals if not r.get('rope_scaling')]
    stats = [(lab, st) for lab, st in stats if st]
    if stats:
        out.append("### Training (final train loss; median throughput, first log interval left out)\n")
        out.append(_table(['run', 'train loss', 'tokens/s', 'ms/iter'],
                          [[lab, _fmt(st[0]), f"{st[1]:,.0f}", f"{st[2]:.1f}"] for lab, st in stats]) + '\n')
    if evals:
        mults = max((r['mults'] for r in evals), key=len)
        L = evals[0]['block_size']
        for key, name in (('nonoverlap', 'non-overlapping windows'), ('sliding', 'sliding windows')):
            runs = [r for r in evals if r.get(key)]
            if not runs:
                continue
            extra = f", stride {runs[0].get('stride')}" if key == 'sliding' else ''
            out.append(f"### Val loss (nats/token), {name}{extra}, L = {L}\n")
            rows = []
            for r in runs:
                by_m = dict(zip(r['mults'], r[key]))
                short = {m for m, T, w in zip(r['mults'], r['lengths'], r.get(f'{key}_window', r['lengths'])) if w < T}
                rows.append([r['label']] + [_fmt(by_m.get(m)) + ('†' if m in short else '') for m in mults])
            out.append(_table(['run'] + [f"{m}L ({m * L})" for m in mults], rows) + '\n')
            if any(r.get(f'{key}_window') != r['lengths'] for r in runs if f'{key}_window' in r):
                out.append("† a finite position table: scored with its longest window (sliding-window fallback)\n")
        lk = [r for r in evals if r.get('last_k')]
        if lk:
            ctxs = max((r['last_k']['context'] for r in lk), key=len)
            out.append(f"### Loss on the last {lk[0]['last_k']['k']} tokens vs the context before them\n")
            rows = []
            for r in lk:
                by_c = dict(zip(r['last_k']['context'], r['last_k']['loss']))
                rows.append([r['label']] + [_fmt(by_c.get(c)) for c in ctxs])
            out.append(_table(['run'] + [f"ctx {c}" for c in ctxs], rows) + '\n')
    if passkeys:
        mults = max((r['mults'] for r in passkeys), key=len)
        out.append("### Passkey retrieval accuracy (mean over key depths)\n")
        rows = []
        for r in passkeys:
            by_m = {m: (None if a is None else float(np.mean(a))) for m, a in zip(r['mults'], r['acc'])}
            rows.append([r['label']] + [_fmt(by_m.get(m), 2) for m in mults])
        out.append(_table(['run'] + [f"{m}L" for m in mults], rows) + '\n')
        runs = [r for r in passkeys if r.get('answer_loss')]
        if runs:
            out.append("### Passkey answer loss (nats per digit, mean over depths; ln 10 = 2.30 is a blind guess)\n")
            rows = []
            for r in runs:
                by_m = {m: (None if a is None else float(np.mean(a))) for m, a in zip(r['mults'], r['answer_loss'])}
                rows.append([r['label']] + [_fmt(by_m.get(m), 2) for m in mults])
            out.append(_table(['run'] + [f"{m}L" for m in mults], rows) + '\n')
    return '\n'.join(out)


def _styles(labels):
    """A colour (and marker) per scheme, solid; rope_scaling variants dashed in other colours."""
    import matplotlib
    tab, dark = matplotlib.colormaps['tab10'], matplotlib.colormaps['Dark2']
    bases = sorted({lab.split(' +')[0] for lab in labels})
    variants = sorted({lab for lab in labels if ' +' in lab})
    out = {}
    for lab in labels:
        if lab in variants:
            out[lab] = dict(color=dark(variants.index(lab) % 8), linestyle='--', marker='x')
        else:
            i = bases.index(lab)
            out[lab] = dict(color=tab(i % 10), linestyle='-' if i < 10 else '-.', marker='os^Dv'[i // 10 % 5])
    return out


def _save(fig, path, legend_ax=None, dpi=120):
    """Legend outside the axes on the right (many runs), tight layout, write, close."""
    import matplotlib.pyplot as plt
    if legend_ax is not None:
        legend_ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, dpi=dpi, format='png'))  # whole or not at all, as every file
    plt.close(fig)


def plot_lengths(evals, path):
    import matplotlib.pyplot as plt
    keys = [k for k in ('nonoverlap', 'sliding') if any(r.get(k) for r in evals)]
    fig, axes = plt.subplots(1, len(keys), figsize=(6.5 * len(keys), 4.8), squeeze=False)
    st = _styles([r['label'] for r in evals])
    for ax, key in zip(axes[0], keys):
        for r in evals:
            pts = [(m, v) for m, v in zip(r['mults'], r.get(key) or []) if v is not None]
            if pts:
                ax.plot(*zip(*pts), label=r['label'], ms=4, **st[r['label']])
        ax.set_xscale('log', base=2)
        ax.set_xlabel('eval length / training length L')
        ax.set_ylabel('val loss (nats/token)')
        ax.set_title('non-overlapping windows' if key == 'nonoverlap'
                     else f"sliding windows (stride {evals[0].get('stride')})")
        ax.grid(alpha=0.3)
    _save(fig, path, legend_ax=axes[0][-1])


def plot_position(evals, path):
    """Loss by position in the longest windows each run has (geometric bins, eval.bin_curve)."""
    import matplotlib.pyplot as plt
    from eval import bin_curve
    fig, ax = plt.subplots(figsize=(9, 4.8))
    st = _styles([r['label'] for r in evals])
    L = evals[0]['block_size']
    for r in evals:
        curves = [c for c in r.get('position') or [] if c is not None]
        if curves:
            xs, ys = bin_curve(curves[-1])
            ax.plot(xs, ys, label=r['label'], lw=1.2, **{k: v for k, v in st[r['label']].items() if k != 'marker'})
    ax.axvline(L, color='k', lw=0.8, ls=':')
    ax.text(L, ax.get_ylim()[1], ' L', va='top')
    ax.set_xscale('symlog', base=2, linthresh=L / 4)
    ax.set_xlim(0, None)
    ax.set_xlabel('position in the window')
    ax.set_ylabel('val loss (mean over windows and a bin)')
    ax.set_title('loss by position (non-overlapping windows of the longest eval length)')
    ax.grid(alpha=0.3)
    _save(fig, path, legend_ax=ax)


def plot_last_k(evals, path):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4.8))
    st = _styles([r['label'] for r in evals])
    runs = [r for r in evals if r.get('last_k')]
    for r in runs:
        ax.plot(r['last_k']['context'], r['last_k']['loss'], label=r['label'], ms=4, **st[r['label']])
    ax.axvline(runs[0]['block_size'] - runs[0]['last_k']['k'], color='k', lw=0.8, ls=':')  # window = L
    ax.set_xscale('symlog', base=2, linthresh=runs[0]['block_size'] / 4)
    ax.set_xlim(0, None)
    ax.set_xlabel('tokens of context before the scored tokens')
    ax.set_ylabel('val loss')
    ax.set_title(f"loss on the same last {runs[0]['last_k']['k']} tokens as the context grows")
    ax.grid(alpha=0.3)
    _save(fig, path, legend_ax=ax)


def plot_passkeys(passkeys, path):
    import matplotlib.pyplot as plt
    from passkey import plot_heatmap
    n = len(passkeys)
    cols = min(4, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False)
    for ax, r in zip(axes.flat, passkeys):
        plot_heatmap(r, ax=ax, title=r['label'])
    for ax in list(axes.flat)[n:]:
        ax.axis('off')
    _save(fig, path, dpi=110)


def make_report(dirs, report_dir, title='nanoPE comparison', notes=''):
    import matplotlib
    matplotlib.use('Agg')
    evals, passkeys = load_runs(dirs)
    os.makedirs(report_dir, exist_ok=True)
    parts = [f"# {title}\n", notes, f"Runs: {', '.join(sorted({os.path.dirname(r['path']) for r in evals + passkeys}))}\n"]
    if evals:
        plot_lengths(evals, os.path.join(report_dir, 'loss_vs_length.png'))
        parts.append("![loss vs eval length](loss_vs_length.png)\n")
        if any(r.get('position') for r in evals):
            plot_position(evals, os.path.join(report_dir, 'loss_vs_position.png'))
            parts.append("![loss vs position](loss_vs_position.png)\n")
        if any(r.get('last_k') for r in evals):
            plot_last_k(evals, os.path.join(report_dir, 'last_k.png'))
            parts.append("![loss on the last k tokens vs context](last_k.png)\n")
    if passkeys:
        plot_passkeys(passkeys, os.path.join(report_dir, 'passkey.png'))
        parts.append("![passkey retrieval](passkey.png)\n")
    parts.append(markdown_tables(evals, passkeys))
    return atomic_text('\n'.join(p for p in parts if p), os.path.join(report_dir, 'report.md'))


def task_label(res):
    """'rope', or 'rope +randomized' for a run trained with a position trick."""
    pos = res.get('train_positions', 'plain')
    return res['scheme'] + ('' if pos == 'plain' else f" +{pos}")


def make_task_report(dirs, report_dir, notes=''):
    """The task suite's report: exact match in and beyond the training sizes per task and run,
    per length bin, and heat maps (one panel per task, one row per run) -> report.md."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    runs = [r for r in (usable(os.path.join(d, 'eval.json')) for d in dirs) if r and 'task' in r]
    if not runs:
        raise ValueError(f"no task eval.json in {dirs}: run the suite first (python sweep.py --tasks=default)")
    os.makedirs(report_dir, exist_ok=True)
    task_names = list(dict.fromkeys(r['task'] for r in runs))
    labels = list(dict.fromkeys(task_label(r) for r in runs))
    by = {(r['task'], task_label(r)): r for r in runs}
    parts = [f"# nanoPE task suite\n\n{notes}", "Exact match (the whole answer right, teacher-forced argmax = greedy "
             "decoding), mean over the length bins in the training sizes (1..N) / beyond them (N+1..4N). "
             "`—`: the scheme cannot address those lengths (a finite position table). Randomized-position runs: "
             "plain positions at evaluation, then (in brackets) ordered random positions as Ruoss et al. evaluate.\n",
             "![exact match by length](tasks.png)\n"]
    rows = []
    for lab in labels:
        cells = []
        for t in task_names:
            r = by.get((t, lab))
            if r is None:
                cells.append('')
                continue
            cell = f"{_fmt(r.get('exact_id'), 2)} / {_fmt(r.get('exact_ood'), 2)}"
            if 'exact_ood_randomized' in r:
                cell += f" ({_fmt(r.get('exact_id_randomized'), 2)} / {_fmt(r.get('exact_ood_randomized'), 2)})"
            cells.append(cell)
        rows.append([lab] + cells)
    parts.append(_table(['run'] + [f"{t} (N={next(r['N'] for r in runs if r['task'] == t)})" for t in task_names],
                        rows) + '\n')
    for t in task_names:
        rs = [by[(t, lab)] for lab in labels if (t, lab) in by]
        bins = [(b['lo'], b['hi']) for b in max((r['bins'] for r in rs), key=len)]
        parts.append(f"### {t}: exact match by size (N = {rs[0]['N']})\n")
        parts.append(_table(['run'] + [f"{lo}-{hi}" if hi > lo else f"{lo}" for lo, hi in bins],
                            [[task_label(r)] + [_fmt(next((b['exact'] for b in r['bins'] if b['lo'] == lo), None), 2)
                                                for lo, _ in bins] for r in rs]) + '\n')
    fig, axes = plt.subplots(1, len(task_names), figsize=(3.2 * len(task_names) + 1, 0.32 * len(labels) + 1.6),
                             squeeze=False)
    cmap = matplotlib.colormaps['viridis'].with_extremes(bad='lightgrey')
    for ax, t in zip(axes[0], task_names):
        rs = [by.get((t, lab)) for lab in labels]
        bins = max((r['bins'] for r in rs if r), key=len)
        grid = np.array([[np.nan if not r else next((np.nan if b['exact'] is None else b['exact']
                                                     for b in r['bins'] if b['lo'] == c['lo']), np.nan)
                          for c in bins] for r in rs], dtype=float)
        ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=1, cmap=cmap, aspect='auto')
        N = next(r['N'] for r in rs if r)
        edge = next((i for i, b in enumerate(bins) if b['lo'] > N), len(bins)) - 0.5
        ax.axvline(edge, color='red', lw=1)
        ax.set_xticks(range(len(bins)), [str(b['lo']) for b in bins], fontsize=6, rotation=90)
        ax.set_yticks(range(len(labels)), labels if ax is axes[0][0] else [], fontsize=7)
        ax.set_title(f"{t} (train 1..{N})", fontsize=9)
        ax.set_xlabel('size (bin start)', fontsize=7)
    _save(fig, os.path.join(report_dir, 'tasks.png'))
    atomic_json(runs, os.path.join(report_dir, 'tasks.json'))
    return atomic_text('\n'.join(parts), os.path.join(report_dir, 'report.md'))


def read_result(path):
    """A result JSON (eval*.json, passkey*.json, sweep_args.json) -> (dict, None) when whole,
    (None, None) when missing, (None, why) when damaged (files.read_json: truncated or corrupt,
    a link, not a file), not a JSON object, or an evaluation that was stopped half way
    (complete: false). Never mixed into a report."""
    res, why = read_json(path)
    if why or res is None:
        return None, why
    if not isinstance(res, dict):
        return None, f"not a JSON object (a {type(res).__name__})"
    if res.get('complete') is False:
        return None, "incomplete (complete: false; its evaluation was stopped half way)"
    return res, None


def usable(path):
    """read_result's dict, or None; a damaged file is named in one line and left out."""
    res, why = read_result(path)
    if why:
        print(f"compare: skipping {path}: {why}; redo it (run the same sweep.py command again, or eval.py / "
              f"train.py --init_from=resume on that run)", file=sys.stderr)
    return res


def load_json(path):
    """A result dict, or None when it is missing or damaged (read_result says which)."""
    return read_result(path)[0]


def atomic_text(text, path):
    """Write a text file whole or not at all: a reader never sees half a report."""
    atomic_write(path, lambda f: f.write(text), binary=False)
    return path


def main(argv):
    from configurator import options
    o = options(dict(report_dir='report', runs=[]), argv, positional='runs')
    missing = [d for d in o.runs if not os.path.isdir(d)]
    if missing or not o.runs:
        sys.exit(f"not a run directory: {', '.join(missing)}" if missing else
                 "usage: python compare.py OUT_DIR [OUT_DIR ...] [--report_dir=DIR]  (no out_dir given)")
    found = [r for r in (load_json(os.path.join(d, 'eval.json')) for d in o.runs) if r]  # (a damaged one is named below)
    tasks_only = bool(found) and all('task' in r for r in found)
    try:
        print(f"wrote {(make_task_report if tasks_only else make_report)(o.runs, o.report_dir)}")
    except ValueError as e:  # nothing readable to report on
        sys.exit(str(e))


if __name__ == '__main__':
    main(sys.argv[1:])
