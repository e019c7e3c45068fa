"""
The comparison sweep: train every registered scheme the same way (same config, seed,
data and steps), evaluate each (eval.py's full suite; rope also with each run-time
context-extension method), run the passkey probe, and write the report (compare.py).

  python sweep.py                                  # default CPU config -> out-sweep/, out-sweep/report/
  python sweep.py --gpu                            # config/sweep_gpu.py -> out-sweep-gpu/
  python sweep.py --schemes=rope,alibi --max_iters=20 --out=out-tiny   # a quick check
  python sweep.py --key=value                      # any other train.py key, for every run
  python sweep.py --gpu --runs_per_gpu=4           # every GPU here busy, 4 runs side by side on each
  python sweep.py --gpu --launcher=slurm           # one SLURM job a run; run again for their state and the report

Many runs at once (launch.py): each run is handed a slot of this machine, as many at a time as there are slots: on
the CPU --workers runs, one thread each; with GPUs one run per GPU, --runs_per_gpu=K runs side by side on each, or
--gpus_per_run=G GPUs to a run under torchrun. Each child's command line, printed and in its log, names its slot
(its GPUs as CUDA_VISIBLE_DEVICES); OUT/schedule.jsonl records each change of the slots. Under --launcher=slurm each
run is a job (submitit): the command returns after submitting, naming each job and its log; run again, it shows
every run's state, submits only what is missing or failed, and writes the report once all have ended (or waits:
--wait=True). A job stopped by its time limit or a preemption saves and is requeued, and resumes as a resumed run.

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

Sweep options (the rest go to train.py; a config file's sweep keys set the sweep, its other keys every run):
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
  --workers=N         on the CPU: runs at a time, one thread each (default 2 for the task suite; 1 for language
                      modelling, with every thread)
  --gpu_ids=0,1       the GPUs runs go to (default: CUDA_VISIBLE_DEVICES, else all that nvidia-smi lists; '' none)
  --runs_per_gpu=K    runs side by side on each GPU (default 1; small models: see docs/gpu.md's packing)
  --gpus_per_run=G    GPUs per run: locally a torchrun of G ranks; under SLURM per node of the run (SLURM's
                      --gpus-per-node), one task a GPU (default 1; under SLURM 1 with --gpu, else 0)
  --launcher=slurm    each run a SLURM job: --partition, --account, --time (minutes, default 60), --nodes,
                      --cpus_per_task (default 8 with GPUs, 2 without, 1 for the task suite), --ntasks_per_node
                      (default one per GPU), --signal_delay_s (SLURM's signal this long before the time limit,
                      default 90), --max_num_timeout (requeues at a time limit, default 3), --wait=True (poll
                      every --poll_s seconds until none is queued or running, then the report)
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
import json
import os
import signal
import subprocess
import sys
import time

from console import exit_on_ctrl_c

if __name__ == '__main__':  # a Ctrl-C before the runs start (torch loading, the dry run): one line, no traceback
    exit_on_ctrl_c('sweep.py', 'no run had started; run the same command again')
import launch  # noqa: E402
import positional  # noqa: E402
import rope_scaling  # noqa: E402
import runtime  # noqa: E402
import tasks  # noqa: E402
from checkpoint import lock_out_dir  # noqa: E402
from configurator import configure, read_config_file, unknown_names  # noqa: E402
from evaluation import scaling_tag  # noqa: E402
from files import atomic_json, read_json  # noqa: E402
from launch import finished, result  # noqa: E402
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


def plan_line(what, jobs, seeds, kind, slots, out, evals=0):
    """The plan: runs, how many are left, and about how long they take here (none of that under SLURM)."""
    left, secs = estimate(jobs, kind, len(slots) or 1, evals)
    return (f"sweep: {what}: {len(jobs)} runs ({len(jobs) // len(seeds)} x {len(seeds)} seed(s): "
            f"{', '.join(map(str, seeds))}), {left} to do, "
            + (f"about {secs / 60:.0f} min, {launch.describe(slots)}" if slots else "as SLURM jobs") + f" -> {out}/")


LAUNCH_KEYS = dict(launcher='local', gpu_ids=None, runs_per_gpu=1, gpus_per_run=None, partition='', account='',
                   time=60, nodes=1, ntasks_per_node=None, cpus_per_task=None, signal_delay_s=90, max_num_timeout=3,
                   wait=False, poll_s=30.0)
LAUNCH_RULES = dict(launcher=(lambda v: v in ('local', 'slurm'), "'local' or 'slurm'"), runs_per_gpu='>0',
                    gpus_per_run='>=0', time='>0', nodes='>0', ntasks_per_node='>0', cpus_per_task='>0',
                    signal_delay_s='>=0', max_num_timeout='>=0', poll_s='>0',
                    wait=(lambda v: isinstance(v, bool), 'True or False'),
                    gpu_ids=(lambda v: isinstance(v, (int, str, list, tuple)) and not isinstance(v, bool),
                             "GPU numbers: --gpu_ids=0,1 ('' for none, 'auto' for all)"))


def slots_for(sweep, train_args, one_thread):
    """This machine's slots (launch.local_slots) from the sweep's options, or exit naming a choice that cannot be.
    GPUs: --gpu_ids, else CUDA_VISIBLE_DEVICES, else every GPU nvidia-smi lists; none with --device=cpu."""
    if sweep['launcher'] == 'slurm':
        if sweep['runs_per_gpu'] > 1 or sweep['gpu_ids'] not in (None, 'auto'):
            sys.exit("sweep: --runs_per_gpu and --gpu_ids are for --launcher=local; under SLURM each run is a job "
                     "with GPUs of its own (--gpus_per_run)")
        launch.slurm_ready()  # sbatch and submitit, or one line naming what to install
        return []
    ids, device = sweep['gpu_ids'], str(train_args.get('device', 'auto'))
    if device == 'cpu' or ids == '':
        gpus = []
    elif ids is None or ids == 'auto':
        gpus = launch.visible_gpus()
    else:
        gpus = [str(x).strip() for x in (ids.split(',') if isinstance(ids, str) else ids if isinstance(ids, (list,
                tuple)) else [ids])]
    per_run = sweep['gpus_per_run'] or 1
    if gpus and device not in ('auto', 'cuda'):
        sys.exit(f"sweep: --device={device}: sweep.py hands each run its GPU(s) itself (CUDA_VISIBLE_DEVICES); drop "
                 f"--device and choose GPUs with --gpu_ids=0,1")
    if per_run > 1 and sweep['runs_per_gpu'] > 1:
        sys.exit("sweep: --gpus_per_run > 1 with --runs_per_gpu > 1: a run over several GPUs shares none of them; "
                 "choose one")
    if per_run > max(1, len(gpus)):
        sys.exit(f"sweep: --gpus_per_run={per_run} but {len(gpus)} GPU(s) here ({', '.join(gpus) or 'none'}); lower "
                 f"it, or name them with --gpu_ids")
    if len(gpus) % per_run:
        print(f"sweep: GPU(s) {', '.join(gpus[len(gpus) - len(gpus) % per_run:])} left idle: {len(gpus)} GPUs do not "
              f"split into runs of {per_run}", flush=True)
    workers = sweep['workers'] or (2 if sweep['tasks'] else 1)
    if not gpus and (sweep['gpu'] or sweep['runs_per_gpu'] > 1) and device != 'cpu' and ids != '':
        print("sweep: no GPU here: the runs train on the CPU"
              + (", --runs_per_gpu unused" if sweep['runs_per_gpu'] > 1 else ''), flush=True)
    return launch.local_slots(workers, one_thread, gpus, sweep['runs_per_gpu'], per_run)


def slurm_params(sweep, gpu, tasks):
    """submitit's SlurmExecutor parameters (SLURM's names) for one run: --gpu's runs take a GPU and 8 CPUs each,
    CPU runs 2 CPUs (the task suite's single-threaded runs 1); one task per GPU (a DDP rank each)."""
    per_run = sweep['gpus_per_run'] if sweep['gpus_per_run'] is not None else int(gpu)
    return dict(partition=sweep['partition'] or None, account=sweep['account'] or None, time=sweep['time'],
                nodes=sweep['nodes'], ntasks_per_node=sweep['ntasks_per_node'] or max(1, per_run),
                gpus_per_node=per_run or None, cpus_per_task=sweep['cpus_per_task'] or (8 if per_run else 1 if tasks
                                                                                       else 2),
                signal_delay_s=sweep['signal_delay_s'], max_num_timeout=sweep['max_num_timeout'])


def execute(runs, sweep, slots, out, on_done):
    """The claimed runs to their launcher -> (failed [(name, why)], names still queued or running in SLURM)."""
    if sweep['launcher'] == 'slurm':
        def stop(signum, frame):
            raise SystemExit(f"sweep: stopped ({signal.Signals(signum).name}); the jobs go on in SLURM: run the same "
                             f"command again for their state, and the report once all have ended")
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)
        return launch.run_slurm(runs, out, slurm_params(sweep, sweep['gpu'], bool(sweep['tasks'])), sweep['wait'],
                                sweep['poll_s'])
    held = launch.slurm_held(runs)
    for n, why in held:
        print(f"sweep: {n}: {why}", flush=True)
    launch.catch_signals()  # from here on a signal stops the runs, which save first
    return held + launch.run_local([r for r in runs if r['name'] not in dict(held)], slots, out, on_done,
                                   echo=sys.stdout.isatty() and len(slots) == 1), []


