"""The least a Python process does for a base-URL request: the floor bench/forwarder_floor.py
measures sealgate against.

    python bench/floorproxy.py CA_FILE LISTEN_PORT

Plain HTTP/1.1 in (`GET /_/host:port/path`, keep-alive), verified TLS out on asyncio's loop and
the standard `ssl` module, on an upstream connection kept across requests and client
connections; the answer's head and its Content-Length body back. No decision, no credential,
no audit line, no bounds, no chunked bodies, no error answers: a well-formed request to a
well-behaved origin, which is all the benchmark sends. Never a proxy to run.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys

_KEPT = 64  # idle upstream connections kept for the next client connection
_DROPPED = (b"proxy-authorization", b"connection", b"host")

Upstream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Floor:
    def __init__(self, cafile: str) -> None:
        self.tls = ssl.create_default_context(cafile=cafile)
        self.idle: list[Upstream] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = self.idle.pop() if self.idle else None
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                line, _, fields = head.partition(b"\r\n")
                method, target, _ = line.split(b" ", 2)
                authority, _, path = target.removeprefix(b"/_/").partition(b"/")
                host, _, port = authority.partition(b":")
                kept = [f for f in fields.split(b"\r\n")
                        if f and f.partition(b":")[0].strip().lower() not in _DROPPED]
                if upstream is None:
                    upstream = await asyncio.open_connection(
                        "127.0.0.1", int(port), ssl=self.tls, server_hostname=host.decode())
                upstream[1].write(b"%s /%s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (
                    method, path, host, b"".join(f + b"\r\n" for f in kept)))
                answer = await upstream[0].readuntil(b"\r\n\r\n")
                length = next((int(f.partition(b":")[2]) for f in answer.split(b"\r\n")
                               if f.partition(b":")[0].lower() == b"content-length"), 0)
                writer.write(answer + await upstream[0].readexactly(length))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client's end
        finally:
            writer.close()
            if upstream is not None and not upstream[1].is_closing() and len(self.idle) < _KEPT:
                self.idle.append(upstream)
            elif upstream is not None:
                upstream[1].close()


async def main(cafile: str, port: int) -> None:
    floor = Floor(cafile)
    server = await asyncio.start_server(floor.serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(sys.argv[1], int(sys.argv[2])))
