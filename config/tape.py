# Scheme: tape. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'tape'
out_dir = 'out-tape'
