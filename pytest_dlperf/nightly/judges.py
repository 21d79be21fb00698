"""The night's judges as pure functions of the sessions' results files, and the night's outcome.

- **A/B** (against the last good night, and against the anchor): a case is passed where its
  paired verdict is a pass or an improvement, slow where it is a regression.
- **The baselines**: a case is passed where its verdict against the runner's baseline is a pass
  or an improvement, failed on a regression (throughput, scaling efficiency, memory); a case
  recorded tonight starts its record (night 1, a new case, the night after an accept).
- **The history**: fails a night that sits after an unaccepted step down. A step needs two
  nights after it (``changepoints.MIN_SIZE``), so the history never speaks for tonight alone:
  it can fail a night, not pass one.

A night **passes only on a judgement** (``verdict_of``): every case passed by a judge (or
recorded tonight), none failed. A night where a case was judged by no one (A/B skipped because
nothing changed, or inconclusive, or beside a busy machine; the baselines inconclusive or not
recorded), or whose run failed or recorded nothing, is **not judged** and moves nothing.
"""

from __future__ import annotations

from typing import Any

PASSED, FAILED, NOT_JUDGED, ERROR = "passed", "failed", "not judged", "error"
# A/B's own words (``bisect``'s for a probe): "slow" fails the night, "not slow" passes it.
SLOW, NOT_SLOW, SKIPPED = "slow", "not slow", "skipped"
FAILED_TO_RUN = "failed to run"
RECORDED = ("recorded", "updated", "replaced-unreadable", "added")


def _ran(data: dict[str, Any] | None, code: int) -> str | None:
    """Why a session's run gives no judgement at all (None: it ran)."""
    if data is None:
        return f"pytest exited {code} and wrote no results"
    if code not in (0, 1):
        return f"pytest exited {code} (interrupted, or a usage or internal error)"
    return None


def judge_ab(data: dict[str, Any] | None, code: int, against: str) -> dict[str, Any]:
    """An A/B session's judge: each case's ratio and interval; slow where a case regressed."""
    problem = _ran(data, code)
    if problem or data is None:
        return {"outcome": ERROR, "lines": [problem], "cases": [], "passed": [],
                "against": against}
    lines, cases, passed, outcomes = [], [], [], []
    for bench in data.get("benchmarks", []):
        info = bench["extra_info"]
        ab, case = info.get("ab") or {}, info["case"]
        outcome = ab.get("outcome", "missing")
        cases.append(case)
        outcomes.append(outcome)
        if outcome in ("pass", "improvement"):
            passed.append(case)
        ci = ab.get("ratio_ci")
        interval = f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""
        ratio = f"{ab['ratio']:.3f}" if ab.get("ratio") else "?"
        lines.append(f"{case}: head/base {ratio}{interval}, {len(ab.get('pairs', []))} pairs, "
                     f"{outcome}")
    for unjudged in data.get("dlperf_not_judged") or []:
        cases.append(unjudged.get("case", "?"))
        outcomes.append("machine busy")
        lines.append(f"{unjudged.get('case', '?')}: not judged, the machine was busy")
    if "regression" in outcomes:
        outcome = SLOW
    elif not outcomes or (code == 1 and "machine busy" not in outcomes):
        # a case failed otherwise (a side that did not run): no verdict explains it
        outcome = FAILED_TO_RUN
        lines.append("pytest failed a case without a regression (a side failed to run: see "
                     "the session's output)" if outcomes else "no case ran")
    elif all(o in ("pass", "improvement") for o in outcomes):
        outcome = NOT_SLOW
    elif "machine busy" in outcomes:
        outcome = "machine busy"
    else:
        outcome = "inconclusive"
    return {"outcome": outcome, "lines": lines, "cases": cases, "passed": passed,
            "against": against}


