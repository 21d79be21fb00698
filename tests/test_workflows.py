"""Structural checks of the GitHub Actions workflows (CI, the nightly perf gate, the pull
requests' A/B and the release)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
CI_PATH = WORKFLOWS / "ci.yml"
NIGHTLY_PATH = WORKFLOWS / "nightly.yml"
PERF_PR_PATH = WORKFLOWS / "perf-pr.yml"
RELEASE_PATH = WORKFLOWS / "release.yml"
PUBLISH_ACTION = "pypa/gh-action-pypi-publish"
README_PATH = ROOT / "README.md"
TEST_COMMAND = "./scripts/test"
PINNED_USES = re.compile(r"^[\w.-]+/[\w./-]+@(v\d[\w.-]*|[0-9a-f]{40})$")

Workflow = dict[str, Any]
Step = dict[str, Any]


def load_workflow(path: Path) -> Workflow:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path.name} is not a YAML mapping"
    return data


def triggers(workflow: Workflow) -> dict[str, Any]:
    # PyYAML (YAML 1.1) parses the bare key `on` as boolean True.
    on = workflow.get("on", workflow.get(True))
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return {name: None for name in on}
    assert isinstance(on, dict), "workflow has no `on:` triggers"
    return on


def jobs(workflow: Workflow) -> dict[str, Any]:
    found = workflow.get("jobs")
    assert isinstance(found, dict) and found, "workflow has no jobs"
    return found


def all_steps(workflow: Workflow) -> list[Step]:
    return [step for job in jobs(workflow).values() for step in job.get("steps", [])]


def run_steps(workflow: Workflow) -> list[Step]:
    return [step for step in all_steps(workflow) if "run" in step]


def uses_steps(workflow: Workflow, action: str) -> list[Step]:
    return [s for s in all_steps(workflow) if str(s.get("uses", "")).split("@")[0] == action]


def runs_on_labels(job: dict[str, Any]) -> list[str]:
    labels = job.get("runs-on", [])
    return [labels] if isinstance(labels, str) else list(labels)


def perf_step(workflow: Workflow) -> Step:
    matches = [s for s in run_steps(workflow)
               if "pytest perf_tests" in s["run"] or "scripts/nightly" in s["run"]]
    assert len(matches) == 1, "expected exactly one step running the perf tests"
    return matches[0]


def option_value(argv: list[str], option: str) -> str:
    assert option in argv, f"{option} missing from {argv}"
    index = argv.index(option)
    assert index + 1 < len(argv), f"{option} has no value"
    return argv[index + 1]


@pytest.fixture(scope="module")
def ci() -> Workflow:
    return load_workflow(CI_PATH)


@pytest.fixture(scope="module")
def nightly() -> Workflow:
    return load_workflow(NIGHTLY_PATH)


@pytest.fixture(scope="module")
def perf_argv(nightly: Workflow) -> list[str]:
    """The nightly gate's command line: scripts/nightly and the pytest arguments it passes on."""
    argv = shlex.split(perf_step(nightly)["run"])
    assert argv[0] == "./scripts/nightly", argv
    return argv[1:]


# --- CI ---------------------------------------------------------------------


def test_ci_triggers_on_push_and_pull_request(ci: Workflow) -> None:
    on = triggers(ci)
    assert "push" in on
    assert "pull_request" in on


def test_ci_runs_on_hosted_cpu_runner(ci: Workflow) -> None:
    for job in jobs(ci).values():
        assert runs_on_labels(job) == ["ubuntu-latest"]
        assert isinstance(job.get("timeout-minutes"), int)


def test_ci_sets_up_python(ci: Workflow) -> None:
    (setup,) = uses_steps(ci, "actions/setup-python")
    assert str(setup["with"]["python-version"]) == "3.11"


def test_ci_runs_exactly_the_test_script(ci: Workflow) -> None:
    runs = [str(step["run"]).strip() for step in run_steps(ci)]
    assert TEST_COMMAND in runs


def test_readme_documents_the_ci_command() -> None:
    if not README_PATH.exists():
        pytest.skip("README.md not written yet")
    assert TEST_COMMAND in README_PATH.read_text(encoding="utf-8")


# --- Nightly ------------------------------------------------------------------


def test_nightly_runs_on_self_hosted_gpu(nightly: Workflow) -> None:
    for job in jobs(nightly).values():
        labels = runs_on_labels(job)
        assert "self-hosted" in labels
        assert "gpu" in labels


