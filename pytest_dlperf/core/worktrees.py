"""Git for A/B runs and bisection: the repository holding the test files, a revision resolved to
its commit, and a worktree of that commit (a checkout of its own beside the user's, which stays
untouched). Worktrees are made under ``<top>/.pytest-dlperf/worktrees/<sha>``, reused while they
last, and removed with ``git worktree remove`` (``Worktrees.close``)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


class GitError(RuntimeError):
    pass


def _git(cwd: Path, *args: str, strip: bool = True) -> str:
    try:
        done = subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=300)
    except FileNotFoundError:
        raise GitError("git is not installed (Debian: apt-get install git)") from None
    if done.returncode != 0:
        raise GitError((done.stderr or done.stdout).strip() or f"git {' '.join(args)} failed")
    return done.stdout.strip() if strip else done.stdout


def toplevel(folder: Path) -> Path:
    """The root of the git repository ``folder`` is in."""
    try:
        return Path(_git(folder, "rev-parse", "--show-toplevel"))
    except GitError:
        raise GitError(f"{folder} is not inside a git repository: A/B runs and bisection take "
                       "the base side's code from a commit of the repository holding the "
                       "tests") from None


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str

    @property
    def short(self) -> str:
        return self.sha[:10]


def resolve(top: Path, revision: str) -> Commit:
    """``revision`` (a branch, tag, ``HEAD~1``, a sha) as a commit of the repository at ``top``."""
    try:
        sha = _git(top, "rev-parse", "--verify", "--quiet", "--end-of-options",
                   f"{revision}^{{commit}}")
    except GitError:
        sha = ""
    if not sha:
        raise GitError(f"{revision!r} is not a commit of the repository at {top} (try "
                       "git log --oneline to see its commits; fetch a remote branch first)")
    return Commit(sha, _git(top, "log", "-1", "--format=%s", sha))


def dirty(top: Path, paths: list[Path] | None = None, leave_out: Sequence[Path] = ()
          ) -> list[str]:
    """Tracked files with uncommitted changes, and untracked files, under ``paths`` (all of the
    repository when None), as git names them; none under ``leave_out`` (files and folders: ones
    outside the repository, or the repository's top itself, are ignored)."""
    resolved = top.resolve()
    excluded = []
    for path in leave_out:
        inside = path.resolve()
        if inside != resolved and inside.is_relative_to(resolved):
            excluded.append(f":(exclude,literal){inside.relative_to(resolved).as_posix()}")
    included = [str(p) for p in paths or ()] or (["."] if excluded else [])
    where = ["--", *included, *excluded] if included else []
    # -z: names as they are (no quoting), and the output unstripped: a line's status may
    # start with a space (" M name"), which stripping would take from the first name
    out = _git(top, "status", "--porcelain", "-z", "--untracked-files=all", *where, strip=False)
    names: list[str] = []
    entries = iter(out.split("\0"))
    for entry in entries:
        if entry:
            names.append(entry[3:])
            if "R" in entry[:2] or "C" in entry[:2]:
                next(entries, None)  # a rename's or copy's old name follows its new one
    return names


def checkouts(top: Path) -> list[Path]:
    """Every checkout of the repository at ``top`` (its main worktree and the others, A/B's and
    bisect's included), as real paths, the deepest first: a path inside one is inside the
    deepest that holds it."""
    out = _git(top, "worktree", "list", "--porcelain")
    found = [Path(line[len("worktree "):]).resolve() for line in out.splitlines()
             if line.startswith("worktree ")]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def is_linked(top: Path) -> bool:
    """Whether the checkout at ``top`` is a linked worktree (``git worktree add``: a bisect
    probe's, an A/B base's), not the repository's main one."""
    return Path(_git(top, "rev-parse", "--absolute-git-dir")) != Path(
        _git(top, "rev-parse", "--path-format=absolute", "--git-common-dir"))


def first_parent_range(top: Path, good: Commit, bad: Commit) -> list[Commit]:
    """The commits after ``good`` up to ``bad`` (oldest first), along first parents."""
    out = _git(top, "rev-list", "--first-parent", "--reverse", "--format=%H %s",
               f"{good.sha}..{bad.sha}")
    commits = []
    for line in out.splitlines():
        if line.startswith("commit "):
            continue
        sha, _, subject = line.partition(" ")
        commits.append(Commit(sha, subject))
    return commits


def is_ancestor(top: Path, older: Commit, newer: Commit) -> bool:
    done = subprocess.run(["git", "-C", str(top), "merge-base", "--is-ancestor", older.sha,
                           newer.sha], capture_output=True)
    return done.returncode == 0


def scratch(top: Path) -> Path:
    """``<top>/.pytest-dlperf``, the plugin's scratch folder in the repository, ignored by git
    (its own ``.gitignore``, as pytest's cache folder has)."""
    folder = top / ".pytest-dlperf"
    folder.mkdir(parents=True, exist_ok=True)
    ignore = folder / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# made by pytest-dlperf: scratch, never committed\n*\n")
    return folder


@dataclass
class Worktrees:
    """The worktrees one session (or one bisection) made, by commit."""

    top: Path
    made: dict[str, Path] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.top / ".pytest-dlperf" / "worktrees"

    def get(self, commit: Commit) -> Path:
        """A worktree at ``commit`` (detached), made on first use."""
        if commit.sha in self.made:
            return self.made[commit.sha]
        path = self.root / commit.sha
        if path.exists():  # a run killed before it removed its worktree
            self._remove(path)
        scratch(self.top)
        self.root.mkdir(parents=True, exist_ok=True)
        _git(self.top, "worktree", "add", "--detach", "--force", str(path), commit.sha)
        self.made[commit.sha] = path
        return path

    def _remove(self, path: Path) -> None:
        try:
            _git(self.top, "worktree", "remove", "--force", str(path))
        except GitError:
            shutil.rmtree(path, ignore_errors=True)
            _git(self.top, "worktree", "prune")

    def close(self) -> None:
        for path in self.made.values():
            self._remove(path)
        self.made.clear()
        try:
            self.root.rmdir()
        except OSError:
            pass
