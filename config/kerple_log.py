# Scheme: kerple_log. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'kerple_log'
out_dir = 'out-kerple_log'
