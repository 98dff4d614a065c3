"""sealgate: egress credential proxy and sandbox runtime for untrusted code."""

__version__ = "0.1.0"
