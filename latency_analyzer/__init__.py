"""latency_analyzer: where every millisecond of an HTTP request went."""

__version__ = "0.1.0"
