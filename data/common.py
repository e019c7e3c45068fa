"""
Shared helpers for the prepare scripts in data/:

  get_encoding(name)        the GPT-2 BPE through tiktoken, also on machines that cannot
                            reach tiktoken's download host (the vocabulary then comes from PyPI)
  write_bin / write_meta    flat uint16 token files (train.bin, val.bin) and meta.json
  tokenize_to_bin(docs, ..) stream documents through worker processes into a uint16 file,
                            an EOT token after every document
  document_windows(...)     window starts that never cross an EOT (long-context eval on books)

Token files are flat uint16 arrays that train.py and eval.py memory-map, as in
nanoGPT; GPT-2 ids stop at 50256, so uint16 holds them.
"""
import base64
import glob
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tarfile
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from console import progress  # noqa: E402
from files import atomic_json, atomic_write  # noqa: E402

# -----------------------------------------------------------------------------
# the GPT-2 tokenizer, offline
#
# tiktoken downloads its vocabularies from openaipublic.blob.core.windows.net and
# caches each file as <cache dir>/sha1(url) (tiktoken/load.py, read_file_cached),
# checking the sha256 given in tiktoken_ext/openai_public.py; URLs and hashes below
# are copied from there. The two GPT-2 encodings are the same BPE stored two ways:
# 'r50k_base' reads one .tiktoken file, 'gpt2' the original release's vocab.bpe and
# encoder.json. PyPI carries the r50k_base file byte for byte: the openai-whisper
# sdist ships it as whisper/assets/gpt2.tiktoken. The other two are derived from it
# exactly (gpt2_release_files), so both names work and tiktoken checks all three.

_BLOB = 'https://openaipublic.blob.core.windows.net/'
GPT2_FILES = {  # name -> (url tiktoken reads, sha256 tiktoken expects)
    'r50k_base.tiktoken': (_BLOB + 'encodings/r50k_base.tiktoken',
                           '306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930'),
    'vocab.bpe': (_BLOB + 'gpt-2/encodings/main/vocab.bpe',
                  '1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5'),
    'encoder.json': (_BLOB + 'gpt-2/encodings/main/encoder.json',
                     '196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783'),
}
GPT2_ENCODINGS = ('gpt2', 'r50k_base')
WHISPER_SDISTS = ('openai-whisper==20250625', 'openai-whisper')  # pinned first; any version has the file
WHISPER_ASSET = 'whisper/assets/gpt2.tiktoken'


def tiktoken_cache_dir():
    """The folder tiktoken caches vocabularies in: $TIKTOKEN_CACHE_DIR, else
    $DATA_GYM_CACHE_DIR (tiktoken's own order). When neither is set tiktoken would use
    <tmp>/data-gym-cache, which a reboot wipes; we point TIKTOKEN_CACHE_DIR at
    ~/.cache/nanoPE/tiktoken instead, so the vocabulary is fetched once per machine."""
    for var in ('TIKTOKEN_CACHE_DIR', 'DATA_GYM_CACHE_DIR'):
        if var in os.environ:
            return os.environ[var]
    root = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    os.environ['TIKTOKEN_CACHE_DIR'] = os.path.join(root, 'nanoPE', 'tiktoken')
    return os.environ['TIKTOKEN_CACHE_DIR']


def get_encoding(name='gpt2'):
    """tiktoken.get_encoding(name). If tiktoken cannot download a GPT-2 vocabulary, put
    the identical files (from PyPI) where its cache looks and load again; tiktoken
    itself then verifies their sha256."""
    import tiktoken
    cache_dir = tiktoken_cache_dir()
    try:
        return tiktoken.get_encoding(name)
    except Exception as e:  # usually: no route to openaipublic.blob.core.windows.net
        if name not in GPT2_ENCODINGS:
            raise RuntimeError(f"tiktoken could not load encoding {name!r} ({type(e).__name__}: {e}). "
                               f"Only the GPT-2 encodings {GPT2_ENCODINGS} have an offline fallback here; "
                               f"make {_BLOB} reachable or use one of those.") from e
        if cache_dir == '':
            raise RuntimeError(f"tiktoken could not download the GPT-2 vocabulary ({e}) and "
                               f"TIKTOKEN_CACHE_DIR='' disables its cache, so no offline copy can be "
                               f"used. Fix: unset TIKTOKEN_CACHE_DIR (or set it to a folder).") from e
        sdist = install_gpt2_vocab(cache_dir)
        enc = tiktoken.get_encoding(name)  # reads the cache; tiktoken checks each file's sha256
        print(f"tiktoken could not download the GPT-2 vocabulary ({type(e).__name__}); installed the "
              f"identical r50k_base file from PyPI ({sdist}: {WHISPER_ASSET}) and the gpt2 "
              f"vocab.bpe/encoder.json derived from it into {cache_dir}, each with the sha256 tiktoken "
              f"expects; tiktoken loaded {name!r} from there.", file=sys.stderr)
        return enc


