"""Statistics over seeds against hand-computed values and published t tables."""
import math

import pytest

import stats


def test_summarize_hand_computed():
    s = stats.summarize([1.0, 2.0, 3.0, 4.0])
    assert s['n'] == 4 and s['mean'] == 2.5 and s['min'] == 1.0 and s['max'] == 4.0
    assert s['sd'] == pytest.approx(math.sqrt(5 / 3))  # (2.25 + 0.25 + 0.25 + 2.25) / 3
    one = stats.summarize([2.75])
    assert one == {'n': 1, 'mean': 2.75, 'sd': None, 'min': 2.75, 'max': 2.75}
    assert stats.summarize([None, float('nan'), 1.0])['n'] == 1  # unaddressable lengths are not counted
    assert stats.summarize([])['mean'] is None


@pytest.mark.parametrize('df,published', [(1, 12.706), (2, 4.303), (4, 2.776), (9, 2.262), (29, 2.045),
                                          (120, 1.980)])
def test_t_quantile_matches_published_tables(df, published):
    assert stats.t_quantile(0.975, df) == pytest.approx(published, abs=5e-4)


def test_t_quantile_other_levels():
    assert stats.t_quantile(0.95, 2) == pytest.approx(2.920, abs=5e-4)
    assert stats.t_quantile(0.995, 5) == pytest.approx(4.032, abs=5e-4)
    with pytest.raises(ValueError):
        stats.t_quantile(0.3, 2)


def test_paired_interval_hand_computed():
    r = stats.paired_interval([3.0, 5.0, 7.0], [1.0, 2.0, 3.0])  # d = 2, 3, 4: mean 3, sd 1
    half = 4.302653 / math.sqrt(3)
    assert r['n'] == 3 and r['diff'] == pytest.approx(3.0)
    assert (r['lo'], r['hi']) == (pytest.approx(3 - half, abs=1e-5), pytest.approx(3 + half, abs=1e-5))
    assert r['excludes_zero']
    r = stats.paired_interval([2.0, 0.0, 3.0], [1.0, 1.0, 1.0])  # d = 1, -1, 2: mean 2/3, sd sqrt(7/3)
    half = 4.302653 * math.sqrt(7 / 3) / math.sqrt(3)
    assert r['lo'] == pytest.approx(2 / 3 - half, abs=1e-5) and not r['excludes_zero']
    r = stats.paired_interval([2.0, None, 3.0], [1.0, 5.0, 1.0])  # a missing seed drops its pair
    assert r['n'] == 2 and r['diff'] == pytest.approx(1.5)
    r = stats.paired_interval([2.0], [1.0])  # n = 1: no interval, nothing excluded
    assert r == {'n': 1, 'diff': 1.0, 'lo': None, 'hi': None, 'excludes_zero': False}


def test_rank_prints_ties_where_the_seeds_do_not_separate():
    per = {'rope': [2.9, 2.8, 3.0], 'alibi': [2.5, 2.4, 2.6],  # alibi below rope by 0.4 at every seed
           't5': [2.52, 2.35, 2.66],                            # t5 - alibi = 0.02, -0.05, 0.06: a tie
           'none': [3.5, 3.6, 3.4]}
    assert stats.rank(per) == [(1, 'alibi', pytest.approx(2.5)), (1, 't5', pytest.approx(2.51)),
                               (3, 'rope', pytest.approx(2.9)), (4, 'none', pytest.approx(3.5))]
    hi = stats.rank({'a': [0.9, 0.8, 0.85], 'b': [0.5, 0.55, 0.52]}, higher_is_better=True)
    assert [(p, k) for p, k, _ in hi] == [(1, 'a'), (2, 'b')]
    two = stats.rank({'a': [0.9, 0.8], 'b': [0.5, 0.55]}, higher_is_better=True)  # t_{0.975,1} = 12.7: too wide
    assert [(p, k) for p, k, _ in two] == [(1, 'a'), (1, 'b')]
    # places need not follow the means: c is confirmed below a (c - a = -0.1, -0.1, -0.11) while b,
    # with the lower mean (0.833 < 0.897), is confirmed below nobody (b - a = -0.7, 0.2, 0): by place, then mean
    mixed = stats.rank({'a': [1.0, 1.0, 1.0], 'b': [0.3, 1.2, 1.0], 'c': [0.9, 0.9, 0.89]}, higher_is_better=True)
    assert [(p, k) for p, k, _ in mixed] == [(1, 'a'), (1, 'b'), (2, 'c')]
    single = stats.rank({'a': [1.0], 'b': [2.0]})  # one seed: no interval, so no order is claimed
    assert [p for p, _, _ in single] == [1, 1]
    # a tie on place and mean (flip-flop's 0.00 error at every seed) lists by name, whatever order the runs came in
    same = {'z': [0.0, 0.0, 0.0], 'a': [0.0, 0.0, 0.0], 'm': [0.0, 0.0, 0.0], 'w': [5.0, 6.0, 7.0]}
    assert [k for _, k, _ in stats.rank(same)] == ['a', 'm', 'z', 'w']
    assert [k for _, k, _ in stats.rank(dict(reversed(same.items())), higher_is_better=True)] == ['w', 'a', 'm', 'z']
