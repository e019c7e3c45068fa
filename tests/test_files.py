"""Files you can share: checkpoints and data metadata hold data, not code (a crafted pickle's
side effect never happens, in any script that opens one); writes never follow a symbolic link
out of their folder; convert.py turns a trusted older file into the data-only format."""
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import ROOT, TINY, fork_run
from test_train_robust import copy_run

sys.path.insert(0, ROOT)
import checkpoint  # noqa: E402
import files  # noqa: E402


class RunsCode:
    """A pickled object whose unpickling runs a shell command (what a crafted file carries)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f'touch {self.marker}',)


def crafted_checkpoint(src, dst, marker):
    """A working checkpoint (src) plus one object that runs `touch marker` when unpickled."""
    ck = torch.load(src, weights_only=True)
    ck['extra'] = RunsCode(marker)
    torch.save(ck, dst)


def assert_refused(r, marker, what):
    assert r.returncode != 0, r.stdout[-1000:]
    assert not os.path.exists(marker), "the crafted pickle ran its code"
    assert 'Traceback' not in r.stderr, r.stderr[-2000:]
    assert what in r.stderr, r.stderr[-2000:]


def test_crafted_checkpoint_runs_no_code_in_any_script(trained, tmp_path):
    out = copy_run(trained, tmp_path)
    marker = str(tmp_path / 'PWNED')
    os.remove(os.path.join(out, 'ckpt.pt'))  # (a hard link to ckpt_best.pt: write a new file)
    crafted_checkpoint(os.path.join(trained, 'ckpt.pt'), os.path.join(out, 'ckpt.pt'), marker)
    path = os.path.join(out, 'ckpt.pt')
    unsafe = f'{path} holds pickled Python objects, which could run code'
    runs = {
        'sample': ['sample.py', f'--out_dir={out}', '--max_new_tokens=5'],
        'eval': ['eval.py', f'--out_dir={out}', '--quick=True', '--tokens=64'],
        'eval init_from': ['eval.py', f'--init_from={path}', f'--out_dir={tmp_path}/ev', '--quick=True'],
        'train resume': ['train.py', f'--out_dir={out}', '--init_from=resume', '--wandb_log=False'],
        'train fine-tune': ['train.py', f'--init_from={path}', f'--out_dir={tmp_path}/ft', '--max_iters=2'] + TINY,
        'passkey': ['passkey.py', f'--out_dir={out}', '--iters=1', '--trials=1', '--mults=[1]'],
    }
    for name, args in runs.items():
        r = fork_run(args)
        assert_refused(r, marker, unsafe)
        assert f'python convert.py {path}' in r.stderr, name
    # compare.py reads only results; a crafted checkpoint beside them is never opened
    r = fork_run(['compare.py', out, f'--report_dir={tmp_path}/report'])
    assert r.returncode == 0 and not os.path.exists(marker), r.stderr[-2000:]


def test_crafted_checkpoint_in_a_sweep_folder_runs_no_code(trained, tmp_path):
    """A sweep re-run resumes a half-trained run from its ckpt.pt: a crafted one is refused, the
    sweep reports that run as failed, and nothing runs."""
    marker = str(tmp_path / 'PWNED')
    d = tmp_path / 'sw' / 'rope-s1337'
    d.mkdir(parents=True)
    crafted_checkpoint(os.path.join(trained, 'ckpt.pt'), str(d / 'ckpt.pt'), marker)
    data_dir = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)['config']['data_dir']
    r = subprocess.run([sys.executable, 'sweep.py', '--schemes=rope', '--scalings=', f'--out={tmp_path}/sw',
                        f'--data_dir={data_dir}', '--max_iters=2'] + [a for a in TINY if 'max_iters' not in a],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and not os.path.exists(marker)
    assert 'holds pickled Python objects' in open(d / 'sweep.log').read()


def test_crafted_meta_pkl_runs_no_code(data, trained, tmp_path):
    """A data folder whose metadata is a pickle (older prepare scripts, or a crafted folder) is
    refused in train.py and eval.py, naming convert.py."""
    marker = str(tmp_path / 'PWNED')
    folder = tmp_path / 'shared-data'
    folder.mkdir()
    for f in ('train.bin', 'val.bin'):
        shutil.copy(os.path.join(data, f), folder / f)
    import pickle
    with open(folder / 'meta.pkl', 'wb') as f:
        pickle.dump({'vocab_size': 84, 'x': RunsCode(marker)}, f)
    line = f'{folder} has a meta.pkl but no meta.json: a pickle could run code'
    r = fork_run(['train.py', f'--data_dir={folder}', f'--out_dir={tmp_path}/out', '--max_iters=2'] + TINY)
    assert_refused(r, marker, line)
    r = fork_run(['eval.py', f'--out_dir={copy_run(trained, tmp_path)}', f'--data_dir={folder}', '--quick=True'])
    assert_refused(r, marker, line)


def test_checkpoints_load_weights_only_and_resume_state_is_plain(trained):
    """Every value in a checkpoint is a tensor or a plain Python value: torch's weights-only
    unpickler (no extra allowed globals) reads it whole, and the numpy RNG state restores exactly."""
    ck = torch.load(os.path.join(trained, 'ckpt.pt'), weights_only=True)
    assert {'model', 'optimizer', 'model_args', 'config', 'rng', 'meta', 'iter_num'} <= ck.keys()
    assert torch.serialization.get_unsafe_globals_in_checkpoint(os.path.join(trained, 'ckpt.pt')) == []
    np.random.seed(5)
    np.random.rand(3)
    saved = checkpoint.rng_states('cpu')
    want = np.random.rand(4)
    random.seed(1)
    np.random.seed(99)
    checkpoint.restore_rng(saved, 'cpu')
    assert np.array_equal(np.random.rand(4), want)


def old_format_checkpoint(src, dst):
    """A checkpoint as nanoPE wrote them before: numpy's RNG state as np.random.get_state()."""
    ck = torch.load(src, weights_only=True)
    ck['rng']['numpy'] = np.random.get_state()
    torch.save(ck, dst)
    return ck


