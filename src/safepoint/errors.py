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
    "AdmissionDenied",
    "AdmissionThrottled",
    "AdmissionRefused",
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
    """The safe-point service expired this reader or transaction under history pressure.

    Raised at the handle's next operation boundary (``check()``, ``prepare()``, a commit, the end
    of a ``with`` block whose snapshot was already released). The same error for a graceful and a
    hard expiry, so a database maps it to one transient/resource-pressure error code: the
    operation may be retried with a fresh snapshot.
    """

    code = "snapshot_expired"
    """A stable code for the database's error mapping (transient, resource pressure)."""

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        ident: str | None = None,
        mode: str | None = None,
        reason: str | None = None,
        seq: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        """``"reader"`` or ``"tx"``."""
        self.ident = ident
        """The reader_id or tx_id."""
        self.mode = mode
        """``"graceful"`` or ``"hard"``."""
        self.reason = reason
        """The job's reason, from the directive."""
        self.seq = seq
        """The expire directive's seq."""


class ClientClosed(SafepointError):
    """The reporter was used after close()."""


class AdmissionDenied(ReaderRefused):
    """A long snapshot was not admitted: the node is under history pressure (its pinned-bytes band,
    which the job sends it). Short readers are never denied. ``band`` is the node's band."""

    def __init__(self, message: str, band: str) -> None:
        super().__init__(message)
        self.band = band


class AdmissionThrottled(AdmissionDenied):
    """The node is in the ``warning`` band and long snapshots are rate-limited: retry after
    ``retry_after_s`` seconds (or read nearer ``mvcc_now``)."""

    def __init__(self, message: str, band: str, retry_after_s: float) -> None:
        super().__init__(message, band)
        self.retry_after_s = retry_after_s


class AdmissionRefused(AdmissionDenied):
    """The node is in the ``critical`` band: long snapshots are refused until it leaves it."""
