# Scheme: rope2d. Every other setting is train.py's shared small CPU default,
# so config/*.py runs differ only in the positional encoding.
pos_encoding = 'rope2d'
out_dir = 'out-rope2d'
