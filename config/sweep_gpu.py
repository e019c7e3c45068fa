# The GPU-sized LM sweep (python sweep.py --gpu): nanoGPT's shakespeare_char GPU model
# (6 layers x 384, 6 heads) at L = 256, so that eval.py's 16L is 4096 tokens. A train.py
# config too: python train.py config/sweep_gpu.py --pos_encoding=alibi --out_dir=out-gpu-alibi
n_layer = 6
n_head = 6
n_embd = 384
block_size = 256
batch_size = 64
max_iters = 5000
eval_interval = 500
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 100
dropout = 0.1