def waiting(active, failed):
    """What a SLURM sweep with runs still queued or running says (no report yet) -> its exit code."""
    for n, why in failed:
        print(f"sweep: FAILED {n}: {why}")
    print(f"sweep: {len(active)} run(s) queued or running in SLURM: run the same command again for every run's state "
          f"(it submits only what is missing or failed), and the report once all have ended; or add --wait=True",
          flush=True)
    return 1 if failed else 0


def main(argv):
    sweep = dict(out='', schemes='', scalings=','.join(SCALINGS), scaling_factor=float(EVAL_MULTS), passkey=None,
                 passkey_iters=300, passkey_trials=20, gpu=False, tasks='', randomized=TASK_SUITE['randomized'],
                 workers=None, variants='default', seeds=None, presets='', drope=False, **LAUNCH_KEYS)
    # config files: their sweep keys set the sweep, the rest go to every train.py run; the command line wins
    files = [a for a in argv if not a.startswith('--') and a.endswith('.py')]
    args = [f"--{k}={v!r}" if k in sweep else f"--{k}={v}" for f in files for k, v in read_config_file(f).items()] \
        + [a for a in argv if a not in files]
    ours = [a for a in args if a == '--gpu' or a.split('=', 1)[0][2:] in sweep]
    train_args = dict(a[2:].split('=', 1) for a in args if a not in ours and a.startswith('--') and '=' in a)
    bad = [a for a in args if a not in ours and not (a.startswith('--') and '=' in a)]
    if bad:
        sys.exit(f"bad argument(s) {bad}: use --key=value or a config file (sweep keys: {', '.join(sweep)}; others "
                 f"go to train.py)")
    configure(sweep, ['--gpu=True' if a == '--gpu' else a for a in ours], dict(scaling_factor='>0',
              passkey_iters='>=0', passkey_trials='>0', passkey=(lambda v: isinstance(v, bool), 'True or False'),
              workers='>0', drope=(lambda v: isinstance(v, bool), 'True or False'),
              seeds=(lambda v: seed_list(v, 0) is not None,
                     'a count (--seeds=3) or a list of seeds (--seeds=[1337,7,42])'), **LAUNCH_RULES))
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
    slots = slots_for(sweep, train_args, one_thread=False)
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
                                           for s, a in runs], seeds, 'lm', slots, out, evals)
          + (f"; with {evals} rope_scaling evaluations of rope runs" if evals else ''), flush=True)
    failed, plan, t_start = [], [], time.time()
    tokens = [f"--tokens={base['eval_tokens']}"] if 'eval_tokens' in base else []  # the final eval's budget
    for s, run_args in runs:  # each run's steps: train.py, then DroPE's fit, rope_scaling evals, passkey
        d = os.path.join(out, s)
        args = dict(base, **run_args, out_dir=d)
        why = claim(d, args)
        if why:
            failed.append((s, why))
            print(f"sweep: {why}")
            continue
        steps = [launch.step([sys.executable, 'train.py'] + [f'--{k}={v}' for k, v in args.items()],
                             os.path.join(d, 'eval.json'), 'train.py', int(run_args.get('max_iters', max_iters)),
                             train=True)]
        if s.startswith('drope-'):  # fit c, then evaluate
            steps.append(launch.step([sys.executable, 'drope.py', f'--out_dir={d}'] + tokens,
                                     os.path.join(d, 'eval_drope.json'), 'drope.py'))
        scaled = scalings if run_args['pos_encoding'] in SCALED_SCHEMES and 'wandb_run_name' not in run_args else []
        steps += [launch.step([sys.executable, 'eval.py', f'--out_dir={d}', f'--rope_scaling={sc!r}'] + tokens,
                              os.path.join(d, f'eval_{scaling_tag(sc)}.json'), f'eval.py with {scaling_tag(sc)}')
                  for sc in scaled]
        for sc in [None] + scaled if sweep['passkey'] else []:
            tag = scaling_tag(sc)
            steps.append(launch.step([sys.executable, 'passkey.py', f"--out_dir={d}",
                                      f"--iters={sweep['passkey_iters']}", f"--trials={sweep['passkey_trials']}"]
                                     + ([f'--rope_scaling={sc!r}'] if sc else []),
                                     os.path.join(d, 'passkey' + (f'_{tag}' if tag else '') + '.json'),
                                     f'passkey.py {tag}'.strip()))
        plan.append(dict(name=s, dir=d, steps=steps, after=f"rope-s{run_args['seed']}" if s.startswith('drope-')
                         else None))

    def on_done(run, whys):
        if not whys:
            print(f"sweep: {run['name']} done in {time.time() - run['t0']:.0f}s ({time.time() - t_start:.0f}s so far)",
                  flush=True)
    fails, active = execute(plan, sweep, slots, out, on_done)
    failed += fails
    if active:
        return waiting(active, failed)
    done = [os.path.join(out, s) for s, a in runs if finished(read_result(os.path.join(out, s, 'eval.json'))[0],
                                                              int(a.get('max_iters', max_iters)))]
    if done:
        notes = (f"Sweep: `python sweep.py {' '.join(argv)}` ({provenance()}); train args {base}; rope_scaling "
                 f"variants at eval time with factor {factor:g} and original_max_len {L}; runs "
                 + (launch.describe(slots) if slots else 'as SLURM jobs') + ".\n")
        print(f"sweep: report -> {make_report(done, os.path.join(out, 'report'), notes=notes)} "
              f"({time.time() - t_start:.0f}s in all)")
        log_aggregate(os.path.join(out, 'report'), base)
    for s, why in failed:
        print(f"sweep: FAILED {s}: {why}")
    launch.stop_if_asked()
    return 1 if failed else 0


