"""tools/bench.py's one-model-at-a-time parts (pairs, attn_time, long: the GPU's timing) on CPU: each model timed
against rope of its depth in alternate blocks, whose design a fake device checks; a run cut short or out of budget;
the goal classes; a bias layer timed four ways; docs/gpu.md's table from a hand-written JSON; and the optimizer the
tools train with (tools/harness.py)."""
import json
import statistics
from types import SimpleNamespace

import pytest
import torch

import bench
import harness
import runtime
from model import GPT, GPTConfig

TINY = ['--n_layer=2', '--n_embd=32', '--n_head=2', '--block_size=32', '--batch_size=4', '--threads=1',
        '--compile=False', '--warmup=1']


def pairs(path, *args):
    return bench.main(['--parts=pairs', f'--json={path}', *TINY, *args])


@pytest.fixture
def builds(monkeypatch):
    """The (name, depth) of every model bench builds for training, in order."""
    seen, build = [], bench.Models.build

    def recording(self, name, cfg):
        seen.append((name, cfg.n_layer))
        return build(self, name, cfg)
    monkeypatch.setattr(bench.Models, 'build', recording)
    return seen


def test_pairs_time_each_model_against_rope_of_its_depth(tmp_path, builds):
    """Every model's entry has its class, goal, route per layer, compile time, peak memory and step statistics;
    vs_rope is the median over its blocks of rope's median step in the two blocks beside each over the model's;
    gemma3 (a 6-layer preset) is paired with a 6-layer rope, not the 2-layer one; rope's entries say how its step
    went beside each partner, and rope's MFU."""
    path = str(tmp_path / 'pairs.json')
    assert pairs(path, '--schemes=alibi,none', '--presets=gemma3', '--blocks=3', '--block_steps=2') == 0
    out = json.load(open(path))
    res = out['results']
    assert builds == [('rope', 2), ('alibi', 2), ('none', 2), ('rope-6L', 6), ('gemma3', 6)]
    assert set(res) == {'rope', 'alibi', 'none', 'rope-6L', 'gemma3'}
    assert {n: (r['ref'], r['n_layer']) for n, r in res.items()} == {
        'rope': ('rope', 2), 'alibi': ('rope', 2), 'none': ('rope', 2), 'rope-6L': ('rope-6L', 6),
        'gemma3': ('rope-6L', 6)}
    assert res['alibi']['goal_class'] == 'score_mod' and res['alibi']['routes'] == ['dense'] * 2  # CPU
    assert res['gemma3']['goal_class'] == 'no_bias' and res['gemma3']['routes'] == ['sdpa'] * 6
    for name, r in res.items():
        assert r['goal'] == bench.GOALS[r['goal_class']][1] and len(r['routes']) == r['n_layer']
        assert r['compile_s'] > 0 and r['peak_MiB'] > 0 and r['ms_min'] <= r['ms_q1'] <= r['ms_median'] <= \
            r['ms_q3'] <= r['ms_max'], (name, r)
        if r['ref'] == name:
            assert len(r['ms_blocks']) == 4 and r['vs_rope'] == 1.0
            continue
        mine, refs = r['ms_blocks'], r['rope_ms_blocks']
        assert len(mine) == 3 and len(refs) == 4 and all(len(b) == 2 for b in mine + refs)
        med = [statistics.median(b) for b in refs]
        want = [(med[i] + med[i + 1]) / 2 / statistics.median(b) for i, b in enumerate(mine)]
        assert r['vs_rope_blocks'] == pytest.approx(want)
        assert r['vs_rope'] == pytest.approx(statistics.median(want))
        assert r['vs_rope_q1'] <= r['vs_rope'] <= r['vs_rope_q3']
    assert set(res['rope']['by_partner']) == {'alibi', 'none'} and set(res['rope-6L']['by_partner']) == {'gemma3'}
    assert res['rope']['by_partner']['alibi'] == res['alibi']['rope_ms_median']
    assert res['rope']['mfu'] > 0 and res['rope']['mfu_at'] == [4, 32]
    goals = {g['figure'].split(':')[0]: g for g in out['goals']}
    assert goals['gemma3']['measured'] == res['gemma3']['vs_rope'] and "rope-6L's" in goals['gemma3']['figure']
    assert goals["rope's MFU at 16 x 1024"]['measured'] is None  # measured at 4 x 32 here


