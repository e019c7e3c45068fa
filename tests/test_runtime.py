"""The training runtime's helpers: the peak-FLOPs table behind MFU, and how split_batch shares a global
batch among DDP ranks."""
import pytest

import runtime


def test_peak_flops_table():
    assert runtime.peak_flops('NVIDIA H100 80GB HBM3') == 989e12
    assert runtime.peak_flops('NVIDIA H100 PCIe') == 756e12
    assert runtime.peak_flops('NVIDIA H200') == 989e12
    assert runtime.peak_flops('NVIDIA A100-SXM4-80GB') == 312e12
    assert runtime.peak_flops('Tesla T4') is None


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
