# tools/bench.py's default model (--preset=default): train.py's defaults, the shakespeare_char
# vocabulary (84) and train.py's batch of 32 sequences at L = 128.
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
vocab_size = 84
batch_size = 32
