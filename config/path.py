# Scheme: path. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'path'
out_dir = 'out-path'
