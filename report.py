"""
The comparison report: read the eval/passkey JSONs of several out_dirs and write a report folder with markdown
tables and PNG plots (make_report), the task suite's report (make_task_report), one leaderboard over sweeps'
reports (sweeps_leaderboard), its result files read defensively (files.read_result). compare.py and sweep.py run it.

Reads, in each out_dir, every eval*.json (eval.py / the end of train.py; one per rope_scaling variant; eval.py
--quick's eval_quick.json as its own '+quick' row) and passkey*.json (passkey.py). Writes to report_dir:
  report.md                 a leaderboard (loss at L and at the longest length, paired against rope, places
                            with ties); tables: non-overlapping and sliding loss at each eval length,
                            loss on the last k tokens vs context, passkey accuracy
  loss_vs_length.png        loss against eval length per run (non-overlapping | sliding), seed range shaded
  loss_vs_position.png      loss against position inside the longest windows
  last_k.png                loss on the last k tokens against the context before them
  passkey.png               passkey heat maps, one per run (plot_heatmap; passkey.py draws one run's alone)
matplotlib is imported inside the functions that plot: it is slow to import, and a report read back for its
numbers (sweep.py, the leaderboard) draws nothing.
"""
import glob
import json
import math
import os
import sys

import numpy as np

from evaluation import bin_curve, scaling_tag
from files import atomic_json, atomic_write, read_json, read_result
from stats import paired_interval, rank, summarize


def label_of(res):
    """A result's row: its name, or its scheme with its run-time scalings; '+quick' on eval.py's quick results
    (non-overlapping loss only), so that one is never read as a run's full evaluation."""
    tag = scaling_tag(res.get('rope_scaling'))
    attn = (res.get('attn_scaling') or {}).get('type')
    label = res.get('name') or res.get('scheme', '?') + (f" +{tag}" if tag else '') + (f" +{attn}" if attn else '')
    return label + (' +quick' if res.get('quick') else '')


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


def seed_of(res):
    """The seed a result came from: its own record, else its run's sweep_args.json, else None."""
    if res.get('seed') is not None:
        return str(res['seed'])
    args, _ = read_json(os.path.join(os.path.dirname(res.get('path', '')), 'sweep_args.json'))
    return str(args['seed']) if isinstance(args, dict) and args.get('seed') is not None else None


def groups(runs):
    """{label: [result per seed]}, labels in first-seen order: the runs of one scheme (or variant)
    that differ only in their seed. Runs that share a label but not as seeds of one setting (a
    seed twice, or none known) are different runs: each is labelled with its folder instead."""
    out = {}
    for r in runs:
        out.setdefault(r['label'], []).append(r)
    for lab, rs in list(out.items()):
        seeds = [seed_of(r) for r in rs]
        if len(rs) > 1 and (None in seeds or len(set(seeds)) < len(rs)):
            del out[lab]
            for r in rs:
                r['label'] = f"{lab} ({os.path.basename(os.path.dirname(os.path.abspath(r['path'])))})"
                out.setdefault(r['label'], []).append(r)
    return out


def per_seed(rs, get):
    """{seed: get(result)} over one label's results (a result without a seed gets its index)."""
    return {seed_of(r) or f'#{i}': get(r) for i, r in enumerate(rs)}


def cell(values, digits=3):
    """mean, and with several seeds '± sd (min–max)'; '—' where no seed has a value."""
    s = summarize(values)
    if s['n'] == 0:
        return '—'
    if s['n'] == 1:
        return _fmt(s['mean'], digits)
    f = f".{digits}f"
    return f"{s['mean']:{f}} ± {s['sd']:{f}} ({s['min']:{f}}–{s['max']:{f}})"


def paired_cell(p, digits=3):
    if p['n'] == 0:
        return '—'
    f = f"+.{digits}f"
    if p['lo'] is None:
        return f"{p['diff']:{f}} (n=1)"
    return f"{p['diff']:{f}} [{p['lo']:{f}}, {p['hi']:{f}}]" + (' *' if p['excludes_zero'] else '')


