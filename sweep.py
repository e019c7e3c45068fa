"""
The comparison sweep: train every registered scheme the same way (same config, seed,
data and steps), evaluate each (eval.py's full suite; rope also with each run-time
context-extension method), run the passkey probe, and write the report (compare.py).

  python sweep.py                                  # default CPU config -> out-sweep/, out-sweep/report/
  python sweep.py --gpu                            # the GPU-sized config -> out-sweep-gpu/
  python sweep.py --schemes=rope,alibi --max_iters=20 --out=out-tiny   # a quick check
  python sweep.py --key=value                      # any other train.py key, for every run

Resumable: a run whose eval.json is at max_iters is not trained again, a half-trained run
resumes from its checkpoint (init_from='resume'), and each eval/passkey JSON that
exists is kept. Re-running the same command after an interruption finishes the sweep.
A run that fails is reported and skipped; the report covers the runs that finished.

The algorithmic task suite (tasks.py; issue 15): every task x scheme x position option,
trained from scratch, exact match by length up to 4x the training sizes, heat maps:
  python sweep.py --tasks=default                  # the default suite -> out-tasks/, out-tasks/report/
  python sweep.py --tasks=copy,reverse --schemes=rope,alibi --randomized=rope --workers=2

Sweep options (the rest go to train.py):
  --out=DIR           where runs go (default out-sweep, or out-sweep-gpu with --gpu)
  --schemes=a,b       default: every scheme in positional.REGISTRY
  --scalings=a,b      run-time methods evaluated on rope (default: all of SCALINGS: the
                      rope_scaling types at factor s, and fixed recipes for yarn without
                      mscale, longrope, Self-Extend, ReRoPE, leaky ReRoPE; see scaling_dicts)
  --scaling_factor=F  their scale factor (default: the longest eval length / L = 16)
  --variants=a,b      training-time variants of rope run too (default: all of VARIANTS in a full
                      sweep, none when --schemes is given; 'default' all; '' none)
  --tasks=a,b         the task suite instead of language modelling ('default': TASK_SUITE below)
  --randomized=a,b    task suite: schemes also trained with randomized positions (default rope,learned)
  --workers=N         task suite: runs at a time, one CPU thread each (default 2)
  --passkey=True      also run the passkey probe on every run (default: on with --gpu,
                      off on the CPU config, whose 0.8M-parameter model does not learn
                      to retrieve in a short fine-tune: see README, Passkey retrieval);
                      --passkey_iters=N (default 300), --passkey_trials=N prompts per
                      length x depth cell (default 20)
"""
import json
import os
import subprocess
import sys
import time

import positional
from compare import load_json

HERE = os.path.dirname(os.path.abspath(__file__))
SCALINGS = ['linear', 'ntk', 'dynamic', 'yarn', 'llama3', 'yarn_nomscale', 'longrope', 'self_extend', 'rerope',
            'leaky_rerope']
# training-time variants of rope run beside the schemes (name -> train.py args): p-RoPE (arXiv 2410.06205),
# NoPE in every 4th layer (RNoPE, arXiv 2501.18795), log-n scaling (arXiv 2202.12172), SSMax (arXiv 2501.19399)
VARIANTS = {'rope-prope': {'pos_encoding': 'rope', 'pos_options': "{'p_rope': 0.25}"},
            'rope-nope4': {'pos_encoding': 'rope', 'nope_layers': '4'},
            'rope-logn': {'pos_encoding': 'rope', 'attn_scaling': "{'type': 'logn'}"},
            'rope-ssmax': {'pos_encoding': 'rope', 'attn_scaling': "{'type': 'ssmax'}"}}
