"""
The named setups the scripts run, read from config/: the attention stacks of 2025-26 models (PRESETS,
config/NAME.py), each with its twin NAME-full, the same stack without windows or chunks, as GPTConfig keys
(preset_plans: tools/bench.py, tools/gpu_check.py) or as train.py arguments (preset_args: sweep.py); bench.py's models
(model_size: config/bench_NAME.py), a scheme or preset at such a size (model_config); and lists of schemes by name
(scheme_names).
"""
import os
import sys

import kernels
import layers
import positional
from configurator import read_config_file, unknown_names
from model import GPTConfig

HERE = os.path.dirname(os.path.abspath(__file__))
# the attention stacks of 2025-26 models (config/NAME.py); each also runs as NAME-full, without windows or chunks
PRESETS = ['rnope_swa', 'irope', 'gemma3', 'gpt_oss', 'sssl']
PLAN_KEYS = ('pos_encoding', 'pos_options', 'n_layer') + layers.PLAN_KEYS  # what a preset's stack is made of


def preset_names(spec, every='all'):
    """The presets a --presets value names: a comma list, or `every` for all of them; exits naming unknown ones."""
    names = list(PRESETS) if spec == every else [p for p in spec.split(',') if p]
    bad = [p for p in names if p not in PRESETS]
    if bad:
        sys.exit(f"unknown preset(s) {bad}; presets: {', '.join(PRESETS)} (or {every!r} for all of them)")
    return names


def preset_config(name):
    """config/NAME.py's settings, in the file's order."""
    return read_config_file(os.path.join(HERE, 'config', f'{name}.py'))


def with_twins(plans, off=None):
    """{name: plan, name-full: the plan with `off` for its windows and chunks, ...}, each twin after its preset."""
    out = {}
    for p, plan in plans.items():
        out[p], out[f'{p}-full'] = plan, {**plan, 'sliding_window': off, 'attention_chunk_size': off}
    return out


def preset_plans(spec, twins=True):
    """{name: GPTConfig keys} of the presets --presets names ('all' or a comma list), with their twins NAME-full
    (twins=False: without)."""
    plans = {p: {k: v for k, v in preset_config(p).items() if k in PLAN_KEYS} for p in preset_names(spec)}
    return with_twins(plans) if twins else plans


def preset_args(spec, task=False):
    """{run name: train.py args as strings} of the presets sweep.py's --presets names ('default' or a comma list)
    and their twins NAME-full. In the task suite a preset keeps its own depth (train.py's 4 layers unless it sets
    n_layer), so its pattern fits."""
    out = {}
    for p in preset_names(spec, every='default'):
        a = {k: str(v) for k, v in preset_config(p).items() if k != 'out_dir'}
        out[p] = {'n_layer': '4', **a} if task else a
    return with_twins(out, off='None')


def model_size(a, preset):
    """The named model config/bench_<preset>.py, with any size given on the command line (a: the options)."""
    path = os.path.join(HERE, 'config', f'bench_{preset}.py')
    if not os.path.exists(path):
        sys.exit(f"--preset={preset!r}: there is no config/bench_{preset}.py; use default or gpt2 (or write that file)")
    size = read_config_file(path)
    size.update({k: getattr(a, k) for k in size if getattr(a, k)})
    return size


def model_config(name, size, plans, auto_only=False):
    """The GPTConfig of a scheme or preset (a key of `plans`, which keeps its own n_layer) at `size`. A layer whose
    fla kernel 'auto' does not take (Wall's: exact only in a range, kernels.FLA_KERNELS) gets attn_backend='fla'
    where fla can run here, so that every scheme with a kernel is measured on it; elsewhere, or with auto_only
    (the path a default config runs), 'auto'."""
    cfg = {**size, **plans[name]} if name in plans else dict(size, pos_encoding=name)
    kernel = positional.REGISTRY[cfg.get('pos_encoding', 'rope')].fla_kernel
    if kernel and kernels.FLA_KERNELS[kernel].not_auto and kernels.fla_status()[0] and not auto_only:
        cfg['attn_backend'] = 'fla'
    return GPTConfig(**cfg)


def scheme_names(schemes):
    """--schemes: a comma list of registered schemes, or 'all' for every one; exits naming unknown ones."""
    names = sorted(positional.REGISTRY) if schemes == 'all' else [s.strip() for s in schemes.split(',') if s.strip()]
    bad = [n for n in names if n not in positional.REGISTRY]
    if bad:
        sys.exit(unknown_names('scheme(s)', bad, positional.REGISTRY, "valid (or 'all')"))
    return names
