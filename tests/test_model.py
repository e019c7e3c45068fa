"""Model properties parametrized over the registry, so a new scheme is covered by its name alone:
causality, KV-cache parity, forwards at 4x the block size, training lowers the loss, generation with
and without the cache, the padded vocabulary; the CUDA path's failure modes caught on CPU
(FlexAttention == dense, FlexAttention's backward graph built and validated as Inductor does before
it writes the CUDA kernel, no graph breaks in compiled forwards, a bf16 autocast train step); and
StreamingLLM attention sinks / rolling caches, with generation far past the block size."""
import inspect
import pytest
import torch
import torch.nn.attention.flex_attention as fa
import torch.nn.functional as F

import attention as A
import positional
from conftest import (SCHEMES, Validated, assert_causal, assert_flex_equals_dense, assert_kv_cache_matches_full_forward,
                      assert_same_grads, assert_trains_and_pe_params_learn, attend_mods, flex_and_dense_grads,
                      has_attention_mod, tiny_model, validating_backend)
from presets import PRESETS, preset_plans
from test_stack import STACKS, split_heads, stack_model


BIAS_SCHEMES = [s for s in SCHEMES if has_attention_mod(s)]  # derived from the hooks, not the name


# schemes that hand attention.attend a score_mod or value_mod (stick-breaking, with its own attention, does not)
MOD_SCHEMES = [s for s in SCHEMES if has_attention_mod(s) or has_attention_mod(s, train=True)]


def _has_training_mod(scheme):
    return any(mod is not None or vmod is not None for mod, vmod in attend_mods(scheme, train=True))


# --- the registry ---------------------------------------------------------------

def test_unknown_scheme_lists_valid_ones():
    with pytest.raises(ValueError) as e:
        tiny_model('ropee')
    for name in SCHEMES:
        assert name in str(e.value)


# --- model properties for every registered scheme --------------------------------

@pytest.mark.parametrize('scheme', SCHEMES)
@pytest.mark.fast
def test_causal(scheme):
    assert_causal(tiny_model(scheme).eval())


@pytest.mark.parametrize('scheme', SCHEMES)
@pytest.mark.fast
def test_kv_cache_matches_full_forward(scheme):
    assert_kv_cache_matches_full_forward(tiny_model(scheme).eval())


@pytest.mark.parametrize('scheme', SCHEMES)
def test_forward_at_4x_block_size(scheme):
    m = tiny_model(scheme).eval()
    x = torch.randint(0, 37, (1, 64))
    if m.pe.max_len is not None and m.pe.max_len < 64:
        with pytest.raises(ValueError, match='positions'):
            m(x)
        return
    with torch.no_grad():
        logits, loss = m(x, x)
    assert logits.shape == (1, 64, 37) and torch.isfinite(logits).all()
    # the first block_size logits are those of a forward over just those tokens
    assert torch.allclose(logits[:, :16], m(x[:, :16])[0], atol=1e-5)


@pytest.mark.parametrize('scheme', SCHEMES)
@pytest.mark.fast
def test_training_lowers_loss(scheme):
    assert_trains_and_pe_params_learn(tiny_model(scheme))


# --- generation and the vocabulary ------------------------------------------------

def test_generate_learned_falls_back_to_sliding_window():
    m = tiny_model('learned').eval()
    torch.manual_seed(0)
    out = m.generate(torch.zeros(1, 1, dtype=torch.long), 40, top_k=1)
    assert out.shape == (1, 41)
    # greedy step past the table = argmax of a forward over the last 16 tokens
    with torch.no_grad():
        want = m(out[:, 24:40])[0][0, -1].argmax()
    assert out[0, 40] == want


@pytest.mark.parametrize('scheme', [s for s in SCHEMES if s != 'learned'])
def test_generate_with_cache_equals_without(scheme):
    m = tiny_model(scheme).eval()
    torch.manual_seed(1)
    a = m.generate(torch.zeros(1, 3, dtype=torch.long), 30, top_k=1)
    b = m.generate(torch.zeros(1, 3, dtype=torch.long), 30, top_k=1, use_cache=False)
    assert torch.equal(a, b)


