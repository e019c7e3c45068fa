"""
Algorithmic length-generalization tasks for nanoPE: generators, batches,
scoring per length bin, and the two position tricks the literature pairs with them.

Every task maps a size n (its own length: digits, items, string length...) and a
numpy Generator to one example, deterministically from the generator's state:

  TASKS[name](n, rng) -> (prompt_ids, answer_ids)              every answer token is scored
                      or (prompt_ids, answer_ids, scored)      scored[j] False: a token the
                                                               evaluator supplies (mqar's queries)

The prompt always ends with SEP ('='), so the answer starts at a known place. All
tasks share one small vocabulary, so one model (one embedding table) can serve any
task. Training draws n ~ U(1..N) per row (`train_sizes`); evaluation covers 1..4N in
length bins (`bin_edges`) with a boundary at N+1, so in- and out-of-distribution rows
never share a bin.

  x, y, ns = make_batch('copy', train_sizes(64, DEFAULT_N['copy'], rng), rng)
  logits, _ = model(x)                       # [B, T, V]; loss = cross_entropy(..., y, ignore_index=-1)
  acc = BinScores(bin_edges(N)); acc.add(logits, y, ns); acc.result()   # JSON-ready dict
"""

import numpy as np
import torch

# -----------------------------------------------------------------------------
# vocabulary: one character per token, so prompts and answers read as plain strings

PAD, SEP, PLUS, MARK, POP, END = '.', '=', '+', '#', '^', '$'
DIGITS = '0123456789'
LETTERS = 'abcdefghijklmnopqrstuvwxyz'
PUSH = 'AB'  # stack task: 'A' pushes a, 'B' pushes b
VOCAB = PAD + SEP + DIGITS + LETTERS + PLUS + MARK + POP + PUSH + END
stoi = {c: i for i, c in enumerate(VOCAB)}
itos = {i: c for i, c in enumerate(VOCAB)}
vocab_size = len(VOCAB)  # 44
PAD_ID, SEP_ID = stoi[PAD], stoi[SEP]

# Repeats are common in an 8-letter alphabet, so matching a token's content cannot
# find "the next thing to copy": the model has to use position, which is what we test.
ALPHA = LETTERS[:8]
KEY_LEN = 4  # passkey digits


def encode(s):
    return [stoi[c] for c in s]


def decode(ids):
    return ''.join(itos[int(i)] for i in ids)


def rand_str(rng, alphabet, n):
    return ''.join(rng.choice(list(alphabet), size=n))


# -----------------------------------------------------------------------------
# tasks

TASKS = {}


def task(name):
    def deco(fn):
        TASKS[name] = fn
        return fn
    return deco


@task('copy')
def copy(n, rng):
    """Copy a string (Kazemnejad et al., arXiv 2305.19466). 'cabd=' -> 'cabd'."""
    s = rand_str(rng, ALPHA, n)
    return encode(s + SEP), encode(s)


@task('reverse')
def reverse(n, rng):
    """Reverse a string (Delétang et al., arXiv 2207.02098; Kazemnejad et al.). 'cabd=' -> 'dbac'."""
    s = rand_str(rng, ALPHA, n)
    return encode(s + SEP), encode(s[::-1])


@task('duplicate')
def duplicate(n, rng):
    """Duplicate a string (Delétang et al., arXiv 2207.02098). 'cab=' -> 'cabcab'."""
    s = rand_str(rng, ALPHA, n)
    return encode(s + SEP), encode(s + s)


@task('addition')
def addition(n, rng):
    """Decimal addition, every number least-significant digit first (Zhou et al., arXiv 2402.09371).
    Two n-digit operands with i.i.d. digits (leading zeros allowed, so all columns are alike);
    the answer is always n+1 digits, its last one the final carry (possibly 0).
    47 + 85 = 132:  '74+58=' -> '231'. (The paper's recipe also adds index hints; not here.)"""
    a, b = rand_str(rng, DIGITS, n), rand_str(rng, DIGITS, n)
    total = str(int(a[::-1]) + int(b[::-1])).zfill(n + 1)
    return encode(a + PLUS + b + SEP), encode(total[::-1])


@task('parity')
def parity(n, rng):
    """Parity of a bit string (Delétang et al., arXiv 2207.02098). '1011=' -> '1'."""
    s = rand_str(rng, '01', n)
    return encode(s + SEP), encode(str(s.count('1') % 2))


@task('sort')
def sort(n, rng):
    """Sort n letters, repeats allowed (Kazemnejad et al., arXiv 2305.19466). 'dbca=' -> 'abcd'."""
    s = rand_str(rng, ALPHA, n)
    return encode(s + SEP), encode(''.join(sorted(s)))


