"""What every script shares: the option mechanism, portable out_dirs, Hugging Face GPT-2
weights (nanoGPT's init_from='gpt2'), and evaluation that scores only what it needs."""
import os
import shutil

import numpy as np
import pytest
import torch

import configurator
import evaluation as E
from conftest import ROOT, SCHEMES, fork_run, tiny_model

TINY = ['--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=8', '--eval_tokens=256',
        '--wandb_log=False', '--compile=False', '--eval_mults=[1]', '--final_eval=False']


# --- the option mechanism -------------------------------------------------------

def test_configure_types_rules_and_files(tmp_path):
    d = dict(lr=1e-3, n=4, mults=[1, 2], name='x', opt=None)
    assert configurator.configure(d, ['--lr=1', '--mults=1,2,4', "--opt={'a': 1}"]) == {'lr', 'mults', 'opt'}
    assert d['lr'] == 1.0 and isinstance(d['lr'], float) and d['mults'] == [1, 2, 4] and d['opt'] == {'a': 1}
    cfg = tmp_path / 'c.py'
    cfg.write_text("n = 8\n_private = 3\n")
    configurator.configure(d, [str(cfg)])
    assert d['n'] == 8 and '_private' not in d
    with pytest.raises(SystemExit) as e:  # every problem, one line each
        configurator.configure(dict(d), ['--n=0', '--lr=-1', '--nn=3', '--name=5'], rules=dict(n='>0', lr='>0'))
    lines = str(e.value).splitlines()
    assert len(lines) == 4 and "unknown config key 'nn'; did you mean n?" in lines[0]
    assert "'name' expects str" in lines[1] and lines[2] == '--n=0: must be a positive number'


def test_an_unknown_name_gets_its_closest_valid_ones(tmp_path):
    """A misspelt scheme (model config, sweep.py --schemes, the tools' --schemes) is met as a misspelt key is: the
    closest valid names first, by the one difflib rule, then every valid one; a name close to none gets the list
    alone."""
    from model import GPT, GPTConfig
    every = ', '.join(SCHEMES)
    with pytest.raises(ValueError) as e:
        GPT(GPTConfig(pos_encoding='ropee', vocab_size=10))
    assert str(e.value) == f"unknown pos_encoding 'ropee'; did you mean rope, mrope, ropepp? valid schemes: {every}"
    with pytest.raises(ValueError) as e:
        GPT(GPTConfig(pos_encoding='qqq', vocab_size=10))
    assert str(e.value) == f"unknown pos_encoding 'qqq'; valid schemes: {every}"
    r = fork_run(['sweep.py', '--schemes=rope,alibii,kerple', f'--out={tmp_path}/sw'])
    assert r.returncode != 0 and r.stderr.strip() == (
        f"unknown scheme(s) 'alibii', 'kerple'; did you mean alibi for 'alibii'; kerple_log, kerple_power, rope for "
        f"'kerple'? registered: {every}"), r.stderr[-2000:]
    assert not os.path.exists(tmp_path / 'sw')
    import presets  # tools/bench.py's and tools/gpu_check.py's --schemes
    with pytest.raises(SystemExit) as e:
        presets.scheme_names('rope,ropee')
    assert str(e.value) == f"unknown scheme(s) 'ropee'; did you mean rope, mrope, ropepp? valid (or 'all'): {every}"


def test_config_file_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / 'bad.py'
    bad.write_text("n_layer = 4\nblock_size = = 3\n")
    r = fork_run(['train.py', str(bad)])
    assert r.returncode != 0 and 'Traceback' not in r.stderr and f'config file {bad}, line 2' in r.stderr
    r = fork_run(['train.py', str(tmp_path)])
    assert r.returncode != 0 and 'is a directory' in r.stderr and 'Traceback' not in r.stderr