def rounded(blocks):
    return [[round(t, 6) for t in b] for b in blocks]


class FakeDevice:
    """Steps that take what a schedule says, on a clock of their own (ms): `cost(name, t)`; a model's first step
    after another's costs `switch` more (what the other left behind), and `after(name)` runs after each step."""

    def __init__(self, cost, switch=0.0, after=lambda name: None):
        self.t, self.last, self.cost, self.switch, self.after = 0.0, None, cost, switch, after

    def step(self, name):
        self.t += self.cost(name, self.t) + (self.switch if self.last not in (None, name) else 0.0)
        self.last = name
        self.after(name)

    def now(self):
        return self.t / 1e3


def test_adjacent_blocks_cancel_a_device_that_slows_down():
    """A device 3x slower from the model's second block on, the model at twice rope's step throughout: vs_rope from
    the blocks beside each of the model's is the true 0.5, where the quotient of all rope's steps' median over the
    model's would say 0.33; the step after a switch, 100 ms dearer, is in no statistic."""
    dev = FakeDevice(lambda name, t: (10.0 if name == 'rope' else 20.0) * (3 if t >= 360 else 1), switch=100.0)
    steps = {n: (lambda n=n: dev.step(n)) for n in ('rope', 'm')}
    timed = bench.time_blocks(bench.pair_order('rope', 'm', 3), steps, 3, dev)
    assert [n for n, _ in timed] == ['rope', 'm'] * 3 + ['rope']
    r = bench.pair_stats(timed, 'rope', 'm')
    assert rounded(r['rope_ms_blocks']) == [[10.0] * 3, [10.0] * 3, [30.0] * 3, [30.0] * 3]
    assert rounded(r['ms_blocks']) == [[20.0] * 3, [60.0] * 3, [60.0] * 3]
    assert r['vs_rope_blocks'] == pytest.approx([0.5, 1 / 3, 0.5]) and r['vs_rope'] == pytest.approx(0.5)
    assert r['rope_ms_median'] / r['ms_median'] == pytest.approx(1 / 3)
    assert r['ms_max'] == pytest.approx(60.0) and r['rope_ms_max'] == pytest.approx(30.0)


def test_rope_beside_a_partner_that_heats_the_device(tmp_path, monkeypatch):
    """A partner (alibi) after whose steps the device runs 1.5x slower until a cool one (none) runs: rope's median
    step beside each partner, in the JSON, shows it (10 ms beside none, 15 beside alibi: a spread of 1.5), and
    alibi's vs_rope is taken against rope's steps as slow as its own conditions (1/3, not 10/45). Timed alone again
    after its partners, rope runs as hot as alibi, the last, left the device: 15 ms against 10 before them."""
    heat = {'v': 1.0}

    def after(name):
        heat['v'] = {'alibi': 1.5, 'none': 1.0}.get(name, heat['v'])
    dev = FakeDevice(lambda name, t: {'rope': 10.0, 'none': 10.0, 'alibi': 30.0}[name] * heat['v'], switch=100.0,
                     after=after)

    def fake_build(self, name, cfg):
        self.res.setdefault(name, {})
        return (lambda: dev.step('rope' if name.startswith('rope') else name)), None
    monkeypatch.setattr(bench.Models, 'build', fake_build)
    a = SimpleNamespace(seed=0, auto_only=False, warmup=1, blocks=3, block_steps=3, scheme_limit=0, compile=False)
    size = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64, batch_size=4)
    path = tmp_path / 'fake.json'
    out = {'meta': {'runs': [{}]}, 'results': {}}
    m = bench.Models(a, size, {}, runtime.setup('cpu', 'float32'), dev, None, out,
                     lambda: path.write_text(json.dumps(out)))
    assert m.run('pairs', ['none', 'alibi'], lambda: False) == []
    res = json.loads(path.read_text())['results']
    rope = res['rope']
    assert rounded(rope['ms_blocks']) == [[10.0] * 3] * 4  # alone
    assert rope['by_partner'] == pytest.approx({'none': 10.0, 'alibi': 15.0})
    assert rope['partner_spread_ms'] == pytest.approx([10.0, 15.0]) and rope['partner_spread'] == pytest.approx(1.5)
    assert rope['ms_median'] == pytest.approx(10.0) and rope['alone_after_ms'] == pytest.approx(15.0)
    assert rounded(res['alibi']['rope_ms_blocks']) == [[10.0] * 3] + [[15.0] * 3] * 3
    assert res['alibi']['ms_max'] == pytest.approx(45.0)
    assert res['alibi']['vs_rope'] == pytest.approx(1 / 3) and res['none']['vs_rope'] == pytest.approx(1.0)


