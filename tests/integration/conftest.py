"""One broker and one Spark session for the whole integration suite."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from safepoint.broker import EmbeddedBroker


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    b = EmbeddedBroker()
    b.start()
    try:
        yield b
    finally:
        b.cleanup()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from safepoint.streaming.session import build_session

    session = build_session(master="local[2]", shuffle_partitions=2, app="safepoint-tests")
    try:
        yield session
    finally:
        session.stop()