@task('bucket_sort')
def bucket_sort(n, rng):
    """Sort n tokens from a 5-symbol alphabet (Delétang et al., arXiv 2207.02098). 'caeab=' -> 'aabce'."""
    s = rand_str(rng, LETTERS[:5], n)
    return encode(s + SEP), encode(''.join(sorted(s)))


@task('stack')
def stack(n, rng):
    """Stack manipulation (Delétang et al., arXiv 2207.02098). n input tokens: an initial stack
    of a/b given bottom-to-top (length U(1..n-1)), then actions ('^' pop, 'A' push a,
    'B' push b), uniform; a pop on an empty stack is ignored. The answer is the final stack
    top-to-bottom, then END (it has no fixed length). 'ab' + 'A^^' : ab -> aba -> ab -> a,
    so 'abA^^=' -> 'a$'."""
    if n == 1:  # no room for an action: the stack comes back as it went in
        s = rand_str(rng, 'ab', 1)
        return encode(s + SEP), encode(s + END)
    k = int(rng.integers(1, n))
    init, ops = rand_str(rng, 'ab', k), rand_str(rng, POP + PUSH, n - k)
    st = list(init)
    for op in ops:
        if op == POP:
            if st:
                st.pop()
        else:
            st.append(op.lower())
    return encode(init + ops + SEP), encode(''.join(reversed(st)) + END)


@task('mqar')
def mqar(n, rng):
    """Multi-query associative recall (Arora et al., arXiv 2312.04927). n pairs key->value
    (distinct letter keys, digit values), SEP, then every key once in random order, each
    followed by its value: 'a3c1b7=' -> 'b7a3c1'. Only the values are scored; the query
    keys are given by the evaluator (teacher forcing), as in the paper's setup where
    queries are part of the input. n <= 26 (one letter per key)."""
    keys = rng.choice(list(LETTERS), size=n, replace=False)
    vals = rng.choice(list(DIGITS), size=n)
    order = rng.permutation(n)
    answer = ''.join(keys[i] + vals[i] for i in order)
    return (encode(''.join(k + v for k, v in zip(keys, vals)) + SEP), encode(answer),
            [False, True] * n)


@task('passkey')
def passkey(n, rng):
    """Passkey retrieval trained from scratch (after Mohtashami & Jaggi, arXiv 2305.16300):
    n random filler letters with MARK + a KEY_LEN-digit key inserted at a uniform depth
    d in 0..n (d = number of filler letters before the mark), then SEP as the query.
    'qwe#4821rty=' -> '4821'."""
    filler, key = rand_str(rng, LETTERS, n), rand_str(rng, DIGITS, KEY_LEN)
    d = int(rng.integers(0, n + 1))
    return encode(filler[:d] + MARK + key + filler[d:] + SEP), encode(key)


def sample(name, n, rng):
    """One example of task `name` at size n as (prompt, answer, scored), scored a list of bools."""
    out = TASKS[name](n, rng)
    prompt, answer = out[0], out[1]
    scored = out[2] if len(out) == 3 else [True] * len(answer)
    return prompt, answer, scored


# Default training size N per task, aimed at >= 95% exact match in-distribution for a
# ~0.2M-parameter model in a few CPU minutes, with 4N still cheap. Trailing comments: the
# longest sequence at 4N (tokens), then a short check (3 layers, d=64, 0.15M params, rope,
# batch 64, AdamW 3e-3 cosine, 2 CPU cores): in-distribution exact match after that many steps.
# addition and mqar did not get there: they need a longer budget (or leave them out).
# The largest task_n a run may ask for: it is evaluated up to 4 x task_n, i.e. sequences of ~8-16k tokens
# whose dense attention already needs GBs; past that a typo (task_n=10**9) would only exhaust memory.
MAX_N = 1024
DEFAULT_N = {
    'copy': 12,         # 4N: 97  | 0.89 @ 2000 steps (N=16: 0.87)
    'reverse': 12,      # 97      | 1.00 @ 2000
    'duplicate': 8,     # 97      | 0.98 @ 2000
    'addition': 4,      # 51      | 0.50 @ 2500 (n <= 2 solved; N=8: 0.02 @ 2000)
    'parity': 8,        # 34      | 1.00 @ 800
    'sort': 12,         # 97      | 1.00 @ 1500
    'bucket_sort': 12,  # 97      | 1.00 @ 1500
    'stack': 12,        # <= 98   | 0.97 @ 1500
    'mqar': 4,          # 65      | 0.44 @ 5000 (lr 1e-3; N=6: 0.33 @ 2500; 0.8M params: 0.42 @ 2000)
    'passkey': 32,      # 138     | 1.00 @ 1500
}


def max_len(name, n):
    """Longest prompt+answer at size n (size the model's block for the evaluation grid with it)."""
    if name == 'stack':  # n tokens + SEP, and at most n stack symbols + END
        return 2 * n + 2
    p, a, _ = sample(name, n, np.random.default_rng(0))
    return len(p) + len(a)  # every other task's length depends on n only


