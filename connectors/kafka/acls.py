"""The Kafka ACLs each role of a deployment needs, on the topics its settings name (the security page's
table is this one): ``safepoint acls ROLE PRINCIPAL`` prints them as Apache Kafka's ``kafka-acls.sh``
lines, or grants them with the admin API (``--apply``, as a principal that may alter ACLs).

The roles: a database ``node`` and an ``agent`` (write events, read directives), the ``job`` (reads the
events and control topics, writes and reads directives and status, writes alerts, dead letters and
accounting), an ``operator`` (writes control, reads status, alerts and dead letters) and a ``holder``
(a backup's ``ServiceHold``: writes control, reads status). Kafka lets READ and WRITE describe the topic
too. Nothing lets a node write the control or the directives topic.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ROLES", "bindings", "apply", "shell_lines"]

ROLES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "node": (("events", ("WRITE",)), ("directives", ("READ",))),
    "agent": (("events", ("WRITE",)), ("directives", ("READ",))),
    "job": (("events", ("READ", "DESCRIBE")), ("control", ("READ", "DESCRIBE")), ("directives", ("WRITE", "READ")),
            ("alerts", ("WRITE",)), ("deadletter", ("WRITE",)), ("status", ("WRITE", "READ")), ("accounting", ("WRITE",))),
    "operator": (("control", ("WRITE",)), ("status", ("READ",)), ("alerts", ("READ",)), ("deadletter", ("READ",))),
    "holder": (("control", ("WRITE",)), ("status", ("READ",))),
}
"""Role -> (topic of ``Settings.topics()``, the operations it is allowed there)."""


def bindings(role: str, principal: str, topics: dict[str, str]) -> list[tuple[str, str]]:
    """(topic name, operation) of every ACL ``role`` needs, for the topics ``topics`` names (one left
    empty, such as an unset accounting topic, needs none)."""
    from safepoint.errors import ConfigError

    if role not in ROLES:
        msg = f"unknown role {role!r}: use one of {', '.join(ROLES)}"
        raise ConfigError(msg)
    if not principal.startswith("User:"):
        msg = f"a principal is User:NAME (the SASL user or the certificate's name), not {principal!r}"
        raise ConfigError(msg)
    return [(topics[key], op) for key, ops in ROLES[role] for op in ops if topics.get(key)]


def shell_lines(role: str, principal: str, topics: dict[str, str], bootstrap: str) -> list[str]:
    """The ``kafka-acls.sh`` commands that grant ``role``'s ACLs to ``principal``."""
    return [f"kafka-acls.sh --bootstrap-server {bootstrap} --add --allow-principal {principal} --operation {op} "
            f"--topic {topic}" for topic, op in bindings(role, principal, topics)]


def apply(conf: dict[str, Any], role: str, principal: str, topics: dict[str, str], timeout_s: float = 10.0) -> int:
    """Grant ``role``'s ACLs to ``principal`` with the admin API (``conf``: a principal that may alter
    ACLs); returns how many were granted (granting one that exists again is no error)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    from safepoint.errors import BrokerError

    wanted = bindings(role, principal, topics)
    acls = [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, principal, "*", AclOperation[op],
                       AclPermissionType.ALLOW) for topic, op in wanted]
    admin = AdminClient(conf)
    for (topic, op), fut in zip(wanted, admin.create_acls(acls, request_timeout=timeout_s).values(), strict=True):
        try:
            fut.result(timeout_s)
        except KafkaException as exc:
            msg = (f"cannot grant {op} on topic {topic} to {principal}: {exc} (the [kafka] "
                   "settings must name a principal that may alter ACLs, and the broker must have an authorizer)")
            raise BrokerError(msg) from exc
    return len(acls)