def test_named_run_configs_hold_the_sizes_the_scripts_used():
    """The named runs read from config/ hold, value for value and type for type, the sizes that
    sweep.py (GPU, TASK_TRAIN) and tools/bench.py (PRESETS) defined inline before; sweep passes them
    to train.py as these exact strings, in this order."""
    import sweep
    want = {
        'sweep_gpu.py': dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, max_iters=5000,
                             eval_interval=500, learning_rate=0.001, min_lr=0.0001, warmup_iters=100, dropout=0.1),
        'task_small.py': dict(n_layer=3, n_head=4, n_embd=64, batch_size=64, max_iters=1500, eval_interval=500,
                              log_interval=100, learning_rate=0.003, min_lr=0.0003, warmup_iters=100, compile=False),
        'bench_default.py': dict(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=84, batch_size=32),
        'bench_gpt2.py': dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304, batch_size=8),
    }
    for name, values in want.items():
        got = configurator.read_config_file(os.path.join(ROOT, 'config', name))
        assert list(got.items()) == list(values.items()), name
        assert [type(v) for v in got.values()] == [type(v) for v in values.values()], name
    assert sweep.config_args(sweep.GPU_CONFIG) == {
        'n_layer': '6', 'n_head': '6', 'n_embd': '384', 'block_size': '256', 'batch_size': '64', 'max_iters': '5000',
        'eval_interval': '500', 'learning_rate': '0.001', 'min_lr': '0.0001', 'warmup_iters': '100', 'dropout': '0.1'}
    assert ' '.join(f'--{k}={v}' for k, v in sweep.config_args(sweep.TASK_CONFIG).items()) == (
        '--n_layer=3 --n_head=4 --n_embd=64 --batch_size=64 --max_iters=1500 --eval_interval=500 '
        '--log_interval=100 --learning_rate=0.003 --min_lr=0.0003 --warmup_iters=100 --compile=False')


def test_smoke_timing_reads_the_runs_own_eval_json(tmp_path):
    """tools/bench.py's smoke table takes where a run's time went from the run's eval.json (`timing`:
    startup_s, train_s, final_eval_s), not from its log; a run that reports none, or reports it
    damaged, gives no phases rather than wrong ones."""
    import json
    from bench import smoke_timing
    (tmp_path / 'eval.json').write_text(json.dumps({'iter': 4, 'complete': True, 'val_loss': 4.05, 'timing': {
        'startup_s': 2.5, 'train_s': 1, 'final_eval_s': 3.25, 'extra_s': 9.0}}))
    t = smoke_timing(str(tmp_path))
    assert t == {'startup_s': 2.5, 'train_s': 1.0, 'final_eval_s': 3.25} and type(t['train_s']) is float
    for bad in ({'iter': 4}, {'timing': {'startup_s': 2.5, 'train_s': 1.0}},
                {'timing': {'startup_s': '2.5', 'train_s': 1.0, 'final_eval_s': 3.0}}, {'timing': [1, 2, 3]}, [1]):
        (tmp_path / 'eval.json').write_text(json.dumps(bad))
        assert smoke_timing(str(tmp_path)) == {}, bad
    (tmp_path / 'eval.json').write_text('{"timing": {"startup_s": 2.5, "tr')  # truncated
    assert smoke_timing(str(tmp_path)) == {} and smoke_timing(str(tmp_path / 'nowhere')) == {}


def test_gpu_check_trains_each_model_and_can_leave_it_uncompiled(tmp_path, monkeypatch):
    """gpu_check's training check learns its repeated batch (the last step's loss below the first's), with sink
    logits and windows too (the gpt_oss preset), and --compile=False keeps the model out of torch.compile, so a
    lent GPU can tell the compiled graph's fault from the kernel's."""
    import json
    import gpu_check

    def refuse(*a, **kw):
        raise AssertionError('torch.compile called with --compile=False')
    monkeypatch.setattr(torch, 'compile', refuse)
    path = str(tmp_path / 'check.json')
    rc = gpu_check.main(['--schemes=rope', '--presets=gpt_oss', '--compile=False', '--n_layer=2', '--n_embd=32',
                         '--n_head=2', '--block_size=32', '--batch_size=4', '--steps=3', f'--json={path}'])
    got = json.load(open(path))['results']
    assert rc == 0 and sorted(got) == ['gpt_oss', 'rope'], got
    for name, r in got.items():
        assert r['correct'] and 'train_error' not in r, (name, r)
        assert r['loss'] < r['loss_first'] - 0.01 and r['learns'], (name, r['loss_first'], r['loss'])


