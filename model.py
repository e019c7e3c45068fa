"""
One-file GPT for nanoPE. Pre-LN blocks, tied embeddings, GPT-2 init, a KV cache, and
a layer plan (layers.py) computed once from the config and handed to each layer with
its index: each layer's attention (attention.CausalSelfAttention) asks its positional
scheme (positional.py) for everything position-related, and attends over the keys its
mask lets a query see, with its own QK-norm, sink logits and logit scaling.
"""

import inspect
import math
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn
from torch.nn import functional as F

import attention
import kernels
import kvcache
import layers
import runtime
import stack


@dataclass
class GPTConfig(layers.PlanKeys):  # the layer plan's per-layer keys (layer_types, sliding_window, ...): layers.py
    block_size: int = 256          # training context length L
    vocab_size: int = 50304
    vocab_multiple: int = 1        # pad embedding/lm_head rows to a multiple (64 for GPT-2 BPE); never scored
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = False
    gelu: str = 'none'             # 'none' (exact) | 'tanh' (the approximation GPT-2 was trained with)
    pos_encoding: str = 'rope'     # a key of positional.REGISTRY
    pos_options: dict = field(default_factory=dict)  # kwargs for that scheme
    rope_scaling: dict = None      # run-time RoPE context extension (overrides pos_options)
    attn_backend: str = 'auto'     # 'auto' | 'flex' | 'dense' | 'fla' (attention.BACKENDS)


def is_positional(name):
    """True for a parameter, buffer or module that belongs to the positional scheme: the model-wide
    scheme (pe.*) or a layer's positional module (*.pe_layer.*). The one definition of "positional
    weights": GPT-2's init skips them (schemes initialise themselves), and a fine-tune into another
    scheme starts them fresh."""
    parts = name.split('.')
    return parts[0] == 'pe' or 'pe_layer' in parts


def changeable(name):
    """True for a weight that a change of scheme (pos_encoding, pos_options) or of the layer plan may
    add or drop in a fine-tune: a positional one, or one of the weights a layer plan adds to a layer's
    attention or MLP (attention.PLAN_WEIGHTS, MLP.PLAN_WEIGHTS: sink logits, SSMax scales, QK-norm, Canon layers)."""
    return is_positional(name) or name.endswith(tuple('.attn.' + w for w in attention.PLAN_WEIGHTS) + MLP.PLAN_WEIGHTS)


class MLP(nn.Module):
    PLAN_WEIGHTS = ('.mlp.canonC.weight', '.mlp.canonD.weight')  # the Canon layers a layer plan may add here

    def __init__(self, config, spec):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.gelu = config.gelu
        self.canonC, self.canonD = kernels.canons(spec, C=config.n_embd, D=4 * config.n_embd)  # None where it has none

    def forward(self, x, cache=None):  # Canon-C on the MLP's input, Canon-D on its hidden layer before the GELU
        h = self.c_fc(x if self.canonC is None else self.canonC(x, cache))
        h = h if self.canonD is None else self.canonD(h, cache)
        return self.dropout(self.c_proj(F.gelu(h, approximate=self.gelu)))


