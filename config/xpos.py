# Scheme: xpos. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'xpos'
out_dir = 'out-xpos'
