# Scheme: stick_breaking. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'stick_breaking'
out_dir = 'out-stick_breaking'
