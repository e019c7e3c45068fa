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

Sweep options (the rest go to train.py):
  --out=DIR           where runs go (default out-sweep, or out-sweep-gpu with --gpu)
  --schemes=a,b       default: every scheme in positional.REGISTRY
  --scalings=a,b      rope_scaling types evaluated on rope at eval time (default: all
                      of linear, ntk, dynamic, yarn, llama3 that positional.py knows)
  --scaling_factor=F  their scale factor (default: the longest eval length / L = 16)
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

HERE = os.path.dirname(os.path.abspath(__file__))
SCALINGS = ['linear', 'ntk', 'dynamic', 'yarn', 'llama3']
SCALED_SCHEMES = ['rope']  # schemes evaluated with each rope_scaling type
EVAL_MULTS = 16            # eval.py's longest length, in units of L
# nanoGPT's shakespeare_char GPU model (6 x 384, 6 heads) at L = 256: 16L = 4096 on a GPU
GPU = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, max_iters=5000, eval_interval=500,
           learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, dropout=0.1)


def scaling_dicts(names, factor, L):
    """rope_scaling dicts for the types positional.py implements (the others are skipped,
    with a note); original_max_len only for the types that take it."""
    keys = getattr(positional, 'ROPE_SCALING_KEYS', {})  # type -> the keys it takes
    out = []
    for t in names:
        if t not in keys:
            print(f"sweep: skipping rope_scaling type {t!r}: positional.py does not implement it")
            continue
        out.append({'type': t, 'factor': factor, **({'original_max_len': L} if 'original_max_len' in keys[t] else {})})
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


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(argv):
    from configurator import configure
    sweep = dict(out='', schemes='', scalings=','.join(SCALINGS), scaling_factor=float(EVAL_MULTS), passkey=None,
                 passkey_iters=300, passkey_trials=20, gpu=False)
    ours = [a for a in argv if a == '--gpu' or a.split('=', 1)[0][2:] in sweep]
    train_args = dict(a[2:].split('=', 1) for a in argv if a not in ours and a.startswith('--') and '=' in a)
    bad = [a for a in argv if a not in ours and not (a.startswith('--') and '=' in a)]
    if bad:
        sys.exit(f"bad argument(s) {bad}: use --key=value (sweep keys: {', '.join(sweep)}; others go to train.py)")
    configure(sweep, ['--gpu=True' if a == '--gpu' else a for a in ours], dict(scaling_factor='>0', passkey_iters='>=0',
              passkey_trials='>0', passkey=(lambda v: isinstance(v, bool), 'True or False')))
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
    # train.py resolves (and checks) the settings every run will use: one dry run, no training
    cfg = train_config(base)
    max_iters, L = cfg['max_iters'], cfg['block_size']
    factor = sweep['scaling_factor']
    scalings = scaling_dicts([t for t in sweep['scalings'].split(',') if t], factor, L)
    os.makedirs(out, exist_ok=True)
    print(f"sweep: {len(schemes)} schemes ({', '.join(schemes)}), train args {base}, -> {out}/; rope_scaling "
          f"at eval: {', '.join(sc['type'] for sc in scalings) or 'none'} (factor {factor:g}); passkey {'on' if sweep['passkey'] else 'off'}")
    failed, t_start = [], time.time()
    for s in schemes:
        d = os.path.join(out, s)
        os.makedirs(d, exist_ok=True)
        log = os.path.join(d, 'sweep.log')
        args = dict(base, pos_encoding=s, out_dir=d)
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
        from eval import scaling_tag
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
    done = [os.path.join(out, s) for s in schemes if os.path.exists(os.path.join(out, s, 'eval.json'))]
    if done:
        notes = (f"Sweep: `python sweep.py {' '.join(argv)}` ({provenance()}); train args {base}; rope_scaling "
                 f"variants at eval time with factor {factor:g} and original_max_len {L}.\n")
        print(f"sweep: report -> {make_report(done, os.path.join(out, 'report'), notes=notes)} "
              f"({time.time() - t_start:.0f}s in all)")
    for s, why in failed:
        print(f"sweep: FAILED {s}: {why}")
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
