"""Data preparation: the offline GPT-2 tokenizer, token files, EOT handling, document windows,
the prepare scripts on small local fixtures, and the GPU configs."""
import ast
import hashlib
import os
import json
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from data import common  # noqa: E402
from data.common import document_windows  # noqa: E402

EOT = 50256
# tiktoken's download URLs, written out here (not taken from data/common.py): the cache
# file names are sha1(url) (tiktoken/load.py); the `offline` fixture is in conftest.py
URLS = ['https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken',
        'https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe',
        'https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json']


def test_offline_fallback_fills_tiktokens_cache(offline):
    # tiktoken tried its host and failed, then read all three files from the cache; it
    # checks each against its own sha256 (a mismatch would make it re-download, which
    # fails here), so a loaded encoding means byte-identical files.
    assert offline['blocked'], "the test did not exercise the download failure"
    names = sorted(os.listdir(offline['cache']))
    assert names == sorted(hashlib.sha1(u.encode()).hexdigest() for u in URLS)
    msg = offline['message'].strip()
    assert msg.count('\n') == 0 and 'PyPI' in msg and 'openai' in msg and offline['cache'] in msg


def test_gpt2_known_ids(offline):
    # published GPT-2 ids (e.g. the HF gpt2 tokenizer): "Hello world" -> 15496, 995
    for enc in (offline['enc'], offline['r50k']):
        assert enc.n_vocab == 50257 and enc.eot_token == EOT
        assert enc.encode_ordinary('Hello world') == [15496, 995]
    text = "To be, or not to be: that is the question.\n\n\tWhether 'tis nobler"
    assert offline['enc'].encode_ordinary(text) == offline['r50k'].encode_ordinary(text)


def test_bpe_round_trip(offline):
    enc = offline['enc']
    text = ("O Romeo, Romeo! wherefore art thou Romeo?\n  \t\n" "naïve café — ünïcödé 東京 🙂 \x00\x7f"
            " <|endoftext|> 3.14159 don't   'tis")
    ids = enc.encode_ordinary(text)
    assert enc.decode(ids) == text
    assert EOT not in ids  # a literal '<|endoftext|>' in a document is text, not a separator
    assert enc.decode_bytes(common.encode_doc(text, enc).tolist()).endswith(b'<|endoftext|>')
    assert common.encode_doc(text, enc)[-1] == EOT and common.encode_doc(text, enc).dtype == np.uint16


def test_cache_dir_defaults_to_persistent(monkeypatch, tmp_path):
    for var in ('TIKTOKEN_CACHE_DIR', 'DATA_GYM_CACHE_DIR'):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
    assert common.tiktoken_cache_dir() == os.path.join(str(tmp_path), 'nanoPE', 'tiktoken')
    assert os.environ['TIKTOKEN_CACHE_DIR'] == os.path.join(str(tmp_path), 'nanoPE', 'tiktoken')
    monkeypatch.setenv('DATA_GYM_CACHE_DIR', '/somewhere')  # a user's choice wins
    monkeypatch.delenv('TIKTOKEN_CACHE_DIR')
    assert common.tiktoken_cache_dir() == '/somewhere'


def test_write_bin_rejects_ids_beyond_uint16(tmp_path):
    with pytest.raises(ValueError, match='uint16'):
        common.write_bin(np.array([1, 70000]), str(tmp_path / 'x.bin'))


# --- streaming tokenization into uint16 files ---------------------------------------

def fixture_docs(n=120, seed=0):
    rng = np.random.default_rng(seed)
    words = ['the', 'king', 'ünïcödé', 'rose', '\n', 'thou', 'art', '42', 'café', 'Romeo', ';', 'tis']
    docs = [' '.join(rng.choice(words, size=int(rng.integers(0, 60)))) for _ in range(n)]
    if n > 7:
        docs[3] = ''  # an empty document is just its EOT
        docs[7] = 'a literal <|endoftext|> inside a document'
    return docs


def expected_tokens(enc, docs):
    out = []
    for d in docs:
        out += enc.encode_ordinary(d) + [EOT]
    return np.array(out, dtype=np.uint16)


def read_bin(path):
    return np.fromfile(path, dtype=np.uint16)


def test_tokenize_to_bin_order_and_eot(offline, tmp_path):
    docs = fixture_docs()
    path = str(tmp_path / 'train.bin')
    # 2 processes, 25 documents per chunk: several chunks, several workers, order kept
    n_docs, n_tok = common.tokenize_to_bin(iter(docs), path, num_proc=2, chunk_docs=25)
    want = expected_tokens(offline['enc'], docs)
    got = read_bin(path)
    assert (n_docs, n_tok) == (len(docs), len(want))
    np.testing.assert_array_equal(got, want)
    assert int((got == EOT).sum()) == len(docs)
    assert not os.path.exists(path + '.tmp')