def test_a_run_cut_short_goes_on_where_it_stopped(tmp_path, monkeypatch):
    """Cut (SystemExit, as Ctrl-C or `timeout -s INT` raise) as its third model starts, a run keeps the two it
    measured; the same command again builds only rope (the reference) and the third, leaves the first two as they
    were, and notes both runs. A JSON of another setup is refused rather than mixed."""
    path = str(tmp_path / 'pairs.json')
    argv = ['--schemes=none,alibi,learned', '--presets=', '--blocks=1', '--block_steps=1']
    seen, cut, build = [], {'at': 'learned'}, bench.Models.build

    def cutting(self, name, cfg):
        seen.append(name)
        if name == cut['at']:
            raise SystemExit('cut')
        return build(self, name, cfg)
    monkeypatch.setattr(bench.Models, 'build', cutting)
    with pytest.raises(SystemExit, match='cut'):
        pairs(path, *argv)
    first = json.load(open(path))['results']
    assert seen == ['rope', 'none', 'alibi', 'learned'] and 'vs_rope' not in first.get('learned', {})
    assert 'measuring' not in first.get('learned', {})  # cut short, not crashed: measured again below
    assert all('vs_rope' in first[n] for n in ('rope', 'none', 'alibi'))
    seen.clear()
    cut['at'] = None
    assert pairs(path, *argv) == 0
    out = json.load(open(path))
    assert seen == ['rope', 'learned'] and 'vs_rope' in out['results']['learned']
    assert out['results']['none'] == first['none'] and out['results']['alibi'] == first['alibi']
    assert len(out['meta']['runs']) == 2 and out['results']['learned']['run'] == 1
    with pytest.raises(SystemExit, match='another setup'):
        pairs(path, *argv[:-1], '--block_steps=2')


def test_a_failed_model_is_measured_again_only_with_retry(tmp_path, builds):
    """A model stopped by --scheme_limit fails alone (rope, outside the limit, is timed); run again, its error is its
    result, unless --retry=True, which measures it again."""
    path = str(tmp_path / 'pairs.json')
    argv = ['--schemes=alibi', '--presets=', '--blocks=1', '--block_steps=1']
    assert pairs(path, *argv, '--scheme_limit=0.001') == 1
    res = json.load(open(path))['results']
    assert res['alibi']['error'].startswith('SchemeTimeout') and 'vs_rope' in res['rope']
    builds.clear()
    assert pairs(path, *argv) == 0 and builds == []
    assert pairs(path, *argv, '--retry=True') == 0 and [n for n, _ in builds] == ['rope', 'alibi']
    res = json.load(open(path))['results']
    assert 'error' not in res['alibi'] and res['alibi']['vs_rope'] > 0


