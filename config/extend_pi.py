# Fine-tune the RoPE model of config/rope.py (L = 128) to s*L = 512 with Position
# Interpolation (arXiv 2306.15595): positions divided by s = 4. Train it first:
#   python train.py config/rope.py && python train.py config/extend_pi.py
# Evaluates at 128, 256, 512, 1024 (= L, 2L, sL, 2sL) at iter 0 (before) and at the end.
init_from = 'out-rope/ckpt.pt'   # weights and architecture; block_size and rope_scaling from here
out_dir = 'out-extend-pi'
block_size = 512
rope_scaling = {'type': 'linear', 'factor': 4}
eval_mults = [0.25, 0.5, 1, 2]   # in units of the new block_size
# a short, gentle fine-tune: 200 steps of 4 x 512 tokens (half the tokens per step of
# the base run, 10% of its tokens in all), small LR: a few minutes on 2 CPU cores
batch_size = 4
max_iters = 200
eval_interval = 200
learning_rate = 5e-4
min_lr = 5e-5
warmup_iters = 20