def test_padded_vocab_is_never_scored_or_sampled():
    m = tiny_model('rope', vocab_size=50, vocab_multiple=64)
    assert m.lm_head.weight.shape[0] == 64 and m.transformer.wte.weight.shape[0] == 64
    x = torch.randint(0, 50, (2, 16))
    logits, loss = m(x, x)
    assert torch.isinf(logits[..., 50:]).all() and torch.isfinite(logits[..., :50]).all()
    ref = torch.nn.functional.cross_entropy(logits[..., :50].reshape(-1, 50), x.reshape(-1))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    torch.manual_seed(0)
    out = m.eval().generate(x[:, :2], 200, temperature=5.0)  # hot: every real id gets sampled
    assert out.max() < 50 and len(out.unique()) > 40


# --- FlexAttention, compiled forwards, bf16 ---------------------------------------

@pytest.mark.parametrize('scheme', BIAS_SCHEMES)
@pytest.mark.fast
def test_flex_attention_equals_dense_on_cpu(scheme):
    """Compiled FlexAttention forward (CPU, no grad) gives the dense path's logits."""
    assert_flex_equals_dense(tiny_model(scheme, block_size=64).eval())


@pytest.mark.parametrize('scheme', MOD_SCHEMES)
def test_flex_backward_graph_validates_and_gradients_equal_dense(scheme, flex_with_grad_on_cpu, monkeypatch):
    """Training through FlexAttention, with attention dropout: (1) Inductor accepts the joint
    graph of every score_mod (two flex calls per layer: dropout's kept-keys pass and the lse
    pass); (2) FlexAttention's own (eager) backward gives the dense path's loss and gradients.
    One layer: every layer hands attention the same score_mod, and each one traced costs seconds."""
    x = torch.randint(0, 37, (2, 64), generator=torch.Generator().manual_seed(0))
    counts = []
    kw = dict(block_size=64, dropout=0.1, n_layer=1)
    m = tiny_model(scheme, attn_backend='flex', **kw)
    with pytest.raises(Validated):
        _, loss = torch.compile(m, backend=validating_backend(counts))(x, x)
        loss.backward()
    assert len(counts) == (2 * m.config.n_layer if _has_training_mod(scheme) else 0)

    monkeypatch.setitem(A._compiled, 'flex', fa.flex_attention)  # eager flex: its backward runs on CPU
    assert_same_grads(flex_and_dense_grads(lambda be: tiny_model(scheme, attn_backend=be, **kw), x))


@pytest.mark.parametrize('scheme', SCHEMES)
def test_compiled_forward_has_no_graph_breaks(scheme):
    """A training forward (grad, the backend train.py uses) and a no-grad FlexAttention forward
    (eval's long lengths) compile to one graph: no int()/.item() host sync, no Python state
    mutated inside forward."""
    x = torch.randint(0, 37, (2, 64))
    for backend, grad in (('auto', True), ('flex', False)):
        torch._dynamo.reset()
        m = tiny_model(scheme, block_size=64, attn_backend=backend)
        m.train(grad)
        with torch.set_grad_enabled(grad):
            ex = torch._dynamo.explain(m)(x, x)
        assert ex.graph_break_count == 0, (backend, [str(b.reason)[:200] for b in ex.break_reasons])
        assert ex.graph_count == 1
    torch._dynamo.reset()


def test_objects_built_inside_forward_default_to_constants():
    """Every layer builds an Attender inside the compiled forward. torch 2.11's dynamo (the lent GPUs' torch) cannot
    build an object whose __init__ defaults to a dataclass instance: Attender's default mask=CAUSAL broke the graph at
    every layer there (one graph a model became six per two layers in torch._dynamo.explain, and the loss ran
    outside the compiled graph on an H200), while torch 2.13 traces it. So its defaults are plain constants."""
    defaults = [p.default for p in inspect.signature(A.Attender.__init__).parameters.values()
                if p.default is not inspect.Parameter.empty]
    assert defaults and all(d is None or type(d) in (int, float, str, bool) for d in defaults), defaults
    assert A.Attender().mask == A.CAUSAL


