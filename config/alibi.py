# Scheme: alibi. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'alibi'
out_dir = 'out-alibi'
