"""The embedded broker's ports lie below the kernel's ephemeral range: a stopped broker's port is
never handed to a socket bound to port 0 (a Spark task's state server took one, and a cached
Kafka client of the stopped broker connected to it)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from safepoint.devtools import broker
from safepoint.devtools.broker import ephemeral_range, free_port


def test_free_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    low, _high = ephemeral_range()
    ports = {free_port() for _ in range(20)}
    assert all(broker._LOWEST <= p < low for p in ports), sorted(ports)
    assert len(ports) > 1, "chosen at random: brokers started one after the other get different ports"
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_without_room_below_the_range_a_port_of_the_range_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text("10500\t60999\n")
    monkeypatch.setattr(broker, "EPHEMERAL_RANGE", narrow)
    assert ephemeral_range() == (10500, 60999)
    assert free_port() >= 10500
    monkeypatch.setattr(broker, "EPHEMERAL_RANGE", tmp_path / "missing")
    assert ephemeral_range() == (32768, 60999)
