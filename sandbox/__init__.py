"""The sandbox runtime around the proxy (namespaces, firewall, isolation)."""
