"""Where figures are kept: the baseline files (``baselines``; one file's schema, records and
migrations: ``baseline_file``) and the history of every run (``history``, SQLite or PostgreSQL;
the rows a session adds: ``history_rows``). Imports ``core`` only: a store keeps figures, it does not
judge them.
"""
