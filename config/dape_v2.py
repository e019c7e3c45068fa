# Scheme: dape_v2. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'dape_v2'
out_dir = 'out-dape_v2'
