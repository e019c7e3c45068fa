# Llama 4's iRoPE (HF Llama4TextConfig; Meta's Llama 4 release): RoPE layers attend within chunks of 8192
# tokens (attention_chunk_size, counted by token index) with weightless QK-norm; every 4th layer has no
# RoPE, full attention and attention temperature tuning (log(floor((pos + 1) / 8192) + 1) * 0.1 + 1).
# Scaled down: the chunk and the temperature's floor_scale keep their fraction of Llama 4's 256K training
# context (1/32): 4 tokens at L = 128. Width, depth and data are train.py's small CPU defaults.
pos_encoding = 'rope'
layer_types = 'CCCF'          # C: chunked attention; F: full attention (tiled over the layers)
attention_chunk_size = 4      # on the C layers
nope_layers = 'F'
qk_norm = {'C': 'weightless'}  # Llama 4 normalises q and k on its RoPE layers only
attn_scaling = {'type': 'llama4', 'floor_scale': 4, 'attn_scale': 0.1}  # on the NoPE layers (its default)
out_dir = 'out-irope'
