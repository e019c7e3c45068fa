# Scheme: ropepp. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'ropepp'
out_dir = 'out-ropepp'
