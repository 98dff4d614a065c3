"""Entry point for an existing mitmproxy: `mitmdump -s proxy/addon.py --set sealgate_rules=…`.

mitmproxy loads scripts outside the import system, so the addon itself lives in a real module.
Set `connection_strategy=lazy` as well: nothing should be dialed before a request is authorised.
What `sealgate proxy` adds around the addon is not here: the bounded upstream dial and JSON
error pages (proxy/engine/upstream.py, wired in by proxy/engine/mitm.py), workers, and the lean
master's speed.
"""

# Absolute, unlike every other import inside the proxy: a script mitmproxy loads has no package
# (it runs as `__mitmproxy_script__.addon`), so a relative import fails there.
from sealgate.proxy.request.pipeline import Sealgate

addons = [Sealgate()]
