"""
Device, precision and speed: the one place every script (train, eval, sample, passkey, extend_table and the tools)
gets them from, so a GPU run of each uses the same bf16 autocast and TF32 settings and the tables they write are
comparable. Also: peak FLOP/s, FLOPs per token and MFU (one formula for train.py and tools/bench.py), train.py's
step profile, the global batch split, signals and the DDP stop agreement, child runs (spawn) and wandb.

  rt = runtime.setup('auto', 'auto')   # CUDA + bf16 autocast where available, else CPU float32
  with rt.autocast: logits, loss = model(x, y)
"""
import atexit
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# Dense bf16 tensor-core peak FLOP/s, no sparsity (NVIDIA datasheets), matched against
# torch.cuda.get_device_name() in this order (the PCIe and NVL H100s are slower than SXM).
PEAK_BF16_FLOPS = [('H100 PCIe', 756e12), ('H100 NVL', 835e12), ('H100', 989e12), ('H200', 989e12),
                   ('GH200', 989e12), ('A100', 312e12), ('L40S', 362e12), ('A10G', 70e12)]
DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}
HERE = os.path.dirname(os.path.abspath(__file__))  # the repo: where child runs start


@dataclass
class Runtime:
    device: str            # 'cpu', 'cuda', 'cuda:1', ...
    device_type: str       # 'cpu' | 'cuda'
    dtype: str             # 'float32' | 'bfloat16' | 'float16' (autocast's; weights stay float32)
    autocast: object       # a context manager: torch.autocast, or a no-op for float32

    @property
    def ptdtype(self):
        return DTYPES[self.dtype]


def setup(device='auto', dtype='auto'):
    """Resolve 'auto' (CUDA if available; bf16 on a GPU that has it, else float32) and
    turn TF32 on for CUDA matmuls (float32 work that is left, e.g. the loss, gets tensor cores)."""
    if device == 'auto':
        device = 'cuda' if torch.cuda.is_available() else 'cpu'
    device_type = 'cuda' if device.startswith('cuda') else 'cpu'
    if device_type == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but torch sees no CUDA GPU (torch {torch.__version__}); "
                         f"use device='cpu' or 'auto'")
    if dtype == 'auto':
        dtype = 'bfloat16' if device_type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r}: use 'auto', {', '.join(map(repr, DTYPES))}")
    if device_type == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    ctx = nullcontext() if dtype == 'float32' else torch.autocast(device_type=device_type, dtype=DTYPES[dtype])
    return Runtime(device, device_type, dtype, ctx)


def peak_flops(device_type, cores=1, gpu=None):
    """(peak FLOP/s, label) that MFU is taken against; (None, why not) where it is unknown. CUDA: one GPU's dense
    bf16 peak from PEAK_BF16_FLOPS, by its name (`gpu`; default the current GPU's). CPU: an ESTIMATE, `cores` x the
    clock x fp32 FLOPs per cycle from the ISA flags (2 FMA pipes x vector lanes x 2)."""
    if device_type == 'cuda':
        name = gpu or torch.cuda.get_device_name()
        v = next((v for k, v in PEAK_BF16_FLOPS if k in name), None)
        label = f'{name} bf16 dense {v / 1e12:.0f} TFLOP/s' if v else f'{name}: not in runtime.PEAK_BF16_FLOPS, no MFU'
        return v, label
    info = cpu_info()
    try:
        mhz = float(info['cpu MHz'])
    except (KeyError, ValueError):
        return None, 'CPU clock unknown, no MFU'
    flags = info.get('flags', '').split()
    per_cycle = 64 if 'avx512f' in flags else 32 if 'fma' in flags else 8  # 2 FMA pipes x lanes x 2
    v = cores * mhz * 1e6 * per_cycle
    return v, f'ESTIMATE: {cores} core(s) x {mhz / 1e3:.2f} GHz x {per_cycle} fp32 FLOP/cycle = {v / 1e9:.0f} GFLOP/s'


def flops_per_token(model, T):
    """Training FLOPs per token at sequence length T (PaLM, arXiv 2204.02311, App. B): 6N for the N parameters
    (all of them) + 12 * n_layer * n_head * head_dim * T for the attention. Any model with a GPTConfig-like
    .config: nanoPE's GPT, tools/bench.py's nanoGPT."""
    c = model.config
    return 6 * sum(p.numel() for p in model.parameters()) + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * T


def mfu(model, T, rows, seconds, peak):
    """Model FLOPs utilisation: `rows` sequences of T tokens trained in `seconds`, a fraction of `peak` FLOP/s."""
    return flops_per_token(model, T) * T * rows / seconds / peak