def test_a_model_that_killed_the_process_is_an_error_on_resume(tmp_path, monkeypatch):
    """While a model is measured its entry says so on disk ('measuring'); a process that dies there (a crash: a
    segfault in a compiled kernel) leaves it, and the next run records that model's error without measuring it
    again, unless --retry=True; a model measured to the end, or cut short by Ctrl-C, keeps no such mark."""
    path = str(tmp_path / 'pairs.json')
    argv = ['--presets=', '--blocks=1', '--block_steps=1']
    on_disk, build = {}, bench.Models.build

    def peeking(self, name, cfg):
        on_disk[name] = json.load(open(path))['results'].get(name, {}).get('measuring')
        return build(self, name, cfg)
    monkeypatch.setattr(bench.Models, 'build', peeking)
    assert pairs(path, '--schemes=none', *argv) == 0
    assert on_disk['none'] == 'pairs'  # (rope, the reference, is built as the models need it)
    out = json.load(open(path))
    assert not any('measuring' in r for r in out['results'].values())
    out['results']['alibi'] = {'measuring': 'pairs'}  # as a process that died measuring alibi leaves it
    json.dump(out, open(path, 'w'))
    on_disk.clear()
    assert pairs(path, '--schemes=none,alibi', *argv) == 0 and on_disk == {}
    res = json.load(open(path))['results']
    assert res['alibi'] == {'error': 'the process died measuring it (a crash, or killed): --retry=True measures it '
                                     'again'}
    assert pairs(path, '--schemes=none,alibi', *argv, '--retry=True') == 0 and on_disk['alibi'] == 'pairs'
    assert set(on_disk) == {'rope', 'alibi'}
    res = json.load(open(path))['results']
    assert 'error' not in res['alibi'] and res['alibi']['vs_rope'] > 0 and 'measuring' not in res['alibi']


def test_no_model_starts_after_the_budget(tmp_path, monkeypatch):
    """Past --budget no model starts: the one running finishes, the rest are listed as skipped and never built."""
    import time
    seen, build = [], bench.Models.build

    def slow(self, name, cfg):
        seen.append(name)
        time.sleep(0.6)
        return build(self, name, cfg)
    monkeypatch.setattr(bench.Models, 'build', slow)
    path = str(tmp_path / 'pairs.json')
    assert pairs(path, '--schemes=none,alibi,learned', '--presets=', '--blocks=1', '--block_steps=1',
                 '--budget=0.3') == 0
    out = json.load(open(path))
    assert seen == ['rope', 'none'] and 'vs_rope' in out['results']['none']
    assert out['skipped'] == {'pairs': ['alibi', 'learned']} and 'alibi' not in out['results']


def test_goal_classes_follow_the_hooks():
    """A scheme with an fla kernel is 'fla', one whose position term meets q or k 'content_position' (Shaw, XL,
    DeBERTa, CoPE), one with its own attention and neither 'own_attention' (GRAPE-AP), one whose score_mod runs in
    training 'score_mod' (xPos's blockwise mask does not), the rest 'no_bias'; a model takes its lowest goal."""
    import positional
    hooks = {n: bench.layer_hooks(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, pos_encoding=n))
             for n in positional.REGISTRY}
    got = {n: bench.goal_class(h) for n, h in hooks.items()}
    assert {n for n, c in got.items() if c == 'fla'} == set(positional.PositionalEncoding.fla_schemes())
    assert {n for n, c in got.items() if c == 'content_position'} == {'shaw', 'xl', 'deberta', 'cope'}
    assert {'alibi', 't5', 'kerple_log', 'fire', 'sandwich', 'grape_a'} <= {n for n, c in got.items()
                                                                          if c == 'score_mod'}
    assert {'rope', 'xpos', 'none', 'learned'} <= {n for n, c in got.items() if c == 'no_bias'}
    path = bench.layer_hooks(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, pos_encoding='grape_a',
                                       pos_options={'variant': 'path'}))
    assert bench.goal_class(path) == 'own_attention'
    sinks = bench.layer_hooks(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, sink_logits=True))
    assert bench.goal_class(sinks) == 'score_mod'
    assert bench.goal_class(hooks['rope'][:1] + hooks['alibi'][1:]) == 'score_mod'
    assert bench.goal_class(hooks['cope'][:1] + hooks['fox'][1:]) == 'content_position'
    assert bench.runs_text(['sdpa', 'sdpa', 'flex', 'sdpa']) == 'sdpa ×2, flex, sdpa'


