"""The compiled cases a JAX module gets by default. The contract every adapter meets (two ranks
average under dp and fsdp, a window waits for JAX's asynchronous dispatch, an own model trains on
two nodes) is tests/test_conformance.py's.

JAX runs under its own interpreter (``scripts/setup-jax``, or ``DLPERF_TEST_JAX_PYTHON``): every
JAX line here runs in a subprocess under it, and the tests skip without it."""

from __future__ import annotations

import pytest
from snippets import run_snippet


def test_a_jax_module_gets_its_compiled_cases_by_default(pytester: pytest.Pytester,
                                                         jax_python: str) -> None:
    """CPU's default compiler axis is eager, which JAX has not: a module whose FRAMEWORK is
    "jax" gets its compiled cases instead of cases that would all skip; another framework's
    module keeps eager, and --dlperf-compilers, when given, rules every module: a JAX eager
    case then skips, saying why, before anything is launched."""
    body = ("\ndef test_x(cluster, compiler, throughput_meter):\n"
            "    throughput_meter.measure(FRAMEWORK, 'gpt')\n")
    pytester.makepyfile(test_j='FRAMEWORK = "jax"\n' + body, test_t='FRAMEWORK = "torch"\n' + body,
                        test_none='FRAMEWORK = None\n' + body)
    default = pytester.runpytest("--co", "-q", "-p", "no:cacheprovider")
    default.stdout.fnmatch_lines_random(["test_j.py::test_x[[]1n1d-compiled[]]",
                                         "test_t.py::test_x[[]1n1d-eager[]]",
                                         "test_none.py::test_x[[]1n1d-eager[]]"])
    default.stdout.no_fnmatch_line("test_j.py::test_x[[]1n1d-eager[]]")
    given = pytester.runpytest("-p", "no:cacheprovider", "--dlperf-compilers", "eager", "-rs",
                               "--dlperf-python", f"jax={jax_python}", "test_j.py", "-k", "1n1d")
    given.assert_outcomes(skipped=1)
    given.stdout.fnmatch_lines(["SKIPPED [[]1[]] *jax has no eager mode to measure: JAX trains "
                                "under jax.jit*--dlperf-compilers compiled*"])


# Tensor parallelism in the JAX adapter (frameworks/jax/tp.py): that two tp ranks train what one
# process trains is the port contract's (tests/ports.py's row, run by tests/test_ports_ranks.py).
def test_fsdp_with_tp_is_refused_saying_what_runs(jax_python: str) -> None:
    out = run_snippet(jax_python, """
import json
from pytest_dlperf.core.strategies import why_not
from pytest_dlperf.frameworks import load
load("jax")  # registers its strategies
print(json.dumps([why_not("jax", kinds, "cpu", True)
                  for kinds in (("tp",), ("dp", "tp"), ("fsdp", "tp"), ("pp",))]))
""")
    assert isinstance(out, list)
    tp, dp_tp, fsdp_tp, pp = out
    assert tp is None and dp_tp is None
    assert "tp with dp, not with fsdp" in fsdp_tp
    assert "pp is not ported" in pp
