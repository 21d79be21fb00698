"""Where ranks import pytest-dlperf from (``launch.importpath``). From a source tree, its root;
from an installed copy, only the package: with all of pytest's site-packages first on a rank's
path, OneFlow's Python 3.10 imported the 3.11 venv's numpy and failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pytest_dlperf.launch.importpath import PACKAGE, rank_import_path


def test_a_source_tree_is_imported_from_its_root(tmp_path: Path) -> None:
    tree = tmp_path / "checkout"
    (tree / "pytest_dlperf").mkdir(parents=True)
    assert rank_import_path(tmp_path / "scratch", tree / "pytest_dlperf") == str(tree)
    assert not (tmp_path / "scratch").exists()


def test_an_installed_copy_brings_only_itself_onto_the_ranks_path(tmp_path: Path) -> None:
    """A site-packages holding the plugin beside another interpreter's wrong numpy: a rank
    whose path starts where rank_import_path says imports the plugin from there and its own
    numpy."""
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "pytest_dlperf").symlink_to(PACKAGE, target_is_directory=True)
    (site / "numpy").mkdir()
    (site / "numpy" / "__init__.py").write_text("raise ImportError('the 3.11 venv numpy')\n")
    scratch = tmp_path / "launch" / "tmp"
    path = rank_import_path(scratch, site / "pytest_dlperf")
    assert Path(path).parent == scratch and sorted(os.listdir(path)) == ["pytest_dlperf"]
    assert rank_import_path(scratch, site / "pytest_dlperf") == path  # a second launch's ranks
    probe = ("import json, numpy, pytest_dlperf.rank.worker as w; "
             "print(json.dumps([numpy.__file__, w.__file__]))")
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, timeout=120, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    numpy_file, worker_file = json.loads(done.stdout)
    assert not numpy_file.startswith(str(site))
    assert worker_file.startswith(path)
    # What the ranks' path was before: site-packages itself, and the wrong numpy with it.
    env["PYTHONPATH"] = str(site)
    before = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                            text=True, timeout=120, check=False, cwd=tmp_path)
    assert "the 3.11 venv numpy" in before.stderr


def test_a_rank_imported_through_the_link_knows_its_own_frames(tmp_path: Path) -> None:
    """The rank trims the plugin's frames from a user's traceback by the file each frame was
    imported from: through the link too."""
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "pytest_dlperf").symlink_to(PACKAGE, target_is_directory=True)
    path = rank_import_path(tmp_path / "scratch", site / "pytest_dlperf")
    user = tmp_path / "user_code.py"
    user.write_text("def fail():\n    raise ValueError('the user raised')\n")
    probe = (f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
             "import user_code\nfrom pytest_dlperf.rank import worker\n"
             "from pytest_dlperf.core.protocol import QUICK\n"
             "try:\n    worker.measure(QUICK, user_code.fail, lambda: None)\n"
             "except Exception as exc:\n    print(worker.error_text(exc))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path}, timeout=120, check=False,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert 'user_code.py", line 2, in fail' in done.stdout
    assert "pytest_dlperf" not in done.stdout.replace("pytest-dlperf", "")
