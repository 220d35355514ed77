"""The node labels NVIDIA's GPU Feature Discovery (GFD) wrote for Node Feature Discovery to publish.

Writer: NVIDIA/k8s-device-plugin v0.20.0 (GFD lives there since v0.15.0; gpu-feature-discovery is archived):
internal/lm/output.go ``toWriter.Output`` prints each label as ``fmt.Fprintf("%s=%s\\n", k, v)`` and
``toFile.Output`` replaces the file atomically (renameio.WriteFile); the default path is the ``--output-file``
flag's value in cmd/gpu-feature-discovery/main.go, ``/etc/kubernetes/node-feature-discovery/features.d/gfd``
(NFD's local feature source reads that directory). With ``useNodeFeatureAPI`` GFD writes a NodeFeature object
instead and no file exists: nothing to compare then.

The labels read here (internal/lm/mig-strategy.go, resource.go, timestamp.go):

- ``nvidia.com/mig.strategy``: ``single`` or ``mixed``, set only when GFD runs with one of them
  (``newMigLabeler`` is not called for ``none``): no such label means ``none``.
- ``nvidia.com/gpu.count``: whole GPUs; under ``single`` the number of MIG devices, and ``0`` with
  ``nvidia.com/gpu.product=<model>-MIG-INVALID`` when the node's MIG layout is invalid for ``single``
  (``newInvalidMigStrategyLabeler``).
- ``nvidia.com/mig-<profile>.count``: under ``mixed``, the MIG devices of each profile
  (``newMigStrategyMixedLabeler``: resource name ``nvidia.com/mig-<name>``).
- ``nvidia.com/gfd.timestamp``: Unix seconds of the labelling, unless ``--no-timestamp``.

Bounded: at most ``MAX_BYTES`` read, ``MAX_LABELS`` kept; a label name over 317 characters (a 253-character
DNS prefix, ``/``, a 63-character name) or a value over 63 (Kubernetes label values) is counted, not kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gna_sdk import HostPaths

DEFAULT_PATH = "/etc/kubernetes/node-feature-discovery/features.d/gfd"
MAX_BYTES = 64 * 1024
MAX_LABELS = 512
MAX_NAME, MAX_VALUE = 317, 63
_MIG_COUNT = re.compile(r"^nvidia\.com/mig-(?P<profile>[A-Za-z0-9.+_-]{1,48})\.count$")


@dataclass
class GFDLabels:
    labels: dict[str, str] = field(default_factory=dict)
    unparsed: int = 0  # lines that are no label, or past a bound

    @property
    def strategy(self) -> str:
        """GFD's --mig-strategy as its labels tell it: no ``nvidia.com/mig.strategy`` label is ``none``."""
        return self.labels.get("nvidia.com/mig.strategy", "none")

    def _count(self, name: str) -> int | None:
        value = self.labels.get(name, "")
        return int(value) if value.isdigit() and len(value) <= 9 else None

    @property
    def invalid_single(self) -> bool:
        """GFD found the MIG layout invalid for ``single`` (product ``...-MIG-INVALID``, count 0)."""
        return self.labels.get("nvidia.com/gpu.product", "").endswith("-MIG-INVALID")

    def mig_devices(self) -> int | None:
        """The MIG devices GFD labelled: the sum of ``nvidia.com/mig-*.count`` under ``mixed``, ``gpu.count`` under a
        valid ``single``; None when its labels do not say (``none``, an invalid ``single``, a count unreadable)."""
        if self.strategy == "mixed":
            counts = [self._count(k) for k in self.labels if _MIG_COUNT.fullmatch(k)]
            return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
        if self.strategy == "single" and not self.invalid_single:
            return self._count("nvidia.com/gpu.count")
        return None


def parse(text: str) -> GFDLabels:
    """GFD's feature file -> its labels. Never raises; blank and ``#`` lines are skipped, others counted."""
    out = GFDLabels()
    for raw in text[:MAX_BYTES].splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, eq, value = line.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name or len(name) > MAX_NAME or len(value) > MAX_VALUE or len(out.labels) >= MAX_LABELS \
                or not name.isprintable() or not value.isprintable():
            out.unparsed += 1
            continue
        out.labels[name] = value
    return out


def read(host: HostPaths, path: str = DEFAULT_PATH) -> GFDLabels | None:
    """The file under the host root; None when it does not exist (no GFD, or GFD on the NodeFeature API)."""
    text = host.read_text(path, MAX_BYTES)
    return None if text is None else parse(text)
