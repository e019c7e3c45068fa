"""The attention of fox, path, path_fox, wall and stick_breaking on flash-linear-attention's Triton kernels
(kernels.py): each kernel under Triton's interpreter against nanoPE's own PyTorch path (forward, and the gradients
of q, k, v, the layer input, the sink logits and every scheme parameter; GQA, windows and sink logits where the
kernel takes them), each convention mapping shown to matter (the same call with the mapping changed misses), the
graph breaks under torch.compile, and, without triton, the one-line refusals of attn_backend='fla', 'auto' on CPU
unchanged, and the backend each layer reports."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

import kernels
import positional
from conftest import ROOT, fork_run, tiny_model
from fla_interpret import CASES

FLA_SCHEMES = ['fox', 'path', 'path_fox', 'stick_breaking', 'wall']
MISSING = [m for m in ('triton', 'einops', 'fla') if importlib.util.find_spec(m) is None]


def fla_notes(model, device):
    """kernels.fla_notes of a model's layers."""
    return kernels.fla_notes([block.attn.fla_note for block in model.transformer.h], device)


# fla_interpret.py's cases in two halves, a subprocess each, in two xdist groups, so that under pytest -n 2 the
# two workers can interpret them at the same time: the whole-model cases (and explain), and the hooks.
HALVES = {'fla-models': [c for c in CASES if c.startswith(('model_', 'explain_'))]}
HALVES['fla-hooks'] = [c for c in CASES if c not in HALVES['fla-models']]
HALF = {c: half for half, cases in HALVES.items() for c in cases}


@pytest.fixture(scope='session')
def interpreted():
    """The halves this worker has run: {half: CompletedProcess}, filled by `interpret`."""
    if MISSING:
        pytest.skip(f"fla's kernels need {', '.join(MISSING)} (pip install -r requirements.txt; triton: Linux only)")
    return {}