GPU_CHECK_TINY = ['--n_layer=2', '--n_embd=32', '--n_head=2', '--block_size=32', '--batch_size=4']


def test_gpu_check_stops_a_scheme_past_its_limit_and_goes_on(tmp_path):
    """--scheme_limit ends one scheme's check as its error (SchemeTimeout), and the next scheme is still checked."""
    import json
    import gpu_check
    path = str(tmp_path / 'check.json')
    rc = gpu_check.main(['--parts=correct', '--schemes=alibi', '--presets=', '--scheme_limit=0.001',
                         f'--json={path}'] + GPU_CHECK_TINY)
    res = json.load(open(path))['results']
    assert rc == 1 and list(res) == ['rope', 'alibi'] and all(r['error'].startswith('SchemeTimeout')
                                                              for r in res.values())


def test_attn_grads_match_float64_and_see_a_dropped_logsumexp_gradient(tmp_path, monkeypatch):
    """--parts=attn_grads: dq, dk and dv of each kind of layer against a float64 copy on the dense path are
    float32's rounding on CPU; with the logsumexp's gradient dropped (as a kernel's backward might), dq and dk of
    the layers that read it (Shaw's value term, sink logits) are off by more than 5%, and the check fails."""
    import json
    import attention
    import gpu_check
    path = str(tmp_path / 'grads.json')
    argv = ['--parts=attn_grads', '--schemes=rope,shaw', '--presets=gpt_oss', '--compile=False',
            f'--json={path}'] + GPU_CHECK_TINY
    assert gpu_check.main(argv) == 0
    res = json.load(open(path))['results']
    assert list(res['gpt_oss']['attn_grads']) == ['layer 0', 'layer 1']  # its sliding and its full layer
    for name, r in res.items():
        assert r['correct'], (name, r)
        for e in r['attn_grads'].values():
            assert max(e[k] for k in ('dq', 'dk', 'dv', 'dq_dense', 'dk_dense', 'dv_dense')) < 1e-5, (name, e)
            assert 0 < e['param_worst_err'] < 1e-4, (name, e)
    dense = attention._dense

    def lse_dropped(q, *args, **kw):  # the run under test loses the logsumexp's gradient; the float64 one keeps it
        y, lse = dense(q, *args, **kw)
        return y, lse if lse is None or q.dtype == torch.float64 else lse.detach()
    monkeypatch.setattr(attention, '_dense', lse_dropped)
    assert gpu_check.main(argv) == 1
    res = json.load(open(path))['results']
    assert res['rope']['correct'] and not res['shaw']['correct'] and not res['gpt_oss']['correct']
    for name in ('shaw', 'gpt_oss'):
        for e in res[name]['attn_grads'].values():
            assert min(e['dq'], e['dk']) > 0.05 and e['dv'] < 1e-5, (name, e)


def test_attn_grads_compiled_sees_a_compiler_that_loses_a_table_gradient(tmp_path, monkeypatch):
    """--parts=attn_grads compiles each layer too (--compile, the default) and checks its parameter gradients against
    float64: a compiled layer that loses the gradient of T5's table on route sdpa_bias (routes forced as on CUDA, the
    compiler stood in for by one whose graph lays the table out from a detached vector) fails the check, one that
    keeps it passes, and dq, dk, dv are checked compiled as well."""
    import json
    import attention
    import gpu_check
    from conftest import forced_cuda_routes
    real_toeplitz = attention.toeplitz
    forced_cuda_routes(monkeypatch)
    path = str(tmp_path / 'grads.json')
    argv = ['--parts=attn_grads', '--schemes=t5', '--presets=', f'--json={path}'] + GPU_CHECK_TINY
    for lossy in (False, True):
        def compiled(module, lossy=lossy):
            def run(*args):
                if lossy:
                    monkeypatch.setattr(attention, 'toeplitz', lambda vec, T: real_toeplitz(vec.detach(), T))
                try:
                    return module(*args)
                finally:
                    monkeypatch.setattr(attention, 'toeplitz', real_toeplitz)
            return run
        monkeypatch.setattr(torch, 'compile', compiled)
        assert gpu_check.main(argv) == int(lossy)
        e = json.load(open(path))['results']['t5']['attn_grads']['layer 0']
        assert e['route'] == 'sdpa_bias' and max(e[f'd{n}_compiled'] for n in 'qkv') < 1e-5, e
        assert e['compiled_ok'] != lossy and (e['param_worst_compiled_err'] == 1.0) == lossy, e


