# tools/bench.py's GPT-2 124M (--preset=gpt2, and tools/gpu_check.py's default on CUDA): 12 layers x 768,
# 12 heads, L = 1024, GPT-2's 50257-token vocabulary padded to 50304 rows, 8 sequences a step.
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
vocab_size = 50304
batch_size = 8