def interpret(runs, half):
    """The cases of `half`, run once per worker in a subprocess with TRITON_INTERPRET=1 -> {case: result}."""
    if half not in runs:
        env = dict(os.environ, TRITON_INTERPRET='1')
        runs[half] = subprocess.run([sys.executable, os.path.join(ROOT, 'tests', 'fla_interpret.py')] + HALVES[half],
                                    capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    r = runs[half]
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if 'unavailable' in res:
        pytest.skip(f"fla cannot run under Triton's interpreter here: {res['unavailable']}")
    return res


@pytest.mark.parametrize('case', [pytest.param(c, marks=pytest.mark.xdist_group(HALF[c])) for c in CASES
                                  if not c.startswith('explain')])
def test_fla_kernel_equals_nanope_path(interpreted, case):
    """Output and gradients within tolerance of nanoPE's dense path; each mapping changed on purpose misses."""
    r = interpret(interpreted, HALF[case])[case]
    assert 'error' not in r, r['error']
    bad = {k: v for k, v in r['checks'].items() if not v[0] <= v[1]}
    assert r['checks'] and not bad, bad
    near = {k: v for k, v in r['far'].items() if not v[0] >= v[1]}
    assert not near, f"a wrong mapping would pass: {near}"


def test_every_fla_scheme_and_option_is_covered():
    """Each scheme with an fla kernel has hook cases and a model case; GQA, windows and sinks are covered where
    the kernel takes them."""
    assert positional.PositionalEncoding.fla_schemes() == FLA_SCHEMES
    for s in FLA_SCHEMES:
        assert f'model_{s}' in CASES and any(c == s or c.startswith(s + '_') for c in CASES), s
    for kernel, has in (('attn', 'fox_window_sinks_gqa'), ('wall', 'wall_scalar_window_sinks_gqa'),
                        ('path', 'path_gqa'), ('stickbreaking', 'stick_breaking_current_gqa')):
        assert has in CASES, kernel


@pytest.mark.xdist_group('fla-models')
def test_model_layers_run_and_report_fla(interpreted):
    """A whole model on attn_backend='fla' says each layer ran its fla kernel; on 'dense', nanoPE's path."""
    res = interpret(interpreted, 'fla-models')
    for s in FLA_SCHEMES:
        route = 'own' if s == 'stick_breaking' else 'dense'  # its own attention; the others' logits through attend
        kernel = f"fla:{positional.REGISTRY[s].fla_kernel}"
        assert res[f'model_{s}']['backends'] == {'dense': [route] * 2, 'fla': [kernel] * 2}, s


@pytest.mark.xdist_group('fla-models')
def test_the_fla_call_is_the_only_graph_break(interpreted):
    """Under torch.compile every graph break is the adapter's torch.compiler.disable (the frames above it break at the
    call), and a layer's graphs are reused by every layer: a handful of graphs whatever the depth."""
    r = interpret(interpreted, 'fla-models')['explain_fox']
    assert 'error' not in r, r['error']
    assert r['breaks'] >= 1 and r['graphs'] <= 6, r
    assert all('torch.compiler.disable' in why for why in r['reasons']), r['reasons']


# --- without triton: the refusals, 'auto' on CPU, the backend each layer reports

@pytest.mark.parametrize('scheme, kw, says', [
    ('rope', {}, "rope on layer 0 has no flash-linear-attention kernel"),
    ('path', dict(sliding_window=4), "has no sliding window: drop sliding_window"),
    ('stick_breaking', dict(sliding_window=4), "has no sliding window"),
    ('path_fox', dict(sink_logits=True), "takes no sink logits: drop sink_logits"),
    ('fox', dict(attention_chunk_size=8), "has no chunked attention: drop attention_chunk_size"),
    ('path', dict(n_embd=48, n_head=2), "takes head sizes 16, 32, 64, 128, not n_embd / n_head = 24"),
    ('wall', dict(n_embd=1040, n_head=2), "head sizes at most 256, not n_embd / n_head = 520"),
    ('stick_breaking', dict(dropout=0.1), "has no attention dropout: set dropout=0"),
])
def test_fla_is_refused_in_one_line_naming_the_fix(scheme, kw, says):
    with pytest.raises(ValueError) as e:
        tiny_model(scheme, attn_backend='fla', **kw)
    msg = str(e.value)
    assert says in msg and msg.startswith("attn_backend='fla'") and '\n' not in msg, msg
    assert "attn_backend='auto'" in msg


def test_fla_without_a_gpu_or_the_interpreter_or_fla_is_refused(monkeypatch):
    """Where fla cannot run at all, attn_backend='fla' says why (not installed; no CUDA and no interpreter) in one
    line; this process has no interpreter (the tests above run it in a subprocess)."""
    ok, why = kernels.fla_status()
    if not torch.cuda.is_available() and not kernels.interpreting():
        assert not ok and ('is not installed' in why or 'TRITON_INTERPRET=1' in why), why
    monkeypatch.setattr(kernels, 'fla_status', lambda: (False, 'fla-core is not installed: pip install fla-core'))
    with pytest.raises(ValueError, match=r"^attn_backend='fla' cannot run fox on layer 0: fla-core is not installed"):
        tiny_model('fox', attn_backend='fla')


@pytest.mark.parametrize('autotune', [True, False])
def test_autotune_false_runs_fla_kernels_first_config_untimed(autotune):
    """kernels.AUTOTUNE=False (tools/gpu_check.py's default): once an fla kernel is loaded, every autotuned Triton
    kernel keeps only its first candidate config and times none; with True (training) all candidates stay. In a
    process of its own: this one keeps fla unimported (test_auto_on_cpu_is_nanopes_path)."""
    if importlib.util.find_spec('triton') is None or importlib.util.find_spec('fla') is None:
        pytest.skip('triton or fla-core is not installed')
    code = ("import kernels\n"
            "from triton.runtime.autotuner import Autotuner\n"
            "Autotuner.prune_configs = lambda self, kwargs: ['first', 'second', 'third']\n"
            f"kernels.AUTOTUNE = {autotune}\n"
            "kernels.fla_op('wall')\n"
            "print(Autotuner.prune_configs(None, {}))\n")
    env = {k: v for k, v in os.environ.items() if k != 'TRITON_INTERPRET'}
    out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split('\n')[-2] == str(['first', 'second', 'third'] if autotune else ['first'])


def test_an_unknown_attn_backend_is_refused():
    with pytest.raises(ValueError, match="attn_backend='flash' is not one of 'auto', 'flex', 'dense', 'fla'"):
        tiny_model('fox', attn_backend='flash')


@pytest.mark.parametrize('scheme', FLA_SCHEMES)
def test_auto_on_cpu_is_nanopes_path(scheme):
    """attn_backend='auto' on CPU runs nanoPE's path, bit for bit the dense one, and imports no fla."""
    x = torch.randint(0, 37, (2, 16), generator=torch.Generator().manual_seed(0))
    auto, dense = tiny_model(scheme, attn_backend='auto'), tiny_model(scheme, attn_backend='dense')
    route = 'own' if scheme == 'stick_breaking' else 'dense'  # its own attention; the others' logits through attend
    assert auto.routes('cpu') == [route, route] and fla_notes(auto, 'cpu') == []
    la, ld = auto(x, x)[1], dense(x, x)[1]
    assert torch.equal(la, ld)
    la.backward()
    assert 'fla.ops' not in sys.modules


def test_auto_on_cuda_uses_fla_where_it_can_and_says_once_why_not(monkeypatch):
    """On a CUDA machine (simulated) 'auto' runs fla on the layers whose options the kernel takes, and the log's
    notes say, once per reason with its layers, why the others do not; on CPU tensors those layers stay on nanoPE's
    path. Nothing is imported: fla_status is simulated too."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(kernels, 'fla_status', lambda: (True, None))
    m = tiny_model('path', n_layer=3, n_embd=32, n_head=2, attn_backend='auto', sliding_window={1: 4})
    assert m.routes('cuda') == ['fla:path', 'flex', 'fla:path']  # layer 1: its logits to FlexAttention
    assert m.routes('cpu') == ['dense', 'dense', 'dense']
    assert m.plan_lines('cuda')[0] == 'layer 0: path; attention fla:path'
    notes = fla_notes(m, 'cuda')
    assert notes == ["attn_backend='auto': layers 1 run nanoPE's PyTorch attention, not fla's kernel: "
                     "parallel_path_attn has no sliding window: drop sliding_window on this layer"]
    assert fla_notes(m, 'cpu') == []
    monkeypatch.setattr(kernels, 'fla_status', lambda: (False, 'fla-core is not installed: pip install fla-core'))
    m = tiny_model('fox', attn_backend='auto')
    assert m.routes('cuda') == ['qk_lift', 'qk_lift']  # its bias as an extra column of q and k
    assert m.routes('cuda', dtype=torch.bfloat16) == ['flex', 'flex']  # its gates' gradients: float32
    assert fla_notes(m, 'cuda') == ["attn_backend='auto': layers 0, 1 run nanoPE's PyTorch attention, not fla's "
                                   "kernel: fla-core is not installed: pip install fla-core"]
    assert fla_notes(tiny_model('rope', attn_backend='auto'), 'cuda') == []  # no kernel: nothing to fall back from
    monkeypatch.setattr(kernels, 'fla_status', lambda: (True, None))
    m = tiny_model('wall', attn_backend='auto')  # exact only in a range a trained gate can leave: not under 'auto'
    assert m.routes('cuda') == ['flex', 'flex']
    assert 'decays by more than about 76 nats' in fla_notes(m, 'cuda')[0]
    assert tiny_model('wall', attn_backend='fla').routes('cuda') == ['fla:wall', 'fla:wall']


def test_a_kv_cache_stays_on_nanopes_path(monkeypatch):
    """Decoding with a KV cache never calls fla; 'fla' on CPU tensors without the interpreter is one line."""
    from attention import Attender
    q = torch.zeros(1, 2, 3, 16)
    fla = Attender(backend='fla', fla='attn')
    assert not fla.uses_fla(q, cache=object())
    assert not Attender(backend='auto', fla='attn').uses_fla(q, None)  # 'auto' on CPU
    assert not Attender(backend='fla').uses_fla(q, None)  # no kernel for this layer
    for backend in ('flex', 'dense'):  # set on a built model by tools/bench.py and gpu_check.py: never fla
        assert not kernels.runs_fla('attn', backend, 'cuda')
    assert kernels.runs_fla('attn', 'auto', 'cuda') and kernels.runs_fla('attn', 'fla', 'cpu')
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    with pytest.raises(ValueError, match=r"^attn_backend='fla' on CPU tensors needs Triton's interpreter"):
        fla.uses_fla(q, None)


@pytest.mark.e2e
def test_train_log_and_eval_json_say_which_route_each_layer_ran(char_data, tmp_path):
    """train.py's plan lines say each layer's route in training, eval.json's routes the route of the
    evaluation (on CPU fox's gate bias goes to the dense path); a checkpoint's 'fla' evaluated where fla cannot
    run is refused in one line."""
    out = str(tmp_path / 'out')
    r = fork_run(['train.py', 'config/fox.py', f'--data_dir={char_data}', f'--out_dir={out}', '--max_iters=2',
                  '--eval_interval=2', '--n_layer=2', '--n_head=2', '--n_embd=32', '--block_size=16', '--batch_size=8',
                  '--eval_tokens=256', '--eval_mults=[1]', '--final_eval_mults=[1]', '--wandb_log=False',
                  '--compile=False'])
    assert r.returncode == 0, r.stderr[-2000:]
    assert '  layer 0: fox; attention dense\n  layer 1: fox; attention dense\n' in r.stdout
    assert json.load(open(os.path.join(out, 'eval.json')))['routes'] == ['dense', 'dense']
    r = fork_run(['train.py', f'--out_dir={out}-x', '--attn_backend=flash', '--wandb_log=False'])
    assert r.returncode != 0 and "attn_backend" in r.stderr and 'Traceback' not in r.stderr
    # a checkpoint saved with 'fla' (a GPU run's), evaluated where fla cannot run: refused in one line, and
    # eval.py's --attn_backend replaces it
    path = os.path.join(out, 'ckpt.pt')
    ck = torch.load(path, weights_only=True)
    ck['model_args']['attn_backend'] = 'fla'
    torch.save(ck, path)
    quick = ['eval.py', f'--out_dir={out}', '--mults=[1]', '--tokens=64', '--quick=True']
    if not kernels.fla_status()[0]:  # this process: no GPU and no interpreter, or no fla
        r = fork_run(quick)
        assert r.returncode != 0 and "attn_backend='fla' cannot run fox on layer 0" in r.stderr, r.stderr[-2000:]
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = fork_run(quick + ['--attn_backend=dense'])
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.load(open(os.path.join(out, 'eval_quick.json')))['routes'] == ['dense', 'dense']