def test_attn_time_probes_a_bias_layer_four_ways_and_leaves_the_model_as_it_was():
    """Part attn_time (check_attn_time): a bias scheme's first layer as built, frozen, with its bias as one
    [B, H, T, T] table and without it. The table gives the built layer's output (grape_a's gates differ per batch
    row, t5's table is model-wide); Shaw's value term has no table form; afterwards every parameter trains again and
    the scheme keeps no hook of the probe's."""
    rt = runtime.setup('cpu', 'float32')
    clock = harness.Clock('cpu', 'cpu')
    for name in ('t5', 'grape_a', 'shaw'):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64, pos_encoding=name))
        trains = [n for n, p in model.named_parameters() if p.requires_grad]
        r = {}
        bench.check_attn_time(model, 3, 32, rt, clock, r, reps=2)
        t = r['attn_time']
        assert all(t[w] > 0 for w in ('built', 'frozen', 'no_bias')), (name, t)
        assert t['route'] == 'dense' and t['flex'] is t['dense'] is t['table_sdpa'] is None  # the CPU: one route
        if name == 'shaw':
            assert t['table'] is None and 'table_err' not in t
        else:
            assert t['table'] > 0 and t['table_err'] < 1e-6, (name, t)
        assert [n for n, p in model.named_parameters() if p.requires_grad] == trains
        assert not {'score_mod', 'value_mod'} & set(vars(model.pe.at(0))), name


def test_a_rebiased_scheme_changes_the_layers_bias_alone():
    """attn_time's ways hand the layer a bench.Rebiased scheme, the scheme itself untouched: without its bias,
    alibi's first layer gives what the same weights give with no positions (scheme 'none'), and with its bias as one
    table, read at each logit or handed whole, what it gives as built (harness.layer_pass, forward and backward)."""
    def first_layer(name):
        torch.manual_seed(0)
        return harness.layer(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64,
                                           pos_encoding=name)).train(), 0)
    (attn, scheme), (plain, none) = first_layer('alibi'), first_layer('none')
    plain.load_state_dict(attn.state_dict())
    x, g = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1)), torch.randn(2, 16, 32)
    built = harness.layer_pass(attn, scheme, x, g)
    unbiased = harness.layer_pass(attn, bench.Rebiased(scheme, bench.no_bias, bench.no_bias), x, g)
    assert torch.allclose(unbiased, harness.layer_pass(plain, none, x, g), atol=1e-6)
    assert not torch.allclose(unbiased, built, atol=1e-3)
    for whole in (False, True):
        tabled = bench.Rebiased(scheme, bench.tabled(scheme.score_mod, whole))
        assert torch.allclose(harness.layer_pass(attn, tabled, x, g), built, atol=1e-6), whole
    assert not {'score_mod', 'value_mod'} & set(vars(scheme))


def test_attn_time_takes_its_ways_in_turn_each_round_and_pairs_built_with_no_bias():
    """check_attn_time times its ways in rounds, one call of each way in turn (on CPU: built, frozen, table,
    no_bias), so a device that slows from round to round (here 1x, 3x, 10x) slows every way alike: each way's time
    is its median over rounds, and built_vs_no_bias the median of each round's quotient, exactly 2 here where the
    quotient of two medians taken in separate runs would carry the drift."""
    class Ticks:  # a clock whose readings around each call are `intervals` apart, in turn
        def __init__(self, intervals):
            self.left, self.t, self.started = iter(intervals), 0.0, False

        def now(self):
            if self.started:
                self.t += next(self.left)
            self.started = not self.started
            return self.t
    base = [2.0, 1.5, 4.0, 1.0]  # built, frozen, table, no_bias
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=64, pos_encoding='t5'))
    r = {}
    bench.check_attn_time(model, 2, 32, runtime.setup('cpu', 'float32'), Ticks([b * f for f in (1, 3, 10)
                                                                                 for b in base]), r, reps=3)
    t = r['attn_time']
    assert [t[w] for w in ('built', 'frozen', 'table', 'no_bias')] == [b * 3e3 for b in base]
    assert t['built_vs_no_bias'] == t['built_vs_no_bias_q1'] == t['built_vs_no_bias_q3'] == 2.0


