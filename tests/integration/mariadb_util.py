"""The tests' real MariaDB (``safepoint.devtools.mariadb``: Debian's MariaDB 10.11 as the ``mysql``
user, on loopback, in a temp dir): the fixture every MariaDB test module imports."""

from __future__ import annotations

import pytest

from safepoint.devtools.mariadb import mariadb_missing

from observers import missing_tool


@pytest.fixture(autouse=True)
def _needs_mariadb() -> None:
    """Every test of a module that imports this fixture needs Debian's MariaDB and PyMySQL."""
    why = mariadb_missing()
    if why:
        missing_tool(why)
