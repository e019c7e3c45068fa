"""
Statistics for comparisons over seeds: nothing reported without its n, and nothing called
better that the noise does not allow.

  summarize([2.91, 2.75, 2.80])          # {'n': 3, 'mean': ..., 'sd': ..., 'min': ..., 'max': ...}
  paired_interval(alibi, rope)           # mean difference over paired seeds, 95% t interval
  rank({'rope': [...], 'alibi': [...]})  # best first; place = 1 + how many schemes the seeds
                                         # confirm are better (paired interval excludes 0)

Differences are paired by seed (seed s gives every scheme the same batches), and the interval
is Student's t on the per-seed differences: mean(d) +- t_{0.975, n-1} * sd(d) / sqrt(n). With
n = 1 there is no spread and no interval: the functions say so (None) instead of guessing.
"""
import functools
import math


def _clean(values):
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def summarize(values):
    """n, mean, sample sd (n - 1 in the denominator; None for n < 2), min and max of the
    finite values (None and nan, e.g. an unaddressable length, are left out and not counted)."""
    v = _clean(values)
    n = len(v)
    if n == 0:
        return {'n': 0, 'mean': None, 'sd': None, 'min': None, 'max': None}
    mean = sum(v) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1)) if n > 1 else None
    return {'n': n, 'mean': mean, 'sd': sd, 'min': min(v), 'max': max(v)}


def _t_pdf(x, df):
    c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(c - (df + 1) / 2 * math.log1p(x * x / df))


@functools.lru_cache(maxsize=None)  # a report's rankings ask for the same few quantiles thousands of times
def t_quantile(p, df):
    """The p-quantile (0.5 < p < 1) of Student's t with df degrees of freedom: bisection on the
    CDF, which is 1/2 plus Simpson's rule on the density from 0 (accurate to ~1e-9 here)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")

    def cdf(x, steps=2000):
        h = x / steps
        s = _t_pdf(0, df) + _t_pdf(x, df) + sum((4 if k % 2 else 2) * _t_pdf(k * h, df) for k in range(1, steps))
        return 0.5 + s * h / 3
    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def paired_interval(a, b, level=0.95):
    """a - b over seeds paired by position (a[i] and b[i] come from the same seed; pairs with a
    missing value are dropped): n, the mean difference, its t interval (lo, hi; None for n < 2)
    and whether the interval excludes 0."""
    d = [float(x) - float(y) for x, y in zip(a, b) if x is not None and y is not None
         and math.isfinite(float(x)) and math.isfinite(float(y))]
    s = summarize(d)
    if s['n'] < 2:
        return {'n': s['n'], 'diff': s['mean'], 'lo': None, 'hi': None, 'excludes_zero': False}
    half = t_quantile(1 - (1 - level) / 2, s['n'] - 1) * s['sd'] / math.sqrt(s['n'])
    lo, hi = s['mean'] - half, s['mean'] + half
    return {'n': s['n'], 'diff': s['mean'], 'lo': lo, 'hi': hi, 'excludes_zero': lo > 0 or hi < 0}


def rank(per_scheme, higher_is_better=False, level=0.95):
    """[(place, scheme, mean)], by place, then by the mean over seeds, best first, then by name. A scheme's place
    is 1 + the number of schemes whose advantage over it the paired interval confirms (excludes 0),
    so schemes the seeds do not separate share a place and no order is claimed beyond the seeds.
    (Confirmation is pairwise, so a scheme with a better mean can have the worse place: c may be
    confirmed below a but not b, while b's mean is below c's.)
    per_scheme: {scheme: [value per seed, in the same seed order for every scheme]}."""
    means = {k: summarize(v)['mean'] for k, v in per_scheme.items()}
    sign = -1 if higher_is_better else 1
    order = sorted((k for k in means if means[k] is not None), key=lambda k: (sign * means[k], k))

    def beats(a, b):  # a's advantage over b is confirmed by the seeds
        p = paired_interval(per_scheme[a], per_scheme[b], level)
        return p['excludes_zero'] and sign * p['diff'] < 0
    return sorted(((1 + sum(beats(o, k) for o in order if o != k), k, means[k]) for k in order), key=lambda x: x[0])
