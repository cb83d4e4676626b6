"""safepoint: how much MVCC history a distributed database may throw away, right now."""

__all__ = ["__version__"]

__version__ = "0.1.0"
