# Canon layers (Allen-Zhu, "Physics of Language Models: Part 4.1", arXiv 2512.17351; code facebookresearch/PhysicsLM4)
# on NoPE: a residual causal depthwise convolution of width 4 at the four places of every layer (A: the attention's
# input, B: q, k and v, C: the MLP's input, D: the MLP's hidden layer), the authors' released setting (canon_set
# "ABCD"). Position reaches the model only through the causal mask and the convolutions: the control a claim about
# NoPE or another scheme needs. Every other setting is train.py's shared small CPU default.
# On another scheme: python train.py config/canon.py --pos_encoding=rope --out_dir=out-canon-rope
# (any scheme and any plan key compose with it: canon_set={'F': 'AC'} with layer_types='SF', canon_kernel=3, ...).
pos_encoding = 'none'
canon_set = 'ABCD'
out_dir = 'out-canon'
