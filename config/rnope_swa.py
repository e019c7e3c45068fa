# RNoPE-SWA (Cohere, Yang et al., arXiv 2501.18795; Command R7B / Command A): three RoPE layers with a
# sliding window, then one layer with full attention and no positions. HF's Cohere2Config: window 4096
# of a 8192-token training length, a window of half the length; here 64 of L = 128. Scaled down: the
# width, depth and data are train.py's small CPU defaults (4 layers x 128, characters); Cohere's models
# also use GQA and a logit scale, left out.
pos_encoding = 'rope'
layer_types = 'SSSF'          # S: sliding window; F: full attention (tiled over the layers)
sliding_window = 64           # keys a query sees on the S layers, its own included
nope_layers = 'F'             # the full-attention layers run without RoPE
out_dir = 'out-rnope_swa'