class Block(nn.Module):

    def __init__(self, config, spec, pe):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = attention.CausalSelfAttention(config, spec, pe)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config, spec)

    def forward(self, x, scheme, ctx, cache=None):
        y, ctx = self.attn(self.ln_1(x), scheme, ctx, cache, with_ctx=True)
        x = x + y
        m = self.mlp(self.ln_2(x), cache)
        return x + m, scheme.stream(m, ctx, self.attn.pe_layer, cache)  # and the positional stream the next block gets


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        if config.n_embd % config.n_head:  # before the scheme, whose head_dim would be wrong
            ok = [h for h in range(1, min(config.n_embd, 64) + 1) if config.n_embd % h == 0]
            raise ValueError(f"n_embd={config.n_embd} is not divisible by n_head={config.n_head}: every head "
                             f"gets n_embd/n_head dims. Use an n_head that divides {config.n_embd} "
                             f"({', '.join(map(str, ok))}) or an n_embd that is a multiple of {config.n_head}")
        self.config = config
        self.plan = layers.layer_specs(config, nope_scheme=config.pos_encoding == 'none')  # a LayerSpec a layer
        self.pe = stack.Positions(config, self.plan)  # the scheme, one instance per distinct options
        # GPT-2's 50257 tokens padded to 50304 (a multiple of 64) make the lm_head matmul
        # faster on GPUs (nanoGPT); the padding ids get logit -inf, so they are never scored or sampled
        mult = max(1, config.vocab_multiple)
        n_rows = -(-config.vocab_size // mult) * mult
        pad = torch.full((n_rows - config.vocab_size,), float('-inf'))
        mask = None if n_rows == config.vocab_size else torch.cat((torch.zeros(config.vocab_size), pad))
        self.register_buffer('vocab_mask', mask, persistent=False)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(n_rows, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, spec, self.pe) for spec in self.plan]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, n_rows, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        # GPT-2 init for the transformer; positional modules initialise themselves
        for name, m in self.named_modules():
            if not is_positional(name):
                self._init_weights(m)
        for pn, p in self.named_parameters():
            if pn.endswith('c_proj.weight'):  # scaled residual projections (GPT-2)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def start_fresh(self, names):
        """Weights a fine-tune adds (names) keep their init, but where their module starts them changing nothing."""
        for prefix, m in self.named_modules():
            if prefix and hasattr(m, 'start_fresh'):
                m.start_fresh({n[len(prefix) + 1:] for n in names if n.startswith(prefix + '.')})

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def plan_lines(self, device=None, dtype=None, B=None, T=None):
        """The layer plan, a line a layer (train.py prints it at start-up); with `device`, the route each layer's
        attention takes there in training in `dtype` at batch B and T tokens (routes), then a line on each route
        taken (attention.ROUTES) and on each layer the bias-table memory budget moves off sdpa_bias."""
        lines = [spec.describe(self.pe.at(spec.index).name) for spec in self.plan]
        if device is None:
            return lines
        why = {}
        routes = self.routes(device, dtype=dtype, B=B, T=T, why=why)
        names = dict.fromkeys(r.split(':')[0] for layer in routes for r in layer.split('+'))
        return [f"{line}; attention {r}" for line, r in zip(lines, routes)] + \
            [f"route {n}: {attention.ROUTES[n].what}" for n in names] + [f"layer {i}: {w}" for i, w in why.items()]

    def routes(self, device, grad=True, dtype=None, B=None, T=None, why=None):
        """The route each layer's attention takes on `device` without a KV cache, in training (grad=True) or in
        evaluation, computing in `dtype` (autocast's or the model's; None: float32's answer), at batch B and T
        tokens where given (sdpa_bias's memory budget reads them): attention.route's name, 'sdpa', 'flex', 'dense',
        'fla:<kernel>' or 'own' ('+' joins several where a layer's attention takes more than one). A layer that runs
        its fla kernel says so from its plan; the others are asked of a copy of this model on the CPU (its plan and
        backends, a 64-token vocabulary, weights and dropout from a forked RNG) whose forward of 8 tokens notes
        under attention.RouteProbe where each call of attend would go; a layer with no call computes its attention
        itself ('own'). `why`, a dict, gets each layer the budget moved off sdpa_bias, with the reason."""
        dev = torch.device(device).type
        fla = [block.attn.fla_route(dev) for block in self.transformer.h]
        if all(fla):
            return fla
        with torch.random.fork_rng(devices=[]):  # the copy's weights and its dropout draw from a forked RNG
            copy = GPT(replace(self.config, vocab_size=64, vocab_multiple=1,
                               attn_backend='auto' if self.config.attn_backend == 'fla' else self.config.attn_backend))
            for mine, theirs in zip(copy.transformer.h, self.transformer.h):
                mine.attn.backend = theirs.attn.backend
            copy.train(grad)
            with attention.RouteProbe(dev, grad, dtype, B, T) as probe, torch.set_grad_enabled(grad):
                copy(torch.zeros(1, 8, dtype=torch.long))
        if why is not None:
            why.update(probe.why)
        return [f or '+'.join(probe.seen.get(i, ['own'])) for i, f in enumerate(fla)]

    @contextmanager
    def attention_backend(self, backend):
        """Every attention layer on `backend` ('flex' | 'dense') inside the block, as before after it (tools/bench.py
        and tools/gpu_check.py run one model on both paths)."""
        saved = [(blk.attn, blk.attn.backend) for blk in self.transformer.h]
        for m, _ in saved:
            m.backend = backend
        try:
            yield
        finally:
            for m, b in saved:
                m.backend = b

    def get_num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, targets=None, cache=None, reduction='mean', pos=None, n_pos=None, last=None):
        """idx [B, T]. Positions are 0..T-1, or continue after the cached tokens with
        `cache` (from new_cache()), or are given: pos [T] sorted (e.g. randomized
        positions), n_pos a Python-int bound on them (else found with a host sync).
        No cap at block_size: evaluating past L is the point.
        last: only the last `last` positions get logits (and targets [B, last] are theirs).
        reduction='none' -> (None, per-token losses [B, T]), computed in chunks of positions
        so that no [tokens x vocab] logit tensor exists at once (evaluation)."""
        B, T = idx.size()
        start = cache.next_position if cache is not None else 0
        if pos is None:
            q_pos, n_pos = torch.arange(start, start + T, device=idx.device), start + T
        else:
            if cache is not None and cache.recent is not None:
                raise ValueError("a StreamingLLM (sink tokens + recent) KV cache assigns positions by place in the "
                                 "cache; do not pass pos with it")
            q_pos, n_pos = pos, n_pos or int(pos.max()) + 1
        if cache is not None:
            k_pos, n_pos = cache.add_positions(q_pos, n_pos)
        else:
            k_pos = q_pos
        self.pe.check_positions(n_pos)  # a Python int: a finite table refuses before any work
        x = self.pe.embed(self.transformer.wte(idx), q_pos)
        x = self.transformer.drop(x)
        ctxs = {}  # one Context per scheme instance and key count, shared by the layers that have both
        stream = None  # the positional stream a scheme carries beside the residual one, block to block (TAPE's)
        for i, block in enumerate(self.transformer.h):
            layer_cache = cache.layers[i] if cache is not None else None
            n_keys = T + (layer_cache.n if layer_cache is not None else 0)  # a windowed cache keeps fewer
            scheme = self.pe.at(i)
            key = (self.pe.slot[i], n_keys)
            if key not in ctxs:
                ctxs[key] = scheme.context(q_pos, k_pos if n_keys == k_pos.numel() else k_pos[-n_keys:], n_pos)
                ctxs[key].consecutive = pos is None and cache is None  # q_pos = k_pos = 0..T-1
            ctx = ctxs[key] if stream is None else replace(ctxs[key], stream=stream)
            x, stream = block(x, scheme, ctx, layer_cache)
        if cache is not None:
            cache.advance(T)
        x = self.transformer.ln_f(x if last is None else x[:, -last:])
        if reduction == 'none' and targets is not None:
            return None, self.token_losses(x, targets)
        logits = F.linear(x, self.lm_head.weight, self.vocab_mask)  # vocab_mask: -inf on padding ids, or None
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1),
                               ignore_index=-1, reduction=reduction)
        return logits, loss

    def token_losses(self, x, targets, chunk_bytes=64 * 2**20):
        """Cross-entropy of every position of x [B, T, C] against targets [B, T] -> [B, T],
        the logits made and dropped a chunk of positions at a time (BPE: 50k floats each)."""
        B, T, C = x.shape
        x, targets = x.reshape(B * T, C), targets.reshape(B * T)
        n = max(1, chunk_bytes // (4 * self.lm_head.weight.size(0)))
        out = [F.cross_entropy(F.linear(x[s:s + n], self.lm_head.weight, self.vocab_mask).float(),
                               targets[s:s + n], ignore_index=-1, reduction='none') for s in range(0, B * T, n)]
        return torch.cat(out).view(B, T)

    def new_cache(self, recent=None, sink_tokens=4):
        """An empty KV cache for this model's layers (kvcache.KVCache); with `recent`, a StreamingLLM cache that keeps
        the first `sink_tokens` tokens and the last `recent`, so its memory stays bounded."""
        return kvcache.KVCache([block.attn.mask for block in self.transformer.h],
                               [self.pe.at(i) for i in range(self.config.n_layer)], sink_tokens, recent)

    @classmethod
    def from_pretrained(cls, name, **overrides):
        """Hugging Face GPT-2 weights (as nanoGPT loads them): name = 'gpt2', 'gpt2-medium',
        'gpt2-large', 'gpt2-xl' (downloaded by transformers) or a folder written by
        save_pretrained. -> a 'learned' model with GPT-2's biases, tanh GELU and 50257 tokens;
        overrides: other GPTConfig fields (dropout, attn_backend)."""
        try:
            from transformers import GPT2LMHeadModel  # here: transformers is optional, needed only for this
        except ImportError:
            raise ImportError(f"init_from={name!r} loads Hugging Face weights and needs transformers: "
                              f"pip install transformers") from None
        try:
            hf = GPT2LMHeadModel.from_pretrained(name)
        except OSError as e:  # no network and not cached, or a folder without a model
            raise ValueError(f"cannot load GPT-2 weights {name!r} ({str(e).splitlines()[0][:200]}); without a "
                             f"network, save them elsewhere with save_pretrained and pass that folder") from None
        c = hf.config
        # block_size (the training length L) may be shorter than GPT-2's table, which keeps all its rows
        args = dict(block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head,
                    n_embd=c.n_embd, bias=True, gelu='tanh', pos_encoding='learned')
        args.update(overrides, pos_options={'max_len': c.n_positions})
        if args['block_size'] > c.n_positions:
            raise ValueError(f"block_size={args['block_size']} is longer than GPT-2's {c.n_positions} positions")
        model = cls(GPTConfig(**args))
        sd, ours = hf.state_dict(), model.state_dict()
        conv1d = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')
        for k, v in sd.items():
            if k.endswith(('.attn.bias', '.attn.masked_bias')):  # causal-mask buffers of older transformers
                continue
            mine = 'pe.wpe.weight' if k == 'transformer.wpe.weight' else k
            v = v.t() if k.endswith(conv1d) else v  # HF's Conv1D stores [in, out]; nn.Linear [out, in]
            assert ours[mine].shape == v.shape, (k, v.shape, ours[mine].shape)
            with torch.no_grad():
                ours[mine].copy_(v)
        return model

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]      # matmuls and embedding tables
        no_decay = [p for p in params if p.dim() < 2]    # biases, norms, per-head scalars
        groups = [{'params': decay, 'weight_decay': weight_decay},
                  {'params': no_decay, 'weight_decay': 0.0}]
        fused = 'fused' in inspect.signature(torch.optim.AdamW).parameters and device_type in ('cuda', 'cpu')
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=fused or None)

    def estimate_mfu(self, fwdbwd_per_iter, dt, peak_flops):
        """Model FLOPs utilisation of fwdbwd_per_iter sequences of block_size tokens in dt seconds (runtime.mfu)."""
        return runtime.mfu(self, self.config.block_size, fwdbwd_per_iter, dt, peak_flops)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True, recent=None, sink_tokens=4):
        """Sample max_new_tokens after idx [B, T]. With a KV cache, each new token
        costs one position. A scheme with a finite position table (learned) falls
        back to its last max_len tokens, recomputed each step.
        recent: StreamingLLM attention sinks (new_cache(recent, sink_tokens)): every token
        attends to the first `sink_tokens` tokens, the `recent` before it and itself, at
        positions 0..n-1 in the cache; the prompt goes in one forward up to
        sink_tokens + recent + 1 tokens, then one token at a time, so every token sees
        exactly that. Bounded memory for any max_new_tokens."""
        max_len = self.pe.max_len
        if recent is not None and not use_cache:
            raise ValueError("attention sinks (window=...) are a KV cache policy; use_cache must be True")
        cache = self.new_cache(recent, sink_tokens) if use_cache else None
        for _ in range(max_new_tokens):
            fits = self.pe.addresses(idx.size(1))
            if cache is not None and recent is not None:
                while cache.length < idx.size(1):
                    n = sink_tokens + recent + 1 if cache.length == 0 else 1
                    logits, _ = self(idx[:, cache.length:cache.length + n], cache=cache)
            elif cache is not None and fits:
                inp = idx if cache.length == 0 else idx[:, cache.length:]
                logits, _ = self(inp, cache=cache)
            else:  # no cache, or a finite position table: recompute over its last max_len tokens
                cache = None
                ctx = idx if max_len is None else idx[:, -max_len:]
                logits, _ = self(ctx)
            logits = logits[:, -1, :] / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                logits[logits < v[:, [-1]]] = -float('inf')
            idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
