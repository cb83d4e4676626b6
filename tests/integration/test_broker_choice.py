"""Which broker a module gets (``tests/integration/conftest.py``): the embedded one unless the module is
marked ``kafka`` or ``SAFEPOINT_TEST_KAFKA`` says otherwise, as the developers' page tells."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from typing import Any

import pytest

from safepoint.devtools.apache_kafka import ApacheKafka
from safepoint.devtools.broker import EmbeddedBroker

from doc_blocks import ROOT, block

pytestmark = pytest.mark.integration


def test_the_broker_is_the_embedded_one_unless_asked(broker: Any) -> None:
    mode = os.environ.get("SAFEPOINT_TEST_KAFKA", "")
    if mode.startswith("bootstrap="):
        assert broker.bootstrap == mode.split("=", 1)[1]
    else:
        assert isinstance(broker, ApacheKafka if mode == "kafka" else EmbeddedBroker), (mode, broker)


def test_the_development_pages_line_runs_a_module_on_apache_kafka() -> None:
    line = block("docs/development.md", "SAFEPOINT_TEST_KAFKA=kafka").text.split("#", 1)[0].split()
    assert line == ["SAFEPOINT_TEST_KAFKA=kafka", "./scripts/test.sh"]
    name, value = line[0].split("=", 1)
    # the test command is pytest after setup: here pytest alone, on the test above
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{__file__}::test_the_broker_is_the_embedded_one_unless_asked"],
                          cwd=ROOT, env={**os.environ, name: value}, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, shlex.join(line) + "\n" + proc.stdout[-3000:]