def test_attn_time_and_long_parts_pick_their_models(tmp_path):
    """attn_time takes the models with a bias in their first layer (alibi, not rope); long takes every model, a
    length past a learned table noted instead of run; both resume as pairs do."""
    path = str(tmp_path / 'parts.json')
    assert bench.main(['--parts=attn_time,long', f'--json={path}', *TINY, '--schemes=rope,alibi,learned',
                       '--presets=', '--eval_batch_tokens=512']) == 0
    out = json.load(open(path))
    res = out['results']
    assert [n for n, r in res.items() if 'attn_time' in r] == ['alibi']
    assert res['alibi']['attn_time']['table_err'] < 1e-6
    goal = [g for g in out['goals'] if g['figure'] == "alibi: layer 0's attention / without bias, at most"]
    assert goal == [dict(figure=goal[0]['figure'], goal=2.0, measured=res['alibi']['attn_time']['built_vs_no_bias'],
                         met=res['alibi']['attn_time']['built_vs_no_bias'] <= 2.0)]
    for name in ('rope', 'alibi'):
        long = res[name]['long']
        assert [long[m]['T'] for m in ('8L', '16L')] == [256, 512] and long['16L']['rows'] == 1
        assert all(long[m]['tok_s'] > 0 and long[m]['peak_MiB'] > 0 for m in ('8L', '16L')), (name, long)
    assert res['learned']['long'] == {m: {'error': 'no positions past 32'} for m in ('8L', '16L')}


def write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))
    return str(path)


META = dict(device='NVIDIA H200', torch='2.11.0+cu130', dtype='bfloat16', preset='gpt2', batch_size=8, compile=True,
            model=dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304))


