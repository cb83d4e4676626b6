"""Helpers both suites share live beside this file (``pty_util``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The slowest modules first (test-seconds of a run on 2 cores, most first), so that the workers end
# together: what runs last is short. Without it a minute-long test could start last on one
# worker while the other sat idle (a clean-clone run's last 10% of tests took 58 s in one run and
# 175 s in the next).
SLOWEST_FIRST = ["test_compose", "test_container_faults", "test_faults", "test_spark_cluster", "test_apache_kafka", "test_kafka_failover", "test_container_postgres", "test_three_languages", "test_control_e2e", "test_client_vectors", "test_submit", "test_demo", "test_etcd_e2e", "test_status_http",
                 "test_stop", "test_etcd_example", "test_accounting", "test_router_placement", "test_parity", "test_properties",
                 "test_status_follower", "test_pressure_e2e", "test_client", "test_kafka_acls", "test_check_node", "test_unreachable"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: the rest keep their order