def compare_seeds(grouped, cols, get, baseline=None, higher_is_better=False):
    """Per column c: {label: {seed: value}}, summaries, the paired differences against `baseline`
    (same seeds only) and the ranking with ties -> a JSON-ready dict."""
    out = {}
    seeds = list(dict.fromkeys(s for rs in grouped.values() for s in per_seed(rs, lambda r: 0)))
    for c in cols:
        vals = {lab: per_seed(rs, lambda r: get(r, c)) for lab, rs in grouped.items()}
        col = {'runs': {lab: {**summarize(list(v.values())), 'seeds': v} for lab, v in vals.items()}}
        if baseline in vals:
            col['paired_vs_' + baseline] = {
                lab: paired_interval([v.get(s) for s in seeds], [vals[baseline].get(s) for s in seeds])
                for lab, v in vals.items() if lab != baseline}
        col['ranking'] = rank({lab: [v.get(s) for s in seeds] for lab, v in vals.items()}, higher_is_better)
        out[str(c)] = col
    return out


def seed_tables(title, grouped, cols, col_names, get, baseline, digits=3, higher_is_better=False, note=''):
    """Markdown: the cells (mean ± sd (min–max) over seeds, with n), the paired differences against
    the baseline with their 95% t interval (* where it excludes 0), and the ranking with ties;
    and the same numbers as a dict for aggregate.json."""
    agg = compare_seeds(grouped, cols, get, baseline, higher_is_better)
    rows = [[lab, str(len(rs))] + [cell([get(r, c) for r in rs], digits) for c in cols] for lab, rs in grouped.items()]
    out = [f"### {title}\n", (note + '\n') if note else '', _table(['run', 'n'] + col_names, rows) + '\n']
    key = 'paired_vs_' + str(baseline)
    if any(key in agg[str(c)] for c in cols) and len(grouped) > 1:
        out.append(f"Difference from {baseline} (run − {baseline}), paired by seed: mean [95% paired t interval]; "
                   f"* where the interval excludes 0.\n")
        out.append(_table(['run'] + col_names, [[lab] + [paired_cell(agg[str(c)][key][lab], digits) for c in cols]
                                                for lab in grouped if lab != baseline]) + '\n')
    best = 'highest' if higher_is_better else 'lowest'
    out.append(f"Ranking ({best} first; place = 1 + the runs the seeds confirm better, by a paired interval "
                   f"that excludes 0):\n")
    for c, name in zip(cols, col_names):
        places = agg[str(c)]['ranking']
        out.append(f"- {name}: " + (', '.join(f"{p}. {lab}" for p, lab, _ in places) or 'no values'))
    return '\n'.join(o for o in out if o) + '\n', agg


def leaderboard(col_aggs, names, baseline='rope', digits=3, title=None):
    """Markdown: one row per run, by its place in the first column (then its order in that column's ranking, best
    first; runs it lacks last): per column the mean ± sd over seeds, the difference from `baseline` paired by seed
    with its 95% interval, and the place with ties (stats.rank). col_aggs: [compare_seeds' dict of a column], names:
    their headers, digits: one for all columns or one per column; n is the most seeds any column has for the run
    (a column with fewer shows no ± sd)."""
    places = [{lab: p for p, lab, _ in a['ranking']} for a in col_aggs]
    order = {lab: i for i, (_, lab, _) in enumerate(col_aggs[0]['ranking'])}
    none = {'n': 0, 'mean': None}
    labs = sorted(dict.fromkeys(lab for a in col_aggs for lab in a['runs']),
                  key=lambda lab: (places[0].get(lab, math.inf), order.get(lab, math.inf)))
    digits = digits if isinstance(digits, list) else [digits] * len(col_aggs)

    def spread(s, d):
        return '—' if not s['n'] else f"{s['mean']:.{d}f}" + (f" ± {s['sd']:.{d}f}" if s['n'] > 1 else '')
    header = ['run', 'n'] + [h for n in names for h in (n, f"− {baseline}", 'place')]
    rows = []
    for lab in labs:
        row = [lab, str(max(a['runs'].get(lab, none)['n'] for a in col_aggs))]
        for a, pl, d in zip(col_aggs, places, digits):
            p = a.get('paired_vs_' + baseline, {}).get(lab)
            row += [spread(a['runs'].get(lab, none), d), '0' if lab == baseline else paired_cell(p, d) if p else '—',
                    str(pl.get(lab, '—'))]
        rows.append(row)
    return (f"### {title or 'Leaderboard (non-overlapping windows at ' + ' and '.join(names) + ')'}\n\n"
            f"Mean ± sd over seeds; the difference from {baseline} paired by seed [95% t interval] (* where it "
            "excludes 0); place = 1 + the runs the seeds confirm better (ties share a place).\n\n"
            + _table(header, rows) + '\n')