def test_table_of_the_committed_json(tmp_path):
    """--table: a row a model, a later file's over an earlier one's, each with its run (the dated folder); a preset
    of another depth measured before the same-depth reference is not shown as a ratio; a failure says so; rope's
    MFU and its spread over partners follow; a model that a later run measured is not listed as skipped."""
    old = write(tmp_path / '2026-11-28-9bb9952' / 'pairs.json', dict(meta=META, skipped=['irope', 'sssl'], results=dict(
        rope=dict(goal_class='no_bias', goal=0.9, ms_median=40.0, ms_q1=35.0, ms_q3=45.0, compile_s=3.0,
                  peak_MiB=9653.2, attention_backends=['auto'] * 12),
        t5=dict(goal_class='score_mod', goal=0.7, vs_rope=0.427, vs_rope_q1=0.363, vs_rope_q3=0.468, ms_median=100.0,
                ms_q1=99.0, ms_q3=101.0, rope_ms_median=42.7, compile_s=11.6, peak_MiB=9658.0,
                attention_backends=['auto'] * 12),
        gemma3=dict(goal_class='no_bias', goal=0.9, vs_rope=1.502, vs_rope_q1=1.4, vs_rope_q3=1.6, ms_median=30.0,
                    ms_q1=29.0, ms_q3=31.0, rope_ms_median=45.0, compile_s=8.3, peak_MiB=8088.0,
                    attention_backends=['auto'] * 6))))
    new = write(tmp_path / 'run' / 'bench.json', dict(
        meta={**META, 'runs': [dict(time='2026-12-01 10:00:00', commit='abcdef1')]}, skipped={'pairs': ['sssl']},
        results=dict(
            rope=dict(ref='rope', n_layer=12, goal_class='no_bias', goal=0.9, vs_rope=1.0, ms_median=20.9, ms_q1=20.7,
                      ms_q3=21.2, compile_s=31.1, peak_MiB=7001.3, routes=['sdpa'] * 12, mfu=0.339,
                      mfu_at=[8, 1024], by_partner=dict(t5=21.0, irope=20.5), partner_spread_ms=[20.5, 21.0],
                      partner_spread=21.0 / 20.5, alone_after_ms=26.25),
            t5=dict(ref='rope', n_layer=12, goal_class='score_mod', goal=0.7, error='InductorError: shared | memory'),
            irope=dict(ref='rope', n_layer=12, goal_class='no_bias', goal=0.9, vs_rope=0.95, vs_rope_q1=0.94,
                       vs_rope_q3=0.97, ms_median=22.0, ms_q1=21.5, ms_q3=22.5, rope_ms_median=20.5, compile_s=5.0,
                       peak_MiB=7100.0, routes=['sdpa'] * 3 + ['flex'] + ['sdpa'] * 8))))
    other = write(tmp_path / '2026-12-02-1234567' / 'long.json', dict(meta=META, results=dict(
        t5=dict(goal_class='score_mod', goal=0.7, attn_time=dict(built=2.0, frozen=1.0, table=1.5, no_bias=0.5,
                                                                 table_err=1e-3)),
        alibi=dict(goal_class='score_mod', goal=0.7, attn_time=dict(route='qk_lift', built=2.0, no_bias=1.0,
                                                                    built_vs_no_bias=2.1, built_vs_no_bias_q1=2.0,
                                                                    built_vs_no_bias_q3=2.25)),
        learned=dict(goal_class='no_bias', goal=0.9,
                     long={m: dict(error='no positions past 1024') for m in ('8L', '16L')}),
        fire=dict(goal_class='score_mod', goal=0.7, long_error='SchemeTimeout: stopped after --scheme_limit=40 s'))))
    parts = bench.table([old, new, other]).split('\n\n')  # a file of other parts leaves the pairs' rows as they were
    assert parts[-2].splitlines()[2:] == [
        "| t5 | — | 2.00 | — | — | 1.00 | 1.50 | — | 0.50 | — | 1.0e-03 | 2026-12-02-1234567 |",
        "| alibi | qk_lift | 2.00 | — | — | — | — | — | 1.00 | 2.10 [2.00, 2.25] | — | 2026-12-02-1234567 |"]
    assert parts[-1].splitlines()[2:] == [
        '| learned | ' + ' | '.join(['failed: no positions past 1024'] * 4) + ' | 2026-12-02-1234567 |',
        '| fire | failed: SchemeTimeout: stopped after --scheme_limit=40 s |  |  |  | 2026-12-02-1234567 |']
    got = bench.table([old, new]).splitlines()
    assert bench.table([old, new, other]).count('| t5 | score_mod | 0.7 | failed: InductorError') == 1
    rows = {line.split(' | ')[0][2:]: line for line in got if line.startswith('| ') and '---' not in line}
    assert got[:2] == ['- 2026-11-28-9bb9952: NVIDIA H200, torch 2.11.0+cu130, bfloat16, gpt2 (12 × 768, T = 1024), '
                       'batch 8, compiled', '- 2026-12-01-abcdef1: NVIDIA H200, torch 2.11.0+cu130, bfloat16, gpt2 '
                       '(12 × 768, T = 1024), batch 8, compiled']
    assert list(rows) == ['model', 'rope', 'gemma3', 't5', 'irope']
    assert rows['rope'] == ('| rope | no_bias | — | 1 (the reference) |  | 20.9 [20.7, 21.2] | 20.5–21.0 over 2 | '
                            '31.1 | 7,001 | sdpa ×12 | 2026-12-01-abcdef1 |')
    assert rows['gemma3'] == ("| gemma3 | no_bias | 0.9 | not a ratio: 6 layers against rope's 12 |  | 30.0 [29.0, "
                              "31.0] | 45.0 | 8.3 | 8,088 | auto ×6 | 2026-11-28-9bb9952 |")
    assert rows['t5'].startswith('| t5 | score_mod | 0.7 | failed: InductorError: shared / memory |  |')
    assert rows['t5'].endswith('| 2026-12-01-abcdef1 |')
    assert rows['irope'] == ('| irope | no_bias | 0.9 | 0.950 [0.940, 0.970] | yes | 22.0 [21.5, 22.5] | 20.5 | 5.0 | '
                             '7,100 | sdpa ×3, flex, sdpa ×8 | 2026-12-01-abcdef1 |')
    assert "- rope's MFU: 0.339 at 8 × 1024 (2026-12-01-abcdef1; the goal: 0.40 at 16 × 1024)" in got
    note = got.index("- rope's median step beside each partner, ms: t5 21.0, irope 20.5 (max / min 1.024; alone 20.9 "
                     "before its partners, 26.2")  # one note, folded at 120 characters
    assert got[note + 1] == '  after them)'
    assert got[-1] == '- not reached (time budget): sssl (pairs, 2026-12-01-abcdef1)'  # irope: measured later


