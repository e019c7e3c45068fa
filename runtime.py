"""
Device, precision and peak FLOP/s: the one place every script (train, eval, sample,
passkey, bench, extend_table) gets them from, so a GPU run of each uses the same
bf16 autocast and TF32 settings and the tables they write are comparable.

  rt = runtime.setup('auto', 'auto')   # CUDA + bf16 autocast where available, else CPU float32
  with rt.autocast: logits, loss = model(x, y)
"""
import atexit
import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch

# Dense bf16 tensor-core peak FLOP/s, no sparsity (NVIDIA datasheets), matched against
# torch.cuda.get_device_name() in this order (the PCIe and NVL H100s are slower than SXM).
PEAK_BF16_FLOPS = [('H100 PCIe', 756e12), ('H100 NVL', 835e12), ('H100', 989e12), ('H200', 989e12),
                   ('GH200', 989e12), ('A100', 312e12), ('L40S', 362e12), ('A10G', 70e12)]
DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}


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


def peak_flops(device_name):
    """Dense bf16 peak FLOP/s of one GPU named `device_name`, or None if unknown."""
    return next((v for k, v in PEAK_BF16_FLOPS if k in device_name), None)


def cpu_info():
    """The first processor's fields in /proc/cpuinfo ('model name', 'cpu MHz', 'flags', ...); {} without one."""
    try:
        with open('/proc/cpuinfo') as f:
            first = f.read().split('\n\n', 1)[0]
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, sep, v in (line.partition(':') for line in first.splitlines()) if sep}


def cpu_name():
    import platform
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
        import torch.distributed as dist
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


def wandb_init(project, name, config, out_dir, resume_id=None):
    """A wandb run: online when wandb finds credentials (its own login lookup: env, settings,
    netrc), else offline; online init failing (no network) falls back to offline too."""
    import wandb
    mode = os.environ.get('WANDB_MODE')
    if mode is None:
        try:
            mode = 'online' if wandb.login(prompt=False, verify=False) else 'offline'
        except Exception:  # noqa: BLE001 - an older wandb without prompt=, or a broken setup
            mode = 'offline'
    resume = dict(id=resume_id, resume='allow') if resume_id else {}  # a resumed run continues its wandb run
    try:
        run = wandb.init(project=project, name=name, config=config, mode=mode, dir=out_dir, **resume)
    except Exception as e:  # noqa: BLE001 - no network: keep the run, log offline
        print(f"wandb online init failed ({e}); logging offline")
        mode = 'offline'
        run = wandb.init(project=project, name=name, config=config, mode=mode, dir=out_dir, **resume)
    print(f"wandb: {mode} mode" + (f" (sync later with `wandb sync {out_dir}/wandb/latest-run`)"
                                   if mode == 'offline' else ''))
    return run
