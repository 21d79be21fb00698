# shellcheck shell=bash
# Sourced by scripts/setup and scripts/setup-<framework>: install_into PYTHON ARGS... installs
# pip's ARGS into PYTHON's environment, through uv where it can be had, else through pip.
#
# Why uv: .venv (torch, torchvision, TensorFlow, Paddle and the test tools) took 390 s through
# pip on this project's 2-core VM and 105 s through uv, both compiling bytecode, the same
# versions of every package (2026-11-28). Bytecode is compiled at install (uv's
# --compile-bytecode, as pip does) where PYTHONDONTWRITEBYTECODE is set: a process would
# otherwise compile torch's sources again at every import. Where it is not set, each module's
# bytecode is written the first time any process imports it, and only those modules are ever
# compiled: 2 s to install .venv's 160 packages from uv's cache, against 53 s (93 s of CPU)
# compiling all 21,790 of their sources (this 2-core VM, 2026-12-08); scripts/test unsets it.
#
# uv does not read pip's configuration, so the settings pip is configured with (`pip config
# list`: its files and PIP_* variables) are passed to it: indexes, find-links, constraints,
# no-index, the certificate bundle, the timeout; and uv takes the best version over all
# indexes, as pip does. Where uv cannot be had or its install fails, pip installs (saying so).
# DLPERF_INSTALLER=pip always uses pip. uv comes from PATH, else it is installed once into
# .venv-uv (from the same indexes, through pip).

dlperf_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# dlperf_uv: the path of a uv to use, or nothing (status 1).
dlperf_uv() {
  [ "${DLPERF_INSTALLER:-}" != pip ] || return 1
  if command -v uv >/dev/null 2>&1; then command -v uv; return 0; fi
  local tools="$dlperf_root/.venv-uv"
  (
    flock 9  # the setup scripts run side by side (scripts/test): one of them makes .venv-uv
    if [ ! -x "$tools/bin/uv" ]; then
      rm -rf "$tools"
      python3 -m venv "$tools" && "$tools/bin/python" -m pip install \
        --disable-pip-version-check -q uv 2>&1 | grep -v "^WARNING: Location 'file:" >&2
    fi
  ) 9>"$dlperf_root/.venv-uv.lock"
  [ -x "$tools/bin/uv" ] && echo "$tools/bin/uv"
}

# dlperf_uv_settings PYTHON: pip's configuration as uv's flags (one a line), and as the
# environment uv reads (lines KEY=VALUE after a line "--env").
dlperf_uv_settings() {
  "$1" - <<'PY'
import ast, subprocess, sys

listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True,
                        text=True).stdout
# pip's precedence: its environment variables, then the [install] section, then [global].
order = {":env:": 0, "install": 1, "global": 2}
found: dict[str, tuple[int, str]] = {}
for line in listed.splitlines():
    name, _, raw = line.partition("=")
    section, _, key = name.rpartition(".")
    if section not in order or not raw:
        continue
    value = ast.literal_eval(raw)
    if key not in found or order[section] < found[key][0]:
        found[key] = (order[section], value)
values = {key: value for key, (_, value) in found.items()}
flags = ["--index-strategy", "unsafe-best-match"]
if "index-url" in values:
    flags += ["--index-url", values["index-url"]]
for key in ("extra-index-url", "find-links", "constraint"):
    for item in values.get(key, "").split():
        flags += [f"--{key}", item]
if values.get("no-index", "").lower() in ("1", "true", "yes", "on"):
    flags.append("--no-index")
print("\n".join(flags))
print("--env")
if "cert" in values:
    print(f"SSL_CERT_FILE={values['cert']}")
timeout = values.get("default-timeout") or values.get("timeout")
if timeout:
    print(f"UV_HTTP_TIMEOUT={int(float(timeout))}")
PY
}

# install_into PYTHON ARGS...: ARGS (pip install's) into PYTHON's environment.
install_into() {
  local python=$1; shift
  local uv
  if uv=$(dlperf_uv); then
    local flags=() uv_env=() line in_env=0
    while IFS= read -r line; do
      if [ "$line" = --env ]; then in_env=1
      elif [ "$in_env" = 1 ]; then uv_env+=("$line")
      else flags+=("$line"); fi
    done < <(dlperf_uv_settings "$python")
    local compile=()
    [ -z "${PYTHONDONTWRITEBYTECODE:-}" ] || compile=(--compile-bytecode)
    if env "${uv_env[@]}" "$uv" pip install -q "${compile[@]}" --python "$python" \
         "${flags[@]}" "$@"; then
      return 0
    fi
    echo "install: uv could not install into $python (above); installing with pip" >&2
  fi
  local no_compile=()  # pip compiles every source unless told not to
  [ -n "${PYTHONDONTWRITEBYTECODE:-}" ] || no_compile=(--no-compile)
  "$python" -m pip install --disable-pip-version-check -q "${no_compile[@]}" "$@" 2>&1 \
    | grep -v "^WARNING: Location 'file:" >&2 || true
}
