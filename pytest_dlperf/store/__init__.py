"""Where figures are kept: the baseline files (``baselines``; one file's schema, records and
migrations: ``baseline_file``; a night's run added to them, the newest nights kept: ``nights``)
and the history of every run (``history``, SQLite or PostgreSQL; the rows a session adds:
``history_rows``; one machine's nights, of which its drift between runs is pooled:
``history_nights``). Imports ``core`` only: a store keeps figures, it does not judge them.
"""
