"""
Runs per hour of config/sweep_gpu.py with N runs side by side on one GPU, packed as sweep.py --runs_per_gpu=N packs
them (launch.local_slots: the same CUDA_VISIBLE_DEVICES, threads and cores for each run): plain processes (the GPU
time-sliced between them), then under NVIDIA MPS where its daemon starts. One measurement: N train.py runs of the
config, --iters iterations each on synthetic characters (65 of them, as Shakespeare's), timed from their own
metrics.jsonl (the median ms per iteration after the first log interval, which holds the compile) and their wall
time. A run of the config is projected as its wall time plus the iterations it did not train at that pace:
runs_per_hour = N x 3600 / (mean wall + (max_iters - iters) x ms per iteration); steady_runs_per_hour leaves
start-up out: N x 3600 / (max_iters x ms per iteration). The periodic and final evaluations and the passkey probe
of a sweep's run are left out of both. A warm-up run first fills the compile cache (its wall time: a cold start).
The JSON at --json is rewritten after every measurement, and one already there is not taken again, so that a lease
cut short keeps what it measured and the next lease goes on. The seeds of one scheme in one process (torch.func)
are not built: the JSON says so, and nothing is measured for them.

  python tools/packing.py --json=out-lease/packing.json      # on a GPU: 1, 2, 4, 8 runs; processes, then MPS
  python tools/packing.py --json=/tmp/packing.json --device=cpu --counts=1,2 --iters=40 --log_interval=10 \\
      --n_layer=1 --n_head=2 --n_embd=32 --block_size=32 --batch_size=4 --compile=False     # a check on the CPU
Options: json, counts, modes (procs, mps), iters, log_interval, budget (s: no measurement started past it), limit (s
a measurement), device ('cpu': no GPU), data, work (folders); any other --key=value goes to every train.py run.
"""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
import launch  # noqa: E402
from configurator import options, read_config_file  # noqa: E402
from console import exit_on_ctrl_c  # noqa: E402
from files import atomic_json, read_json  # noqa: E402

CONFIG = os.path.join(HERE, 'config', 'sweep_gpu.py')
NOT_BUILT = {'seeds_in_one_process': "not built: the seeds of one scheme as one model of stacked parameters "
                                     "(torch.func.vmap) is not a route of train.py; nothing measured"}


def synthetic_chars(folder, n=2_000_000):
    """Random characters over 65 symbols (Shakespeare's vocabulary size), prepared as the char corpora are."""
    if os.path.exists(os.path.join(folder, 'val.bin')):
        return folder
    import numpy as np
    sys.path.insert(0, os.path.join(HERE, 'data', 'shakespeare_char'))
    from prepare import prepare
    symbols = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n.,;:!?'-&"[:65]))
    prepare(''.join(np.random.default_rng(0).choice(symbols, n)), folder)
    return folder


def env_line():
    """What ran: the GPU, torch, the commit."""
    r = subprocess.run([sys.executable, '-c', "import torch; print(f'torch {torch.__version__}, ' + "
                        "(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA'))"],
                       capture_output=True, text=True, cwd=HERE)
    commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True, cwd=HERE)
    return dict(machine=r.stdout.strip(), commit=commit.stdout.strip(), cpus=os.cpu_count(),
                date=time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()))


def start_mps(folder):
    """NVIDIA MPS's control daemon with its pipe and log folders under `folder` -> (the env its clients need, None),
    or (None, why not)."""
    if shutil.which('nvidia-cuda-mps-control') is None:
        return None, 'nvidia-cuda-mps-control not on PATH'
    env = dict(CUDA_MPS_PIPE_DIRECTORY=os.path.join(folder, 'pipe'), CUDA_MPS_LOG_DIRECTORY=os.path.join(folder, 'log'))
    for d in env.values():
        os.makedirs(d, exist_ok=True)
    r = subprocess.run(['nvidia-cuda-mps-control', '-d'], env=dict(os.environ, **env), capture_output=True, text=True)
    if r.returncode != 0:
        return None, f"nvidia-cuda-mps-control -d failed: {(r.stderr or r.stdout).strip()[:300]}"
    return env, None


def stop_mps(env):
    subprocess.run(['nvidia-cuda-mps-control'], input='quit\n', env=dict(os.environ, **env), capture_output=True,
                   text=True, timeout=60)