def judge_baselines(data: dict[str, Any] | None, code: int = 0
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The baseline and history judges from the baseline session."""
    problem = _ran(data, code)
    if problem or data is None:
        error = {"outcome": ERROR, "lines": [problem], "cases": [], "passed": [],
                 "recorded": [], "regressed": [], "busy": []}
        return error, {"outcome": ERROR, "lines": [], "cases": [], "passed": []}
    seen: dict[str, list[str]] = {"cases": [], "passed": [], "recorded": [], "regressed": [],
                                  "refused": [], "lines": [], "steps": [], "step_lines": []}
    for bench in data.get("benchmarks", []):
        _baseline_case(bench["extra_info"], seen)
    busy = [u.get("case", "?") for u in data.get("dlperf_not_judged") or []]
    seen["lines"] += [f"{case}: not judged, the machine was busy" for case in busy]
    cases = seen["cases"] + busy
    explained = seen["regressed"] or seen["refused"] or busy  # what fails a test, said
    if seen["regressed"]:
        outcome = FAILED
    elif code == 1 and not explained:
        outcome = FAILED_TO_RUN
        seen["lines"].append("pytest failed a case without a regression (see the session's "
                             "output)")
    elif cases and set(cases) <= set(seen["passed"]) | set(seen["recorded"]):
        outcome = PASSED if seen["passed"] else "recorded"
    else:
        outcome = NOT_JUDGED
    baselines = {"outcome": outcome, "lines": seen["lines"], "cases": cases,
                 "passed": seen["passed"], "recorded": seen["recorded"],
                 "regressed": seen["regressed"], "busy": busy}
    history = {"outcome": FAILED if seen["steps"] else "no step", "lines": seen["step_lines"],
               "cases": seen["cases"], "passed": []}
    return baselines, history


def _baseline_case(info: dict[str, Any], seen: dict[str, list[str]]) -> None:
    verdict, case = info["verdict"], info["case"]
    seen["cases"].append(case)
    outcomes = {verdict.get("outcome"), (info.get("efficiency_verdict") or {}).get("outcome"),
                (info.get("memory_verdict") or {}).get("outcome")}
    written = (info.get("baseline_update") or {}).get("action")
    text = str(verdict.get("text", verdict.get("outcome")))
    if written in RECORDED:
        seen["recorded"].append(case)  # what later nights are judged against
    elif "regression" in outcomes:
        seen["regressed"].append(case)
    elif text.startswith("not recorded"):
        seen["refused"].append(case)
    elif verdict.get("outcome") in ("pass", "improvement") and "inconclusive" not in outcomes:
        seen["passed"].append(case)
    delta = verdict.get("delta")
    seen["lines"].append(f"{case}: {info['samples_per_s']:,.2f} {info.get('unit', 'samples')}/s"
                         + (f", baseline {verdict['baseline']:,.2f}, delta {delta:+.1%}"
                            if delta is not None else "") + f", {text}")
    history = info.get("history") or {}
    if history.get("blocking") is not None:
        seen["steps"].append(case)
        seen["step_lines"].append(f"{case}: {history['steps'][history['blocking']]['text']} "
                                  f"({history['runs']} nights)")


def verdict_of(judges: dict[str, dict[str, Any]], known: set[str] | None = None
               ) -> tuple[str, list[str]]:
    """The night, and the cases no judge could judge: failed where a judge proved a slowdown;
    an error where a session did not run; passed only where every case was passed by a judge
    or recorded tonight as a new case (``known``: the last good night's cases, whose baseline
    recorded anew means its fingerprint changed; None: every recorded case is new); else not
    judged."""
    if any(j.get("outcome") in (SLOW, FAILED) for j in judges.values()):
        return FAILED, []
    if any(j.get("outcome") == ERROR for j in judges.values()):
        return ERROR, []
    if any(j.get("outcome") == FAILED_TO_RUN for j in judges.values()):
        return NOT_JUDGED, []
    cases = {c for j in judges.values() for c in j.get("cases", [])}
    covered = {c for j in judges.values() for c in j.get("passed", [])}
    covered |= {c for j in judges.values() for c in j.get("recorded", [])
                if known is None or c not in known}
    unjudged = sorted(cases - covered)
    if not cases or unjudged:
        return NOT_JUDGED, unjudged
    return PASSED, []
