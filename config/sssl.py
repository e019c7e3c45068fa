# nanochat's window pattern 'SSSL' (Karpathy, github.com/karpathy/nanochat): tiled over the layers, the
# last one always L; S attends to a short window of a quarter of the context rounded up to 128 tokens
# (512 at 2048), L to the context length; weightless QK-norm on every layer. nanochat passes these to
# FlashAttention as window_size=(w, 0), which means w + 1 keys; here sliding_window counts the keys, the
# query's own included, so nanochat's (32, 0) at L = 128 is 33 and its L layers are 129 (a window too,
# past the training length). nanochat's other changes (relu^2, value embeddings, Muon) are left out.
pos_encoding = 'rope'
layer_types = 'SSSL'
sliding_window = {'S': 33, 'L': 129}
qk_norm = 'weightless'
out_dir = 'out-sssl'
