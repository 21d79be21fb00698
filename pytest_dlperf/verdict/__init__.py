"""Pure decisions: takes figures, returns decisions; no launching, no pytest, no files; imports
``core`` and ``store``.

- A case's verdict against its baseline (``decide``), from the statistics (``stats``) on evidence
  at three levels, windows within launches within runs (``levels``), with the machine's drift
  between runs pooled over its baselines (``drift``); the A/B verdict from paired launches
  (``paired``); a bisect probe against both ends of its range (``ends``).
- What makes figures untrustworthy: windows of one launch far apart (``unstable``), a busy
  machine (``busy``), a first launch that reads apart run after run (``position``), an
  efficiency above 100% (``superlinear``).
- What a result means beyond its throughput: which phases moved (``phases``), the scaling
  model held against the measured efficiency (``scaling``), MFU (``mfu``), change points in a
  history (``changepoints``), and the case record itself (``record``).
"""