def scheme_list(value):
    """--schemes: 'a,b', or 'all' for every registered scheme."""
    return sorted(positional.REGISTRY) if value == 'all' else [s for s in value.split(',') if s]


def task_suite(sweep, train_args, argv):
    """Train every task x scheme (x randomized positions for some schemes) from scratch, as many runs at a time as
    the machine has slots (--workers on the CPU, one thread each: tiny models gain nothing from a second thread), or
    as SLURM jobs, resumable as the LM sweep; then report.make_task_report.
    Each run: out/<task>/<scheme>[-randomized]-s<seed>."""
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
    slots = slots_for(sweep, train_args, one_thread=True)
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
    print(plan_line('task suite', jobs, seeds, 'task', slots, out), flush=True)
    t_start, failed, plan, ended = time.time(), [], [], []
    pct = lambda v: 'unaddressable' if v is None else f"{v:.2f}"  # noqa: E731 (None: a finite position table)
    for args in jobs:
        d = args['out_dir']
        why = claim(d, args)
        if why:
            failed.append((d, why))
            continue
        plan.append(dict(name=os.path.relpath(d, out), dir=d, steps=[launch.step(
            [sys.executable, 'train.py'] + [f'--{k}={v}' for k, v in args.items()], os.path.join(d, 'eval.json'),
            'train.py', int(args['max_iters']), train=True)]))

    def on_done(run, whys):
        ended.append(run['name'])
        if not run.get('ran'):  # finished before this invocation
            return
        res = read_result(os.path.join(run['dir'], 'eval.json'))[0] or {}
        print(f"sweep: {run['name']}: " + (f"FAILED: {whys[0]}" if whys else f"exact match "
              f"{pct(res.get('exact_id'))} in distribution, {pct(res.get('exact_ood'))} beyond")
              + f" ({len(ended)}/{len(jobs)} runs, {time.time() - t_start:.0f}s since the suite started)", flush=True)
    fails, active = execute(plan, sweep, slots, out, on_done)
    failed += [(os.path.join(out, n), why) for n, why in fails]
    if active:
        return waiting(active, failed)
    own_iters = {a['task']: a['max_iters'] for a in jobs if a['max_iters'] != base['max_iters']}
    notes = (f"Task suite: `python sweep.py {' '.join(argv)}` ({provenance()}); train args {base}"
             + (f" (max_iters per task: {own_iters})" if own_iters else '') + "; runs "
             + (launch.describe(slots) if slots else 'as SLURM jobs') + f"; {time.time() - t_start:.0f}s for this "
             f"invocation.\n")
    done = [a['out_dir'] for a in jobs if finished(read_result(os.path.join(a['out_dir'], 'eval.json'))[0],
                                                   a['max_iters'])]
    if done:
        print(f"sweep: report -> {make_task_report(done, os.path.join(out, 'report'), notes=notes)} "
              f"({time.time() - t_start:.0f}s in all)")
        log_aggregate(os.path.join(out, 'report'), base)
    for d, why in failed:
        print(f"sweep: FAILED {d}: {why}")
    launch.stop_if_asked()
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
