"""A mutation check of the test suite: small bugs, one at a time, each put into a copy of the repo as an exact
string replacement; the suite (or the tier given) runs on the copy with -x and the first test that fails is the one
that caught the bug. A replacement whose text is no longer in its file (or is there twice) is reported as not
applied, never skipped in silence. The repo itself is never written: the copy is its tracked files as they are on
disk. Not collected by pytest (not named test_*.py).

    python tests/mutants.py                          # every mutant, the full suite: python -m pytest -x -q -n 2
    python tests/mutants.py --only=rope_sign,window  # some of them
    python tests/mutants.py --repo=/tmp/old -- -m "not e2e"   # another checkout; pytest arguments after --
    python tests/mutants.py --control="--durations=40 -v"     # first the unmutated suite, which must pass
    python tests/mutants.py --same_tests=old/results.json     # only the test that caught each bug in an earlier check
"""
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# attention.py's QK-norm and Canon-B, in their order (canon_b_before_norm swaps them)
_QK_NORM = "        if self.q_norm is not None:\n            q, k = self.q_norm(q), self.k_norm(k)\n"
_CANON_B = ("        if self.canonB is not None:  # Canon-B: q, k, v after QK-norm and before the positions, as the "
            "authors' code\n            qkv = self.canonB(torch.cat([t.transpose(1, 2).reshape(B, T, -1) for t in "
            "(q, k, v)], 2), cache)\n            q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in "
            "qkv.split((self.q_heads * hd, kv, kv), dim=2))\n")
