"""The Kubernetes API's configuration, for every part that talks to it (the pod watcher,
`sealgate.kube`; sandboxd's Kubernetes backend, `sealgate.sandbox.kubernetes`): a kubeconfig
file if one is named, else the pod's own service account (in-cluster). kubernetes-asyncio is
imported only here and when called: it is an extra (`sealgate[kube]`).
"""

from __future__ import annotations

from typing import Any

from .reasons import SealgateError


class KubeApiError(SealgateError):
    """No API to talk to: the client is not installed, or no configuration could be read."""


async def configuration(kubeconfig: str | None) -> Any:
    """A kubernetes-asyncio `Configuration`. Raises KubeApiError saying why not (never with
    the configuration's contents: a kubeconfig holds a token)."""
    try:
        from kubernetes_asyncio import client, config
        from kubernetes_asyncio.config.config_exception import ConfigException
    except ImportError:
        raise KubeApiError("needs kubernetes-asyncio (pip install 'sealgate[kube]')") from None
    made = client.Configuration()
    try:
        if kubeconfig:
            await config.load_kube_config(config_file=kubeconfig, client_configuration=made)
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=made)
    except (ConfigException, OSError, ValueError) as exc:
        raise KubeApiError(f"no Kubernetes API: {type(exc).__name__}: "
                           f"{str(exc)[:200]}") from None
    return made
