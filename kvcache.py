"""
The KV cache of a generation: per layer the keys and values so far (LayerKV, in buffers that grow by doubling), their
positions, and what each layer keeps: every key, the keys a window or chunk still lets a later query see, or
StreamingLLM's sink tokens and recent window. model.GPT.new_cache builds one from the layer plan and the schemes.
"""
import torch


class KVCache:
    """Per-layer keys and values, their positions and the length so far (tokens seen).
    Each layer's cache has a mode (LayerKV.mode), from what its scheme asks (keys=, the schemes'
    cache_keys) and what this cache can do: 'transformed' (keys kept as transform_qk made them),
    'raw' (kept raw, and all of them transformed every forward: xPos, ExtendedRoPE, and any
    scheme in a rolling cache) or 'scheme' (the scheme appends and rewrites them itself: PaTH).

    A layer with a sliding window or a chunk (its attention.Mask) keeps only the keys a later
    query can still see: after every forward it drops the keys before the next token's window
    or chunk, so its memory is bounded; the positions kept are those of the longest layer.

    With `recent` (StreamingLLM attention sinks, arXiv 2309.17453): after every forward
    each layer keeps only the first `sink_tokens` tokens and the last `recent` (as the
    authors' StartRecentKVCache, called after each step), so a forward sees at most
    sink_tokens + recent cached keys plus its own. Positions are places in the cache: the
    keys are 0..n-1 and the new tokens follow, re-indexed every forward, so the cache
    holds raw keys (mode 'raw') and the scheme transforms all of them each forward."""

    def __init__(self, masks, schemes, sink_tokens=4, recent=None):
        """masks: each layer's attention.Mask; schemes: each layer's positional scheme (its cache_keys)."""
        if recent is not None:
            for what, v, lo in (('window', recent, 1), ('sink', sink_tokens, 0)):
                if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                    raise ValueError(f"attention-sink cache: {what} must be an integer >= {lo}, got {v!r}")
            own = [s.name for s in schemes if s.cache_keys == 'scheme']
            if own:
                raise ValueError(f"{own[0]} keeps its own cache of keys (rewritten as tokens arrive), which a "
                                 f"StreamingLLM (sink tokens + recent) cache cannot re-index: sample without window=")
            embeds = [s.name for s in schemes if s.embeds_positions]
            if embeds:
                name = embeds[0]
                raise ValueError(f"{name} adds positions to the token embeddings, so every cached key carries its "
                                 f"position in the text, which a StreamingLLM cache (sink tokens + recent) cannot "
                                 f"re-index. Attention sinks need a relative scheme; sample {name} over its last "
                                 f"max_len tokens (use_cache=False)")
            bounded = [i for i, m in enumerate(masks) if m.bounded]
            if bounded:
                raise ValueError(f"a StreamingLLM (sink tokens + recent) KV cache numbers its keys by place, but "
                                 f"layers {bounded} see a sliding window or chunk of the text's tokens "
                                 f"(sliding_window, attention_chunk_size), which it cannot tell apart; those layers' "
                                 f"caches are bounded already: sample without window=")
        self.sink_tokens, self.recent, self.masks = sink_tokens, recent, masks
        self.layers = [LayerKV('raw' if recent is not None and s.cache_keys == 'transformed' else s.cache_keys)
                       for s in schemes]
        self.length = 0
        self.k_pos, self.n_pos = None, 0

    @property
    def next_position(self):
        """Position of the next token: its index in the text, or its place in a rolling cache."""
        return self.length if self.recent is None else self.layers[0].n

    def add_positions(self, q_pos, n_pos):
        """Positions of all keys once q_pos's tokens are added, and the bound on them."""
        if self.recent is not None:  # places in the cache, every forward
            n = self.layers[0].n + q_pos.numel()
            self.k_pos, self.n_pos = torch.arange(n, device=q_pos.device), n
            return self.k_pos, n
        self.k_pos = q_pos if self.k_pos is None else torch.cat((self.k_pos, q_pos))
        self.n_pos = max(self.n_pos, n_pos)
        return self.k_pos, self.n_pos

    def advance(self, T):
        """After a forward of T tokens: count them, and evict what no later query sees."""
        self.length += T
        if self.recent is not None:
            for layer in self.layers:
                layer.keep(self.sink_tokens, self.recent)
        elif any(m.bounded for m in self.masks):
            for layer, mask in zip(self.layers, self.masks):
                if mask.bounded:
                    layer.evict(mask.lowest(self.length))  # the first key the next token sees
            n = max(layer.n for layer in self.layers)
            self.k_pos = self.k_pos[self.k_pos.numel() - n:]


