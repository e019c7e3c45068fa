"""Run under torchrun (2 ranks, gloo). Each rank does train.py's DDP step on its share
of a fixed global batch (grad accumulation with no_sync on all micro-steps but the
last); rank 0 compares the all-reduced gradients with one process on the whole batch."""
import gc
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import tiny_model  # noqa: E402

scheme, out = sys.argv[1], sys.argv[2]
dist.init_process_group('gloo')
rank, world = dist.get_rank(), dist.get_world_size()
accum_total, bs = 4, 3                       # 4 micro-batches of 3 over all ranks
g = torch.Generator().manual_seed(0)
X = torch.randint(0, 37, (accum_total * bs, 17), generator=g)
accum = accum_total // world

model = DDP(tiny_model(scheme, seed=0))
for m in range(accum):
    rows = slice((m * world + rank) * bs, (m * world + rank + 1) * bs)  # as train.py's get_batch
    model.require_backward_grad_sync = m == accum - 1
    _, loss = model(X[rows, :-1], X[rows, 1:])
    (loss / accum).backward()

if rank == 0:
    ref = tiny_model(scheme, seed=0)
    for m in range(accum_total):
        _, loss = ref(X[m * bs:(m + 1) * bs, :-1], X[m * bs:(m + 1) * bs, 1:])
        (loss / accum_total).backward()
    diff = max((p.grad - q.grad).abs().max().item()
               for p, q in zip(model.module.parameters(), ref.parameters()))
    with open(out, 'w') as f:
        f.write(repr(diff))
# train.py's teardown order: a DDP wrapper still alive at interpreter exit makes gloo
# abort a rank in a fraction of runs
dist.barrier()
del model
gc.collect()
dist.destroy_process_group()
