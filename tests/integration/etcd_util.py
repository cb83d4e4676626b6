"""The tests' real etcd (``safepoint.devtools.etcd``: Debian's ``etcd``, members on loopback in a temp
dir), and the fixture every etcd test module imports."""

from __future__ import annotations

import pytest

from safepoint.devtools.etcd import LocalEtcd, etcd_missing

from observers import missing_tool

EtcdCluster = LocalEtcd


@pytest.fixture(autouse=True)
def _needs_etcd() -> None:
    """Every test of a module that imports this fixture needs Debian's etcd."""
    why = etcd_missing()
    if why:
        missing_tool(why)