# --- portable out_dirs ------------------------------------------------------------

@pytest.mark.e2e
def test_out_dir_moved_with_its_data_gone(char_data, tmp_path):
    """The checkpoint keeps its vocabulary: a copied out_dir samples without the data folder,
    and eval.py finds its data again with --data_dir (and says so when it cannot)."""
    a = str(tmp_path / 'a')
    r = fork_run(['train.py', f'--data_dir={char_data}', f'--out_dir={a}', '--max_iters=2', '--eval_interval=2'] + TINY)
    assert r.returncode == 0, r.stderr[-2000:]
    b = str(tmp_path / 'elsewhere' / 'b')
    shutil.copytree(a, b)
    moved = str(tmp_path / 'moved_data')
    shutil.move(char_data, moved)
    r = fork_run(['sample.py', f'--out_dir={b}', '--max_new_tokens=20', '--start=to be'])
    assert r.returncode == 0, r.stderr[-2000:]
    text = r.stdout[r.stdout.index('to be'):].split('---------------')[0]
    assert len(text) >= 22 and set(text) <= set('\ntobeqursinhlw ')  # decoded with its char vocabulary
    r = fork_run(['eval.py', f'--out_dir={b}', '--mults=[1]', '--tokens=64', '--quick=True'])
    assert r.returncode != 0 and '--data_dir' in r.stderr and 'Traceback' not in r.stderr
    r = fork_run(['eval.py', f'--out_dir={b}', f'--data_dir={moved}', '--mults=[1]', '--tokens=64', '--quick=True'])
    assert r.returncode == 0, r.stderr[-2000:]
    assert os.path.exists(os.path.join(b, 'eval_quick.json'))


# --- Hugging Face GPT-2 -------------------------------------------------------------

@pytest.fixture(scope='module')
def hf_gpt2(tmp_path_factory):
    """A tiny randomly initialised HF GPT-2 (GPT-2's vocabulary, 64 positions), saved locally."""
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64,
                                                              vocab_size=50257)).eval()
    folder = str(tmp_path_factory.mktemp('hf-gpt2'))
    hf.save_pretrained(folder)
    return hf, folder


def test_gpt2_weights_give_hf_logits(hf_gpt2):
    from model import GPT
    hf, folder = hf_gpt2
    m = GPT.from_pretrained(folder).eval()
    assert m.config.pos_encoding == 'learned' and m.config.gelu == 'tanh' and m.config.bias
    x = torch.randint(0, 50257, (2, 48))
    with torch.no_grad():
        assert (m(x)[0] - hf(x).logits).abs().max() < 1e-4


@pytest.mark.e2e
def test_gpt2_sample_eval_and_finetune(hf_gpt2, offline, tmp_path):
    """sample.py past the 64-position table (sliding-window fallback), eval.py with the sliding
    fallback past it, and train.py fine-tuning from the weights (a conflicting shape is refused). Forked
    children: they find the offline vocabulary as this process does (TIKTOKEN_CACHE_DIR, set by `offline`)."""
    _, folder = hf_gpt2
    from data.text.prepare import prepare
    prepare(['The quick brown fox jumps over the lazy dog. ' * 400], str(tmp_path / 'bpe'), tokenizer='gpt2')
    r = fork_run(['sample.py', f'--init_from={folder}', '--max_new_tokens=80', '--start=Hello'])
    assert r.returncode == 0, r.stderr[-2000:]
    assert 'sliding window' in r.stdout and r.stdout.split('\n', 2)[2].startswith('Hello')
    out = str(tmp_path / 'eval')
    r = fork_run(['eval.py', f'--init_from={folder}', f'--data_dir={tmp_path / "bpe"}', f'--out_dir={out}',
                  '--mults=[1, 2]', '--tokens=256', '--last_k_spans=4'])
    assert r.returncode == 0, r.stderr[-2000:]
    import json
    res = json.load(open(os.path.join(out, 'eval.json')))
    assert res['nonoverlap'][1] is None and res['sliding_window'] == [64, 64] and res['sliding'][1] is not None
    r = fork_run(['train.py', f'--init_from={folder}', f'--data_dir={tmp_path / "bpe"}', f'--out_dir={tmp_path / "ft"}',
                  '--block_size=32', '--batch_size=4', '--max_iters=2', '--eval_interval=2', '--eval_tokens=128',
                  '--eval_mults=[1]', '--final_eval=False', '--compile=False', '--wandb_log=False'])
    assert r.returncode == 0, r.stderr[-2000:]
    ck = torch.load(str(tmp_path / 'ft' / 'ckpt.pt'), weights_only=True)
    assert ck['model_args']['gelu'] == 'tanh' and ck['config']['pos_encoding'] == 'learned'
    assert ck['config']['n_layer'] == 2  # the saved config describes the saved model
    r = fork_run(['train.py', f'--init_from={folder}', f'--data_dir={tmp_path / "bpe"}', f'--out_dir={tmp_path / "x"}',
                  '--n_layer=4', '--block_size=32', '--wandb_log=False'])
    assert r.returncode != 0 and 'n_layer=4 cannot apply' in r.stderr and 'Traceback' not in r.stderr