@pytest.mark.parametrize('scheme', SCHEMES + ['preset:' + p for p in PRESETS])
def test_forward_and_backward_make_no_tensor_off_the_model_device(scheme, monkeypatch):
    """On the meta device (shapes, no data), a tensor a forward makes without device= lands on the CPU and the
    next op with the model's tensors raises, as on CUDA (sinusoidal's angle table did so on an H200)."""
    autocast = torch.autocast  # autocast knows no meta device; its dtype rules are not what is checked here
    monkeypatch.setattr(torch, 'autocast', lambda dev, *a, **kw: autocast('cpu' if dev == 'meta' else dev, *a, **kw))
    kw = {'n_layer': 4, **preset_plans(scheme[7:])[scheme[7:]]} if scheme.startswith('preset:') else {}
    m = tiny_model(kw.pop('pos_encoding', 'rope') if kw else scheme, **kw).to('meta')
    x = torch.randint(0, 37, (2, 17)).to('meta')
    logits, loss = m(x[:, :-1], x[:, 1:])
    loss.backward()
    assert logits.device.type == 'meta' and all(p.grad.device.type == 'meta' for p in m.parameters()
                                                if p.grad is not None)


@pytest.mark.parametrize('scheme', SCHEMES)
def test_bf16_autocast_train_step_and_kv_cache(scheme):
    m = tiny_model(scheme)
    opt = m.configure_optimizers(0.0, 3e-3, (0.9, 0.99), 'cpu')
    x = torch.randint(0, 37, (4, 17), generator=torch.Generator().manual_seed(0))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        logits, loss = m(x[:, :-1], x[:, 1:])
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
    opt.step()
    m.eval()
    T = 16 if m.pe.max_len else 30
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        full = m(x[:, :1].repeat(1, T) if T > 17 else x[:, :T])[0].float()
        xs = x[:, :1].repeat(1, T) if T > 17 else x[:, :T]
        cache = m.new_cache()
        steps = [m(xs[:, :5], cache=cache)[0]] + [m(xs[:, t:t + 1], cache=cache)[0] for t in range(5, T)]
    decoded = torch.cat(steps, 1).float()
    assert (decoded - full).abs().max() < 0.1  # bf16 matmuls; the biases themselves are float32


# --- attention sinks (StreamingLLM) and rolling caches ----------------------------

# the schemes a rolling cache can serve: no positions in the embeddings, and keys the model caches (a scheme that
# keeps its own cache, cache_keys='scheme', refuses a rolling one)
RELATIVE = [s for s in SCHEMES if positional.REGISTRY[s].embed is positional.PositionalEncoding.embed
            and positional.REGISTRY[s].cache_keys != 'scheme']