def fetch_whisper_gpt2_vocab():
    """The r50k_base vocabulary from the openai-whisper sdist on PyPI -> (bytes, sdist name).
    Only that one file is read out of the archive; its sha256 is checked here."""
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, spec in enumerate(WHISPER_SDISTS):
            d = os.path.join(tmp, str(i))
            r = subprocess.run([sys.executable, '-m', 'pip', 'download', '--no-deps', '--no-binary', ':all:',
                                '-q', '-d', d, spec], capture_output=True, text=True)
            blob, sdist = None, None
            for path in glob.glob(os.path.join(d, '*.tar.gz')):
                with tarfile.open(path) as tf:
                    m = next((m for m in tf if m.name.endswith('/' + WHISPER_ASSET)), None)
                    if m is not None:
                        blob, sdist = tf.extractfile(m).read(), os.path.basename(path)
            if blob is None:
                errors.append(f"{spec}: " + (f"pip download failed: {r.stderr.strip()[-300:]}" if r.returncode
                                             else f"no {WHISPER_ASSET} in the sdist"))
            elif hashlib.sha256(blob).hexdigest() != GPT2_FILES['r50k_base.tiktoken'][1]:
                errors.append(f"{spec}: its {WHISPER_ASSET} is not the r50k_base vocabulary (sha256 differs)")
            else:
                return blob, sdist
    raise RuntimeError("could not obtain the GPT-2 vocabulary from PyPI (" + '; '.join(errors) + "). Fix: make "
                       f"PyPI or {_BLOB} reachable, or copy r50k_base.tiktoken into tiktoken's cache yourself")


def gpt2_release_files(tiktoken_bpe):
    """The GPT-2 release's vocab.bpe and encoder.json, byte for byte, from the
    r50k_base .tiktoken file (lines 'base64(token) rank').

    The release spells token bytes as text with GPT-2's byte->unicode map: the 188
    printable non-space bytes stand for themselves, the other 68 become chr(256 + n)
    in byte order. vocab.bpe lists the merges by rank; since ranks are merge
    priorities, running BPE on a token's own bytes until two parts remain gives back
    the merge that created it. The caller checks the results' sha256."""
    ranks = {}
    for line in tiktoken_bpe.splitlines():
        if line:
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != ' ']
    others = [b for b in range(256) if b not in printable]
    spell = {b: chr(b) for b in printable}
    spell.update({b: chr(256 + n) for n, b in enumerate(others)})
    text = lambda bs: ''.join(spell[b] for b in bs)  # noqa: E731

    def last_merge(tok):
        parts = [bytes([b]) for b in tok]
        while len(parts) > 2:
            i = min(range(len(parts) - 1), key=lambda j: ranks.get(parts[j] + parts[j + 1], 1 << 30))
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return parts

    by_rank = sorted(ranks, key=ranks.get)
    merges = [' '.join(text(p) for p in last_merge(t)) for t in by_rank[256:]]
    vocab_bpe = ('#version: 0.2\n' + '\n'.join(merges) + '\n').encode()
    encoder = {text(t): ranks[t] for t in by_rank}
    encoder['<|endoftext|>'] = len(by_rank)
    return {'vocab.bpe': vocab_bpe, 'encoder.json': json.dumps(encoder).encode()}


def install_gpt2_vocab(cache_dir):
    """Write the three GPT-2 vocabulary files into tiktoken's cache under the names it
    looks for (sha1 of the download URL), after checking each file's sha256."""
    blob, sdist = fetch_whisper_gpt2_vocab()
    files = {'r50k_base.tiktoken': blob, **gpt2_release_files(blob)}
    os.makedirs(cache_dir, exist_ok=True)
    for fname, content in files.items():
        url, sha = GPT2_FILES[fname]
        if hashlib.sha256(content).hexdigest() != sha:
            raise RuntimeError(f"derived {fname} does not match tiktoken's sha256 {sha}; "
                               f"make {_BLOB} reachable once so tiktoken caches it itself")
        path = os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest())
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, 'wb') as f:
            f.write(content)
        os.replace(tmp, path)  # atomic: parallel processes may do this at once
    return sdist


# -----------------------------------------------------------------------------
# token files

def write_bin(ids, path):
    """Write token ids as a flat uint16 file, atomically (files.atomic_write: a fresh temporary
    file, then rename; a link at either name is never written through)."""
    ids = np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() >= 2 ** 16):
        raise ValueError(f"token ids must fit uint16 (0..65535), got range {ids.min()}..{ids.max()}; "
                         f"a vocabulary this large needs uint32 files, which train.py does not read")
    atomic_write(path, lambda f: f.write(ids.astype(np.uint16).tobytes()))
    return len(ids)


def write_meta(out_dir, enc=None, **extra):
    """meta.json for a dataset: vocab_size plus the tiktoken encoding (name, EOT token) for a
    BPE corpus, or stoi/itos for a char corpus (pass them in extra). JSON, not pickle: a data
    folder shared with others cannot carry code."""
    meta = {'vocab_size': enc.n_vocab, 'encoding': enc.name, 'eot_token': enc.eot_token} if enc else {}
    meta.update(extra)
    atomic_json(meta, os.path.join(out_dir, 'meta.json'))
    return meta


_worker_enc = None


def _init_worker(encoding):
    global _worker_enc
    _worker_enc = get_encoding(encoding)  # the parent filled the cache: no network here


