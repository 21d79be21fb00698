"""Pure decisions: the statistics (``stats``), change points in a history (``changepoints``),
MFU (``mfu``), the case record (``record``) and what a case's figures mean (``decide``). Takes
figures, returns decisions: no launching, no pytest, no files; imports ``core`` and ``store``.
"""
