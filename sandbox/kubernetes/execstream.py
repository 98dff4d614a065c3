"""A command in a pod, its standard input and output joined to a local socket: the Kubernetes
exec API (`pods/exec`, a WebSocket through the API server to the kubelet), as the sandbox
backend's link to the agent in each pod (`backend`, `guest/carry.py`).

The subprotocol is `v4.channel.k8s.io`, which every API server since 1.4 speaks: each binary
message is one channel's bytes after a byte naming the channel (0 standard input, 1 standard
output, 2 standard error, 3 the command's end as a `Status`). Standard error is the pod's end's
own complaints (a Python traceback, at worst): never a command's output, which travels inside
the frames on standard output, so it is dropped. kubernetes-asyncio's `WsApiClient` opens the
WebSocket with the configuration's credentials and TLS; the token never leaves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Sequence
from typing import Any

import aiohttp

from ..errors import SandboxError

_STDIN, _STDOUT, _ERROR = 0, 1, 3
_CHUNK = 1 << 16
# The exec's own messages are bounded by what the pod's end sends: frames of at most 64 KiB of
# payload plus a header, each in one message, far below this.
_MAX_MESSAGE = 1 << 20


class ExecError(SandboxError):
    """The exec could not be opened (the pod is gone, the API refused, no route)."""


async def open_exec(ws_api: Any, namespace: str, pod: str, container: str | None,
                    command: Sequence[str]) -> aiohttp.ClientWebSocketResponse:
    """The exec's WebSocket, open. Raises ExecError saying why not."""
    from kubernetes_asyncio import client

    kwargs: dict[str, Any] = {"container": container} if container else {}
    # Typed as taking one string; the WebSocket client sends a list as one `command` each.
    core: Any = client.CoreV1Api(ws_api)
    try:
        opening = await core.connect_get_namespaced_pod_exec(
            pod, namespace, command=list(command), stdin=True, stdout=True, stderr=True,
            tty=False, _preload_content=False, **kwargs)
        ws: aiohttp.ClientWebSocketResponse = await opening.__aenter__()
    except aiohttp.WSServerHandshakeError as exc:
        raise ExecError(f"the API refused the exec into pod {namespace}/{pod}: "
                        f"{exc.status} {exc.message[:200]}") from None
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        raise ExecError(f"no exec into pod {namespace}/{pod}: {type(exc).__name__}") from None
    return ws


async def join(ws: aiohttp.ClientWebSocketResponse, sock: socket.socket) -> None:
    """Relay between the exec and `sock` (non-blocking) until either ends; then both are
    closed. The exec's output waits for `sock`'s reader, so a slow reader holds the pod back
    through the WebSocket's own flow control, never this process's memory."""
    loop = asyncio.get_running_loop()

    async def up() -> None:
        while data := await loop.sock_recv(sock, _CHUNK):
            await ws.send_bytes(bytes([_STDIN]) + data)

    async def down() -> None:
        async for message in ws:
            if message.type is not aiohttp.WSMsgType.BINARY:
                return  # closed, or an error: the exec is over
            data: bytes = message.data
            if len(data) > _MAX_MESSAGE:
                return
            if data[:1] == bytes([_STDOUT]) and len(data) > 1:
                await loop.sock_sendall(sock, data[1:])
            elif data[:1] == bytes([_ERROR]):
                return  # the command ended (its status is the link's end, nothing more)

    tasks = [asyncio.create_task(up()), asyncio.create_task(down())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, OSError, aiohttp.ClientError):
                await task
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        await ws.close()
