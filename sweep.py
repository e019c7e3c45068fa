"""
The comparison sweep: train every registered scheme the same way (same config, seed,
data and steps), evaluate each (eval.py's full suite; rope also with each run-time
context-extension method), run the passkey probe, and write the report (compare.py).

  python sweep.py                                  # default CPU config -> out-sweep/, out-sweep/report/
  python sweep.py --gpu                            # config/sweep_gpu.py -> out-sweep-gpu/
  python sweep.py --schemes=rope,alibi --max_iters=20 --out=out-tiny   # a quick check
  python sweep.py --key=value                      # any other train.py key, for every run

Resumable: a run whose eval.json is whole, complete and at max_iters is not trained again, a
half-trained run resumes from its checkpoint (init_from='resume'), and each eval/passkey JSON
that is whole is kept (a damaged one is named, moved to NAME.bad and redone). SIGTERM or Ctrl-C
passes SIGTERM on to the running children, which save a checkpoint and exit; a kill -9 of the
sweep sends them SIGTERM too (Linux). Re-running the same command after any of these finishes
the sweep with the report an uninterrupted one writes. One sweep per --out at a time (OUT/.lock).
A run that fails or was stopped is reported with its log (RUN/sweep.log, where each child's
output goes) and skipped; the report covers the runs that finished.

The algorithmic task suite (tasks.py): every task x scheme x position option,
trained from scratch, exact match by length up to 4x the training sizes, heat maps:
  python sweep.py --tasks=default                  # the default suite, config/task_small.py -> out-tasks/
  python sweep.py --tasks=copy,reverse --schemes=rope,alibi --randomized=rope --workers=2

Sweep options (the rest go to train.py):
  --out=DIR           where runs go (default out-sweep, or out-sweep-gpu with --gpu)
  --schemes=a,b       'all': every scheme in positional.REGISTRY (the default, but for the task suite's six
                      and with --presets, where only the presets run)
  --scalings=a,b      run-time methods evaluated on rope (default: all of SCALINGS: the
                      rope_scaling types at factor s, and fixed recipes for yarn without
                      mscale, longrope, Self-Extend, ReRoPE, leaky ReRoPE, STRING; see scaling_dicts)
  --scaling_factor=F  their scale factor (default: the longest eval length / L = 16)
  --variants=a,b      training-time variants of rope run too (default: all of VARIANTS in a full
                      sweep, none when --schemes is given; 'default' all; '' none)
  --tasks=a,b         the task suite instead of language modelling ('default': TASK_SUITE below)
  --randomized=a,b    task suite: schemes also trained with randomized positions (default rope,learned)
  --workers=N         task suite: runs at a time, one CPU thread each (default 2)
  --presets=a,b       the attention stacks of config/ (presets.PRESETS; 'default': all), each also as NAME-full, its
                      twin without windows or chunks; with --presets and no --schemes, only these run
  --drope=True        DroPE (config/drope.py, drope.py) on each seed's rope run: NoPE recalibrated for a fifth
                      of the steps (drope-c0), then DroPE's logit scaling with c fitted (drope); LM only
  --seeds=N           train every run once per seed: N seeds from --seed (default 1337) up, or a
                      list (--seeds=[1337,7,42]); each in its own folder NAME-sSEED, resumable per
                      seed. A seed fixes initialisation, batch order and dropout, and seed s gives
                      every scheme the same batches, so differences at one seed are paired; the
                      report gives mean ± sd over seeds and paired intervals (compare.py)
  --passkey=True      also run the passkey probe on every run (default: on with --gpu,
                      off on the CPU config, whose 0.8M-parameter model does not learn
                      to retrieve in a short fine-tune: see README, Passkey retrieval);
                      --passkey_iters=N (default 300), --passkey_trials=N prompts per
                      length x depth cell (default 20)
"""
import ctypes
import json
import os
import signal
import subprocess
import sys
import time

from console import exit_on_ctrl_c

if __name__ == '__main__':  # a Ctrl-C before the runs start (torch loading, the dry run): one line, no traceback
    exit_on_ctrl_c('sweep.py', 'no run had started; run the same command again')