def test_convert_turns_a_trusted_old_checkpoint_into_the_safe_format(trained, tmp_path):
    out = copy_run(trained, tmp_path)
    path = os.path.join(out, 'ckpt.pt')
    os.remove(path)
    np.random.seed(7)
    old = old_format_checkpoint(os.path.join(trained, 'ckpt.pt'), path)
    want = np.random.rand(3)  # what the generator draws after the saved state
    r = fork_run(['eval.py', f'--out_dir={out}', '--quick=True', '--tokens=64'])
    assert r.returncode != 0 and 'python convert.py' in r.stderr
    r = subprocess.run([sys.executable, 'convert.py', path], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(path + '.pickle')  # the original is kept
    new = torch.load(path, weights_only=True)
    for k, v in old['model'].items():
        assert torch.equal(new['model'][k], v), k
    assert new['iter_num'] == old['iter_num'] and new['config'] == old['config']
    checkpoint.restore_rng(new['rng'], 'cpu')
    assert np.array_equal(np.random.rand(3), want)
    r = fork_run(['train.py', f'--out_dir={out}', '--init_from=resume', f'--max_iters={old["iter_num"] + 2}'])
    assert r.returncode == 0, r.stderr[-2000:]


def test_convert_meta_pkl(data, tmp_path):
    import pickle
    folder = tmp_path / 'd'
    folder.mkdir()
    meta = checkpoint.read_meta(data)
    with open(folder / 'meta.pkl', 'wb') as f:
        pickle.dump(meta, f)
    r = subprocess.run([sys.executable, 'convert.py', str(folder / 'meta.pkl')], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert checkpoint.read_meta(str(folder)) == meta and meta['itos'][0] == '\n'


# --- writes that stay in their folder ---------------------------------------------------------

def plant_links(out, outside):
    """Links from an out_dir's temporary names to files elsewhere, as a copied out_dir can carry."""
    targets = {}
    for name in ('ckpt.pt.tmp', 'ckpt_best.pt.tmp', 'metrics.jsonl.tmp', 'eval.json.tmp'):
        t = outside / f'victim-{name}'
        t.write_text('precious')
        os.symlink(t, os.path.join(out, name))
        targets[name] = t
    return targets


def test_resume_never_writes_through_planted_links(trained, tmp_path):
    out = copy_run(trained, tmp_path)
    outside = tmp_path / 'elsewhere'
    outside.mkdir()
    targets = plant_links(out, outside)
    it = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['iter_num']
    r = fork_run(['train.py', f'--out_dir={out}', '--init_from=resume', f'--max_iters={it + 40}',
                  '--eval_interval=20'])
    assert r.returncode == 0, r.stderr[-2000:]
    for t in targets.values():
        assert t.read_text() == 'precious'
    for name in ('ckpt.pt', 'ckpt_best.pt', 'metrics.jsonl', 'eval.json'):
        assert os.path.isfile(os.path.join(out, name)) and not os.path.islink(os.path.join(out, name)), name
    assert torch.load(os.path.join(out, 'ckpt.pt'), weights_only=True)['iter_num'] == it + 40


def test_links_at_the_files_themselves_are_refused_one_line(trained, tmp_path):
    outside = tmp_path / 'elsewhere'
    outside.mkdir()
    for name in ('.lock', 'metrics.jsonl'):
        out = copy_run(trained, tmp_path / name)
        victim = outside / f'victim{name}'
        victim.write_text('precious\n')
        os.remove(os.path.join(out, name)) if os.path.exists(os.path.join(out, name)) else None
        os.symlink(victim, os.path.join(out, name))
        r = fork_run(['train.py', f'--out_dir={out}', '--init_from=resume', '--max_iters=200'])
        assert r.returncode != 0 and 'Traceback' not in r.stderr
        assert f'{out}/{name} is a symbolic link (to {victim})' in r.stderr and f'rm {out}/{name}' in r.stderr
        assert victim.read_text() == 'precious\n'


def test_atomic_writers_replace_links_never_follow_them(tmp_path):
    outside = tmp_path / 'victim'
    outside.write_text('precious')
    for name, write in (('a.json', lambda p: files.atomic_json({'x': 1}, p)),
                        ('b.pt', lambda p: checkpoint.atomic_save({'x': torch.ones(2)}, p)),
                        ('c.bin', lambda p: files.atomic_write(p, lambda f: f.write(b'123')))):
        p = str(tmp_path / name)
        os.symlink(outside, p + '.tmp')  # a planted temporary name
        write(p)
        assert outside.read_text() == 'precious' and os.path.isfile(p) and not os.path.islink(p)
        assert not os.path.lexists(p + '.tmp')
        os.remove(p)
        os.symlink(outside, p)  # the target name itself: the link is replaced, its target untouched
        write(p)
        assert outside.read_text() == 'precious' and not os.path.islink(p)
    with pytest.raises(files.LinkRefused, match='is a symbolic link'):
        os.symlink(outside, tmp_path / 'log')
        files.open_append(str(tmp_path / 'log'))


def test_read_json_tells_missing_from_damaged(tmp_path):
    p = str(tmp_path / 'r.json')
    assert files.read_json(p) == (None, None)
    open(p, 'w').write('{"loss": [1.0, 2')
    obj, why = files.read_json(p)
    assert obj is None and why.startswith('truncated or corrupt JSON (16 bytes; ')
    files.atomic_json({'loss': [1.0]}, p)
    assert files.read_json(p) == ({'loss': [1.0]}, None)
