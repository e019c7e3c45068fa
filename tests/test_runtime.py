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
