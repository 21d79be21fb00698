"""What an interpreter imports from where, asked inside it. Standard library only: it runs under
any Python 3.10+ the ranks use (``probe_command`` starts it there; a rank calls ``imported``).

- ``report``: the interpreter's ``sys.path`` (``.pth`` path lines and ``PYTHONPATH`` included) and
  every distribution installed from a folder (PEP 610's ``direct_url.json``: ``pip install -e``
  or ``pip install .`` of a checkout), with the top-level modules each gives and where they
  resolve. Editable installs come in two kinds (``docs/ab.md``): a path ``.pth`` (setuptools'
  src layout, hatchling, pdm, flit: a folder on ``sys.path``) or an import hook (setuptools'
  flat layout: ``__editable___*_finder.py``'s ``MAPPING``; hatchling's ``dev-mode-exact`` and
  others through ``editables``: ``_editable_impl_*.py``'s ``map_module`` calls), which names
  its modules without any ``sys.path`` entry: both are read, and each module is resolved
  through the interpreter's own finders (``importlib.util.find_spec``), whatever wrote them.
- ``imported``: the top-level modules this process imported from outside the standard library
  and site-packages, and their real locations: what an A/B side's ranks really ran.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

# Files of an editable install that name its modules without a sys.path entry.
_FINDERS = ("__editable__", "_editable_impl_")
# Built files a checkout's package may hold that git does not (a compiled extension).
COMPILED = (".so", ".pyd", ".dylib")


def probe_command(python: str, plugin_root: str) -> list[str]:
    """The command that prints ``report`` of ``python``'s interpreter as JSON (run it from a
    neutral folder: ``-c`` puts the current one first on ``sys.path``). ``plugin_root``: the
    folder this package is imported from there (``launch.importpath``), left out of the
    report."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from pytest_dlperf.core.installs import report; "
            "print(json.dumps(report(sys.argv[1])))")
    return [python, "-c", code, plugin_root]


def report(leave_out: str = "") -> dict[str, Any]:
    """This interpreter's path entries and its distributions installed from a folder."""
    cwd = os.getcwd()
    paths = [p for p in sys.path if p and p not in (leave_out, cwd) and os.path.isdir(p)]
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.exec_prefix,
                                               getattr(sys, "base_prefix", sys.prefix))}
    return {"python": sys.executable, "sys_path": list(dict.fromkeys(paths)),
            "prefixes": sorted(prefixes), "from_folders": from_folders()}


def _folder_of(dist: Any) -> tuple[str, bool] | None:
    """The folder a distribution was installed from and whether editably (None: from an index
    or a wheel file)."""
    try:
        text = dist.read_text("direct_url.json")
        data = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not str(data.get("url", "")).startswith("file://"):
        return None
    if "dir_info" not in data:  # a local wheel or archive: a copy, not a folder
        return None
    folder = unquote(urlparse(data["url"]).path)
    return folder, bool((data.get("dir_info") or {}).get("editable"))


def from_folders() -> list[dict[str, Any]]:
    """Every distribution installed from a folder: its name, version, folder, whether editable,
    and its top-level modules with the locations they resolve to here."""
    from importlib import metadata

    found = []
    for dist in metadata.distributions():
        origin = _folder_of(dist)
        if origin is None:
            continue
        folder, editable = origin
        names = module_names(dist, editable)
        modules = {name: where for name in sorted(names) if (where := locate(name))}
        found.append({"name": dist.metadata["Name"], "version": dist.version,
                      "folder": folder, "editable": editable, "modules": modules})
    return sorted(found, key=lambda d: str(d["name"]).lower())


def module_names(dist: Any, editable: bool) -> set[str]:
    """The top-level modules a distribution gives: its ``top_level.txt``, the names its
    editable finders map, the packages its path ``.pth`` lines expose, its installed files'
    top folders (a copy), and its own name made a module name."""
    names = set((dist.read_text("top_level.txt") or "").split())
    for file in dist.files or ():
        path = Path(str(dist.locate_file(file)))
        if editable and path.suffix == ".py" and path.name.startswith(_FINDERS):
            names |= finder_names(path)
        elif editable and path.suffix == ".pth":
            names |= pth_names(path)
        elif not editable and len(file.parts) > 1 and not file.parts[0].endswith(
                (".dist-info", ".data")) and file.parts[0] != "..":
            names.add(file.parts[0])
        elif not editable and len(file.parts) == 1 and file.suffix == ".py":
            names.add(file.stem)
    names.add(str(dist.metadata["Name"]).replace("-", "_").lower())
    return {n for n in names if n.isidentifier()}


def finder_names(path: Path) -> set[str]:
    """The modules an editable install's import hook maps: setuptools' ``MAPPING = {...}``,
    ``editables``' ``map_module('name', ...)`` calls."""
    try:
        tree = ast.parse(path.read_text())
    except (OSError, SyntaxError, ValueError):
        return set()
    names: set[str] = set()
    for node in ast.walk(tree):
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(target, ast.Name) \
                and target.id == "MAPPING" and node.value is not None:
            try:
                names |= set(ast.literal_eval(node.value))
            except ValueError:
                pass
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "map_module" \
                and node.args and isinstance(node.args[0], ast.Constant):
            names.add(str(node.args[0].value))
    return names


def pth_names(path: Path) -> set[str]:
    """The packages and modules in the folders a path ``.pth`` puts on ``sys.path``."""
    names: set[str] = set()
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return names
    for line in lines:
        folder = Path(line.strip())
        if line.startswith(("#", "import")) or not line.strip() or not folder.is_dir():
            continue
        for child in folder.iterdir():
            if (child / "__init__.py").exists() or child.suffix == ".py":
                names.add(child.stem)
    return names