def test_nightly_has_schedule_and_dispatch(nightly: Workflow) -> None:
    on = triggers(nightly)
    schedule = on.get("schedule")
    assert isinstance(schedule, list) and schedule
    assert all(len(str(entry["cron"]).split()) == 5 for entry in schedule)
    nodes = on["workflow_dispatch"]["inputs"]["nodes"]
    assert str(nodes["default"]) == "1"


def test_nightly_sets_up_before_perf(nightly: Workflow) -> None:
    runs = [str(step["run"]).strip() for step in run_steps(nightly)]
    assert "./scripts/setup" in runs
    assert runs.index("./scripts/setup") < runs.index(str(perf_step(nightly)["run"]).strip())


def test_nightly_perf_command(perf_argv: list[str]) -> None:
    assert option_value(perf_argv, "-m") == "multinode"
    assert option_value(perf_argv, "--nodes") == "${NODES}"
    # The gate's baselines are the runner's own (scripts/nightly passes the store): a
    # --dlperf-baselines here would point it back at committed figures.
    assert "--dlperf-baselines" not in perf_argv


def test_nightly_nodes_input_goes_through_env(nightly: Workflow) -> None:
    step = perf_step(nightly)
    assert "${{" not in step["run"], "expressions must not be interpolated into the script"
    assert "inputs.nodes" in str(step["env"]["NODES"])


def test_nightly_perf_step_gates_the_job(nightly: Workflow) -> None:
    step = perf_step(nightly)
    assert step.get("id") == "perf"
    assert "continue-on-error" not in step
    assert "if" not in step


def test_nightly_uploads_its_results_folder_always(nightly: Workflow) -> None:
    (upload,) = uses_steps(nightly, "actions/upload-artifact")
    assert upload.get("if") == "always()"
    (job,) = jobs(nightly).values()
    assert upload["with"]["path"] == job["env"]["DLPERF_NIGHTLY_OUT"]
    assert upload["with"].get("if-no-files-found") == "warn"


def test_nightly_writes_the_gates_summary_always(nightly: Workflow) -> None:
    summary = [s for s in run_steps(nightly) if "GITHUB_STEP_SUMMARY" in s["run"]]
    assert len(summary) == 1
    assert summary[0].get("if") == "always()"
    (job,) = jobs(nightly).values()
    assert f"{job['env']['DLPERF_NIGHTLY_OUT']}/summary.md" in summary[0]["run"]


# --- Both ---------------------------------------------------------------------


@pytest.mark.parametrize("path", [CI_PATH, NIGHTLY_PATH, PERF_PR_PATH, RELEASE_PATH],
                         ids=lambda p: p.name)
def test_every_action_is_pinned(path: Path) -> None:
    uses = [str(step["uses"]) for step in all_steps(load_workflow(path)) if "uses" in step]
    assert uses, f"{path.name} uses no actions"
    unpinned = [ref for ref in uses if not PINNED_USES.match(ref)]
    assert not unpinned, f"unpinned actions in {path.name}: {unpinned}"


def test_nightly_summary_links_the_uploaded_page(nightly: Workflow) -> None:
    """The job summary links the artifact (results and the history's page): the summary step
    runs after the upload and takes its URL through env, never interpolated into the script."""
    steps = all_steps(nightly)
    (upload,) = uses_steps(nightly, "actions/upload-artifact")
    (summary,) = [s for s in run_steps(nightly) if "GITHUB_STEP_SUMMARY" in s["run"]]
    assert steps.index(upload) < steps.index(summary)
    assert summary["env"]["ARTIFACT_URL"] == f"${{{{ steps.{upload['id']}.outputs.artifact-url }}}}"
    assert "${{" not in summary["run"] and "ARTIFACT_URL" in summary["run"]



# --- The pull-request A/B -------------------------------------------------------------


def test_the_pr_workflow_compares_the_merge_commit_with_its_first_parent() -> None:
    """Head: the merge commit that pull_request checks out; base: its first parent, the base
    branch's tip (not the raw PR head against the tip: that counts the base's newer commits,
    reversed). Full history, so the base's worktree can be made."""
    pr = load_workflow(PERF_PR_PATH)
    assert "pull_request" in triggers(pr)
    (job,) = jobs(pr).values()
    assert "self-hosted" in runs_on_labels(job)
    (checkout,) = uses_steps(pr, "actions/checkout")
    assert checkout["with"]["fetch-depth"] == 0 and "ref" not in checkout["with"]
    step = perf_step(pr)
    command = step["run"].replace("\\\n", " ")
    (line,) = [line for line in command.splitlines() if "pytest perf_tests" in line]
    argv = shlex.split(line)
    assert option_value(argv, "--dlperf-ab") == "HEAD^1"
    assert "--dlperf-update-baselines" not in step["run"]
    for run in run_steps(pr):
        assert "${{" not in run["run"], "expressions must not be interpolated into scripts"
    (summary,) = [s for s in run_steps(pr) if "GITHUB_STEP_SUMMARY" in s["run"]]
    assert summary["if"] == "always()" and "pytest_dlperf report" in summary["run"]


