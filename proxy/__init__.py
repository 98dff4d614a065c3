"""The egress proxy: mitmproxy addons (identity, guard, audit, budgets) and the lean master."""
