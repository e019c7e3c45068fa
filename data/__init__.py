"""Dataset preparation for nanoPE: one folder per corpus, shared helpers in data/common.py.
(A regular package, so `from data.common import ...` cannot be shadowed by another `data`.)"""