# -----------------------------------------------------------------------------
# batches

def make_batch(name, ns, rng):
    """Rows of task `name` at sizes ns (one per row), right-padded with PAD.
    Returns x [B, T] int64 inputs, y [B, T] int64 targets and ns [B] int64, where
    y[b, t] is the target for input position t (x = seq[:-1], y = seq[1:]), and -1
    (cross_entropy's ignore_index) everywhere but the scored answer tokens. Right
    padding is harmless to a causal model: no real token attends to a later PAD."""
    rows = [sample(name, int(n), rng) for n in ns]
    T = max(len(p) + len(a) for p, a, _ in rows) - 1
    x = np.full((len(rows), T), PAD_ID, dtype=np.int64)
    y = np.full((len(rows), T), -1, dtype=np.int64)
    for b, (p, a, scored) in enumerate(rows):
        seq = p + a
        x[b, :len(seq) - 1] = seq[:-1]
        # answer token j sits at seq index len(p)+j, predicted from input position len(p)+j-1
        t = len(p) - 1 + np.flatnonzero(scored)
        y[b, t] = np.asarray(a)[np.flatnonzero(scored)]
    return torch.from_numpy(x), torch.from_numpy(y), torch.as_tensor(list(ns), dtype=torch.int64)


def train_sizes(B, N, rng):
    """B training sizes n ~ U(1..N), uniform over sizes (Delétang et al.; Ruoss et al.)."""
    return rng.integers(1, N + 1, size=B)


