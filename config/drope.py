# DroPE (Gelberg et al., arXiv 2512.12167), step 2 of 3: drop every positional encoding of the RoPE model of
# config/rope.py and recalibrate briefly at the training length L = 128. The weights the two models share all
# load (rope has no weights of its own); the run prints what it kept. Then fit the logit scaling and evaluate:
#   python train.py config/rope.py && python train.py config/drope.py && python drope.py --out_dir=out-drope
# The recalibration is 200 steps of the base run's batch (20% of its tokens; the paper recalibrates its LMs
# on 0.5-5% of their pretraining tokens, which at this size leaves the NoPE model far from converged), with a
# short warmup and a tenth of the base run's peak learning rate, as a fine-tune.
init_from = 'out-rope/ckpt.pt'
pos_encoding = 'none'
out_dir = 'out-drope'
max_iters = 200
eval_interval = 200
learning_rate = 2e-4
min_lr = 2e-5
warmup_iters = 20
wandb_run_name = 'drope-c0'   # the recalibrated model before DroPE's logit scaling (c = 0); drope.py adds it