SCALED_SCHEMES = ['rope']  # schemes evaluated with each rope_scaling type
EVAL_MULTS = 16            # eval.py's longest length, in units of L
# the task suite: tasks, schemes, and the small model every task run trains (each task's sizes
# and lengths come from tasks.DEFAULT_N); single-threaded runs, two at a time on 2 cores
TASK_SUITE = dict(tasks='copy,reverse,parity,sort,stack,passkey', schemes='none,learned,sinusoidal,rope,alibi,t5',
                  randomized='rope,learned')
TASK_TRAIN = dict(n_layer=3, n_head=4, n_embd=64, batch_size=64, max_iters=1500, eval_interval=500,
                  log_interval=100, learning_rate=3e-3, min_lr=3e-4, warmup_iters=100, compile=False)
# tasks that need more steps: at 1500, stack's best scheme reached 0.94 exact match in distribution
TASK_ITERS = {'stack': 3000}
# nanoGPT's shakespeare_char GPU model (6 x 384, 6 heads) at L = 256: 16L = 4096 on a GPU
GPU = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, max_iters=5000, eval_interval=500,
           learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, dropout=0.1)


def scaling_dicts(names, factor, L, rot_dim=32):
    """rope_scaling dicts for these names: the scaling types with factor s = `factor` (and
    original_max_len L where they take it), and the fixed recipes below for the others."""
    keys = positional.ROPE_SCALING_KEYS  # type -> the keys it takes
    s = factor
    yarn = {'type': 'yarn', 'factor': s, 'original_max_len': L}
    # LongRoPE's factors come from its search (not implemented): here YaRN's per-pair ratios at s, as the
    # long list (the search's starting point in arXiv 2402.13753), plain RoPE up to L
    ratio = (positional.rope_frequencies(rot_dim)[0] / positional.rope_frequencies(rot_dim, scaling=yarn)[0]).tolist()
    recipes = {
        'yarn_nomscale': {**yarn, 'mscale': 1.0, 'mscale_all_dim': 1.0},  # DeepSeek-V3's form: attention factor 1
        'longrope': {'type': 'longrope', 'short_factor': [1.0] * (rot_dim // 2), 'long_factor': ratio,
                     'original_max_len': L, 'factor': s},
        'self_extend': {'type': 'self_extend', 'window': L // 4, 'group': int(s) * 2},  # distances <= L/4 + 16L/2s
        'rerope': {'type': 'rerope', 'window': L // 2},
        'leaky_rerope': {'type': 'leaky_rerope', 'window': L // 2, 'k': s}}
    out = []
    for t in names:
        if t in recipes:
            out.append(recipes[t])
        elif t in keys:
            out.append({'type': t, 'factor': s, **({'original_max_len': L} if 'original_max_len' in keys[t] else {})})
        else:
            print(f"sweep: skipping rope_scaling {t!r}: positional.py does not implement it")
    return out


def run(cmd, log_path):
    """Run a command, echoing its output and appending it to log_path -> exit code."""
    print('$ ' + ' '.join(cmd), flush=True)
    with open(log_path, 'a') as log:
        log.write('$ ' + ' '.join(cmd) + '\n')
        p = subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in p.stdout:
            sys.stdout.write(line)
            log.write(line)
        return p.wait()


def main(argv):
    from configurator import configure
    sweep = dict(out='', schemes='', scalings=','.join(SCALINGS), scaling_factor=float(EVAL_MULTS), passkey=None,
                 passkey_iters=300, passkey_trials=20, gpu=False, tasks='', randomized=TASK_SUITE['randomized'],
                 workers=2, variants='default')
    ours = [a for a in argv if a == '--gpu' or a.split('=', 1)[0][2:] in sweep]
    train_args = dict(a[2:].split('=', 1) for a in argv if a not in ours and a.startswith('--') and '=' in a)
    bad = [a for a in argv if a not in ours and not (a.startswith('--') and '=' in a)]
    if bad:
        sys.exit(f"bad argument(s) {bad}: use --key=value (sweep keys: {', '.join(sweep)}; others go to train.py)")
    configure(sweep, ['--gpu=True' if a == '--gpu' else a for a in ours], dict(scaling_factor='>0', passkey_iters='>=0',
              passkey_trials='>0', passkey=(lambda v: isinstance(v, bool), 'True or False'), workers='>0'))
    if sweep['tasks']:
        return task_suite(sweep, train_args, argv)
    if sweep['passkey'] is None:
        sweep['passkey'] = sweep['gpu']
    if 'pos_encoding' in train_args or 'out_dir' in train_args:
        sys.exit("sweep.py sets pos_encoding and out_dir itself; choose schemes with --schemes and the folder with --out")
    out = os.path.abspath(sweep['out'] or ('out-sweep-gpu' if sweep['gpu'] else 'out-sweep'))
    schemes = sweep['schemes'].split(',') if sweep['schemes'] else sorted(positional.REGISTRY)
    bad = [s for s in schemes if s not in positional.REGISTRY]
    if bad:
        sys.exit(f"unknown scheme(s) {bad}; registered: {', '.join(sorted(positional.REGISTRY))}")
    base = {k: str(v) for k, v in GPU.items()} if sweep['gpu'] else {}
    base.update({'wandb_log': 'False', 'seed': '1337'})
    base.update(train_args)  # the user's keys win
    from eval import scaling_tag
    # train.py resolves (and checks) the settings every run will use: one dry run, no training
    cfg = train_config(base)
    max_iters, L = cfg['max_iters'], cfg['block_size']
    factor = sweep['scaling_factor']
    scalings = scaling_dicts([t for t in sweep['scalings'].split(',') if t], factor, L)
    os.makedirs(out, exist_ok=True)
    print(f"sweep: {len(schemes)} schemes ({', '.join(schemes)}), train args {base}, -> {out}/; rope_scaling "
          f"at eval: {', '.join(scaling_tag(sc) for sc in scalings) or 'none'} (factor {factor:g}); passkey {'on' if sweep['passkey'] else 'off'}")
    # 'default': every variant in a full sweep; with --schemes, only the schemes asked for
    chosen = '' if sweep['variants'] == 'default' and sweep['schemes'] else sweep['variants']
    names = list(VARIANTS) if chosen == 'default' else [v for v in chosen.split(',') if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {unknown}; variants: {', '.join(VARIANTS)} (or 'default' for all)")
    variants = {v: VARIANTS[v] for v in names}
    runs = [(s, {'pos_encoding': s}) for s in schemes] + [(v, {**a, 'wandb_run_name': v}) for v, a in variants.items()]
    failed, t_start = [], time.time()
    for s, run_args in runs:
        d = os.path.join(out, s)
        os.makedirs(d, exist_ok=True)
        log = os.path.join(d, 'sweep.log')
        args = dict(base, **run_args, out_dir=d)
        saved = load_json(os.path.join(d, 'sweep_args.json'))
        if saved is not None and saved != args:
            failed.append((s, f"{d} holds a run with other settings ({saved}); use another --out or delete it"))
            print(f"sweep: {failed[-1][1]}")
            continue
        with open(os.path.join(d, 'sweep_args.json'), 'w') as f:
            json.dump(args, f)
        t0 = time.time()
        res = load_json(os.path.join(d, 'eval.json'))
        if res is None or res.get('iter') != max_iters:
            resume = ['--init_from=resume'] if os.path.exists(os.path.join(d, 'ckpt.pt')) else []
            if run([sys.executable, 'train.py'] + [f'--{k}={v}' for k, v in args.items()] + resume, log) != 0:
                failed.append((s, f'training failed, see {log}'))
                continue
        variants = [None] + (scalings if s in SCALED_SCHEMES else [])
        for sc in variants[1:]:
            if not os.path.exists(os.path.join(d, f'eval_{scaling_tag(sc)}.json')):
                cmd = [sys.executable, 'eval.py', f'--out_dir={d}', f'--rope_scaling={sc!r}']
                if 'eval_tokens' in base:  # the same budget as the final eval in train.py
                    cmd.append(f"--tokens={base['eval_tokens']}")
                if run(cmd, log) != 0:
                    failed.append((s, f'eval with {sc} failed, see {log}'))
        if sweep['passkey']:
            for sc in variants:
                tag = scaling_tag(sc)
                if not os.path.exists(os.path.join(d, 'passkey' + (f'_{tag}' if tag else '') + '.json')):
                    cmd = [sys.executable, 'passkey.py', f"--out_dir={d}", f"--iters={sweep['passkey_iters']}",
                           f"--trials={sweep['passkey_trials']}"]
                    if run(cmd + ([f'--rope_scaling={sc!r}'] if sc else []), log) != 0:
                        failed.append((s, f'passkey {tag} failed, see {log}'))
        print(f"sweep: {s} done in {time.time() - t0:.0f}s ({time.time() - t_start:.0f}s so far)", flush=True)
    from compare import make_report
    done = [os.path.join(out, s) for s, _ in runs if os.path.exists(os.path.join(out, s, 'eval.json'))]
    if done:
        notes = (f"Sweep: `python sweep.py {' '.join(argv)}` ({provenance()}); train args {base}; rope_scaling "
                 f"variants at eval time with factor {factor:g} and original_max_len {L}.\n")
        print(f"sweep: report -> {make_report(done, os.path.join(out, 'report'), notes=notes)} "
              f"({time.time() - t_start:.0f}s in all)")
    for s, why in failed:
        print(f"sweep: FAILED {s}: {why}")
    return 1 if failed else 0


def task_suite(sweep, train_args, argv):
    """Train every task x scheme (x randomized positions for some schemes) from scratch, `workers`
    runs at a time (one thread each: tiny models gain nothing from a second thread), resumable as
    the LM sweep; then compare.make_task_report. Each run: out/<task>/<scheme>[-randomized]."""
    import tasks
    from concurrent.futures import ThreadPoolExecutor
    names = TASK_SUITE['tasks'] if sweep['tasks'] == 'default' else sweep['tasks']
    names = names.split(',')
    schemes = (sweep['schemes'] or TASK_SUITE['schemes']).split(',')
    bad = [t for t in names if t not in tasks.TASKS] + [s for s in schemes if s not in positional.REGISTRY]
    if bad:
        sys.exit(f"unknown task(s)/scheme(s) {bad}; tasks: {', '.join(tasks.TASKS)}; schemes: "
                 f"{', '.join(sorted(positional.REGISTRY))}")
    randomized = [s for s in sweep['randomized'].split(',') if s in schemes]
    out = os.path.abspath(sweep['out'] or 'out-tasks')
    base = {k: str(v) for k, v in TASK_TRAIN.items()}
    base.update({'wandb_log': 'False', 'seed': '1337'})
    base.update(train_args)
    train_config({**base, 'task': names[0]})  # checks the settings once
    jobs = []
    for t in names:
        for s in schemes:
            for pos in ['plain'] + (['randomized'] if s in randomized else []):
                iters = {} if 'max_iters' in train_args or t not in TASK_ITERS else {'max_iters': str(TASK_ITERS[t])}
                args = dict(base, **iters, task=t, pos_encoding=s, positions=pos,
                            out_dir=os.path.join(out, t, s + ('' if pos == 'plain' else f'-{pos}')))
                if pos == 'randomized' and positional.REGISTRY[s].max_len_of is not \
                        positional.PositionalEncoding.max_len_of:  # a finite table must hold pos_max positions
                    args['pos_options'] = repr({'max_len': 4 * tasks.max_len(t, 4 * tasks.DEFAULT_N[t])})
                jobs.append(args)
    print(f"sweep: task suite, {len(jobs)} runs ({len(names)} tasks x {len(schemes)} schemes, randomized positions "
          f"for {', '.join(randomized) or 'none'}), {sweep['workers']} at a time -> {out}/", flush=True)
    t_start, failed = time.time(), []

    def one(args):
        d = args['out_dir']
        os.makedirs(d, exist_ok=True)
        saved = load_json(os.path.join(d, 'sweep_args.json'))
        if saved is not None and saved != args:
            return f"{d} holds a run with other settings; use another --out or delete it"
        with open(os.path.join(d, 'sweep_args.json'), 'w') as f:
            json.dump(args, f)
        res = load_json(os.path.join(d, 'eval.json'))
        if res is not None and res.get('iter') == int(args['max_iters']) and res.get('complete', True):
            return None
        resume = ['--init_from=resume'] if os.path.exists(os.path.join(d, 'ckpt.pt')) else []
        cmd = [sys.executable, 'train.py'] + [f'--{k}={v}' for k, v in args.items() if k != 'out_dir'] + \
              [f'--out_dir={d}'] + resume
        with open(os.path.join(d, 'sweep.log'), 'a') as log:
            rc = subprocess.run(cmd, cwd=HERE, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, OMP_NUM_THREADS='1')).returncode
        res = load_json(os.path.join(d, 'eval.json')) or {}
        pct = lambda v: 'unaddressable' if v is None else f"{v:.2f}"  # noqa: E731 (None: a finite position table)
        print(f"sweep: {os.path.relpath(d, out)}: " + (f"exact match {pct(res.get('exact_id'))} in distribution, "
              f"{pct(res.get('exact_ood'))} beyond" if rc == 0 else f"FAILED (see {d}/sweep.log)")
              + f" ({time.time() - t_start:.0f}s since the suite started)", flush=True)
        return None if rc == 0 else f"training failed, see {d}/sweep.log"

    from tqdm import tqdm
    with ThreadPoolExecutor(sweep['workers']) as pool:
        for args, why in tqdm(zip(jobs, pool.map(one, jobs)), total=len(jobs), desc='task suite', unit='run',
                              mininterval=0.2 if sys.stderr.isatty() else 60):
            if why:
                failed.append((args['out_dir'], why))
    from compare import make_task_report
    own_iters = {a['task']: a['max_iters'] for a in jobs if a['max_iters'] != base['max_iters']}
    notes = (f"Task suite: `python sweep.py {' '.join(argv)}` ({provenance()}); train args {base}"
             + (f" (max_iters per task: {own_iters})" if own_iters else '') + f"; {sweep['workers']} single-threaded "
             f"runs at a time; {time.time() - t_start:.0f}s for this invocation.\n")
    done = [a['out_dir'] for a in jobs if os.path.exists(os.path.join(a['out_dir'], 'eval.json'))]
    if done:
        print(f"sweep: report -> {make_task_report(done, os.path.join(out, 'report'), notes=notes)} "
              f"({time.time() - t_start:.0f}s in all)")
    for d, why in failed:
        print(f"sweep: FAILED {d}: {why}")
    return 1 if failed else 0


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
    import torch
    if torch.cuda.is_available():
        hw = torch.cuda.get_device_name()
    else:
        cpu = next((line.split(':', 1)[1].strip() for line in open('/proc/cpuinfo') if line.startswith('model name')),
                   None) if os.path.exists('/proc/cpuinfo') else None
        hw = f"{cpu or 'CPU'}, {os.cpu_count()} cores"
    return f"commit {commit}, torch {torch.__version__}, {hw}"


def train_config(args):
    """The config train.py would run with these --key=value args (its own checks included)."""
    r = subprocess.run([sys.executable, 'train.py'] + [f'--{k}={v}' for k, v in args.items()] + ['--dry_run=True'],
                       cwd=HERE, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"sweep: train.py refuses these settings:\n{r.stderr.strip() or r.stdout.strip()}")
    return json.loads(r.stdout.strip().splitlines()[-1])


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
