# Scheme: kerple_power. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'kerple_power'
out_dir = 'out-kerple_power'