class LayerKV:
    """One layer's cache. layer[0], layer[1] are the keys and values so far, [B, H, n, hd],
    key 0 being token `start` of the text (a windowed or chunked layer drops older ones).
    They live in buffers that grow by doubling, so appending a token copies that token
    only; torch.cat would copy the whole cache every token (O(n^2) over a generation).
    Under autograd every append gets a fresh buffer instead, since writing into one that
    an earlier step saved for backward would break that backward.
    `state` belongs to the positional scheme: per-key tensors it keeps next to the keys
    (e.g. FoX's log forget gates), one entry per key along dim 2, appended by the scheme;
    keep() and evict() drop them with their keys. `carry` holds per-layer tensors that are not per
    key, the scheme's (a running sum of angles, a convolution's last inputs) and the Canon layers'
    (each one's last kernel - 1 inputs, under 'canonA' .. 'canonD': kernels.Canon), which keep()
    and evict() leave as they are.
    `mode` says who transforms the keys: 'transformed' (the model, before they are cached), 'raw' (the model,
    all of them every forward, after they are cached) or 'scheme' (the scheme, which appends them itself)."""

    def __init__(self, mode='transformed'):
        self.k = self.v = None
        self.n = 0
        self.start = 0
        self.mode = mode
        self.state = {}
        self.carry = {}

    def __getitem__(self, i):
        return None if self.k is None else (self.k, self.v)[i][:, :, :self.n]

    def append(self, k, v):
        n, T = self.n, k.size(2)
        if self.k is None or n + T > self.k.size(2) or torch.is_grad_enabled():
            cap = n + T if torch.is_grad_enabled() else max(2 * (n + T), 64)
            kb, vb = (t.new_empty(t.shape[:2] + (cap,) + t.shape[3:]) for t in (k, v))
            if n:
                kb[:, :, :n], vb[:, :, :n] = self[0], self[1]
            self.k, self.v = kb, vb
        self.k[:, :, n:n + T], self.v[:, :, n:n + T] = k, v
        self.n = n + T
        return self[0], self[1]

    def rewrite(self, fn):
        """Replace the cached keys by fn(keys) [B, H, n, hd]: a scheme that keeps its own cache
        (cache_keys='scheme') rewrites past keys as tokens arrive."""
        k = fn(self[0])
        if torch.is_grad_enabled():  # a fresh tensor: the old one may be saved for backward
            self.k = k
        else:
            self.k[:, :, :self.n] = k

    def keep(self, sink, recent):
        """Keep the first `sink` and the last `recent` entries (in place: the buffer does not grow)."""
        n = self.n
        if n <= sink + recent:
            return
        if torch.is_grad_enabled():  # never write into a tensor an earlier step saved for backward
            self.k, self.v = (torch.cat((t[:, :, :sink], t[:, :, n - recent:n]), 2) for t in (self.k, self.v))
        else:
            for t in (self.k, self.v):
                t[:, :, sink:sink + recent] = t[:, :, n - recent:n].clone()
        self.state = {name: torch.cat((t[:, :, :sink], t[:, :, n - recent:n]), 2) for name, t in self.state.items()}
        self.n = sink + recent

    def evict(self, first):
        """Drop the keys of the tokens before `first` (in place: the buffer does not grow)."""
        drop = min(self.n, first - self.start)
        if drop <= 0:
            return
        n, kept = self.n, self.n - drop
        if torch.is_grad_enabled():  # never write into a tensor an earlier step saved for backward
            self.k, self.v = (t[:, :, drop:n] for t in (self.k, self.v))
        else:
            for t in (self.k, self.v):
                t[:, :, :kept] = t[:, :, drop:n].clone()
        self.state = {name: t[:, :, drop:n] for name, t in self.state.items()}
        self.n, self.start = kept, self.start + drop
