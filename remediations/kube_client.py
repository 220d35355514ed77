"""The Kubernetes client every Kubernetes remediation plugin builds the same way (lightkube)."""

from __future__ import annotations

import importlib.util
from typing import Any


def require_lightkube() -> None:
    """Raise at the plugin's load (the loader lists it as unavailable, with this), not at its first action."""
    if importlib.util.find_spec("lightkube") is None:
        raise RuntimeError("needs the lightkube library: pip install 'gpu-node-agent[kubernetes]'")


def kube_client(kubeconfig: str) -> Any:
    """An async client from ``kubeconfig``, or the in-cluster service account when it is empty; every write
    names the field manager ``gpu-node-agent``."""
    from lightkube import AsyncClient
    from lightkube.config.kubeconfig import KubeConfig

    cfg = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
    return AsyncClient(config=cfg, field_manager="gpu-node-agent")


class LazyClient:
    """A plugin's ``client()``: the client given (tests), else built at its first use, so a plugin loads without
    reaching the API; lightkube is checked at once when ``needed`` (the plugin's method uses Kubernetes)."""

    def __init__(self, kubeconfig: str, client: Any = None, *, needed: bool = True) -> None:
        if client is None and needed:
            require_lightkube()
        self.kubeconfig = kubeconfig
        self._client = client

    def __call__(self) -> Any:
        if self._client is None:
            self._client = kube_client(self.kubeconfig)
        return self._client