class StepProfile:
    """torch.profiler over `iters` training iterations from iteration `first` (compiled and warm by then): writes
    out_dir/profile.json (wall time per iteration, the device's busy time in it, and the operators by self
    device time, CPU time where there is no device) and the Chrome trace profile_trace.json. step(it) is called
    at the start of every iteration; outside the window it does nothing."""

    def __init__(self, out_dir, first, iters, device_type):
        self.out_dir, self.first, self.last, self.cuda = out_dir, first, first + iters, device_type == 'cuda'
        self.prof, self.t0 = None, None

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def step(self, it):
        from torch.profiler import ProfilerActivity, profile  # here: only a profiled run needs it
        if it == self.first:
            self._sync()
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
            self.prof, self.t0 = profile(activities=acts), time.perf_counter()
            self.prof.start()
        elif it == self.last and self.prof is not None:
            self._sync()
            wall = time.perf_counter() - self.t0
            self.prof.stop()
            return self.write(wall)

    def write(self, wall):
        n, ops = self.last - self.first, self.prof.key_averages()

        def table(events, attr, k):
            ms = [(e, getattr(e, attr) / 1e3 / n) for e in events if getattr(e, attr) > 0]
            total = sum(t for _, t in ms)
            return total, [dict(name=e.key[:200], calls=round(e.count / n, 2), ms_per_iter=round(t, 4),
                                share=round(t / total, 4)) for e, t in sorted(ms, key=lambda x: -x[1])[:k]]
        # the device's kernels (events on the device have no children, so their self times add up without
        # counting one twice; an annotation such as Optimizer.step#AdamW.step spans kernels, and is left out),
        # and the host's operators by their own CPU time
        gpu = [e for e in ops if e.device_type != torch.autograd.DeviceType.CPU and not e.is_user_annotation]
        busy, kernels = table(gpu, 'self_device_time_total', 60) if self.cuda else (None, None)
        host, cpu_ops = table(ops if not self.cuda else [e for e in ops if e not in gpu], 'self_cpu_time_total', 30)
        out = dict(iterations=n, wall_ms_per_iter=round(wall * 1e3 / n, 3),
                   device_busy_ms_per_iter=round(busy, 3) if busy is not None else None,
                   host_op_ms_per_iter=round(host, 3), kernels=kernels, cpu_ops=cpu_ops)
        with open(os.path.join(self.out_dir, 'profile.json'), 'w') as f:
            json.dump(out, f, indent=1)
        self.prof.export_chrome_trace(os.path.join(self.out_dir, 'profile_trace.json'))
        return out


def cpu_info():
    """The first processor's fields in /proc/cpuinfo ('model name', 'cpu MHz', 'flags', ...); {} without one."""
    try:
        with open('/proc/cpuinfo') as f:
            first = f.read().split('\n\n', 1)[0]
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, sep, v in (line.partition(':') for line in first.splitlines()) if sep}


def cpu_name():
    return cpu_info().get('model name') or platform.processor() or platform.machine()


def device_name(rt):
    if rt.device_type == 'cuda':
        return torch.cuda.get_device_name(rt.device)
    return f"{cpu_name()}, {torch.get_num_threads()} thread(s)"


