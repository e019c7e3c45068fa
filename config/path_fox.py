# Scheme: path_fox. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'path_fox'
out_dir = 'out-path_fox'
