"""Where figures are kept: the baseline files (``baselines``) and the history of every run
(``history``, SQLite or PostgreSQL). Imports ``core`` only: a store keeps figures, it does not
judge them.
"""
