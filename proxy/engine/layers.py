"""Which protocol a connection may speak next: HTTP, or TLS carrying it, and nothing else.

mitmproxy chooses each connection's next layer by peeking at its first bytes, and relays raw TCP
when they do not look like HTTP: fewer than three bytes, no space in the first line, a server
greeting, an SSH banner. A raw relay carries bytes past every method and path rule (send "PO",
wait, send "ST /forbidden ..."), and mitmproxy 11's TCP layer ignores `flow.kill()`. So the
choice is overridden, not policed afterwards: whatever mitmproxy would relay raw over TCP is
parsed as HTTP instead, which either yields a request that goes through the whole decision, or
a parse error that mitmproxy answers with 400 and a close, before anything is dialed (the
connection strategy is lazy). Anything else (UDP, QUIC, DNS) is closed.

A TLS connection that a rule passes through undecrypted does not come here: mitmproxy relays it
when `tls_clienthello` says so, and the pipeline says so only for a checked SNI.
"""

from __future__ import annotations

from mitmproxy.proxy import commands, events, layer
from mitmproxy.proxy.layers import ClientTLSLayer, HttpLayer, ServerTLSLayer
from mitmproxy.proxy.layers.http import HTTPMode

# The layers a decision may stack. Exact types: mitmproxy's QUIC layers are TLS-like but not
# these classes.
_SPOKEN: frozenset[type[layer.Layer]] = frozenset({HttpLayer, ClientTLSLayer, ServerTLSLayer})


class Refused(layer.Layer):
    """Closes the client's connection as soon as it starts, and ignores whatever else comes."""

    def _handle_event(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.Start):
            yield commands.CloseConnection(self.context.client)


def confine(nextlayer: layer.NextLayer) -> str | None:
    """Replace a layer decision that would speak anything but HTTP or TLS. Runs after
    mitmproxy's own `next_layer` (later addons see its choice). Returns the name of the layer
    it replaced, or None."""
    chosen = nextlayer.layer
    if chosen is None:  # undecided: mitmproxy asks again when more bytes arrive
        return None
    stack = nextlayer.context.layers
    # A layer appends itself to the context when built: the decision's layers are the tail.
    built = stack[stack.index(chosen):] if chosen in stack else [chosen]
    refused = next((type(one).__name__ for one in built if type(one) not in _SPOKEN), None)
    if refused is None:
        return None
    for one in built:
        if one in stack:
            stack.remove(one)
    context = nextlayer.context
    if context.client.transport_protocol == "tcp":
        nextlayer.layer = HttpLayer(context, HTTPMode.transparent)
    else:
        nextlayer.layer = Refused(context)
    return refused