# name: (file, what the bug is, exact text, its replacement)
MUTANTS = {
    'rope_sign': ('positional.py', "RoPE's rotate_half loses the minus sign",
                  "    return torch.cat((-x2, x1), dim=-1)",
                  "    return torch.cat((x2, x1), dim=-1)"),
    'window': ('attention.py', "a sliding window lets a query see one key too many",
               "            ok = ok & (t - u < self.window)",
               "            ok = ok & (t - u <= self.window)"),
    'sink_dropped': ('attention.py', "attend ignores the sink logits",
                     "    if sink_logits is not None:  # the sink's share",
                     "    if False:  # the sink's share"),
    'resume_skip': ('train.py', "a resumed run skips a batch (draws iteration it + 1's)",
                    "in enumerate(get_batch(iter_num)):",
                    "in enumerate(get_batch(iter_num + (resumed_at is not None))):"),
    'sweep_seed': ('sweep.py', "the LM sweep trains every scheme at the first seed only",
                   "{'pos_encoding': s, 'seed': str(seed)}) for s in schemes for seed in seeds]",
                   "{'pos_encoding': s, 'seed': str(seed)}) for s in schemes for seed in seeds[:1]]"),
    'ckpt_rng_key': ('checkpoint.py', "the saved RNG states drop Python's",
                     "    return {'torch': torch.get_rng_state(), 'python': random.getstate(),",
                     "    return {'torch': torch.get_rng_state(),"),
    'stderr_n': ('evaluation.py', "the standard error divides by n, not n - 1",
                 "    return math.sqrt(sum((x - m) ** 2 for x in per_window) / (n - 1) / n)",
                 "    return math.sqrt(sum((x - m) ** 2 for x in per_window) / n / n)"),
    't_df': ('stats.py', "the paired interval's t quantile has n degrees of freedom, not n - 1",
             "    half = t_quantile(1 - (1 - level) / 2, s['n'] - 1) * s['sd']",
             "    half = t_quantile(1 - (1 - level) / 2, s['n']) * s['sd']"),
    'task_exact': ('tasks.py', "exact match forgives one wrong answer token",
                   "    return correct == total, correct, total",
                   "    return correct >= total - 1, correct, total"),
    'split_rows': ('runtime.py', "a rank's micro-steps drop the remainder rows of an uneven share",
                   "[n // accum + (m < n % accum) for m in range(accum)]",
                   "[n // accum for m in range(accum)]"),
    'conv_tap': ('kernels.py', "the short causal convolution drops its current-token tap",
                 "    return sum(xp[:, s:s + x.size(1)] * weight[:, s] for s in range(W))",
                 "    return sum(xp[:, s:s + x.size(1)] * weight[:, s] for s in range(W - 1))"),
    'pi_factor': ('rope_scaling.py', "linear (PI) scaling multiplies the frequencies instead of dividing",
                  "        inv = inv / s\n",
                  "        inv = inv * s\n"),
    'cache_evict': ('kvcache.py', "a windowed layer's KV cache evicts one key too many",
                    "layer.evict(mask.lowest(self.length))",
                    "layer.evict(mask.lowest(self.length) + 1)"),
    'doc_window': ('data/common.py', "document windows may end on the EOT of the next document",
                   "    count = np.maximum(0, (doc_len - 1) // T)",
                   "    count = np.maximum(0, doc_len // T)"),
    'no_follow': ('files.py', "files are opened through symbolic links",
                  "os.open(path, flags | os.O_NOFOLLOW | getattr(os, 'O_CLOEXEC', 0), mode)",
                  "os.open(path, flags | getattr(os, 'O_CLOEXEC', 0), mode)"),
    'layer_types': ('layers.py', "a layer_types pattern is tiled from its second letter",
                    "        return [spec[i % len(spec)] for i in range(n_layer)]",
                    "        return [spec[(i + 1) % len(spec)] for i in range(n_layer)]"),
    'report_star': ('report.py', "a paired difference is starred when its interval includes 0",
                    "(' *' if p['excludes_zero'] else '')",
                    "(' *' if not p['excludes_zero'] else '')"),
    'lift_grads': ('attention.py', "qk_lift takes factors that need a gradient in bfloat16 training (GRAPE-A's gates)",
                   "not (c.grad and c.dtype == torch.bfloat16 and c.bias.grad)",
                   "not (c.grad and c.dtype == torch.bfloat16 and False)"),
    'wide_scale': ('attention.py', "a wide head's split scales its bias columns by their own width",
                   "k[..., w:].transpose(-1, -2)) * q.size(-1) ** -0.5",
                   "k[..., w:].transpose(-1, -2)) * (q.size(-1) - w) ** -0.5"),
    'rope_table': ('positional.py', "RoPE's cos/sin tables start at position 1",
                   "cos, sin = self.cos_sin(torch.arange(self.block_size), inv_freq)",
                   "cos, sin = self.cos_sin(torch.arange(1, self.block_size + 1), inv_freq)"),
    'p2c_table': ('positional.py', "DeBERTa's table lays its p2c term out by query, like c2p",
                  "return query_distance_table(c2p) + key_distance_table(p2c)",
                  "return query_distance_table(c2p) + query_distance_table(p2c)"),
    'lse_sign': ('attention.py', "the logsumexp's gradient enters the kernels' backward with the wrong sign",
                 "y2 = F.pad(torch.cat((y, -glse.unsqueeze(-1).to(y.dtype)), -1), (0, 7))",
                 "y2 = F.pad(torch.cat((y, glse.unsqueeze(-1).to(y.dtype)), -1), (0, 7))"),
    'shaw_clip': ('positional.py', "Shaw's table does not clip the distance at k",
                  "r = torch.arange(q.size(2), device=q.device).clamp(max=self.k)",
                  "r = torch.arange(q.size(2), device=q.device).clamp(max=self.k - 1)"),
    'tabulate_keys': ('attention.py', "a chunk's grid reads its keys from the problem's first, not its own",
                      "t = bias.grid(i.flatten() + row0, j.flatten() + key0)[None]",
                      "t = bias.grid(i.flatten() + row0, j.flatten())[None]"),
    'fire_grid': ('positional.py', "FIRE's table on CUDA drops its output layer's bias",
                  "return (hidden @ params.fc2.weight.t() + params.fc2.bias).permute(2, 0, 1)",
                  "return (hidden @ params.fc2.weight.t()).permute(2, 0, 1)"),
    'logits_table': ('attention.py', "whole logits (Wall's, PaTH's) take sdpa_bias, rounded to bfloat16",
                    "            return Tq == Tk and not self.logits",
                    "            return Tq == Tk"),
    'scaled_table': ('attention.py', "attention scaling leaves a whole bias's table unscaled",
                     "table = lambda: by(bias_table(self, s.size(1)), s[None, :, :, None])",
                     "table = lambda: bias_table(self, s.size(1))"),
    'scaled_factors': ('attention.py', "attention scaling leaves a bias's factors unscaled",
                       "(fq * s[None, :, :, None], fk)", "(fq, fk)"),
    'table_budget': ('attention.py', "sdpa_bias takes a bias table of any size",
                     "(c.dtype or torch.float32).itemsize <= SDPA_BIAS_BYTES",
                     "(c.dtype or torch.float32).itemsize > 0"),
    'cable_step_sign': ('positional.py', "CABLE's steps reward distance (softplus added, not subtracted)",
                        "step = -F.softplus(params.bias_proj(wide(x))).transpose(1, 2)",
                        "step = F.softplus(params.bias_proj(wide(x))).transpose(1, 2)"),
    'cable_table': ('positional.py', "CABLE's table is b_j - b_i",
                    "table=(lambda: b_q[..., :, None] - b[..., None, :])",
                    "table=(lambda: b[..., None, :] - b_q[..., :, None])"),
    'cable_factors': ('positional.py', "CABLE's factors lift +b_j",
                      "factors=lambda: (b.new_ones(1, 1, 1, 1), -b[..., None]),",
                      "factors=lambda: (b.new_ones(1, 1, 1, 1), b[..., None]),"),
    'cable_unscaled': ('positional.py', "CABLE's qk_scale='none' keeps the 1/sqrt(head_dim)",
                       "'head': 1.0, 'none': math.sqrt(self.head_dim),", "'head': 1.0, 'none': 1.0,"),
    'cable_query_rows': ('positional.py', "CABLE's queries read the sums of the first keys, not of the last",
                         "cable_bq=b[..., b.size(-1) - T:]", "cable_bq=b[..., :T]"),
    'hope_half_turn': ('positional.py', "HoPE keeps the pairs that turn half a period within L",
                       "keep = theta * self.train_len >= 2 * math.pi * self.turns",
                       "keep = theta * self.train_len >= math.pi * self.turns"),
    'hope_low_pairs': ('positional.py', "HoPE keeps the low frequencies and drops the high",
                       "keep = theta * self.train_len >= 2 * math.pi * self.turns",
                       "keep = theta * self.train_len < 2 * math.pi * self.turns"),
    'hope_table': ('positional.py', "HoPE's build-time tables keep rope's every pair",
                   "self.cos_table, self.sin_table = self.cos_sin(torch.arange(self.block_size), self.inv_freq)",
                   "pass"),
    'carope_power': ('positional.py', "CARoPE's powers of f start at f^1",
                     "i = torch.arange(self.head_dim // 2, device=x.device, dtype=log_f.dtype)",
                     "i = torch.arange(1, self.head_dim // 2 + 1, device=x.device, dtype=log_f.dtype)"),
    'carope_squash': ('positional.py', "CARoPE's f is exp(-softplus(z)), not 1 / (softplus(z) + 1)",
                      "log_f = -torch.log1p(F.softplus(params.freq(wide(x))))",
                      "log_f = -F.softplus(params.freq(wide(x)))"),
    'carope_init': ('positional.py', "CARoPE's bias starts at softplus^-1(theta_1), not RoPE's",
                    "_softplus_inverse(1 / theta_1 - 1))", "_softplus_inverse(theta_1))"),
    'tape_mix_cols': ('positional.py', "TAPE's attention update scales head h by W_mix's column sum, not its row sum",
                      "e = e + mix.sum(1)[:, None, None]", "e = e + mix.sum(0)[:, None, None]"),
    'tape_unmixed': ('positional.py', "TAPE's attention update adds the stream itself, not its attention average",
                     "* ctx.extra['tape_mixed'].to(e.dtype)", "* e"),
    'tape_mlp_input': ('model.py', "the stream's MLP update reads the MLP's input, not its output",
                       "return x + m, scheme.stream(m, ctx,", "return x + m, scheme.stream(self.ln_2(x), ctx,"),
    'tape_start': ('positional.py', "TAPE's stream starts with sin and cos swapped",
                   "return torch.cat((ang.cos(), ang.sin()), -1).to(dtype)",
                   "return torch.cat((ang.sin(), ang.cos()), -1).to(dtype)"),
    'tape_turn': ('positional.py', "TAPE turns q and k with the sine negated in the second half of each head",
                  "rotate_half(xe) * torch.cat((s, s), -1)", "rotate_half(xe) * torch.cat((s, -s), -1)"),
    'tape_gate': ('positional.py', "TAPE's MLP update gates with GELU, not the code's SiLU",
                  "g = F.silu(F.linear(m.to(e.dtype), gate))", "g = F.gelu(F.linear(m.to(e.dtype), gate))"),
    'tape_detach': ('positional.py', "the stream's attention average passes no gradient back to the stream",
                    "plain(q, k, ctx.extra['tape_keys'].to(v.dtype))",
                    "plain(q, k, ctx.extra['tape_keys'].detach().to(v.dtype))"),
    'tape_thread': ('model.py', "the model drops the stream between blocks: every layer starts it afresh",
                    "ctx = ctxs[key] if stream is None else replace(ctxs[key], stream=stream)", "ctx = ctxs[key]"),
    'tape_cache_order': ('positional.py', "TAPE's KV cache puts the new tokens' streams before the cached keys'",
                         "keys = torch.cat((cache.state['tape'], e), 2)",
                         "keys = torch.cat((e, cache.state['tape']), 2)"),
    'tape_move': ('positional.py', "a rolling cache turns each kept key's stream the wrong way",
                  "ctx.k_pos[ctx.k_pos.numel() - keys.size(2):] - made.view(-1)",
                  "made.view(-1) - ctx.k_pos[ctx.k_pos.numel() - keys.size(2):]"),
    'tape_last': ('positional.py', "the model's last tape layer gets stream weights that feed nothing",
                  "self.updates = [i != last for", "self.updates = [True for"),
    'canon_residual': ('kernels.py', "a Canon layer returns its convolution without the residual",
                       "        return x + depthwise_conv(x, self.weight, past).to(x.dtype)",
                       "        return depthwise_conv(x, self.weight, past).to(x.dtype)"),
    'canon_b_before_norm': ('attention.py', "Canon-B convolves q, k, v before QK-norm, not after (the authors' order)",
                            _QK_NORM + _CANON_B, _CANON_B + _QK_NORM),
    'canon_d_after_gelu': ('model.py', "Canon-D convolves the MLP's hidden layer after the GELU",
                           "        h = h if self.canonD is None else self.canonD(h, cache)\n"
                           "        return self.dropout(self.c_proj(F.gelu(h, approximate=self.gelu)))",
                           "        h = F.gelu(h, approximate=self.gelu)\n        return self.dropout(self.c_proj("
                           "h if self.canonD is None else self.canonD(h, cache)))"),
    'canon_carry_reset': ('kernels.py', "a Canon layer's carry forgets the inputs before the newest forward",
                          "seen = torch.cat((x.new_zeros(x.size(0), W - 1, x.size(2)) if past is None else past, x)",
                          "seen = torch.cat((x.new_zeros(x.size(0), W - 1, x.size(2)), x)"),
    'canon_conv1d_flip': ('kernels.py', "the depthwise conv1d route (CUDA's) reads the taps in reverse",
                          "weight.to(x.dtype)[:, None], groups=weight.size(0))",
                          "weight.flip(1).to(x.dtype)[:, None], groups=weight.size(0))"),
    'canon_init': ('kernels.py', "Canon weights start from N(0, 0.02) (GPT-2's), not nn.Conv1d's U(-1/sqrt(K), ..)",
                   "torch.empty(dim, kernel).uniform_(-kernel ** -0.5, kernel ** -0.5)",
                   "torch.empty(dim, kernel).normal_(0.0, 0.02)"),
    'canon_fresh': ('kernels.py', "Canon layers a fine-tune adds keep their random init, changing the trained outputs",
                    "        if 'weight' in names:\n            self.weight.zero_()",
                    "        if False:\n            self.weight.zero_()"),
    'canon_mlp_plan_weights': ('model.py', "the MLP's Canon layers are not plan weights: a fine-tune may not add them",
                               "    PLAN_WEIGHTS = ('.mlp.canonC.weight', '.mlp.canonD.weight')",
                               "    PLAN_WEIGHTS = ()"),
    'canon_kernel_plain': ('layers.py', "a plain canon_kernel applies to the layers without Canon layers too",
                           "        widths = [k if p else None for k, p in zip(widths, places)]",
                           "        widths = [k for k, p in zip(widths, places)]"),
    'dape_relu': ('positional.py', "DAPE's MLP over the heads has a ReLU, not the authors' LeakyReLU",
                  "            return F.linear(F.leaky_relu(h), w2, b2).permute(0, 3, 1, 2)",
                  "            return F.linear(F.relu(h), w2, b2).permute(0, 3, 1, 2)"),
    'dape_fire_relu': ('positional.py', "FIRE inside DAPE keeps plain FIRE's ReLU, not the authors' LeakyReLU",
                       "hidden = F.leaky_relu(x[..., None] * params.fc1.weight[:, 0].to(dtype)",
                       "hidden = F.relu(x[..., None] * params.fc1.weight[:, 0].to(dtype)"),
    'dape_halves': ('positional.py', "DAPE's MLP reads the logits with the weights of the bias's half",
                    "h = taps(z.permute(0, 2, 3, 1), w1[:, :H], b1)",
                    "h = taps(z.permute(0, 2, 3, 1), w1[:, -H:], b1)"),
    'dape_residual': ('positional.py', "DAPE adds f([z; b]) to the logits but not the bias itself",
                      "parts.append(z + f if b is None else z + b + f)", "parts.append(z + f)"),
    'dape_unscaled': ('positional.py', "DAPE's MLP gets q . k without the 1 / sqrt(d)",
                      "z = q[:, :, s:s + n].to(dtype) @ kt / math.sqrt(d)", "z = q[:, :, s:s + n].to(dtype) @ kt"),
    'dape_chunk_rows': ('positional.py', "a query chunk's bias takes the positions of the problem's first rows",
                        "qp, kp = ctx.q_pos[a.row0:a.row0 + Tq], ctx.k_pos[a.key0:a.key0 + Tk]",
                        "qp, kp = ctx.q_pos[:Tq], ctx.k_pos[a.key0:a.key0 + Tk]"),
    'dape_kerple_clamp': ('positional.py', "DAPE's KERPLE parameters are not clamped before use",
                          "                params.p.clamp_(min=1e-2)\n", ""),
    'dape_eval_budget': ('positional.py', "DAPE's evaluation takes a chunk's rows at once, its hidden units unbounded",
                         "n = Tq if torch.is_grad_enabled() else", "n = Tq if True else"),
    'dape_v2_tril': ('positional.py', "DAPE v2's convolutions read the keys a query cannot see (no tril)",
                     "        if vis is not None:  # the authors' tril", "        if False:  # the authors' tril"),
    'dape_v2_taps': ('positional.py', "DAPE v2's first layer turns its taps round (a convolution, not Conv2d's "
                     "correlation)", "            return F.linear(x, w.flatten(1), bias)",
                     "            return F.linear(x, w.flip(-1).flatten(1), bias)"),
    'dape_v2_edge': ('positional.py', "DAPE v2's hidden units before the text's first token are not zero",
                     "        if p > k0:  # hidden units before", "        if False:  # hidden units before"),
    'dape_v2_k0': ('positional.py', "DAPE v2 takes a cache's or chunk's first key for the text's first token",
                   "f = self.mix(z, b, params, vis[s:s + n] if p else None, a.mask.k0)",
                   "f = self.mix(z, b, params, vis[s:s + n] if p else None, 0)"),
    'dape_v2_relu': ('positional.py', "DAPE v2's convolutions have a ReLU between them, not the authors' LeakyReLU",
                     "        g = F.linear(F.leaky_relu(h), w2)", "        g = F.linear(F.relu(h), w2)"),
}