def split_batch(rows, world_size, rank, batch_size):
    """The global batch of `rows` sequences over `world_size` ranks: this rank's first row
    and its micro-steps' sizes (each <= batch_size), as even as the sizes allow. train.py
    weights each micro-step's mean loss by its rows * world_size / rows (DDP averages
    over ranks), so the ranks together compute the single-process gradient of the batch."""
    if rows < world_size:
        raise ValueError(f"a global batch of {rows} sequences cannot be split over {world_size} ranks")
    share = [rows // world_size + (r < rows % world_size) for r in range(world_size)]
    n = share[rank]
    accum = -(-n // batch_size)
    return sum(share[:rank]), [n // accum + (m < n % accum) for m in range(accum)]


class Heartbeat:
    """A DDP rank's pulse in the launcher's c10d store (MASTER_ADDR:MASTER_PORT; torchrun's
    agent holds it, so it outlives the workers): a daemon thread adds 1 to this rank's counter
    every `every` seconds. A rank whose counter stands still is killed, crashed or frozen
    (SIGSTOP, a dead node); one blocked in a collective still beats, so after a failed
    collective lost() tells the ranks that are gone from the ones that are merely late."""

    def __init__(self, rank, world_size, every=1.0):
        self.rank, self.world_size, self.every = rank, world_size, every
        # a torchrun restart reuses the store: its counters start afresh
        self.prefix = f"nanoPE/heartbeat/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()
        atexit.register(self.stop)

    def stop(self):
        """End the thread, and close its store client, before the interpreter shuts down."""
        self.done.set()
        self.thread.join(timeout=10)

    def _store(self):  # a client of its own per thread: a store connection is not shared across threads
        return dist.TCPStore(os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']), is_master=False,
                             timeout=timedelta(seconds=5))

    def _beat(self):
        try:
            store = self._store()
            while not self.done.is_set():
                store.add(self.prefix + str(self.rank), 1)
                self.done.wait(self.every)
        except Exception:  # noqa: BLE001 - the store is gone (the launcher exited): nothing left to tell
            return

    def lost(self, window=3.0):
        """{rank: its last word, or ''} for the other ranks whose counter did not move for
        `window` seconds (several beats, so a loaded machine's late beat is not taken for
        death); None if the store is unreachable."""
        others = [r for r in range(self.world_size) if r != self.rank]
        try:
            store = self._store()
            before = [store.add(self.prefix + str(r), 0) for r in others]
            time.sleep(window)
            after = [store.add(self.prefix + str(r), 0) for r in others]
            gone = [r for r, a, b in zip(others, before, after) if a == b]
            words = [self.prefix + f'why/{r}' for r in gone]
            return {r: store.get(k).decode() if store.check([k]) else '' for r, k in zip(gone, words)}
        except Exception:  # noqa: BLE001 - the launcher (and its store) died with the rank, or the network is down
            return None

    def last_word(self, text):
        """Leave why this rank gives up, for the ranks that see it go."""
        try:
            self._store().set(self.prefix + f'why/{self.rank}', text)
        except Exception:  # noqa: BLE001 - no store: the others will say "killed, crashed or frozen"
            pass


class RunControl:
    """How a training run stops, and how its DDP ranks agree to. SIGTERM/SIGINT only set a flag
    (catch_signals): the loop finishes its step (an evaluation stops at its next batch), saves and
    exits 0; a second signal more than 1 s after the first exits at once. Under torchrun (`ddp`)
    it joins the process group (nccl on CUDA, gloo on CPU) with `timeout` seconds per collective,
    and a collective that fails because a rank died, froze or outlasted the timeout ends this rank
    with one line instead of a traceback (lost_rank). saved(): the iteration of rank 0's last
    save, or None, for those messages."""

    def __init__(self, ddp, device_type, timeout, out_dir, saved=lambda: None):
        self.ddp, self.timeout, self.out_dir, self.saved = ddp, timeout, out_dir, saved
        self.signum, self.signal_time = None, 0.0
        self.group, self.flag, self.work = None, torch.zeros(1, dtype=torch.int32), None
        self.rank, self.world_size = 0, 1
        if ddp:
            # an explicit timeout: a frozen rank (SIGSTOP, a dead node) otherwise holds the others for gloo's 30 min
            dist.init_process_group(backend='nccl' if device_type == 'cuda' else 'gloo',
                                    timeout=timedelta(seconds=timeout))
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self.heartbeat = Heartbeat(self.rank, self.world_size)
            sys.excepthook = self.lost_rank

    def catch_signals(self):
        """From here on SIGTERM/SIGINT ask for a stop (before, they end the process as usual).
        Under DDP the ranks OR their flags on a CPU (gloo) group of their own: no GPU sync."""
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        if self.ddp:
            self.group = dist.new_group(backend='gloo', timeout=timedelta(seconds=self.timeout))

    def request_stop(self, signum, frame):
        name = signal.Signals(signum).name
        # (torchrun forwards a terminal's Ctrl-C on top of the workers' own: within 1 s it is one signal)
        if self.signum is not None and time.time() - self.signal_time > 1.0:
            print(f"[rank {self.rank}] second {name}: exiting now; {self.out_dir}/ckpt.pt is what the last save "
                  f"wrote", flush=True)
            os._exit(128 + signum)
        if self.signum is None:
            print(f"[rank {self.rank}] got {name}: stopping at the end of this step or evaluation batch, then saving "
                  f"a checkpoint and exiting; {name} again to exit at once", flush=True)
            self.signum, self.signal_time = signum, time.time()

    def stopping(self):
        """The name of the signal that asked this rank to stop ('SIGINT'), or None: an
        evaluation's stop() (checked before each batch)."""
        return signal.Signals(self.signum).name if self.signum is not None else None

    def stop_agreed(self):
        """Whether to stop now; the same answer on every rank. The all-reduce started by one
        call is read by the next, so it overlaps a training step instead of adding a round
        trip to it; the price is that a signal stops the run one iteration later."""
        if not self.ddp:
            return self.signum is not None
        stop = False
        if self.work is not None:
            self.work.wait()
            stop = bool(self.flag.item())
        self.flag.fill_(int(self.signum is not None))
        self.work = None if stop else dist.all_reduce(self.flag, op=dist.ReduceOp.MAX, group=self.group,
                                                      async_op=True)
        return stop

    def any_rank(self, flag):
        """flag, OR-ed over the ranks (blocking; used at eval steps only)."""
        if not self.ddp:
            return flag
        t = torch.tensor([int(flag)], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def finish(self):
        """Every rank started the same all-reduces: let the last one finish."""
        if self.work is not None:
            self.work.wait()

    def lost_rank(self, kind, e, tb):
        """sys.excepthook under DDP: a collective that failed because a rank died or froze (or
        outlasted the timeout) ends this rank with one line naming the lost rank(s) and how to
        resume, instead of a traceback. Any other exception gets the usual traceback."""
        if not (isinstance(e, dist.DistError) or isinstance(e, RuntimeError) and 'gloo' in str(e)):
            return sys.__excepthook__(kind, e, tb)
        # torchrun SIGTERMs the survivors of a dead worker: let this line finish first (3-8 s)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.stdout.flush()
        rank, lost = self.rank, self.heartbeat.lost()
        others = [r for r in range(self.world_size) if r != rank]
        ck = os.path.join(self.out_dir, 'ckpt.pt')
        saved = self.saved() if rank == 0 else None  # (only rank 0 saves, so only it knows)
        resume = (f"resume from {ck}" + (f" (iter {saved})" if saved is not None else '')
                  + " by running the same command with --init_from=resume" if os.path.exists(ck) else
                  f"nothing was saved yet ({ck} does not exist): run the same command again")
        names = lambda rs: ('rank ' if len(rs) == 1 else 'ranks ') + ', '.join(map(str, rs))  # noqa: E731
        if lost and any(lost.values()):  # a rank that gave up first said why
            why = f"lost {names(lost)}, which gave up first: " + '; '.join(w for w in lost.values() if w)
        elif lost:
            why = f"lost {names(lost)} (no heartbeat for 3 s: killed, crashed or frozen)"
        elif lost is None:
            why = (f"lost contact with {names(others)} and with the launcher's store (the node or the launcher "
                   f"is gone?)")
        else:  # everyone is alive: a rank was busy for longer than the timeout
            cause = str(e).split('] ', 1)[-1].split('. ')[0][:120]
            why = (f"a collective failed ({cause}) while every rank was alive: a rank-0-only phase (evaluation, "
                   f"save, data preparation) may outlast ddp_timeout={self.timeout:g}s; raise --ddp_timeout")
            self.heartbeat.last_word(why)
        print(f"[rank {rank}] {why}; the run cannot go on: {resume}", file=sys.stderr, flush=True)
        os._exit(1)  # not a normal exit: gloo's teardown with a peer gone can abort with a C++ message


def spawn(cmd, log, env=None, preexec_fn=None):
    """Start cmd in the repo with its output going straight to the open file `log` (sweep.py's and
    tools/bench.py's children): no pipe through the parent, so the child never dies of a broken pipe, and
    the log is written line by line as it runs. A session of its own: a terminal's Ctrl-C reaches
    the parent only, which decides what the child gets."""
    return subprocess.Popen(cmd, cwd=HERE, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONUNBUFFERED='1', **(env or {})), start_new_session=True,
                            preexec_fn=preexec_fn)


def process_start():
    """When this process started, on time.time()'s clock: from /proc (Linux, to 10 ms), else
    when this module was imported."""
    try:
        with open('/proc/self/stat') as f:
            ticks = int(f.read().rsplit(')', 1)[1].split()[19])  # field 22, starttime: ticks after boot
        with open('/proc/uptime') as f:
            uptime = float(f.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf('SC_CLK_TCK'))
    except (OSError, ValueError, IndexError):
        return _IMPORTED


_IMPORTED = time.time()


def wandb_init(project, name, config, out_dir, resume_id=None, group=None, job_type=None):
    """A wandb run: online when wandb finds credentials (its own login lookup: env, settings,
    netrc), else offline; online init failing (no network) falls back to offline too. group and
    job_type place it in a sweep (one group per sweep, job type 'lm' or the task's name), so that
    wandb's grouping shows each scheme's mean and spread over its seeds."""
    import wandb
    mode = os.environ.get('WANDB_MODE')
    if mode is None:
        try:
            mode = 'online' if wandb.login(prompt=False, verify=False) else 'offline'
        except Exception:  # noqa: BLE001 - an older wandb without prompt=, or a broken setup
            mode = 'offline'
    resume = dict(id=resume_id, resume='allow') if resume_id else {}  # a resumed run continues its wandb run
    try:
        run = wandb.init(project=project, name=name, config=config, mode=mode, dir=out_dir, group=group or None,
                         job_type=job_type or None, **resume)
    except Exception as e:  # noqa: BLE001 - no network: keep the run, log offline
        print(f"wandb online init failed ({e}); logging offline")
        mode = 'offline'
        run = wandb.init(project=project, name=name, config=config, mode=mode, dir=out_dir, group=group or None,
                         job_type=job_type or None, **resume)
    print(f"wandb: {mode} mode" + (f" (sync later with `wandb sync {out_dir}/wandb/latest-run`)"
                                   if mode == 'offline' else ''))
    return run