import positional  # noqa: E402
import rope_scaling  # noqa: E402
import runtime  # noqa: E402
import tasks  # noqa: E402
from checkpoint import lock_out_dir  # noqa: E402
from configurator import configure, read_config_file, unknown_names  # noqa: E402
from evaluation import scaling_tag  # noqa: E402
from files import atomic_json, open_no_follow, read_json  # noqa: E402
from presets import preset_args  # noqa: E402
from report import make_report, make_task_report, read_result  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCALINGS = ['linear', 'ntk', 'dynamic', 'yarn', 'llama3', 'yarn_nomscale', 'longrope', 'self_extend', 'rerope',
            'leaky_rerope', 'string']
# training-time variants of rope run beside the schemes (name -> train.py args): p-RoPE (arXiv 2410.06205),
# NoPE in every 4th layer (RNoPE, arXiv 2501.18795), log-n scaling (arXiv 2202.12172), SSMax (arXiv 2501.19399)
VARIANTS = {'rope-prope': {'pos_encoding': 'rope', 'pos_options': "{'p_rope': 0.25}"},
            'rope-nope4': {'pos_encoding': 'rope', 'nope_layers': '4'},
            'rope-logn': {'pos_encoding': 'rope', 'attn_scaling': "{'type': 'logn'}"},
            'rope-ssmax': {'pos_encoding': 'rope', 'attn_scaling': "{'type': 'ssmax'}"}}
SCALED_SCHEMES = ['rope']  # schemes evaluated with each rope_scaling type
DROPE = os.path.join(HERE, 'config', 'drope.py')
EVAL_MULTS = 16            # eval.py's longest length, in units of L
# the task suite: tasks and schemes; the small model every task run trains is config/task_small.py;
# single-threaded runs, two at a time on 2 cores
TASK_SUITE = dict(tasks='copy,reverse,parity,sort,stack,passkey', schemes='none,learned,sinusoidal,rope,alibi,t5',
                  randomized='rope,learned')
TASK_CONFIG = os.path.join(HERE, 'config', 'task_small.py')
# tasks with their own step count: at 1500, stack's best scheme reached 0.94 exact match in distribution;
# vartrack's block (55 tokens at N = 16) makes a step cost about 55/41 of passkey's, so 1200 steps cost about
# passkey's 1500
TASK_ITERS = {'stack': 3000, 'vartrack': 1200}
GPU_CONFIG = os.path.join(HERE, 'config', 'sweep_gpu.py')  # --gpu: nanoGPT's shakespeare_char GPU model


