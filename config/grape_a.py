# Scheme: grape_a. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'grape_a'
out_dir = 'out-grape_a'
