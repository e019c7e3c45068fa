# Scheme: dape. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'dape'
out_dir = 'out-dape'
