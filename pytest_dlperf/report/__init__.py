"""What a run shows people: the results file (``results``), the tables rendered from it
(``tables``) and the history's static page (``page``, from the history's series: ``series``). Reads the case record and the stores;
judges nothing."""