def locate(name: str) -> list[str] | None:
    """Where ``name`` is imported from in this interpreter: its package's folders, or its
    module's file (real paths); None where nothing finds it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError, AttributeError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return [os.path.realpath(p) for p in spec.submodule_search_locations]
    if spec.origin and os.path.isabs(spec.origin):
        return [os.path.realpath(spec.origin)]
    return None


def _installed_roots() -> tuple[str, ...]:
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib",
                                                     "platlib")}
    return tuple(os.path.realpath(r) + os.sep for r in roots)


# The modules an A/B side's ranks must say where they imported from, wherever that was (an
# installed copy included): set by the launcher (``launch.processes.on_side``).
EXPECTED_VARIABLE = "DLPERF_EXPECTED_IMPORTS"


def imported() -> dict[str, str]:
    """The top-level modules this process imported from a folder of its own (neither the
    standard library nor site-packages), and those ``EXPECTED_VARIABLE`` names wherever they
    came from, by their real locations (a package's folder, a module's file): in a rank, what
    an A/B side really ran."""
    roots = _installed_roots()
    named = set(filter(None, os.environ.get(EXPECTED_VARIABLE, "").split(",")))
    found: dict[str, str] = {}
    for name, module in list(sys.modules.items()):
        if "." in name:
            continue
        file = getattr(module, "__file__", None)
        where = os.path.dirname(file) if file and os.path.basename(file).startswith(
            "__init__.") else file
        if where is None:
            paths = list(getattr(module, "__path__", None) or [])
            where = paths[0] if paths else None
        if not where or not os.path.isabs(where):
            continue
        real = os.path.realpath(where)
        if name not in named and (real.startswith(roots) or "site-packages" in real
                                  or "dist-packages" in real):
            continue
        found[name] = real
    return dict(sorted(found.items()))


def lock() -> dict[str, Any]:
    """This interpreter's environment as the nightly compares it: every distribution by name
    (its version, and its build: a digest of its ``RECORD``, which lists every installed file
    with its hash, so a rebuilt wheel of the same version differs), and every ``.pth`` file
    of its site folders (a package may change the interpreter through one alone) by digest;
    ``prefix``: the environment's folder, ``venv`` whether it is a virtual environment."""
    import hashlib
    import site
    from importlib import metadata

    packages: dict[str, dict[str, Any]] = {}
    for dist in metadata.distributions():
        name = str(dist.metadata["Name"]).lower().replace("_", "-")
        record = dist.read_text("RECORD") or ""
        packages[name] = {"version": dist.version,
                          "build": hashlib.sha256(record.encode()).hexdigest()[:16]}
        origin = _folder_of(dist)
        if origin is not None and origin[1]:  # editable: its code is a checkout's, not this
            packages[name]["editable"] = origin[0]  # environment's (and the .pth it owns)
            packages[name]["pth"] = sorted(Path(str(f)).name for f in dist.files or ()
                                           if str(f).endswith(".pth"))
    pth: dict[str, str] = {}
    for folder in dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]]):
        if os.path.isdir(folder):
            for name in sorted(os.listdir(folder)):
                if name.endswith(".pth"):
                    with open(os.path.join(folder, name), "rb") as f:
                        pth[name] = hashlib.sha256(f.read()).hexdigest()[:16]
    return {"python": sys.executable, "prefix": sys.prefix, "version": sys.version,
            "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
            "system_site_packages": _sees_system_site(),
            "packages": dict(sorted(packages.items())), "pth": pth}


def _sees_system_site() -> bool:
    """Whether this virtual environment also sees the system's packages
    (``include-system-site-packages``): a copy of it would not keep those."""
    cfg = os.path.join(sys.prefix, "pyvenv.cfg")
    try:
        with open(cfg) as f:
            return any(line.split("=", 1)[0].strip() == "include-system-site-packages"
                       and line.split("=", 1)[1].strip().lower() == "true"
                       for line in f if "=" in line)
    except OSError:
        return False


def lock_command(python: str, plugin_root: str) -> list[str]:
    """The command that prints ``lock`` of ``python``'s environment as JSON."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); "
            "from pytest_dlperf.core.installs import lock; print(json.dumps(lock()))")
    return [python, "-c", code, plugin_root]


def lock_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs from environment ``old`` to ``new`` (two ``lock``\\ s), a line each:
    packages added, removed, at another version or another build, ``.pth`` files."""
    lines = []
    if old.get("version") and new.get("version") and old["version"] != new["version"]:
        lines.append(f"Python: {old['version'].split()[0]} -> {new['version'].split()[0]} "
                     "(the interpreter itself)")
    before, after = old.get("packages", {}), new.get("packages", {})
    for name in sorted(set(before) | set(after)):
        was, now = before.get(name), after.get(name)
        if was is None and now is not None:
            lines.append(f"{name} {now['version']}: added")
        elif now is None and was is not None:
            lines.append(f"{name} {was['version']}: removed")
        elif was is not None and now is not None and was["version"] != now["version"]:
            lines.append(f"{name}: {was['version']} -> {now['version']}")
        elif was is not None and now is not None and was["build"] != now["build"]:
            lines.append(f"{name} {now['version']}: another build (its files differ)")
    was_pth, now_pth = old.get("pth", {}), new.get("pth", {})
    for name in sorted(set(was_pth) | set(now_pth)):
        if was_pth.get(name) != now_pth.get(name):
            what = ("added" if name not in was_pth else "removed" if name not in now_pth
                    else "changed")
            lines.append(f"{name} (a .pth file, run at every start): {what}")
    return lines
