"""A topic made again on a broker without topic ids (the embedded broker), through the job: deleted while
the job is down, made again by the nodes' producers and filled past where the job stood, it is read
from its new start because the record the job fingerprinted there is another one
(``streaming/kafka_source.py``, ``prints``): the gap is found (``events_lost``, ``gone_back``), the nodes
restate, and the reader lost with the old topic is not passed while it is open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from safepoint.devtools.broker import EmbeddedBroker

from test_apache_kafka import made_again_and_filled_past

pytestmark = pytest.mark.integration


def test_a_topic_made_again_past_the_old_offsets_without_topic_ids_is_told_by_its_fingerprints(
        broker: Any, spark: Any, tmp_path: Path) -> None:
    if not isinstance(broker, EmbeddedBroker):  # SAFEPOINT_TEST_KAFKA=kafka: the topic's id would tell
        pytest.skip("needs a broker without topic ids (the embedded one)")
    made_again_and_filled_past(broker.bootstrap, spark, tmp_path, "prints")
