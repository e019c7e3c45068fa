# Scheme: t5. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 't5'
out_dir = 'out-t5'