def encode_doc(text, enc=None):
    """One document -> uint16 ids followed by EOT. encode_ordinary: a literal
    '<|endoftext|>' inside a document is text, so only our EOTs separate documents."""
    enc = enc or _worker_enc
    ids = enc.encode_ordinary(text)
    ids.append(enc.eot_token)
    return np.array(ids, dtype=np.uint16)


def tokenize_to_bin(docs, path, encoding='gpt2', num_proc=None, max_tokens=None, total=None,
                    desc=None, chunk_docs=None):
    """Tokenize an iterable of document strings with `num_proc` worker processes and
    write them in order, each followed by EOT, to `path` as one flat uint16 file.

    `docs` may be a stream (a streaming HF dataset): it is read `chunk_docs` documents
    at a time, so memory stays bounded however large the corpus. Stops after the
    document that reaches `max_tokens`. The file appears only when complete (written
    as path.tmp, then renamed). Returns (n_docs, n_tokens)."""
    enc = get_encoding(encoding)  # fill tiktoken's cache once, before the workers start
    if enc.n_vocab > 2 ** 16:
        raise ValueError(f"encoding {encoding!r} has {enc.n_vocab} tokens; uint16 files hold at most 65536")
    num_proc = num_proc or max(1, (os.cpu_count() or 2) - 1)
    chunk_docs = chunk_docs or 256 * num_proc
    docs = iter(docs)
    bar = progress(total, desc or os.path.basename(path), 'doc')  # a bar on a terminal, one line in a log
    counts = [0, 0]  # documents, tokens

    def write(f):
        with mp.Pool(num_proc, _init_worker, (encoding,)) as pool:
            while max_tokens is None or counts[1] < max_tokens:
                batch = list(itertools.islice(docs, chunk_docs))
                if not batch:
                    break
                before = counts[0]
                for ids in pool.imap(encode_doc, batch, chunksize=max(1, len(batch) // (4 * num_proc))):
                    f.write(ids.tobytes())
                    counts[0] += 1
                    counts[1] += len(ids)
                    if max_tokens is not None and counts[1] >= max_tokens:
                        break
                bar.update(counts[0] - before)
                bar.set_postfix_str(f"{counts[1] / 1e6:,.1f}M tokens")
    atomic_write(path, write)
    bar.close()
    n_docs, n_tokens = counts
    return n_docs, n_tokens


def load_hf_stream(path, name=None, split='train'):
    """A streaming Hugging Face dataset split. `datasets` is not a core dependency of
    nanoPE (only these big-corpus scripts need it), so it is imported here, lazily."""
    try:
        from datasets import load_dataset
    except ImportError:
        sys.exit("this script streams a corpus from the Hugging Face Hub and needs the `datasets` "
                 "package, which nanoPE does not install by default: pip install datasets")
    return load_dataset(path, name=name, split=split, streaming=True)


def num_examples(ds, split):
    """Documents in a split, when the dataset card says (for the progress bar); else None."""
    try:
        return ds.info.splits[split].num_examples
    except Exception:
        return None


# -----------------------------------------------------------------------------
# document-aware windows

def document_windows(data, T, eot, n=None):
    """Starts of windows of T tokens that never cross a document boundary.

    data: 1-D token array (e.g. the uint16 memmap of val.bin) whose documents are
          separated by `eot` (read once in full: meant for val/test splits).
    A window starting at s scores targets data[s+1 : s+T+1] from inputs data[s : s+T];
    none of these T+1 tokens is an EOT, so every scored token and all of its context
    come from one document. Each document is tiled from its first token by
    non-overlapping windows (stride T) and its remainder is dropped, so position p
    in a window is position p in the document: whole books, read from the start.
    n: how many windows, spread evenly over all of them (deterministic); None, or
       more than there are, gives all. Returns ascending int64 starts.
    Raises ValueError when no document has the T+1 tokens a window needs."""
    if T < 1 or (n is not None and n < 1):
        raise ValueError(f"document_windows needs T >= 1 and n >= 1 (or None), got T={T}, n={n}")
    data = np.asarray(data)
    eots = np.flatnonzero(data == eot)
    doc_start = np.concatenate(([0], eots + 1))
    doc_len = np.concatenate((eots, [len(data)])) - doc_start
    count = np.maximum(0, (doc_len - 1) // T)  # window k needs doc_start + k*T + T + 1 <= doc end
    total = int(count.sum())
    if total == 0:
        raise ValueError(f"no document has the {T + 1} tokens a window of T={T} needs (longest: "
                         f"{int(doc_len.max())} tokens, {len(doc_start)} documents split by EOT={eot}); "
                         f"use a smaller T or a corpus of longer documents (e.g. data/pg19)")
    first = np.repeat(np.cumsum(count) - count, count)  # index of each window's doc's first window
    starts = np.repeat(doc_start, count) + T * (np.arange(total) - first)
    if n is not None and n < total:  # floor(x + .5), not round(): banker's rounding could repeat an index
        starts = starts[np.floor(np.linspace(0, total - 1, n) + 0.5).astype(np.int64)]
    return starts.astype(np.int64)
