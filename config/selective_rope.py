# Scheme: selective_rope. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'selective_rope'
out_dir = 'out-selective_rope'