def test_tokenize_to_bin_max_tokens_stops_at_document_end(offline, tmp_path):
    docs = fixture_docs()
    lens = [len(offline['enc'].encode_ordinary(d)) + 1 for d in docs]
    cap = sum(lens[:10]) - 1  # reached inside document 10 (index 9)
    n_docs, n_tok = common.tokenize_to_bin(docs, str(tmp_path / 't.bin'), num_proc=2, chunk_docs=4,
                                           max_tokens=cap)
    assert n_docs == 10 and n_tok == sum(lens[:10])
    np.testing.assert_array_equal(read_bin(str(tmp_path / 't.bin')), expected_tokens(offline['enc'], docs[:10]))


def test_fineweb_prepare_on_fixture(offline, tmp_path):
    from data.fineweb_edu.prepare import prepare
    docs = fixture_docs(60, seed=1)
    out = prepare((d for d in docs), str(tmp_path), val_docs=7, num_proc=2)  # a stream, like the Hub's
    assert out['val'][0] == 7 and out['train'][0] == 53
    np.testing.assert_array_equal(read_bin(str(tmp_path / 'val.bin')), expected_tokens(offline['enc'], docs[:7]))
    np.testing.assert_array_equal(read_bin(str(tmp_path / 'train.bin')), expected_tokens(offline['enc'], docs[7:]))
    meta = json.load(open(tmp_path / 'meta.json'))
    assert meta == {'vocab_size': 50257, 'encoding': 'gpt2', 'eot_token': EOT}


def test_pg19_prepare_on_fixture(offline, tmp_path):
    from data.pg19.prepare import prepare
    books = {'validation': fixture_docs(3, seed=2), 'test': fixture_docs(5, seed=3)}
    out = prepare({k: iter(v) for k, v in books.items()}, str(tmp_path), num_proc=2)
    assert out['validation'][0] == 3 and out['test'][0] == 5
    np.testing.assert_array_equal(read_bin(str(tmp_path / 'val.bin')),
                                  expected_tokens(offline['enc'], books['validation']))
    np.testing.assert_array_equal(read_bin(str(tmp_path / 'test.bin')), expected_tokens(offline['enc'], books['test']))


def test_datasets_is_optional_with_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, 'datasets', None)  # import datasets -> ImportError
    with pytest.raises(SystemExit, match='pip install datasets'):
        common.load_hf_stream('HuggingFaceFW/fineweb-edu', 'sample-10BT')


# --- the Shakespeare and generic text prepare scripts --------------------------------

SONNET = ("Shall I compare thee to a summer's day?\nThou art more lovely and more temperate:\n"
          "Rough winds do shake the darling buds of May,\nAnd summer's lease hath all too short a date;\n") * 40


def test_shakespeare_bpe_prepare(offline, tmp_path):
    from data.shakespeare.prepare import prepare
    prepare(SONNET, str(tmp_path))
    enc = offline['enc']
    train, val = read_bin(str(tmp_path / 'train.bin')), read_bin(str(tmp_path / 'val.bin'))
    split = int(len(SONNET) * 0.9)  # the char-level script's split point
    assert enc.decode(train.tolist()) == SONNET[:split] and enc.decode(val.tolist()) == SONNET[split:]
    meta = json.load(open(tmp_path / 'meta.json'))
    assert meta['vocab_size'] == 50257 and meta['encoding'] == 'gpt2'


def test_text_prepare_gpt2_files_are_documents(offline, tmp_path):
    from data.text.prepare import prepare
    texts = [SONNET, 'A second file.\n' * 200, SONNET[:500]]
    prepare(texts, str(tmp_path), tokenizer='gpt2')
    ids = np.concatenate([read_bin(str(tmp_path / 'train.bin')), read_bin(str(tmp_path / 'val.bin'))])
    eots = np.flatnonzero(ids == EOT)
    assert len(eots) == 3 and eots[-1] == len(ids) - 1
    parts = np.split(ids, eots + 1)[:3]
    assert [offline['enc'].decode(p[:-1].tolist()) for p in parts] == texts


@pytest.mark.e2e
def test_train_pads_the_bpe_vocab_and_never_samples_padding(offline, tmp_path):
    """GPT-2 BPE: 50257 tokens -> 50304 rows (a multiple of 64, nanoGPT's GPU speedup); the
    padding ids get logit -inf, so sampling never produces them and decoding works."""
    import torch
    from conftest import fork_run
    from data.text.prepare import prepare
    prepare([SONNET * 4], str(tmp_path / 'bpe'), tokenizer='gpt2')
    out = str(tmp_path / 'out')  # (forked children find the vocabulary where `offline` put it, as this process does)
    r = fork_run(['train.py', f'--data_dir={tmp_path / "bpe"}', f'--out_dir={out}', '--n_layer=1', '--n_head=2',
                  '--n_embd=32', '--block_size=16', '--batch_size=4', '--max_iters=2', '--eval_interval=2',
                  '--eval_tokens=64', '--eval_mults=[1]', '--final_eval=False', '--compile=False', '--wandb_log=False'])
    assert r.returncode == 0, r.stderr[-2000:]
    ck = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)
    assert ck['model_args']['vocab_size'] == 50257 and ck['model']['lm_head.weight'].shape[0] == 50304
    r = fork_run(['sample.py', f'--out_dir={out}', '--max_new_tokens=300', '--temperature=10.0', '--top_k=50304',
                  '--start=Shall'])
    assert r.returncode == 0, r.stderr[-2000:]  # an id >= 50257 would fail to decode


