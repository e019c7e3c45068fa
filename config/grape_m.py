# Scheme: grape_m. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'grape_m'
out_dir = 'out-grape_m'
