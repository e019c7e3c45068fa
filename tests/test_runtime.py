"""The training runtime's helpers: the peak-FLOPs table and the FLOP formula behind MFU, and how split_batch shares
a global batch among DDP ranks."""
import pytest

import runtime


def test_peak_flops_table():
    peak = lambda name: runtime.peak_flops('cuda', gpu=name)[0]  # noqa: E731
    assert peak('NVIDIA H100 80GB HBM3') == 989e12
    assert peak('NVIDIA H100 PCIe') == 756e12
    assert peak('NVIDIA H200') == 989e12
    assert peak('NVIDIA A100-SXM4-80GB') == 312e12
    assert peak('Tesla T4') is None
    assert runtime.peak_flops('cuda', gpu='Tesla T4')[1] == 'Tesla T4: not in runtime.PEAK_BF16_FLOPS, no MFU'


def test_one_flop_formula_behind_every_mfu():
    """6N + 12 * n_layer * n_head * head_dim * T FLOPs per token (PaLM, App. B); GPT.estimate_mfu is runtime.mfu."""
    from conftest import tiny_model
    m = tiny_model('rope')
    c, N = m.config, sum(p.numel() for p in m.parameters())
    per_token = 6 * N + 12 * c.n_layer * c.n_head * (c.n_embd // c.n_head) * c.block_size
    assert runtime.flops_per_token(m, c.block_size) == per_token
    assert runtime.mfu(m, c.block_size, 8, 0.5, 1e12) == per_token * c.block_size * 8 / 0.5 / 1e12
    assert m.estimate_mfu(8, 0.5, 1e12) == runtime.mfu(m, c.block_size, 8, 0.5, 1e12)


def test_split_batch_covers_the_global_batch():
    for rows, world, bs in [(32, 1, 32), (32, 2, 32), (32, 3, 32), (512, 8, 16), (11, 2, 3), (7, 7, 1)]:
        spans = []
        for r in range(world):
            row0, micro = runtime.split_batch(rows, world, r, bs)
            assert max(micro) <= bs and min(micro) >= 1 and max(micro) - min(micro) <= 1
            spans.append((row0, row0 + sum(micro)))
        assert spans[0][0] == 0 and spans[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # contiguous, no overlap
        sizes = [b - a for a, b in spans]
        assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        runtime.split_batch(3, 4, 0, 1)


def test_step_profile_records_exactly_its_iterations(tmp_path):
    """StepProfile(first=2, iters=3) records iterations 2, 3 and 4 of a loop and nothing else: an op that runs
    once per step is counted once per iteration (a window one iteration too wide or narrow would show 4/3 or
    2/3), and the time per iteration is the window's over its iterations."""
    import json
    import torch
    w = torch.nn.Parameter(torch.randn(64, 64))
    opt = torch.optim.AdamW([w], lr=1e-3)
    prof = runtime.StepProfile(str(tmp_path), 2, 3, 'cpu')
    out = None
    for it in range(7):
        out = prof.step(it) or out
        (w @ w).sum().backward()
        torch.cumsum(w, 0)  # once per step
        opt.step()
        opt.zero_grad()
    assert out['iterations'] == 3 and out['device_busy_ms_per_iter'] is None and out['wall_ms_per_iter'] > 0
    ops = {o['name']: o for o in out['cpu_ops']}
    assert ops['aten::cumsum']['calls'] == 1 and ops['aten::mm']['calls'] == 3  # forward and two in backward
    assert json.load(open(tmp_path / 'profile.json')) == out
    assert 'traceEvents' in json.load(open(tmp_path / 'profile_trace.json'))
