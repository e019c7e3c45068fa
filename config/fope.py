# Scheme: fope. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'fope'
out_dir = 'out-fope'