@pytest.mark.parametrize('scheme', RELATIVE + ['stack:' + n for n in STACKS if n != 'learned+logn'])
def test_sink0_and_a_window_past_the_sequence_equals_ordinary_decoding(scheme):
    m = (stack_model(scheme[6:]) if scheme.startswith('stack:') else tiny_model(scheme)).eval()
    torch.manual_seed(1)
    a = m.generate(torch.zeros(1, 3, dtype=torch.long), 40, top_k=1)
    b = m.generate(torch.zeros(1, 3, dtype=torch.long), 40, top_k=1, recent=100, sink_tokens=0)
    assert torch.equal(a, b)
    with torch.no_grad():  # and the logits themselves, with a prompt longer than one chunk
        x = torch.randint(0, 37, (2, 30))
        full, _ = m(x)
        cache = m.new_cache(recent=100, sink_tokens=0)
        steps = [m(x[:, :5], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0] for t in range(5, 30)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize('scheme', RELATIVE)
def test_sink_cache_keeps_first_and_last_tokens_at_places_0_to_n(scheme):
    """One layer: its keys and values depend only on the token, so after eviction a decoding
    step must equal a plain forward over (kept tokens + new token) at positions 0..n -- which
    checks both the cache content and the re-indexed positions, for every relative scheme."""
    sink, window, T = 3, 5, 30
    m = tiny_model(scheme, n_layer=1).eval()
    x = torch.randint(0, 37, (1, T), generator=torch.Generator().manual_seed(0))
    cache = m.new_cache(recent=window, sink_tokens=sink)
    attn = m.transformer.h[0].attn
    with torch.no_grad():
        raw_k = split_heads(attn, m.transformer.h[0].ln_1(m.transformer.wte(x)))[1]  # layer-0 keys, no position
        m(x[:, :sink + window + 1], cache=cache)
        for t in range(sink + window + 1, T):
            kept = list(range(sink)) + list(range(t - window, t))
            assert cache.layers[0].n == sink + window and cache.length == t
            assert torch.allclose(cache.layers[0][0], raw_k[:, :, kept], atol=1e-6)  # raw keys, first + last
            logits, _ = m(x[:, t:t + 1], cache=cache)
            assert torch.equal(cache.k_pos, torch.arange(sink + window + 1))  # places, not text positions
            want, _ = m(x[:, kept + [t]])
            assert torch.allclose(logits[0, -1], want[0, -1], atol=1e-5), t
    assert cache.layers[0].n == sink + window and cache.length == T


def test_sink_cache_memory_is_constant_over_20x_block_size():
    m = tiny_model('rope', n_layer=2).eval()
    L, sink, window = m.config.block_size, 4, 11
    sizes = []
    caches = []
    new_cache = m.new_cache
    m.new_cache = lambda *a, **kw: caches.append(new_cache(*a, **kw)) or caches[-1]

    def measure(module, args, out):
        c = caches[-1]
        sizes.append((c.layers[0].n, sum(t.numel() * t.element_size() for lk in c.layers for t in (lk.k, lk.v)),
                      [lk.k.size(2) for lk in c.layers]))
    m.register_forward_hook(measure)
    torch.manual_seed(0)
    out = m.generate(torch.zeros(1, 2, dtype=torch.long), 20 * L, recent=window, sink_tokens=sink)
    assert out.shape == (1, 2 + 20 * L) and len(sizes) == 20 * L
    full = [s for s in sizes if s[0] == sink + window]
    assert len(full) >= 20 * L - window - sink  # full from the 15th step on
    assert len({s[1] for s in sizes}) == 1 and len({tuple(s[2]) for s in sizes}) == 1  # bytes never change
    assert max(s[0] for s in sizes) == sink + window
    print(f"\nsink cache over {20 * L} new tokens: {sizes[-1][0]} tokens per layer, "
          f"{sizes[-1][1]} bytes in buffers of {sizes[-1][2]} slots, constant from step 1")


def test_sinks_refused_where_positions_are_absolute_or_bad():
    for scheme in ('learned', 'sinusoidal'):
        with pytest.raises(ValueError, match='cannot re-index'):
            tiny_model(scheme).generate(torch.zeros(1, 2, dtype=torch.long), 3, recent=8)
    m = tiny_model('rope')
    with pytest.raises(ValueError, match='use_cache must be True'):
        m.generate(torch.zeros(1, 2, dtype=torch.long), 3, recent=8, use_cache=False)
    for kw in (dict(recent=0), dict(recent=4, sink_tokens=-1), dict(recent=2.5)):
        with pytest.raises(ValueError, match='integer'):
            m.new_cache(**kw)
    with pytest.raises(ValueError, match='do not pass pos'):
        m(torch.zeros(1, 2, dtype=torch.long), cache=m.new_cache(recent=4), pos=torch.arange(2))


def test_rolling_cache_evicts_fox_state_with_its_keys():
    m = tiny_model('fox').eval()
    cache = m.new_cache(recent=5, sink_tokens=2)
    with torch.no_grad():
        for t in range(12):
            m(torch.randint(0, 37, (1, 1)), cache=cache)
            for layer in cache.layers:
                assert layer.state['fox_log_f'].size(2) == layer.n
    assert cache.layers[0].n == 7


WORDS = ['to', 'be', 'or', 'not', 'that', 'is', 'the', 'question', 'whether', 'tis', 'nobler']


def _word_validity(text):
    words = text.split(' ')[1:-1]  # the ends may be cut
    return sum(w in WORDS for w in words) / max(1, len(words))


def test_sinks_keep_generation_in_distribution_far_past_block_size():
    """A tiny RoPE model trained at L = 32 on a repetitive word corpus, then 20 x L tokens
    sampled four ways. Each generated token is scored by the model itself with the L tokens
    before it (in-distribution context); word validity checks the text against the corpus."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    text = ' '.join(WORDS[i] for i in torch.randint(0, len(WORDS), (6000,), generator=g).tolist())
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    L = 32
    m = tiny_model('rope', vocab_size=len(chars), block_size=L, n_layer=2, n_head=4, n_embd=48)
    opt = m.configure_optimizers(0.0, 3e-3, (0.9, 0.99), 'cpu')
    for step in range(300):
        ix = torch.randint(0, len(data) - L - 1, (16,), generator=g)
        xb = torch.stack([data[i:i + L] for i in ix])
        yb = torch.stack([data[i + 1:i + L + 1] for i in ix])
        _, loss = m(xb, yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    with torch.no_grad():
        val = torch.stack([data[i:i + L + 1] for i in range(0, 64 * L, L)])
        val_loss = m(val[:, :-1], val[:, 1:])[1].item()

    def judge(seq, start):
        """Mean NLL of seq[p] for p >= start given seq[p - L:p] (the model at its training length)."""
        ctxs = torch.stack([seq[p - L:p] for p in range(start, len(seq))])
        with torch.no_grad():
            logits = m(ctxs)[0][:, -1]
        return F.cross_entropy(logits, seq[start:]).item()

    prompt = data[:L][None]
    n_new = 20 * L
    results = {}
    for name, kw in (('sinks 4 + window 27', dict(recent=L - 5, sink_tokens=4)),
                     ('window only (sink 0, window 31)', dict(recent=L - 1, sink_tokens=0)),
                     ('recompute last L (no cache)', None),
                     ('full context, no cache (extrapolating)', 'full')):
        torch.manual_seed(1)
        if kw is None:
            idx = prompt
            for _ in range(n_new):
                with torch.no_grad():
                    logits = m(idx[:, -L:])[0][:, -1]
                idx = torch.cat((idx, torch.multinomial(F.softmax(logits, -1), 1)), 1)
            out = idx
        elif kw == 'full':
            out = m.generate(prompt, n_new, use_cache=False)
        else:
            out = m.generate(prompt, n_new, **kw)
        seq = out[0]
        gen_text = ''.join(chars[i] for i in seq[L:].tolist())
        results[name] = (judge(seq, 2 * L), _word_validity(gen_text))
    print(f"\nL={L}, {n_new} new tokens; model val loss {val_loss:.3f}; loss of the generated tokens "
          f"(judged with L tokens of context) and the fraction of valid words:")
    for name, (loss, valid) in results.items():
        print(f"  {name:42s} loss {loss:.3f}  valid words {valid:.3f}")
    sink_loss, sink_valid = results['sinks 4 + window 27']
    ref_loss, ref_valid = results['recompute last L (no cache)']
    assert val_loss < 1.6  # the model learned the corpus (uniform over its 17 chars: 2.83)
    assert sink_loss < val_loss + 0.3 and sink_valid > 0.9  # in distribution after 20 x L tokens
    assert sink_loss < ref_loss + 0.2 and sink_valid > ref_valid - 0.05  # as good as recomputing every step