def measure(n, iters, extra_env, o, train_args, data, folder, limit):
    """n runs of the config side by side in n slots of one GPU (or of the CPU), each to `iters` iterations, with
    extra_env (MPS's; None: a warm-up, nothing projected) -> the measurement's dict; runs still going after `limit`
    seconds are stopped and the measurement says so."""
    gpus = ['0'] if o.device != 'cpu' else []
    slots = launch.local_slots(workers=n, one_thread=True, gpu_ids=gpus, runs_per_gpu=n)
    procs, t0, walls, stopped = [], time.time(), [], False
    shutil.rmtree(folder, ignore_errors=True)
    try:
        for i, slot in enumerate(slots):
            d = os.path.join(folder, f'run{i}')
            os.makedirs(d)
            cmd = [sys.executable, 'train.py', CONFIG, f'--data_dir={data}', f'--out_dir={d}', f'--max_iters={iters}',
                   f'--eval_interval={10 * iters}', '--eval_tokens=4096', '--eval_mults=[1]', '--final_eval=False',
                   '--wandb_log=False', f'--log_interval={o.log_interval}', f'--seed={1337 + i}'] + train_args
            env = dict(slot['env'], **(extra_env or {}), **({} if gpus else {'CUDA_VISIBLE_DEVICES': ''}))
            with open(os.path.join(d, 'log.txt'), 'w') as log:  # (PDEATHSIG: none outlives a stopped measurement)
                procs.append((d, launch.spawn(cmd, log, env, preexec_fn=lambda c=slot['cores'], me=os.getpid():
                                                      launch.in_child(me, launch.PRCTL, c)), time.time()))
        for d, p, t in procs:
            try:
                p.wait(timeout=max(1.0, limit - (time.time() - t0)))
            except subprocess.TimeoutExpired:
                stopped = True
                p.terminate()
                p.wait(timeout=60)
            walls.append(time.time() - t)
    finally:  # a lease's timeout (SIGINT) or an error: no run left behind on the GPU
        for _, p, _ in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    runs = []
    for (d, p, _), wall in zip(procs, walls):
        try:
            ms = [json.loads(line)['ms_per_iter'] for line in open(os.path.join(d, 'metrics.jsonl'))
                  if 'ms_per_iter' in line]
        except OSError:
            ms = []
        runs.append(dict(exit=p.returncode, wall_s=round(wall, 2), ms_per_iter=round(statistics.median(ms[1:]), 3)
                         if len(ms) > 1 else None, log_lines=len(ms)))
    m = dict(n=n, iters=iters, runs=runs, wall_s=round(time.time() - t0, 2), stopped=stopped)
    ms = [r['ms_per_iter'] for r in runs if r['ms_per_iter']]
    if len(ms) == n and not stopped and all(r['exit'] == 0 for r in runs) and extra_env is not None:
        max_iters = int(read_config_file(CONFIG)['max_iters'])
        per = statistics.mean(ms)
        run_s = statistics.mean(r['wall_s'] for r in runs) + (max_iters - iters) * per / 1000
        m.update(ms_per_iter=round(per, 3), max_iters=max_iters, projected_run_s=round(run_s, 1),
                 runs_per_hour=round(n * 3600 / run_s, 2),
                 steady_runs_per_hour=round(n * 3600 / (max_iters * per / 1000), 2))
    return m


def main(argv):
    exit_on_ctrl_c('packing.py', 'run it again: it goes on from its JSON')  # (a lease's timeout sends SIGINT)
    keys = dict(json='packing.json', counts=[1, 2, 4, 8], modes='procs,mps', iters=300, log_interval=50, budget=0.0,
                limit=240.0, device='auto', data='/tmp/packing-data', work='/tmp/packing')
    ours = [a for a in argv if a.split('=', 1)[0][2:] in keys]
    train_args = [a for a in argv if a not in ours]
    o = options(keys, ours, dict(iters='>0', log_interval='>0', budget='>=0', limit='>0', counts=(
        lambda v: all(isinstance(c, int) and c > 0 for c in v), 'run counts: --counts=1,2,4,8')))
    counts = [int(c) for c in o.counts]
    modes = [m for m in str(o.modes).split(',') if m]
    bad = [m for m in modes if m not in ('procs', 'mps')]
    if bad or o.log_interval >= o.iters:
        sys.exit(f"packing: --modes takes procs and mps (not {bad})" if bad else
                 f"packing: --log_interval={o.log_interval} must be below --iters={o.iters} (ms per iteration comes "
                 f"from the log intervals after the first)")
    t_start, last = time.time(), 20.0
    old, why = read_json(o.json)
    res = old if isinstance(old, dict) and old.get('config') == os.path.relpath(CONFIG, HERE) else dict(
        config=os.path.relpath(CONFIG, HERE), env=env_line(), measurements=[], skipped={}, **NOT_BUILT)
    if why:
        print(f"packing: {o.json} is {why}; starting a new one", flush=True)
    data = synthetic_chars(o.data)
    have = {(m['mode'], m['n']) for m in res['measurements']}
    if ('warmup', 1) not in have:  # the compile cache filled once (the sweep's later runs find it too)
        print("packing: warm-up run (compile)", flush=True)
        res['measurements'].append(dict(mode='warmup', **measure(1, 2 * o.log_interval, None, o, train_args, data,
                                                                 os.path.join(o.work, 'warmup'), o.limit)))
        atomic_json(res, o.json)
    for mode in modes:
        todo = [n for n in counts if (mode, n) not in have]
        if not todo:
            continue
        extra, why = ({}, None) if mode == 'procs' else start_mps(os.path.join(o.work, 'mps')) if o.device != 'cpu' \
            else (None, 'no MPS on the CPU')
        if extra is None:
            res['skipped'][mode] = why
            atomic_json(res, o.json)
            print(f"packing: {mode} skipped: {why}", flush=True)
            continue
        try:
            for n in todo:
                left = o.budget - (time.time() - t_start) if o.budget else o.limit
                if left < last:  # less than the last measurement took
                    print(f"packing: {mode} x {n} not started, {left:.0f} s of --budget left", flush=True)
                    break
                print(f"packing: {mode}, {n} run(s) side by side", flush=True)
                m = measure(n, o.iters, extra, o, train_args, data, os.path.join(o.work, f'{mode}-{n}'),
                            min(o.limit, left))
                res['measurements'].append(dict(mode=mode, **m))
                atomic_json(res, o.json)  # after every measurement: a cut-off keeps it
                last = m['wall_s']
                print(f"packing: {mode} x {n}: " + (f"{m['runs_per_hour']} runs/hour ({m['steady_runs_per_hour']} "
                      f"steady), {m['ms_per_iter']} ms/iteration each" if 'runs_per_hour' in m else
                      f"incomplete: {m['runs']}"), flush=True)
        finally:
            if mode == 'mps':
                stop_mps(extra)
    print(f"packing: {len(res['measurements'])} measurements in {o.json} ({time.time() - t_start:.0f} s)")


if __name__ == '__main__':
    main(sys.argv[1:])