def sweeps_leaderboard(folders, baseline='rope', columns=''):
    """One leaderboard over several sweeps, from each folder's report/aggregate.json; rows by place at the first
    column, a run a sweep lacks gets '—' in its columns. By default an LM sweep's loss at its longest length and at
    L (non-overlapping windows) and a task sweep's exact match past N per task. columns: 'a,b' picks columns in
    that order by key: 'NL' (non-overlapping loss at N × L), 'slidingNL' (sliding windows), a task's name; a key
    a folder shares with an earlier one is 'KEY@FOLDER' (its base name)."""
    cols, default = {}, []  # key: (column, header, digits)
    for d in folders:
        path = os.path.join(d, 'report', 'aggregate.json')
        agg, why = read_json(path)
        if not isinstance(agg, dict):
            raise ValueError(f"{path}: {why or 'missing or not a JSON object'}; run the sweep (or compare.py) on "
                             f"{d} first")
        own = {f"{pre.strip()}{m}L": (c, f"{pre}{m}L", 3) for key, pre in (('nonoverlap', ''), ('sliding', 'sliding '))
               for m, c in agg.get(key, {}).items()}
        own.update({task: (c, f"{task} past N", 2) for task, c in agg.get('exact_ood', {}).items()})
        mults = sorted(agg.get('nonoverlap', {}), key=float)
        keys = [f"{m}L" for m in dict.fromkeys(mults[-1:] + mults[:1])] + list(agg.get('exact_ood', {}))
        folder = os.path.basename(os.path.normpath(d))
        tag = {k: k if k not in cols else f"{k}@{folder}" for k in own}  # a column an earlier sweep has too
        cols.update({tag[k]: (c, name if tag[k] == k else f"{name} ({folder})", dg)
                     for k, (c, name, dg) in own.items()})
        default += [tag[k] for k in keys]
    if not cols:
        raise ValueError(f"no LM loss or task columns in {', '.join(folders)}")
    keys = columns.split(',') if columns else default
    wrong = [k for k in keys if k not in cols]
    if wrong:
        raise ValueError(f"--columns: no column {', '.join(wrong)} in {', '.join(folders)}; these exist: "
                         f"{','.join(cols)}")
    aggs, names, digits = map(list, zip(*(cols[k] for k in keys)))
    return leaderboard(aggs, names, baseline, digits, title='Leaderboard: ' + ', '.join(names))