# --- The release ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def release() -> Workflow:
    return load_workflow(RELEASE_PATH)


def job_with(workflow: Workflow, action: str) -> tuple[str, dict[str, Any]]:
    (found,) = [(name, job) for name, job in jobs(workflow).items()
                if any(str(s.get("uses", "")).split("@")[0] == action for s in job["steps"])]
    return found


def step_index(job: dict[str, Any], text: str) -> int:
    (index,) = [i for i, s in enumerate(job["steps"]) if text in str(s.get("run", ""))]
    return index


def test_release_runs_on_version_tags_only(release: Workflow) -> None:
    assert triggers(release) == {"push": {"tags": ["v*"]}}


def test_release_publishes_only_after_the_build_and_its_check(release: Workflow) -> None:
    publisher, publish = job_with(release, PUBLISH_ACTION)
    builder, build = job_with(release, "actions/upload-artifact")
    assert publisher != builder, "build and publish are separate jobs"
    needs = publish.get("needs")
    assert builder in ([needs] if isinstance(needs, str) else needs)
    assert step_index(build, "python -m build") < step_index(build, "pytest --help")
    (upload,) = uses_steps(release, "actions/upload-artifact")
    (download,) = uses_steps(release, "actions/download-artifact")
    assert upload["with"]["name"] == download["with"]["name"]
    assert download["with"]["path"].rstrip("/") == "dist"  # where the publish action looks
    assert not [s for s in publish["steps"] if "run" in s], "the publish job builds nothing"


def test_release_id_token_write_only_on_the_publish_job(release: Workflow) -> None:
    """Trusted publishing: the OIDC token is the upload credential, so only the job that
    uploads may mint one, and only in the "pypi" environment PyPI's publisher names."""
    assert "id-token" not in release.get("permissions", {})
    publisher, publish = job_with(release, PUBLISH_ACTION)
    assert publish["permissions"] == {"id-token": "write"}
    environment = publish["environment"]
    assert (environment["name"] if isinstance(environment, dict) else environment) == "pypi"
    for name, job in jobs(release).items():
        if name != publisher:
            assert "id-token" not in job.get("permissions", {}), name
    (step,) = uses_steps(release, PUBLISH_ACTION)
    assert not {"password", "user"} & set(step.get("with", {})), "no stored token"


def test_release_checks_pytest_help_from_the_installed_wheel(release: Workflow) -> None:
    """The check installs the built wheel into a fresh venv and runs that venv's pytest
    outside the checkout (so the source tree is not what it imports), looking for an option
    only the plugin adds."""
    _, build = job_with(release, "actions/upload-artifact")
    step = build["steps"][step_index(build, "pytest --help")]
    script = step["run"]
    venv = re.search(r'-m venv "?([^"\s]+)"?', script)
    assert venv, "the check makes a fresh venv"
    install = re.search(rf'"?{re.escape(venv.group(1))}/bin/pip"? install dist/\*\.whl', script)
    cd = re.search(r"^\s*cd ", script, re.M)
    help_ = re.search(rf'"?{re.escape(venv.group(1))}/bin/python"? -m pytest --help', script)
    assert install and cd and help_
    assert install.start() < cd.start() < help_.start(), "pytest --help runs outside the checkout"
    assert "--dlperf-protocol" in script[help_.start():]


def test_release_checks_the_tag_names_the_version(release: Workflow) -> None:
    (step,) = [s for s in run_steps(release) if "tomllib" in s["run"]]
    assert step["env"]["TAG"] == "${{ github.ref_name }}"
    _, build = job_with(release, "actions/upload-artifact")
    assert build["steps"].index(step) < step_index(build, "python -m build")


def test_release_never_interpolates_expressions_into_scripts(release: Workflow) -> None:
    for step in run_steps(release):
        assert "${{" not in step["run"], step.get("name")
