"""tailgate: tail-latency governance across the four-layer stack."""

__version__ = "0.1.0"