def markdown_tables(evals, passkeys, baseline='rope'):
    """The report's tables and the aggregate (JSON-ready): every cell over seeds with its n."""
    out, agg = [], {}
    n_seeds = max([len(rs) for runs in (evals, passkeys) for rs in groups(runs).values()] or [0])
    out.append(f"Seeds per run: see column n (up to {n_seeds}). Cells: mean" + (
        " ± sample sd (min–max) over seeds" if n_seeds > 1 else " (one seed: no spread, no interval)") + ".\n")
    stats_rows = [(r['label'], train_stats(os.path.dirname(r['path']))) for r in evals if not r.get('rope_scaling')]
    stats_rows = [(lab, st) for lab, st in stats_rows if st]
    if stats_rows:
        by = {}
        for lab, st in stats_rows:
            by.setdefault(lab, []).append(st)
        out.append("### Training (final train loss; median throughput, first log interval left out)\n")
        out.append(_table(['run', 'n', 'train loss', 'tokens/s', 'ms/iter'],
                          [[lab, str(len(sts)), cell([st[0] for st in sts]), f"{np.mean([st[1] for st in sts]):,.0f}",
                            f"{np.mean([st[2] for st in sts]):.1f}"] for lab, sts in by.items()]) + '\n')
    if evals:
        mults = max((r['mults'] for r in evals), key=len)
        L = evals[0]['block_size']
        names = [f"{m}L ({m * L})" for m in mults]
        for key, name in (('nonoverlap', 'non-overlapping windows'), ('sliding', 'sliding windows')):
            runs = [r for r in evals if r.get(key)]
            if not runs:
                continue
            extra = f", stride {runs[0].get('stride')}" if key == 'sliding' else ''
            short = any(r.get(f'{key}_window') not in (None, r['lengths']) for r in runs)
            text, agg[key] = seed_tables(
                f"Val loss (nats/token), {name}{extra}, L = {L}", groups(runs), mults, names,
                lambda r, m, key=key: dict(zip(r['mults'], r[key])).get(m), baseline,
                note="A finite position table is scored with its longest window (sliding-window fallback)."
                if short else '')
            out.append(text)
            if key == 'nonoverlap' and len(groups(runs)) > 1:  # at the first and the last length
                ends = list(dict.fromkeys([0, len(mults) - 1]))
                out.insert(1, leaderboard([agg[key][str(mults[i])] for i in ends], [names[i] for i in ends], baseline))
        lk = [r for r in evals if r.get('last_k')]
        if lk:
            ctxs = max((r['last_k']['context'] for r in lk), key=len)
            text, agg['last_k'] = seed_tables(
                f"Loss on the last {lk[0]['last_k']['k']} tokens vs the context before them", groups(lk), ctxs,
                [f"ctx {c}" for c in ctxs], lambda r, c: dict(zip(r['last_k']['context'], r['last_k']['loss'])).get(c),
                baseline)
            out.append(text)
        lp = [r for r in evals if r.get('longppl')]
        get = lambda r, m, key='loss': dict(zip(r['mults'], r['longppl'][key])).get(m)  # noqa: E731
        # a length where no run found a key token has no LongPPL: it gets no column (and no columns, no table)
        cols = [(m, n) for m, n in zip(mults, names) if any(get(r, m) is not None for r in lp)]
        if lp and not cols:
            out.append("LongPPL: no key tokens at any length (the long context never beat the short one by "
                       f"{lp[0]['longppl']['alpha']:g} nats): no table.\n")
        if cols:
            first, (ms, ns) = lp[0]['longppl'], zip(*cols)
            text, agg['longppl'] = seed_tables(
                f"LongPPL: loss on the key tokens (nats; LongPPL = exp), the last {first['k']} targets of each "
                f"non-overlapping window, keys where the long context beats the last {first['short']} tokens alone "
                f"by > {first['alpha']:g} nats and its loss is < {-first['beta']:g}; evaluator: the model itself",
                groups(lp), list(ms), list(ns), get, baseline)
            out.append(text)
            mean = lambda rs, m, key: _fmt(summarize([get(r, m, key) for r in rs])['mean'], 0)  # noqa: E731
            rows = [[lab, str(len(rs))] + [f"{mean(rs, m, 'key_tokens')} / {mean(rs, m, 'candidates')}"
                                           for m in mults] for lab, rs in groups(lp).items()]
            out.append("Key tokens / candidate tokens (LongPPL's loss is over the key tokens; mean over seeds):\n")
            out.append(_table(['run', 'n'] + names, rows) + '\n')
    if passkeys:
        mults = max((r['mults'] for r in passkeys), key=len)
        mean_of = lambda grid, m, r: (lambda a: None if a is None else float(np.mean(a)))(  # noqa: E731
            dict(zip(r['mults'], r[grid])).get(m))
        text, agg['passkey_acc'] = seed_tables(
            "Passkey retrieval accuracy (mean over key depths)", groups(passkeys), mults, [f"{m}L" for m in mults],
            lambda r, m: mean_of('acc', m, r), baseline, digits=2, higher_is_better=True)
        out.append(text)
        runs = [r for r in passkeys if r.get('answer_loss')]
        if runs:
            text, agg['passkey_answer_loss'] = seed_tables(
                "Passkey answer loss (nats per digit, mean over depths; ln 10 = 2.30 is a blind guess)", groups(runs),
                mults, [f"{m}L" for m in mults], lambda r, m: mean_of('answer_loss', m, r), baseline, digits=2)
            out.append(text)
    return '\n'.join(out), agg


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


