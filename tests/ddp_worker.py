"""Run under torchrun (gloo, any number of ranks): ddp_worker.py SCHEME[,SCHEME...] OUT.json. For each
scheme, each rank does train.py's DDP step on its share of a fixed global batch of 11 rows
(runtime.split_batch: uneven shares, micro-steps of at most 3 rows, no_sync on all but the last,
each micro-step's mean loss weighted by its rows * world / 11); rank 0 compares the all-reduced
gradients with one process on the whole batch and writes {scheme: largest difference}."""
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from conftest import tiny_model  # noqa: E402
from runtime import split_batch  # noqa: E402

schemes, out = sys.argv[1].split(','), sys.argv[2]
dist.init_process_group('gloo')
rank, world = dist.get_rank(), dist.get_world_size()
rows, bs = 11, 3
g = torch.Generator().manual_seed(0)
X = torch.randint(0, 37, (rows, 17), generator=g)
diffs = {}
for scheme in schemes:
    row0, micro = split_batch(rows, world, rank, bs)
    model = DDP(tiny_model(scheme, seed=0))
    for m, n in enumerate(micro):
        model.require_backward_grad_sync = m == len(micro) - 1
        _, loss = model(X[row0:row0 + n, :-1], X[row0:row0 + n, 1:])
        (loss * n * world / rows).backward()
        row0 += n
    if rank == 0:
        ref = tiny_model(scheme, seed=0)
        _, loss = ref(X[:, :-1], X[:, 1:])
        loss.backward()
        diffs[scheme] = max((p.grad - q.grad).abs().max().item()
                            for p, q in zip(model.module.parameters(), ref.parameters()))
    # train.py's teardown order: a DDP wrapper still alive at interpreter exit makes gloo
    # abort a rank in a fraction of runs
    dist.barrier()
    del model
    gc.collect()
if rank == 0:
    with open(out, 'w') as f:
        json.dump(diffs, f)
dist.destroy_process_group()
