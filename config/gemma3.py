# Gemma 3 (Gemma Team, arXiv 2503.19786; HF Gemma3TextConfig): five local layers with a sliding window
# of 1024 tokens and RoPE base 1e4 to one global layer with full attention and base 1e6; QK-norm on every
# layer. Scaled down: the window keeps its fraction of Gemma 3's 32K pretraining length (1/32): 4 tokens
# at L = 128; 6 layers so that the 5:1 pattern fits once; width and data are train.py's small CPU
# defaults. Gemma's QK-norm is RMSNorm times (1 + w), w from 0, the same function as a weight from 1
# (qk_norm=True here); its global layers' linear RoPE scaling (factor 8 on 4B-27B) is a context
# extension, left out.
pos_encoding = 'rope'
n_layer = 6
layer_types = 'SSSSSF'        # S: sliding window; F: full attention
sliding_window = 4
pos_options = {'base': 1e4}
layer_options = {'F': {'base': 1e6}}
qk_norm = True
out_dir = 'out-gemma3'