def scaling_dicts(names, factor, L, rot_dim=32):
    """rope_scaling dicts for these names: the scaling types with factor s = `factor` (and
    original_max_len L where they take it), and the fixed recipes below for the others."""
    keys = rope_scaling.ROPE_SCALING_KEYS  # type -> the keys it takes
    s = factor
    yarn = {'type': 'yarn', 'factor': s, 'original_max_len': L}
    # LongRoPE's factors come from its search (not implemented): here YaRN's per-pair ratios at s, as the
    # long list (the search's starting point in arXiv 2402.13753), plain RoPE up to L
    plain, scaled = rope_scaling.rope_frequencies(rot_dim)[0], rope_scaling.rope_frequencies(rot_dim, scaling=yarn)[0]
    ratio = (plain / scaled).tolist()
    recipes = {
        'yarn_nomscale': {**yarn, 'mscale': 1.0, 'mscale_all_dim': 1.0},  # DeepSeek-V3's form: attention factor 1
        'longrope': {'type': 'longrope', 'short_factor': [1.0] * (rot_dim // 2), 'long_factor': ratio,
                     'original_max_len': L, 'factor': s},
        'self_extend': {'type': 'self_extend', 'window': L // 4, 'group': int(s) * 2},  # distances <= L/4 + 16L/2s
        'rerope': {'type': 'rerope', 'window': L // 2},
        'leaky_rerope': {'type': 'leaky_rerope', 'window': L // 2, 'k': s},
        # STRING, the authors' shift 0.33 x the length (here the training length L, the length the method is
        # for: it keeps the distances inside L only at lengths up to L); their local W = 128 is for 128K-token
        # models, here W = L / 32 (4 at L = 128)
        'string': {'type': 'string', 'shift': int(rope_scaling.STRING_SHIFT_RATIO * L), 'local': max(1, L // 32)}}
    out = []
    for t in names:
        if t in recipes:
            out.append(recipes[t])
        elif t in keys:
            out.append({'type': t, 'factor': s, **({'original_max_len': L} if 'original_max_len' in keys[t] else {})})
        else:
            print(f"sweep: skipping rope_scaling {t!r}: positional.py does not implement it")
    return out


children = []       # running children: a SIGTERM/SIGINT to the sweep is passed on to each
stop_signal = None  # the signal that asked the sweep to stop
PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith('linux') else None


def on_signal(signum, frame):
    """Pass SIGTERM on to every running child (train.py finishes its step, saves and exits); the
    sweep then stops as soon as they have exited. A second signal is passed on too (exit at once)."""
    global stop_signal
    stop_signal = stop_signal or signum
    for p in children:
        try:
            if p.returncode is None:  # (not yet reaped: its pid is still its own)
                os.kill(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def die_with_parent(parent, prctl):
    """In the child before exec: SIGTERM when sweep.py dies (even by kill -9), so a run saves and stops
    rather than running on detached (Linux prctl PR_SET_PDEATHSIG; libc's prctl is looked up before the fork)."""
    if prctl is not None:
        prctl(1, signal.SIGTERM)
        if os.getppid() != parent:  # the sweep died before the prctl
            os.kill(os.getpid(), signal.SIGTERM)


def wait_for_folder(d, timeout=120):
    """A child of an earlier sweep that was killed may still be saving into d (it got SIGTERM when
    that sweep died): wait for it to let go of d/.lock rather than have the new run refused."""
    import fcntl
    path, t0 = os.path.join(d, '.lock'), time.time()
    if not os.path.exists(path):
        return
    try:
        f = os.fdopen(open_no_follow(path, os.O_RDONLY))
    except OSError:  # a link: train.py refuses it in one line, in the run's log
        return
    with f:
        said = False
        while time.time() - t0 < timeout and not stop_signal:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return  # (closing the file lets go again, for the child)
            except BlockingIOError:
                if not said:
                    f.seek(0)
                    print(f"sweep: waiting for {f.read().strip() or 'another process'} to let go of {d}", flush=True)
                    said = True
                time.sleep(0.2)


def start(cmd, log_path, env=None):
    """Start a child whose output goes to log_path (runtime.spawn) and that gets SIGTERM when the sweep dies;
    a SIGTERM/SIGINT to the sweep passes one SIGTERM on to it."""
    wait_for_folder(os.path.dirname(log_path))
    stop_if_asked()
    with open(log_path, 'a') as log:
        log.write('$ ' + ' '.join(cmd) + '\n')
        log.flush()
        p = runtime.spawn(cmd, log, env, preexec_fn=lambda parent=os.getpid(), f=PRCTL: die_with_parent(parent, f))
    children.append(p)
    if stop_signal:  # the signal came while it was starting
        on_signal(stop_signal, None)
    return p


def stop_if_asked():
    """After a SIGTERM/SIGINT: wait for the children (saving), then exit with one line on resuming."""
    if stop_signal:
        for p in children:
            p.wait()
        print(f"sweep: stopped by {signal.Signals(stop_signal).name} (its runs saved first); run the same command "
              f"again to resume", file=sys.stderr, flush=True)
        raise SystemExit(128 + stop_signal)


def reap(p):
    """A finished child's exit code (or the sweep's exit, if it was asked to stop)."""
    rc = p.wait()
    children.remove(p)
    stop_if_asked()
    return rc


def run(cmd, log_path):
    """Run a child to the end -> exit code; on a terminal its output is echoed from its log."""
    print('$ ' + ' '.join(cmd), flush=True)
    pos = os.path.getsize(log_path) if os.path.exists(log_path) else 0
    p = start(cmd, log_path)
    with open(log_path, errors='replace') as log:
        log.seek(pos)
        log.readline()  # the '$ cmd' line, printed above
        while p.poll() is None:
            time.sleep(0.2)
            if sys.stdout.isatty():
                sys.stdout.write(log.read())
                sys.stdout.flush()
        if sys.stdout.isatty():
            sys.stdout.write(log.read())
    return reap(p)


def result(path):
    """A result file's dict, or None when missing; a damaged or incomplete one is named and moved
    aside (NAME.bad) so that what it should hold is redone, never mixed into a report."""
    res, why = read_result(path)
    if why:
        os.replace(path, path + '.bad')
        print(f"sweep: {path} is {why}: moved to {path}.bad, redoing it", flush=True)
    return res


def outcome(rc, path, log, what, iters=None):
    """None when the child `what` left its result in path (at `iters`), else why not, naming its log.
    Exit code 0 is not enough: train.py stopped by a signal saves and exits 0 too."""
    res, why = read_result(path)
    if rc == 0 and res is not None and (iters is None or res.get('iter') == iters):
        return None
    if rc != 0:
        how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"failed (exit code {rc})"
    elif res is None:
        how = f"stopped before the end ({why or 'no ' + os.path.basename(path)})"
    else:
        how = f"stopped before the end ({os.path.basename(path)} at iter {res.get('iter')}, not {iters})"
    return f"{what} {how}; see {log}; run the sweep again to redo it"


def claim(d, args):
    """Record the settings of the run in d, or say why not: it holds a run with other settings."""
    os.makedirs(d, exist_ok=True)
    saved = result(os.path.join(d, 'sweep_args.json'))
    if saved is not None and saved != args:
        return f"{d} holds a run with other settings ({saved}); use another --out or delete it"
    atomic_json(args, os.path.join(d, 'sweep_args.json'))


def seed_list(spec, base):
    """--seeds: None -> [base]; a count n -> base, base + 1, ..., base + n - 1; a list -> itself.
    None for anything else."""
    if spec is None:
        return [base]
    if isinstance(spec, int) and not isinstance(spec, bool) and spec > 0:
        return [base + i for i in range(spec)]
    if isinstance(spec, (list, tuple)) and spec and all(isinstance(x, int) and not isinstance(x, bool) for x in spec) \
            and len(set(spec)) == len(spec):
        return list(spec)
    return None


# (seconds per iteration, seconds outside the training loop) of one run on 2 CPU cores, measured in the
# multi-seed sweeps of docs/evaluation.md: the default LM config trains at ~0.165 s/iteration, with ~6 s of
# start-up and ~24 s of final suite; a task run, single-threaded beside another, at 0.012 (parity) to
# 0.057 (passkey) s/iteration, median ~0.03, plus ~3 s. A sweep with finished runs uses their own timing.
COST = {'lm': (0.165, 30.0), 'task': (0.03, 3.0)}


def finished(res, iters):
    """Whether a run's result (its eval.json's dict, or None) is whole and at max_iters = iters."""
    return res is not None and res.get('iter') == int(iters)


def estimate(jobs, kind, workers, evals=0):
    """(runs left, expected seconds): runs whose eval.json is whole and at max_iters are done; each
    other run costs what this folder's finished runs of its task took per iteration trained (the
    median of their eval.json 'timing'), else the median over all finished runs, else COST[kind];
    `workers` at a time. `evals` more evaluations (rope_scaling on a trained run) cost a final
    eval's median time each (Self-Extend and ReRoPE take longer: their dense logits are computed twice)."""
    results = [read_result(os.path.join(a['out_dir'], 'eval.json'))[0] for a in jobs]
    left = [a for a, res in zip(jobs, results) if not finished(res, a['max_iters'])]
    spent = {}  # task ('' for LM) -> [(s per iteration, s outside the training loop, s of final eval)]
    for a, res in zip(jobs, results):
        t = (res or {}).get('timing') or {}
        iters = t.get('iters_trained', res.get('iter') if res else None)  # older runs: all of them
        if iters and t.get('train_s'):
            spent.setdefault(a.get('task', ''), []).append(
                (t['train_s'] / iters, t.get('final_eval_s', 0.0) + t.get('startup_s', 0.0), t.get('final_eval_s')))
    median = lambda xs: sorted(xs)[len(xs) // 2]
    every = [x for xs in spent.values() for x in xs]

    def cost(a):
        xs = spent.get(a.get('task', '')) or every
        per_iter, fixed = (median([x[0] for x in xs]), median([x[1] for x in xs])) if xs else COST[kind]
        return per_iter * int(a['max_iters']) + fixed
    eval_s = [x[2] for x in every if x[2] is not None]
    return len(left), (sum(cost(a) for a in left) + evals * (median(eval_s) if eval_s else COST[kind][1])) / workers


def plan_line(what, jobs, seeds, kind, workers, out, evals=0):
    left, secs = estimate(jobs, kind, workers, evals)
    return (f"sweep: {what}: {len(jobs)} runs ({len(jobs) // len(seeds)} x {len(seeds)} seed(s): "
            f"{', '.join(map(str, seeds))}), {left} to do, about {secs / 60:.0f} min"
            + (f" at {workers} at a time" if workers > 1 else '') + " on 2 CPU cores -> " + out + "/")


def main(argv):
    sweep = dict(out='', schemes='', scalings=','.join(SCALINGS), scaling_factor=float(EVAL_MULTS), passkey=None,
                 passkey_iters=300, passkey_trials=20, gpu=False, tasks='', randomized=TASK_SUITE['randomized'],
                 workers=2, variants='default', seeds=None, presets='', drope=False)
    ours = [a for a in argv if a == '--gpu' or a.split('=', 1)[0][2:] in sweep]
    train_args = dict(a[2:].split('=', 1) for a in argv if a not in ours and a.startswith('--') and '=' in a)
    bad = [a for a in argv if a not in ours and not (a.startswith('--') and '=' in a)]
    if bad:
        sys.exit(f"bad argument(s) {bad}: use --key=value (sweep keys: {', '.join(sweep)}; others go to train.py)")
    configure(sweep, ['--gpu=True' if a == '--gpu' else a for a in ours], dict(scaling_factor='>0', passkey_iters='>=0',
              passkey_trials='>0', passkey=(lambda v: isinstance(v, bool), 'True or False'), workers='>0',
              drope=(lambda v: isinstance(v, bool), 'True or False'),
              seeds=(lambda v: seed_list(v, 0) is not None,
                     'a count (--seeds=3) or a list of seeds (--seeds=[1337,7,42])')))
    if sweep['tasks']:
        return task_suite(sweep, train_args, argv)
    if sweep['passkey'] is None:
        sweep['passkey'] = sweep['gpu']
    if 'pos_encoding' in train_args or 'out_dir' in train_args:
        sys.exit("sweep.py sets pos_encoding and out_dir itself; choose schemes with --schemes and the folder "
                 "with --out")
    out = os.path.abspath(sweep['out'] or ('out-sweep-gpu' if sweep['gpu'] else 'out-sweep'))
    presets = preset_args(sweep['presets'])
    schemes = scheme_list(sweep['schemes'] or ('' if presets else 'all'))
    bad = [s for s in schemes if s not in positional.REGISTRY]
    if bad:
        sys.exit(unknown_names('scheme(s)', bad, positional.REGISTRY, 'registered'))
    base = config_args(GPU_CONFIG) if sweep['gpu'] else {}
    # runs log to wandb as single runs do (offline without a login; --wandb_log=False turns it off), in one group
    base.update({'seed': '1337', 'wandb_group': os.path.basename(out)})
    base.update(train_args)  # the user's keys win
    seeds = seed_list(sweep['seeds'], int(base['seed']))
    lock_out_dir(out, 'sweep.py', hint='or pass --out=ANOTHER_DIR')  # two sweeps into one folder undo each other
    # train.py resolves (and checks) the settings every run will use: one dry run, no training
    cfg = train_config(base)
    max_iters, L = cfg['max_iters'], cfg['block_size']
    factor = sweep['scaling_factor']
    scalings = scaling_dicts([t for t in sweep['scalings'].split(',') if t], factor, L)
    print(f"sweep: {len(schemes)} schemes ({', '.join(schemes)}), train args {base}, -> {out}/; rope_scaling "
          f"at eval: {', '.join(scaling_tag(sc) for sc in scalings) or 'none'} (factor {factor:g}); "
          f"passkey {'on' if sweep['passkey'] else 'off'}")
    # 'default': every variant in a full sweep; with --schemes, only the schemes asked for
    chosen = '' if sweep['variants'] == 'default' and (sweep['schemes'] or presets) else sweep['variants']
    names = list(VARIANTS) if chosen == 'default' else [v for v in chosen.split(',') if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {unknown}; variants: {', '.join(VARIANTS)} (or 'default' for all)")
    variants = {v: VARIANTS[v] for v in names}
    # each scheme once per seed, in its own folder; seed s gives every scheme the same batches
    runs = [(f"{s}-s{seed}", {'pos_encoding': s, 'seed': str(seed)}) for s in schemes for seed in seeds] + \
           [(f"{v}-s{seed}", {**a, 'wandb_run_name': v, 'seed': str(seed)}) for v, a in {**variants, **presets}.items()
            for seed in seeds]
    if sweep['drope']:  # after the rope run of the same seed, from its checkpoint; a fifth of its steps
        drope = {k: v for k, v in config_args(DROPE).items() if k != 'out_dir'}
        n = str(max(1, max_iters // 5))
        runs += [(f"drope-s{seed}", {**drope, 'init_from': os.path.join(out, f'rope-s{seed}', 'ckpt.pt'),
                                     'max_iters': n, 'eval_interval': n, 'wandb_run_name': 'drope-c0',
                                     'seed': str(seed)})
                 for seed in seeds]
    evals = sum(not os.path.exists(os.path.join(out, s, f'eval_{scaling_tag(sc)}.json')) for s, a in runs
                if a['pos_encoding'] in SCALED_SCHEMES and 'wandb_run_name' not in a for sc in scalings)
    print(plan_line('language modelling', [{**base, 'max_iters': max_iters, **a, 'out_dir': os.path.join(out, s)}
                                           for s, a in runs], seeds, 'lm', 1, out, evals)
          + (f"; with {evals} rope_scaling evaluations of rope runs" if evals else ''), flush=True)
    failed, t_start = [], time.time()
    for sig in (signal.SIGTERM, signal.SIGINT):  # from here on a signal stops the runs, which save first
        signal.signal(sig, on_signal)
    for s, run_args in runs:
        d = os.path.join(out, s)
        log = os.path.join(d, 'sweep.log')
        args = dict(base, **run_args, out_dir=d)
        why = claim(d, args)
        if why:
            failed.append((s, why))
            print(f"sweep: {why}")
            continue
        t0, n, iters = time.time(), len(failed), int(run_args.get('max_iters', max_iters))
        if not finished(result(os.path.join(d, 'eval.json')), iters):
            resume = ['--init_from=resume'] if os.path.exists(os.path.join(d, 'ckpt.pt')) else []
            rc = run([sys.executable, 'train.py'] + [f'--{k}={v}' for k, v in args.items()] + resume, log)
            why = outcome(rc, os.path.join(d, 'eval.json'), log, 'train.py', iters)
            if why:
                failed.append((s, why))
                continue
        if s.startswith('drope-') and result(os.path.join(d, 'eval_drope.json')) is None:  # fit c, then evaluate
            cmd = [sys.executable, 'drope.py', f'--out_dir={d}'] + \
                  ([f"--tokens={base['eval_tokens']}"] if 'eval_tokens' in base else [])
            why = outcome(run(cmd, log), os.path.join(d, 'eval_drope.json'), log, 'drope.py')
            failed += [(s, why)] if why else []
        variants = [None] + (scalings if run_args['pos_encoding'] in SCALED_SCHEMES and 'wandb_run_name' not in run_args
                             else [])
        for sc in variants[1:]:
            path = os.path.join(d, f'eval_{scaling_tag(sc)}.json')
            if result(path) is None:
                cmd = [sys.executable, 'eval.py', f'--out_dir={d}', f'--rope_scaling={sc!r}']
                if 'eval_tokens' in base:  # the same budget as the final eval in train.py
                    cmd.append(f"--tokens={base['eval_tokens']}")
                why = outcome(run(cmd, log), path, log, f'eval.py with {scaling_tag(sc)}')
                failed += [(s, why)] if why else []
        if sweep['passkey']:
            for sc in variants:
                tag = scaling_tag(sc)
                path = os.path.join(d, 'passkey' + (f'_{tag}' if tag else '') + '.json')
                if result(path) is None:
                    cmd = [sys.executable, 'passkey.py', f"--out_dir={d}", f"--iters={sweep['passkey_iters']}",
                           f"--trials={sweep['passkey_trials']}"]
                    why = outcome(run(cmd + ([f'--rope_scaling={sc!r}'] if sc else []), log), path, log,
                                  f'passkey.py {tag}'.strip())
                    failed += [(s, why)] if why else []
        if len(failed) == n:
            print(f"sweep: {s} done in {time.time() - t0:.0f}s ({time.time() - t_start:.0f}s so far)", flush=True)
    done = [os.path.join(out, s) for s, a in runs if finished(read_result(os.path.join(out, s, 'eval.json'))[0],
                                                              int(a.get('max_iters', max_iters)))]
    if done:
        notes = (f"Sweep: `python sweep.py {' '.join(argv)}` ({provenance()}); train args {base}; rope_scaling "
                 f"variants at eval time with factor {factor:g} and original_max_len {L}.\n")
        print(f"sweep: report -> {make_report(done, os.path.join(out, 'report'), notes=notes)} "
              f"({time.time() - t_start:.0f}s in all)")
        log_aggregate(os.path.join(out, 'report'), base)
    for s, why in failed:
        print(f"sweep: FAILED {s}: {why}")
    stop_if_asked()
    return 1 if failed else 0


def scheme_list(value):
    """--schemes: 'a,b', or 'all' for every registered scheme."""
    return sorted(positional.REGISTRY) if value == 'all' else [s for s in value.split(',') if s]


def task_suite(sweep, train_args, argv):
    """Train every task x scheme (x randomized positions for some schemes) from scratch, `workers`
    runs at a time (one thread each: tiny models gain nothing from a second thread), resumable as
    the LM sweep; then report.make_task_report. Each run: out/<task>/<scheme>[-randomized]-s<seed>."""
    names = TASK_SUITE['tasks'] if sweep['tasks'] == 'default' else sweep['tasks']
    names = names.split(',')
    presets = preset_args(sweep['presets'], task=True)
    schemes = scheme_list(sweep['schemes'] or ('' if presets else TASK_SUITE['schemes']))
    bad = [t for t in names if t not in tasks.TASKS] + [s for s in schemes if s not in positional.REGISTRY]
    if bad:
        sys.exit(f"unknown task(s)/scheme(s) {bad}; tasks: {', '.join(tasks.TASKS)}; schemes: "
                 f"{', '.join(sorted(positional.REGISTRY))}")
    randomized = [s for s in sweep['randomized'].split(',') if s in schemes]
    out = os.path.abspath(sweep['out'] or 'out-tasks')
    base = config_args(TASK_CONFIG)
    base.update({'seed': '1337', 'wandb_group': os.path.basename(out)})  # (job type: the task's name)
    base.update(train_args)
    seeds = seed_list(sweep['seeds'], int(base['seed']))
    lock_out_dir(out, 'sweep.py', hint='or pass --out=ANOTHER_DIR')  # two sweeps into one folder undo each other
    train_config({**base, 'task': names[0]})  # checks the settings once
    jobs = []
    for t in names:
        for s in schemes:
            for pos, seed in [(p, x) for p in ['plain'] + (['randomized'] if s in randomized else []) for x in seeds]:
                iters = {} if 'max_iters' in train_args or t not in TASK_ITERS else {'max_iters': str(TASK_ITERS[t])}
                args = dict(base, **iters, task=t, pos_encoding=s, positions=pos, seed=str(seed),
                            out_dir=os.path.join(out, t, s + ('' if pos == 'plain' else f'-{pos}') + f'-s{seed}'))
                if pos == 'randomized' and positional.REGISTRY[s].max_len_of is not \
                        positional.PositionalEncoding.max_len_of:  # a finite table must hold pos_max positions
                    args['pos_options'] = repr({'max_len': 4 * tasks.max_len(t, 4 * tasks.DEFAULT_N[t])})
                jobs.append(args)
        for p, a in presets.items():
            for seed in seeds:
                iters = {} if 'max_iters' in train_args or t not in TASK_ITERS else {'max_iters': str(TASK_ITERS[t])}
                jobs.append(dict(base, **iters, **a, task=t, wandb_run_name=p, seed=str(seed),
                                 out_dir=os.path.join(out, t, f'{p}-s{seed}')))
    print(f"sweep: task suite, {len(names)} tasks x {len(schemes)} schemes + {len(presets)} presets, randomized "
          f"positions for "
          f"{', '.join(randomized) or 'none'}", flush=True)
    print(plan_line('task suite', jobs, seeds, 'task', sweep['workers'], out), flush=True)
    t_start, failed, running, pending = time.time(), [], {}, list(jobs)
    pct = lambda v: 'unaddressable' if v is None else f"{v:.2f}"  # noqa: E731 (None: a finite position table)
    for sig in (signal.SIGTERM, signal.SIGINT):  # from here on a signal stops the runs, which save first
        signal.signal(sig, on_signal)
    while pending or running:  # `workers` children at a time, each one thread
        while pending and len(running) < sweep['workers']:
            args = pending.pop(0)
            d = args['out_dir']
            why = claim(d, args)
            if why or finished(result(os.path.join(d, 'eval.json')), args['max_iters']):
                failed += [(d, why)] if why else []
                continue
            resume = ['--init_from=resume'] if os.path.exists(os.path.join(d, 'ckpt.pt')) else []
            cmd = [sys.executable, 'train.py'] + [f'--{k}={v}' for k, v in args.items()] + resume
            running[start(cmd, os.path.join(d, 'sweep.log'), env={'OMP_NUM_THREADS': '1'})] = args
        for p in [p for p in running if p.poll() is not None]:
            args = running.pop(p)
            d = args['out_dir']
            why = outcome(reap(p), os.path.join(d, 'eval.json'), os.path.join(d, 'sweep.log'), 'train.py',
                          int(args['max_iters']))
            res = read_result(os.path.join(d, 'eval.json'))[0] or {}
            print(f"sweep: {os.path.relpath(d, out)}: " + (f"FAILED: {why}" if why else f"exact match "
                  f"{pct(res.get('exact_id'))} in distribution, {pct(res.get('exact_ood'))} beyond")
                  + f" ({len(jobs) - len(pending) - len(running)}/{len(jobs)} runs, {time.time() - t_start:.0f}s since "
                  f"the suite started)", flush=True)
            failed += [(d, why)] if why else []
        time.sleep(0.1)
    own_iters = {a['task']: a['max_iters'] for a in jobs if a['max_iters'] != base['max_iters']}
    notes = (f"Task suite: `python sweep.py {' '.join(argv)}` ({provenance()}); train args {base}"
             + (f" (max_iters per task: {own_iters})" if own_iters else '') + f"; {sweep['workers']} single-threaded "
             f"runs at a time; {time.time() - t_start:.0f}s for this invocation.\n")
    done = [a['out_dir'] for a in jobs if finished(read_result(os.path.join(a['out_dir'], 'eval.json'))[0],
                                                   a['max_iters'])]
    if done:
        print(f"sweep: report -> {make_task_report(done, os.path.join(out, 'report'), notes=notes)} "
              f"({time.time() - t_start:.0f}s in all)")
        log_aggregate(os.path.join(out, 'report'), base)
    for d, why in failed:
        print(f"sweep: FAILED {d}: {why}")
    stop_if_asked()
    return 1 if failed else 0


AGGREGATE_COLUMNS = ['metric', 'column', 'run', 'n', 'mean', 'sd', 'min', 'max', 'diff_vs_baseline', 'lo', 'hi',
                     'excludes_zero', 'place']


def log_aggregate(report_dir, base):
    """The report's aggregate (means, spreads, paired intervals, places) once, as a wandb Table in
    the sweep's group, beside the runs it summarises."""
    if str(base.get('wandb_log', True)) in ('False', '0'):
        return
    agg = read_json(os.path.join(report_dir, 'aggregate.json'))[0]
    if not isinstance(agg, dict):
        return
    rows = []
    for metric, cols in agg.items():
        for col, c in cols.items() if isinstance(cols, dict) else ():
            paired = c.get('paired_vs_' + str(agg['baseline']), {})
            places = {lab: place for place, lab, _ in c['ranking']}
            for lab, r in c['runs'].items():
                p = paired.get(lab, {})
                rows.append([metric, col, lab, r['n'], r['mean'], r['sd'], r['min'], r['max'], p.get('diff'),
                             p.get('lo'), p.get('hi'), p.get('excludes_zero'), places.get(lab)])
    import wandb  # here, not at the head: wandb is optional and slow to import
    meta = {k: agg[k] for k in ('baseline', 'interval')}
    run = runtime.wandb_init(base.get('wandb_project', 'nanoPE'), 'aggregate', meta, report_dir,
                             group=base['wandb_group'], job_type='aggregate')
    run.log({'aggregate': wandb.Table(columns=AGGREGATE_COLUMNS, data=rows)})
    run.finish()


def provenance():
    """Commit, torch and hardware, for the report."""
    try:
        commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=HERE, capture_output=True,
                                text=True).stdout.strip()
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=HERE,
                               capture_output=True, text=True).stdout.strip()
        commit = (commit + ('+dirty' if dirty else '')) or 'unknown'
    except OSError:
        commit = 'unknown'
    import torch  # here: sweep.py only starts runs, and starts fast without torch
    hw = torch.cuda.get_device_name() if torch.cuda.is_available() else f"{runtime.cpu_name()}, {os.cpu_count()} cores"
    return f"commit {commit}, torch {torch.__version__}, {hw}"


def config_args(path):
    """A config file's settings as train.py --key=value strings, in the file's order."""
    return {k: str(v) for k, v in read_config_file(path).items()}


def train_config(args):
    """The config train.py would run with these --key=value args (its own checks included)."""
    r = subprocess.run([sys.executable, 'train.py'] + [f'--{k}={v}' for k, v in args.items()] + ['--dry_run=True'],
                       cwd=HERE, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sweep: train.py refuses these settings:\n{r.stderr.strip() or r.stdout.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
