"""What a run shows people: the results file (``results``), the tables rendered from it
(``tables``) and the history's static page (``page``, from the history's series: ``series``;
each case's phases run by run: ``phaseplot``), which ``python -m pytest_dlperf html`` builds
(``__main__``: the old ``python -m pytest_dlperf.report``, deprecated). Reads the case record
and the stores; judges nothing."""
