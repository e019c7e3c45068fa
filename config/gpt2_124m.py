# GPT-2 124M (12 layers, 12 heads, 768 wide) at block_size 1024 on FineWeb-Edu
# sample-10BT in GPT-2 tokens. One file for every scheme, so runs compare fairly:
# pick the scheme (and a folder) on the command line. Prepare the data first (needs a network):
#   pip install datasets && python data/fineweb_edu/prepare.py
# 1 GPU:  torchrun --standalone --nproc_per_node=1 train.py config/gpt2_124m.py \
#           --pos_encoding=alibi --out_dir=out-gpt2-alibi
# 8 GPUs: torchrun --standalone --nproc_per_node=8 train.py config/gpt2_124m.py \
#           --pos_encoding=alibi --out_dir=out-gpt2-alibi
pos_encoding = 'rope'
out_dir = 'out-gpt2-124m-rope'
dataset = 'fineweb_edu'
n_layer = 12
n_head = 12
n_embd = 768
block_size = 1024
dropout = 0.0
# 16 sequences x 1024 tokens per micro-step per GPU; 32 micro-steps in total over all
# GPUs (8 GPUs: 4 each) -> 524,288 tokens per iteration, GPT-3 small's batch
batch_size = 16
gradient_accumulation_steps = 32
# 19,073 iterations x 524,288 tokens = one pass over the 10B tokens
max_iters = 19073
lr_decay_iters = 19073
warmup_iters = 715
learning_rate = 6e-4
min_lr = 6e-5
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
# val loss at 1L..8L (1024..8192 tokens), 2^20 tokens scored per length
eval_interval = 1000
eval_tokens = 1048576
eval_mults = [1, 2, 4, 8]
log_interval = 10