def mean_run(rs):
    """One label's results merged for plotting: every number the mean over its seeds (position
    curves and passkey grids elementwise), None where no seed has a value."""
    def mean(xs):
        if all(isinstance(x, list) for x in xs if x is not None) and any(isinstance(x, list) for x in xs):
            lists = [x for x in xs if x is not None]
            return [mean(list(col)) for col in zip(*lists)]
        return summarize(xs)['mean']
    out = dict(rs[0])
    for k in ('nonoverlap', 'sliding', 'position', 'acc', 'answer_loss'):
        if k in out:
            out[k] = [mean(list(col)) for col in zip(*[r[k] for r in rs])]
    if out.get('last_k'):
        out['last_k'] = dict(out['last_k'], loss=[mean(list(c)) for c in zip(*[r['last_k']['loss'] for r in rs])])
    return out


def seed_band(rs, key):
    """[(mult, lowest, highest)] over the seeds at each eval length every seed has: the band a plot shades."""
    out = []
    for i, x in enumerate(rs[0]['mults']):
        vs = [(r.get(key) or [None] * (i + 1))[i] for r in rs]
        if all(v is not None for v in vs):
            out.append((x, min(vs), max(vs)))
    return out


def plot_lengths(evals, path):
    """Each run's mean over seeds as a line, the seeds' range as a band around it."""
    import matplotlib.pyplot as plt
    keys = [k for k in ('nonoverlap', 'sliding') if any(r.get(k) for r in evals)]
    fig, axes = plt.subplots(1, len(keys), figsize=(6.5 * len(keys), 4.8), squeeze=False)
    grouped = groups(evals)
    st = _styles(list(grouped))
    for ax, key in zip(axes[0], keys):
        for lab, rs in grouped.items():
            m = mean_run(rs)
            pts = [(x, v) for x, v in zip(m['mults'], m.get(key) or []) if v is not None]
            if pts:
                ax.plot(*zip(*pts), label=lab + (f" (n={len(rs)})" if len(rs) > 1 else ''), ms=4, **st[lab])
            band = seed_band(rs, key) if len(rs) > 1 else []
            if band:
                ax.fill_between(*zip(*band), alpha=0.18, color=st[lab]['color'], lw=0, zorder=1)
        ax.set_xscale('log', base=2)
        ax.set_xlabel('eval length / training length L')
        ax.set_ylabel('val loss (nats/token)')
        ax.set_title('non-overlapping windows' if key == 'nonoverlap'
                     else f"sliding windows (stride {evals[0].get('stride')})")
        ax.grid(alpha=0.3)
    _save(fig, path, legend_ax=axes[0][-1])