# --- evaluation that costs what it scores ---------------------------------------------

@pytest.mark.parametrize('scheme', ['rope', 'alibi', 'learned'])
def test_position_selected_chunked_loss_equals_full(scheme):
    """Per-token losses from logits of only the scored positions, in chunks of positions, equal
    cross-entropy over the full logits on every protocol's slice (1e-5)."""
    m = tiny_model(scheme, vocab_size=300).eval()
    x = torch.randint(0, 300, (3, 16))
    y = torch.randint(0, 300, (3, 16))
    with torch.no_grad():
        logits, _ = m(x)
        full = torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction='none')
        for n in (16, 8, 3, 1):  # non-overlapping, sliding (stride), last-k, passkey-style tails
            _, got = m(x, y[:, -n:], reduction='none', last=n)
            assert torch.allclose(got, full[:, -n:], atol=1e-5)
    data = np.random.default_rng(0).integers(0, 300, 4000).astype(np.uint16)
    for T, S in ((16, 16), (16, 4)):
        starts = E.window_layout(len(data), T, S, 20, 4)
        sums, n = E.window_losses(m, data, T, starts, S, batch_tokens=64)
        want = torch.zeros(S, dtype=torch.float64)
        for s in starts:
            xx = torch.from_numpy(data[s:s + T].astype(np.int64))[None]
            yy = torch.from_numpy(data[s + 1:s + T + 1].astype(np.int64))[None]
            with torch.no_grad():
                lg = m(xx)[0]
            want += torch.nn.functional.cross_entropy(lg[0, T - S:], yy[0, T - S:], reduction='none').double()
        assert torch.allclose(sums, want, atol=1e-4)


def test_token_losses_in_small_chunks_equal_one_chunk():
    m = tiny_model('rope', vocab_size=300).eval()
    x, y = torch.randint(0, 300, (2, 16, 32)), torch.randint(0, 300, (2, 16))
    x = x.float()
    with torch.no_grad():
        one = m.token_losses(x, y)
        many = m.token_losses(x, y, chunk_bytes=4 * 300 * 5)  # 5 positions per chunk
    assert torch.allclose(one, many, atol=1e-6)


def test_sample_into_a_pipe_closed_early_ends_quietly(trained):
    """`python sample.py ... | head -1`: when the reader of its output goes, sample.py ends without a
    BrokenPipeError traceback, as Unix tools do."""
    import subprocess
    import sys
    from conftest import RUN_ENV
    p = subprocess.Popen([sys.executable, 'sample.py', f'--out_dir={trained}', '--num_samples=20',
                          '--max_new_tokens=40'], cwd=ROOT, env=RUN_ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith('scheme ')  # its first line, then the reader stops reading (as head does)
    p.stdout.close()
    err = p.stderr.read()
    p.wait(timeout=120)
    assert 'Traceback' not in err and 'BrokenPipe' not in err, err[-2000:]
