"""The Ray launcher's pytest side, registered as a launcher of one's own registers its own
(docs/adding-a-launcher.md): its option, ``--dlperf-ray-address``, with the environment variable
and ini key every option of the plugin has (command line > environment > ini), and its maker,
which hands the address to ``make`` as Ray's own ``RAY_ADDRESS`` (else that variable as found).
The plugin registers this module beside itself (``launch.hook_modules``); nothing in the plugin
knows Ray's option.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest

from . import ADDRESS_VARIABLE

FLAG, ENV, INI = "--dlperf-ray-address", "DLPERF_RAY_ADDRESS", "dlperf_ray_address"
HELP = ("--dlperf-launcher ray: the running Ray cluster to launch on, HOST:PORT of its GCS (pytest "
        "on a node of the cluster) or ray://HOST:10001 (Ray Client). Default: RAY_ADDRESS. The "
        "plugin connects; it never starts a cluster (scripts/local-ray starts one on this "
        "machine).")


def parse_address(raw: str) -> str:
    """A Ray cluster's address: HOST:PORT, or ray://HOST:PORT."""
    value = str(raw).strip()
    if not re.fullmatch(r"(ray://)?[A-Za-z0-9_.\-\[\]:]+:\d+", value):
        raise ValueError("expected a Ray cluster's address, HOST:PORT of its GCS (10.0.0.1:6379) "
                         "or ray://HOST:PORT (Ray Client)")
    return value


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dlperf", "deep-learning training throughput (pytest-dlperf)")
    group.addoption(FLAG, dest=INI, default=None, metavar="ADDRESS",
                    help=f"{HELP} [env {ENV}; ini {INI}]")
    parser.addini(INI, HELP, type="string", default="")


def configured_address(config: pytest.Config) -> str | None:
    """The address the option gives, from the first of its spellings that is set; a bad value is
    a usage error naming where it came from."""
    given = config.getoption(INI)
    where = f"{FLAG}={given}"
    if given is None and ENV in os.environ:
        given, where = os.environ[ENV], f"environment variable {ENV}={os.environ[ENV]!r}"
    if given is None and config.getini(INI) not in ("", None):
        given = config.getini(INI)
        where = f"ini key {INI} = {given!r} in {config.inipath or 'the ini file'}"
    if given is None:
        return None
    try:
        return parse_address(given)
    except ValueError as exc:
        raise pytest.UsageError(f"pytest-dlperf: bad value for {where}: {exc}") from None


def pytest_configure(config: pytest.Config) -> None:
    configured_address(config)  # a bad value is refused before any test, whatever the launcher


def pytest_dlperf_make_launcher(config: pytest.Config, name: str,
                                environ: dict[str, str]) -> Any:
    if name != "ray":
        return None
    from . import make

    address = configured_address(config)
    return make({**environ, ADDRESS_VARIABLE: address} if address else environ)


def options_markdown() -> str:
    """This option's section of the options reference, as the plugin's own are written."""
    return "\n".join([f"## `{FLAG}`", "", f"- command line: `{FLAG} ADDRESS`",
                      f"- environment: `{ENV}`", f"- ini: `{INI}`", "", HELP, ""])