def plot_position(evals, path):
    """Loss by position in the longest windows each run has (geometric bins, evaluation.bin_curve),
    the mean over seeds."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.8))
    grouped = groups(evals)
    st = _styles(list(grouped))
    L = evals[0]['block_size']
    for lab, rs in grouped.items():
        curves = [c for c in mean_run(rs).get('position') or [] if c is not None]
        if curves:
            xs, ys = bin_curve(curves[-1])
            ax.plot(xs, ys, label=lab, lw=1.2, **{k: v for k, v in st[lab].items() if k != 'marker'})
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
    grouped = groups([r for r in evals if r.get('last_k')])
    st = _styles(list(grouped))
    first = next(iter(grouped.values()))[0]
    for lab, rs in grouped.items():
        m = mean_run(rs)
        ax.plot(m['last_k']['context'], m['last_k']['loss'], label=lab, ms=4, **st[lab])
        if len(rs) > 1:
            ax.scatter([c for r in rs for c in r['last_k']['context']], [v for r in rs for v in r['last_k']['loss']],
                       s=9, alpha=0.35, color=st[lab]['color'], zorder=1)
    ax.axvline(first['block_size'] - first['last_k']['k'], color='k', lw=0.8, ls=':')  # window = L
    ax.set_xscale('symlog', base=2, linthresh=first['block_size'] / 4)
    ax.set_xlim(0, None)
    ax.set_xlabel('tokens of context before the scored tokens')
    ax.set_ylabel('val loss')
    ax.set_title(f"loss on the same last {first['last_k']['k']} tokens as the context grows")
    ax.grid(alpha=0.3)
    _save(fig, path, legend_ax=ax)


def plot_heatmap(res, path=None, ax=None, title=None):
    """Passkey accuracy over eval length (x) x key depth (y); grey where the scheme cannot go. Into `ax`, or
    alone into the PNG file `path`."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    grid = np.array([[np.nan] * len(res['depths']) if a is None else a for a in res['acc']], dtype=float).T
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(1.1 * len(res['mults']) + 1.5, 0.5 * len(res['depths']) + 1.5))
    cmap = matplotlib.colormaps['viridis'].with_extremes(bad='lightgrey')
    ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=1, cmap=cmap, aspect='auto', origin='lower')
    for (j, i), v in np.ndenumerate(grid):
        if not np.isnan(v):
            ax.text(i, j, f"{v:.2f}", ha='center', va='center', fontsize=7, color='white' if v < 0.6 else 'black')
    ax.set_xticks(range(len(res['mults'])), [f"{m}L" for m in res['mults']])
    ax.set_yticks(range(len(res['depths'])), [f"{d:g}" for d in res['depths']])
    ax.set_xlabel('prompt length')
    ax.set_ylabel('key depth')
    ax.set_title(title or f"passkey: {res.get('scheme', '')}", fontsize=9)
    if own:
        fig.tight_layout()
        atomic_write(path, lambda f: fig.savefig(f, dpi=120, format='png'))  # never through a link
        plt.close(fig)


def plot_passkeys(passkeys, path):
    """A heat map per run: the mean over its seeds."""
    import matplotlib.pyplot as plt
    grouped = groups(passkeys)
    n = len(grouped)
    cols = min(4, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.8 * rows), squeeze=False)
    for ax, (lab, rs) in zip(axes.flat, grouped.items()):
        plot_heatmap(mean_run(rs), ax=ax, title=lab + (f" (mean of {len(rs)})" if len(rs) > 1 else ''))
    for ax in list(axes.flat)[n:]:
        ax.axis('off')
    _save(fig, path, dpi=110)


def make_report(dirs, report_dir, title='nanoPE comparison', notes='', baseline='rope'):
    """report.md (tables over seeds, paired differences against `baseline`, rankings with ties),
    aggregate.json (the same numbers) and the plots, in report_dir."""
    import matplotlib
    matplotlib.use('Agg')
    evals, passkeys = load_runs(dirs)
    os.makedirs(report_dir, exist_ok=True)
    dirs_seen = sorted({os.path.dirname(r['path']) for r in evals + passkeys})
    parts = [f"# {title}\n", notes, f"Runs: {', '.join(dirs_seen)}\n"]
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
    text, agg = markdown_tables(evals, passkeys, baseline)
    parts.append(text)
    atomic_json({'baseline': baseline, 'interval': 'paired t, 95%', **agg}, os.path.join(report_dir, 'aggregate.json'))
    return atomic_text('\n'.join(p for p in parts if p), os.path.join(report_dir, 'report.md'))


