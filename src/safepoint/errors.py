"""One root exception for everything safepoint raises on purpose."""

from __future__ import annotations

__all__ = [
    "SafepointError",
    "ConfigError",
    "BrokerError",
    "JavaMissingError",
    "ReaderRefused",
    "ReaderExpired",
    "ClientClosed",
]


class SafepointError(Exception):
    """Root of every error safepoint raises on purpose."""


class ConfigError(SafepointError):
    """A setting is missing or invalid; the message says which and how to fix it."""


class BrokerError(SafepointError):
    """The Kafka broker could not be started, reached or used."""


class JavaMissingError(SafepointError):
    """Spark needs Java 17 or newer and none was found."""


class ReaderRefused(SafepointError):
    """A reader or transaction asked for a timestamp the cluster may already have compacted."""


class ReaderExpired(SafepointError):
    """The safe-point service expired this reader or transaction under history pressure."""


class ClientClosed(SafepointError):
    """The reporter was used after close()."""
