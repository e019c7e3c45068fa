# The task suite's model and schedule (python sweep.py --tasks=default): every task x scheme
# run trains this from scratch, single-threaded; each task's sizes and lengths come from
# tasks.DEFAULT_N, and sweep.TASK_ITERS gives the tasks that need more steps their own max_iters.
n_layer = 3
n_head = 4
n_embd = 64
batch_size = 64
max_iters = 1500
eval_interval = 500
log_interval = 100
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 100
compile = False