def task_label(res):
    """The run's name ('rope', or a preset's such as 'gemma3-full'), with ' +randomized' for a run trained with a
    position trick."""
    pos = res.get('train_positions', 'plain')
    return (res.get('name') or res['scheme']) + ('' if pos == 'plain' else f" +{pos}")


# a task result's own numbers; a test split's result (eval.json 'splits') replaces them
RESULT_KEYS = ('task', 'positions', 'bins', 'loss_id', 'exact_id', 'exact_ood', 'token_id', 'token_ood', 'complete',
               'bins_randomized', 'exact_id_randomized', 'exact_ood_randomized')


def split_runs(run):
    """A task run's test splits (eval.json 'splits', e.g. flipflop's flipflop_sparse and flipflop_dense) as
    runs of those tasks: the run's scheme, seed, N and folder, each split's own results."""
    base = {k: v for k, v in run.items() if k not in RESULT_KEYS + ('splits',)}
    return [{**base, **res, 'task': name} for name, res in (run.get('splits') or {}).items()]


def make_task_report(dirs, report_dir, notes='', baseline='rope'):
    """The task suite's report: exact match in and beyond the training sizes per task and run
    (over seeds: mean ± sd, n, paired differences against `baseline`, rankings with ties), per
    length bin, and heat maps of the mean (one panel per task, one row per run) -> report.md,
    aggregate.json, tasks.json."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    runs = []
    for d in dirs:
        r = usable(os.path.join(d, 'eval.json'))
        if r and 'task' in r:
            runs.append(dict(r, path=os.path.join(d, 'eval.json'), label=task_label(r)))
            runs += split_runs(runs[-1])
    if not runs:
        raise ValueError(f"no task eval.json in {dirs}: run the suite first (python sweep.py --tasks=default)")
    os.makedirs(report_dir, exist_ok=True)
    task_names = list(dict.fromkeys(r['task'] for r in runs))
    by = {t: groups([r for r in runs if r['task'] == t]) for t in task_names}
    labels = list(dict.fromkeys(r['label'] for r in runs))
    n_seeds = max(len(rs) for g in by.values() for rs in g.values())
    parts = [f"# nanoPE task suite\n\n{notes}", "Exact match (the whole answer right, teacher-forced argmax = greedy "
             "decoding), mean over the length bins in the training sizes (1..N) / beyond them (N+1..4N). "
             "`—`: the scheme cannot address those lengths (a finite position table). Randomized-position runs: "
             "plain positions at evaluation, then (in brackets) ordered random positions as Ruoss et al. evaluate. "
             + (f"Over seeds (up to {n_seeds}; n per cell): mean ± sample sd (min–max)." if n_seeds > 1 else
                "One seed: no spread, no interval.") + "\n",
             "![exact match by length (mean over seeds)](tasks.png)\n"]
    rows = []
    for lab in labels:
        cells = []
        for t in task_names:
            rs = by[t].get(lab)
            if not rs:
                cells.append('')
                continue
            c = f"{cell([r.get('exact_id') for r in rs], 2)} / {cell([r.get('exact_ood') for r in rs], 2)}"
            if 'exact_ood_randomized' in rs[0]:
                c += (f" ({cell([r.get('exact_id_randomized') for r in rs], 2)} / "
                      f"{cell([r.get('exact_ood_randomized') for r in rs], 2)})")
            cells.append(c + (f" n={len(rs)}" if n_seeds > 1 else ''))
        rows.append([lab] + cells)
    N_of = {t: next(r['N'] for r in runs if r['task'] == t) for t in task_names}
    parts.append(_table(['run'] + [f"{t} (N={N_of[t]})" for t in task_names], rows) + '\n')
    if any(r.get('token_id') is not None for r in runs):
        rows = [[lab] + [f"{cell([r.get('token_id') for r in by[t][lab]], 2)} / "
                         f"{cell([r.get('token_ood') for r in by[t][lab]], 2)}" if lab in by[t] else ''
                         for t in task_names] for lab in labels]
        parts.append("Per-token accuracy, the share of scored answer tokens right (flip-flop: of reads, 1 - Liu et "
                     "al.'s read error rate), in / beyond the training sizes:\n")
        parts.append(_table(['run'] + [f"{t} (N={N_of[t]})" for t in task_names], rows) + '\n')
    agg, per_run_seed = {}, {lab: {} for lab in labels}  # label -> seed -> {'seed', 'path', 'ood': {task: value}}
    for t in task_names:  # one record per (run, seed) across the tasks, so that each seed counts once
        for lab, rs in by[t].items():
            for i, r in enumerate(rs):
                new = {'seed': seed_of(r), 'path': r['path'], 'ood': {}}
                rec = per_run_seed[lab].setdefault(seed_of(r) or f'#{i}', new)
                rec['ood'][t] = r.get('exact_ood')
    text, agg['exact_ood'] = seed_tables(
        "Exact match beyond the training sizes (N+1..4N), by task", {lab: list(v.values()) for lab, v in
                                                                    per_run_seed.items()},
        task_names, task_names, lambda r, t: r['ood'].get(t), baseline, digits=2, higher_is_better=True)
    parts.append(text)
    means = {}
    for t in task_names:
        rs0 = [rs[0] for rs in by[t].values()]
        bins = [(b['lo'], b['hi']) for b in max((r['bins'] for r in rs0), key=len)]
        exact = lambda r, lo: next((b['exact'] for b in r['bins'] if b['lo'] == lo), None)  # noqa: E731
        means[t] = {lab: [summarize([exact(r, lo) for r in rs])['mean'] for lo, _ in bins]
                    for lab, rs in by[t].items()}
        parts.append(f"### {t}: exact match by size (N = {N_of[t]})" + (", mean over seeds" if n_seeds > 1 else '')
                     + "; rows scored per bin in tasks.json\n")
        parts.append(_table(['run'] + [f"{lo}-{hi}" if hi > lo else f"{lo}" for lo, hi in bins],
                            [[lab] + [_fmt(v, 2) for v in means[t][lab]] for lab in by[t]]) + '\n')
    fig, axes = plt.subplots(1, len(task_names), figsize=(3.2 * len(task_names) + 1, 0.32 * len(labels) + 1.6),
                             squeeze=False)
    cmap = matplotlib.colormaps['viridis'].with_extremes(bad='lightgrey')
    for ax, t in zip(axes[0], task_names):
        bins = max((rs[0]['bins'] for rs in by[t].values()), key=len)
        grid = np.array([[np.nan if v is None else v for v in means[t][lab]] if lab in means[t] else
                         [np.nan] * len(bins) for lab in labels], dtype=float)
        ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=1, cmap=cmap, aspect='auto')
        edge = next((i for i, b in enumerate(bins) if b['lo'] > N_of[t]), len(bins)) - 0.5
        ax.axvline(edge, color='red', lw=1)
        ax.set_xticks(range(len(bins)), [str(b['lo']) for b in bins], fontsize=6, rotation=90)
        ax.set_yticks(range(len(labels)), labels if ax is axes[0][0] else [], fontsize=7)
        ax.set_title(f"{t} (train 1..{N_of[t]})", fontsize=9)
        ax.set_xlabel('size (bin start)', fontsize=7)
    _save(fig, os.path.join(report_dir, 'tasks.png'))
    atomic_json([{k: v for k, v in r.items() if k not in ('path', 'label')} for r in runs],
                os.path.join(report_dir, 'tasks.json'))
    atomic_json({'baseline': baseline, 'interval': 'paired t, 95%', **agg}, os.path.join(report_dir, 'aggregate.json'))
    return atomic_text('\n'.join(parts), os.path.join(report_dir, 'report.md'))


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