def test_text_prepare_char(tmp_path):
    from data.text.prepare import prepare
    texts = [SONNET, 'zebra quartz\n' * 100]
    prepare(texts, str(tmp_path), tokenizer='char')
    meta = json.load(open(tmp_path / 'meta.json'))
    ids = np.concatenate([read_bin(str(tmp_path / 'train.bin')), read_bin(str(tmp_path / 'val.bin'))])
    assert ''.join(meta['itos'][str(i)] for i in ids.tolist()) == ''.join(texts)  # JSON keys are strings
    assert meta['vocab_size'] == len(set(''.join(texts)))


# --- document-aware windows ----------------------------------------------------------

def corpus(doc_lens, seed=0):
    """Documents of the given lengths (tokens 0..99, never EOT), each followed by EOT."""
    rng = np.random.default_rng(seed)
    return np.concatenate([np.append(rng.integers(0, 100, n), EOT) for n in doc_lens]).astype(np.uint16)


def brute_force_windows(data, T):
    """Every doc start + k*T whose T+1 tokens hold no EOT, by a plain loop."""
    out, start = [], 0
    for i in range(len(data) + 1):
        if i == len(data) or data[i] == EOT:
            s = start
            while s + T + 1 <= i:
                out.append(s)
                s += T
            start = i + 1
    return out


@pytest.mark.parametrize('T', [1, 4, 16, 33])
def test_document_windows_never_cross_eot(T):
    data = corpus([0, 5, 16, 17, 40, 3, 100, 33, 34, 1])
    starts = document_windows(data, T, EOT)
    assert starts.tolist() == brute_force_windows(data, T)
    for s in starts:
        assert s + T + 1 <= len(data) and EOT not in data[s:s + T + 1]
    assert (np.diff(starts) >= T).all()  # non-overlapping


def test_document_windows_start_at_book_beginnings():
    data = corpus([50, 90])  # book 1 = [0, 50), EOT at 50; book 2 = [51, 141), EOT at 141
    # a window needs T + 1 = 21 tokens: book 1 fits starts 0, 20 (40 + 21 > 50);
    # book 2 fits 51, 71, 91, 111 (131 + 21 > 141)
    assert document_windows(data, 20, EOT).tolist() == [0, 20, 51, 71, 91, 111]


def test_document_windows_subsample_and_errors():
    data = corpus([300] * 10)
    full = document_windows(data, 10, EOT)
    assert len(full) == 10 * 29  # (300 - 1) // 10 per book
    some = document_windows(data, 10, EOT, n=37)
    assert len(some) == 37 and len(set(some.tolist())) == 37 and set(some.tolist()) <= set(full.tolist())
    assert some[0] == full[0] and some[-1] == full[-1] and (np.diff(some) > 0).all()
    assert document_windows(data, 10, EOT, n=10 ** 6).tolist() == full.tolist()
    no_eot = np.arange(1000, dtype=np.uint16) % 7  # one document: plain tiling from 0
    assert document_windows(no_eot, 100, EOT).tolist() == list(range(0, 900, 100))
    with pytest.raises(ValueError, match='longer documents'):
        document_windows(corpus([10, 12]), 12, EOT)


# --- GPU configs -----------------------------------------------------------------------

def load_config(path):
    scope = {}
    exec(open(path).read(), {}, scope)
    return scope


def train_py_keys():
    tree = ast.parse(open(os.path.join(ROOT, 'train.py')).read())
    return {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
            if isinstance(t, ast.Name)}


def test_gpu_config_keys_and_batch():
    c = load_config(os.path.join(ROOT, 'config', 'gpt2_124m.py'))
    assert set(c) <= train_py_keys()  # every key is a train.py setting
    assert (c['n_layer'], c['n_head'], c['n_embd'], c['block_size']) == (12, 12, 768, 1024)
    assert c['gradient_accumulation_steps'] % 8 == 0  # divisible across 1 and 8 GPUs
    assert c['batch_size'] * c['block_size'] * c['gradient_accumulation_steps'] == 524288  # GPT-3 small's batch


def test_gpu_config_is_gpt2_small():
    """The config builds GPT-2 small: parameters counted by formula, not by the model."""
    from model import GPT, GPTConfig
    c = load_config(os.path.join(ROOT, 'config', 'gpt2_124m.py'))
    V, d, L, T = 50257, c['n_embd'], c['n_layer'], c['block_size']
    import torch
    with torch.device('meta'):  # shapes only: no memory, no init time
        model = GPT(GPTConfig(vocab_size=V, n_layer=L, n_head=c['n_head'], n_embd=d, block_size=T,
                              pos_encoding='learned'))
    # tied token embedding, 12 d^2 per block (qkv 3d^2, proj d^2, mlp 8d^2), 2 LN weights
    # per block + the final LN (bias=False), the learned position table
    assert model.get_num_params() == V * d + L * (12 * d * d + 2 * d) + d + T * d
    assert 123e6 < model.get_num_params() < 125e6