# tests merged into another since a check whose results --same_tests reads: the test that holds their assertions now
RENAMED = {
    'tests/test_sweep_seeds.py::test_two_seed_sweep_reports_spread_and_resumes_per_seed':
        'tests/test_sweep_seeds.py::test_two_seed_sweep_reports_spread_logs_to_wandb_and_resumes_per_seed',
    'tests/test_sweep_seeds.py::test_sweep_logs_one_wandb_run_per_scheme_and_seed_in_one_group':
        'tests/test_sweep_seeds.py::test_two_seed_sweep_reports_spread_logs_to_wandb_and_resumes_per_seed',
}


def copy_repo(repo, dst):
    """The tracked files of `repo` as they are on disk (uncommitted edits included) under dst."""
    names = subprocess.run(['git', '-C', repo, 'ls-files', '-z'], capture_output=True, text=True,
                           check=True).stdout.split('\0')
    for name in filter(None, names):
        src = os.path.join(repo, name)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dst, name)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, name))


def run_suite(copy, args, log, timeout):
    """pytest in the copy -> (exit code, [the failing test ids, first first], the summary line, seconds)."""
    t = time.time()
    try:
        r = subprocess.run([sys.executable, '-m', 'pytest'] + args, cwd=copy, capture_output=True, text=True,
                           timeout=timeout)
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = 'timeout', e.stdout.decode(errors='replace') if isinstance(e.stdout, bytes) else (e.stdout or '')
    secs = time.time() - t
    with open(log, 'w') as f:
        f.write(out)
    failed = [m.group(2) for m in re.finditer(r'^(FAILED|ERROR) (\S+)', out, re.M)]
    summary = next((l.strip('= ') for l in reversed(out.splitlines()) if re.search(r' in [\d.]+s', l)), '')
    return rc, failed, summary, secs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--repo', default=ROOT, help='the checkout to mutate (a copy of it; default: this one)')
    ap.add_argument('--only', default='', help='comma-separated mutant names (default: all)')
    ap.add_argument('--control', default=None, help='run the unmutated suite first, with these extra arguments')
    ap.add_argument('--out', default='mutants-out', help='folder for the logs and results.json')
    ap.add_argument('--timeout', type=int, default=3000, help='seconds per suite run')
    ap.add_argument('--same_tests', default='', help="an earlier check's results.json: run, for each bug, only the "
                    "test that caught it there (under its current name)")
    ap.add_argument('pytest_args', nargs='*', help='after --: pytest arguments (default: -x -q -n 2)')
    a = ap.parse_args()
    args = ['-p', 'no:cacheprovider'] + (a.pytest_args or ['-x', '-q', '-n', '2'])
    earlier = json.load(open(a.same_tests))['mutants'] if a.same_tests else {}
    names = a.only.split(',') if a.only else list(earlier or MUTANTS)
    unknown = [n for n in names if n not in MUTANTS]
    if unknown:
        sys.exit(f"unknown mutant(s) {unknown}; known: {', '.join(MUTANTS)}")
    os.makedirs(a.out, exist_ok=True)
    out = os.path.abspath(a.out)
    copy = os.path.join(tempfile.mkdtemp(prefix='mutants-'), 'repo')
    copy_repo(os.path.abspath(a.repo), copy)
    head = subprocess.run(['git', '-C', a.repo, 'rev-parse', '--short', 'HEAD'], capture_output=True,
                          text=True).stdout.strip()
    how = f"the test that caught each in {a.same_tests}, alone" if earlier else f"pytest {shlex.join(args)}"
    print(f"mutants: {len(names)} on a copy of {a.repo} at {head} ({copy}); {how}", flush=True)
    results = {'repo': os.path.abspath(a.repo), 'head': head, 'pytest_args': args, 'same_tests': a.same_tests,
               'mutants': {}}
    if a.control is not None:
        rc, failed, summary, secs = run_suite(copy, args[:2] + [x for x in args[2:] if x != '-x']
                                              + shlex.split(a.control), os.path.join(out, 'control.log'),
                                              a.timeout)
        results['control'] = dict(rc=rc, failed=failed, summary=summary, seconds=round(secs))
        print(f"control: exit {rc}, {summary} ({secs:.0f} s){' FAILED: ' + failed[0] if failed else ''}", flush=True)
        if rc != 0:
            print("the unmutated suite does not pass: a mutant's failure would mean nothing", flush=True)
    for name in names:
        path, what, old, new = MUTANTS[name]
        f = os.path.join(copy, path)
        text = open(f).read()
        n = text.count(old)
        if n != 1:
            results['mutants'][name] = dict(file=path, bug=what, result=f'not applied (text found {n} times)')
            print(f"{name}: NOT APPLIED ({path}: text found {n} times)", flush=True)
            continue
        run_args = args
        if earlier:  # that test alone, by its id without xdist's @group suffix
            test = earlier[name].get('first') or ''
            test = RENAMED.get(test.split('@')[0], test.split('@')[0])
            if not test:
                print(f"{name}: nothing caught it in {a.same_tests}", flush=True)
                continue
            run_args = ['-p', 'no:cacheprovider', '-q', test]
        open(f, 'w').write(text.replace(old, new))
        try:
            rc, failed, summary, secs = run_suite(copy, run_args, os.path.join(out, name + '.log'), a.timeout)
        finally:
            open(f, 'w').write(text)
        result = 'caught' if rc not in (0, 5) and failed else 'SURVIVED' if rc == 0 else f'exit {rc}'
        results['mutants'][name] = dict(file=path, bug=what, result=result, first=failed[0] if failed else None,
                                        failed=failed, summary=summary, seconds=round(secs))
        print(f"{name}: {result} {failed[0] if failed else ''} ({summary}; {secs:.0f} s)", flush=True)
        json.dump(results, open(os.path.join(out, 'results.json'), 'w'), indent=1)
    json.dump(results, open(os.path.join(out, 'results.json'), 'w'), indent=1)
    print('\n| mutant | module | bug | result | first failing test | s |\n|---|---|---|---|---|---|')
    for name, r in results['mutants'].items():
        print(f"| {name} | {r['file']} | {r['bug']} | {r['result']} | {r.get('first') or ''} | "
              f"{r.get('seconds', '')} |")
    shutil.rmtree(os.path.dirname(copy), ignore_errors=True)


if __name__ == '__main__':
    main()
