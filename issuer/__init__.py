"""Sealed credential tokens: the wire format, proxy keys, and the mint CLI and service."""