def test_the_tools_train_with_the_optimizer_train_py_resolves_for_the_model(monkeypatch):
    """harness.train_settings gives each bench preset's model the weight decay, betas and gradient clip train.py
    resolves for it (--dry_run=True): train.py's defaults for the default model, config/gpt2_124m.py's for gpt2
    (beta2 0.99 and 0.95); train_stepper's AdamW takes them, and a clip of 0 clips nothing, as in train.py."""
    from conftest import fork_run
    monkeypatch.chdir(bench.ROOT)
    for preset, config in (('default', []), ('gpt2', ['config/gpt2_124m.py'])):
        r = fork_run(['train.py', *config, '--dry_run=True'])
        assert r.returncode == 0, r.stderr[-2000:]
        want = {k: v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items() if k in harness.OPTIMIZER_KEYS}
        assert harness.train_settings(preset) == want and len(want) == 4, (preset, want)
    assert harness.train_settings('default')['beta2'] != harness.train_settings('gpt2')['beta2']
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64))
    xy = torch.randint(64, (2, 17))
    clipped = []
    monkeypatch.setattr(torch.nn.utils, 'clip_grad_norm_', lambda params, norm: clipped.append(norm))
    for settings in (harness.train_settings('gpt2'), {**harness.train_settings('default'), 'grad_clip': 0.0}):
        step, opt = harness.train_stepper(model, xy, runtime.setup('cpu', 'float32'), 1e-4, settings, compile=False)
        step()
        g = opt.param_groups[0]
        assert (g['betas'], g['weight_decay']) == ((settings['beta1'], settings['beta2']), settings['weight_decay'])
    assert clipped == [1.0]


def test_the_default_json_is_dated_under_results_gpu():
    """Without --json the model parts write results/gpu/<today>-<this commit>/bench.json, where a lease's raw JSON
    is committed."""
    import os
    import subprocess
    import time
    head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=bench.ROOT, capture_output=True, text=True)
    commit = head.stdout.strip() if head.returncode == 0 else 'nogit'
    assert bench.default_json() == os.path.join(bench.ROOT, 'results', 'gpu', f"{time.strftime('%Y-%m-%d')}-{commit}",
                                                'bench.json')


def test_docs_gpu_table_is_what_bench_prints_from_the_committed_json(monkeypatch):
    """docs/gpu.md's `python tools/bench.py --table=...` command runs on the committed results/gpu/ files and prints the
    table the page shows under it, line for line."""
    import os
    import re
    monkeypatch.chdir(bench.ROOT)
    page = open(os.path.join('docs', 'gpu.md'), encoding='utf-8').read()
    commands = re.findall(r'^python tools/bench\.py --table=(\S+)$', page, re.M)
    assert commands, 'docs/gpu.md gives no --table command'
    for paths in commands:
        assert bench.table(paths.split(',')) in page, paths