def bin_edges(N, mult=4, width=None):
    """Integer edges 1 = e0 < e1 < ... = mult*N+1 of half-open length bins [e_i, e_i+1) covering
    1..mult*N: bins of `width` sizes (default N//4, so ~4 bins per N), always with an edge at
    N+1 so that no bin mixes training sizes with longer ones."""
    width = width or max(1, N // 4)
    return sorted(set(range(1, mult * N + 1, width)) | {N + 1, mult * N + 1})


def eval_sizes(N, mult=4, reps=8):
    """Every size 1..mult*N, reps times each: a fixed evaluation grid (shuffle nothing)."""
    return [n for n in range(1, mult * N + 1) for _ in range(reps)]


# -----------------------------------------------------------------------------
# scoring

@torch.no_grad()
def score(logits, y):
    """Per row: (exact [B] bool, correct [B], total [B]) over the scored answer tokens.
    logits [B, T, V] (or already-argmaxed predictions [B, T]); y from make_batch.
    Exact match = every answer token is the argmax. With teacher forcing this equals
    greedy decoding as long as all earlier answer tokens are right, and the first wrong
    one makes the row wrong in both, so the two exact-match rates are identical
    (for mqar the query keys are supplied either way). Positions with y = -1 never count."""
    pred = logits.argmax(-1) if logits.dim() == 3 else logits
    mask = y != -1
    correct = ((pred == y) & mask).sum(1)
    total = mask.sum(1)
    return correct == total, correct, total


class BinScores:
    """Accumulates exact match and per-token accuracy per length bin over batches."""

    def __init__(self, edges):
        self.edges = list(edges)
        k = len(self.edges) - 1
        self.rows, self.exact = np.zeros(k, np.int64), np.zeros(k, np.int64)
        self.tok_ok, self.tok = np.zeros(k, np.int64), np.zeros(k, np.int64)

    def add(self, logits, y, ns):
        exact, correct, total = (t.cpu().numpy() for t in score(logits, y))
        bins = np.searchsorted(self.edges, np.asarray(ns), side='right') - 1
        for i, e, c, t in zip(bins, exact, correct, total):
            if 0 <= i < len(self.rows):  # sizes outside the edges are ignored
                self.rows[i] += 1
                self.exact[i] += int(e)
                self.tok_ok[i] += int(c)
                self.tok[i] += int(t)

    def result(self):
        """JSON-ready: one dict per non-empty bin, {lo, hi (inclusive), rows, exact, token_acc}."""
        out = []
        for i in np.flatnonzero(self.rows):
            out.append(dict(lo=self.edges[i], hi=self.edges[i + 1] - 1, rows=int(self.rows[i]),
                            exact=float(self.exact[i] / self.rows[i]),
                            token_acc=float(self.tok_ok[i] / max(self.tok[i], 1))))
        return out


# -----------------------------------------------------------------------------
# position tricks (training options for any scheme that takes positions)

def randomized_positions(T, max_pos, generator=None, batch=None, device=None):
    """Randomized positions (Ruoss et al., arXiv 2305.16843): a sorted random subset of T
    distinct integers from [0, max_pos). Default: one draw shared by the batch, [T]
    (what model.py's positions are: one int64 vector per forward); batch=B gives one
    draw per row, [B, T].
    What the paper's code does (github.com/google-deepmind/randomized_positional_encodings,
    commit e8c6474): models/positional_encodings.py noisy_fixed_positional_encodings
    draws jrandom.choice(arange(noise_max_length), (T,), replace=False), sorted, i.e.
    one draw per batch; models/transformer.py applies it with no train/eval switch and
    experiments/range_evaluation.py passes a fresh rng to every evaluation batch, so
    test sequences get ordered random positions too (a new draw per batch). Range:
    noise_max_length = 2048 in experiments/example.py (training length 40; the paper
    tests up to 500), i.e. max_pos well above the longest test length. Here: take
    max_pos >= the longest evaluated sequence, and evaluate both ways (random, as in the
    paper, and plain arange)."""
    if max_pos < T:
        raise ValueError(f"randomized_positions: need max_pos >= T, got max_pos={max_pos} < T={T}")
    # generator must live on `device`
    if batch is None:
        pos = torch.randperm(max_pos, generator=generator, device=device)[:T]
    else:  # independent subsets per row: argsort of uniform noise is a random permutation per row
        pos = torch.rand(batch, max_pos, generator=generator, device=device).argsort(-1)[:, :T]
    return pos.sort(-1).values


def random_offset(T, max_offset, generator=None, device=None):
    """arange(T) + k with k ~ U{0..max_offset}, one k per batch: shifted positions as in
    SHAPE (Kiyono et al., arXiv 2109.05644), so no absolute position is tied to the start."""
    k = torch.randint(0, max_offset + 1, (1,), generator=generator, device=device)
    return torch.arange(T, device=device) + k


# -----------------------------------------------------------------------------
# evaluation of a model (train.py's periodic and final evaluation of a task run)

@torch.no_grad()
def evaluate(model, name, N, device='cpu', ctx=None, positions='plain', pos_max=0, mult=4, reps=16, seed=1234,
             stop=None):
    """Exact match and per-token accuracy per length bin over sizes 1..mult*N (reps rows per
    size, the same rows for every model), teacher-forced, plus the answer loss in
    distribution (sizes <= N) -> JSON-ready dict. positions: 'plain' (0..T-1) or
    'randomized' (a fresh sorted draw from [0, pos_max) per batch, as Ruoss et al.
    evaluate). A bin with rows the model cannot address (a position table shorter than
    the sequence, or T > pos_max) is reported as None, not as 0."""
    import torch.nn.functional as F
    from contextlib import nullcontext
    was_training = model.training
    model.eval()
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    scores, cannot = BinScores(bin_edges(N, mult)), set()
    loss_sum, loss_n = 0.0, 0
    for n in range(1, mult * N + 1):  # one batch per size: no padding past what the size needs
        if stop is not None and stop():
            break
        x, y, ns_t = make_batch(name, [n] * reps, rng)
        T = x.size(1)
        if (model.pe.max_len is not None and T > model.pe.max_len) or (positions != 'plain' and T > pos_max):
            cannot.add(n)
            continue
        pos = randomized_positions(T, pos_max, g).to(device) if positions != 'plain' else None
        with ctx or nullcontext():
            logits, _ = model(x.to(device), pos=pos, n_pos=pos_max if pos is not None else None)
        scores.add(logits.float(), y.to(device), ns_t)
        ind = ns_t <= N
        if ind.any():
            lp = F.cross_entropy(logits.float()[ind].transpose(1, 2), y[ind].to(device), ignore_index=-1,
                                 reduction='sum')
            loss_sum, loss_n = loss_sum + lp.item(), loss_n + int((y[ind] != -1).sum())
    model.train(was_training)
    bins = scores.result()
    for b in bins:
        if any(b['lo'] <= n <= b['hi'] for n in cannot):
            b['exact'] = b['token_acc'] = None
    edges = bin_edges(N, mult)
    for lo, hi in zip(edges[:-1], edges[1:]):  # bins the model could not address at all
        if not any(b['lo'] == lo for b in bins) and any(lo <= n < hi for n in cannot):
            bins.append(dict(lo=lo, hi=hi - 1, rows=0, exact=None, token_acc=None))
    bins.sort(key=lambda b: b['lo'])

    def mean(sel):
        v = [b['exact'] for b in bins if sel(b) and b['exact'] is not None]
        return float(np.mean(v)) if v else None
    return {'task': name, 'N': N, 'mult': mult, 'reps': reps, 'positions': positions, 'bins': bins,
            'loss_id': loss_sum / max(loss_n, 1), 'exact_id': mean(lambda b: b['hi'] <= N),
            'exact_ood': mean(lambda b: b['lo'] > N), 'complete': not (stop is not None and stop())}
