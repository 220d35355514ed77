"""The report of an active validation (``gpu-node-agent validate``, the post-repair check), as typed,
bounded Structs: the node publishes it as a ``NodeValidation`` message's details and the fleet decodes it
with :func:`decode`.

One report per run: its ``verdict`` ("passed", "failed", "busy": refused because processes held the GPUs,
"unavailable": no check could run) and one :class:`CheckResult` per check of the level, each with the
figures it measured, the thresholds it was held to (and where each came from), the tool's argv and how long
it ran. docs/validate.md describes the checks and the thresholds' sources.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from gna_types.detail_fields import Citation, Name, Seconds, Word

NODE_VALIDATION: Final = "NodeValidation"  # the message type the report travels as
MAX_CHECKS: Final = 64
MAX_FIGURES: Final = 4096  # an 8x8 P2P matrix is 56 figures; 64 HCAs x a few
MAX_ARGV: Final = 64
MAX_NOTES: Final = 32

Verdict = Literal["passed", "failed", "busy", "unavailable"]
Status = Literal["passed", "failed", "skipped", "error"]
Level = Literal["quick", "standard", "full"]
LEVELS: Final = ("quick", "standard", "full")  # each runs the checks of the one before and more (docs/validate.md)
CHECKS: Final = ("passive", "nccl_allreduce", "nvbandwidth", "dcgm_diag", "ib_write_bw")  # agent/validate/checks.py
Reason = Annotated[str, Meta(max_length=2000, description="why a check has its status, in words")]
Arg = Annotated[str, Meta(max_length=4096)]
FigureName = Annotated[str, Meta(max_length=128, description="a measured quantity: busbw, h2d:GPU0, mlx5_0:1")]
Figure = Annotated[float, Meta(ge=0)]
Note = Annotated[str, Meta(max_length=500)]


class CheckResult(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    name: Word  # passive | nccl_allreduce | nvbandwidth | dcgm_diag | ib_write_bw | topology
    status: Status
    reason: Reason = ""
    figures: Annotated[dict[FigureName, Figure], Meta(max_length=MAX_FIGURES)] = msgspec.field(default_factory=dict)
    thresholds: Annotated[dict[FigureName, Figure], Meta(max_length=MAX_FIGURES)] = msgspec.field(
        default_factory=dict)  # each figure's minimum, by the figure's name (or its kind: "p2p")
    sources: Annotated[dict[Word, Citation], Meta(max_length=16)] = msgspec.field(default_factory=dict)
    argv: Annotated[list[Arg], Meta(max_length=MAX_ARGV)] = msgspec.field(default_factory=list)
    rc: int | None = None  # the tool's exit status (None: not run, or killed at its timeout)
    duration_s: Seconds = 0.0


class ValidationReport(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    node: Name
    level: Level
    verdict: Verdict
    reason: Reason = ""
    sku: Word = ""  # the table row the thresholds came from ("" none)
    gpu_model: Name = ""
    gpu_count: Annotated[int, Meta(ge=0, le=1024)] = 0
    forced: bool = False  # run although processes held the GPUs
    # "<pid> <comm> -> /dev/nvidia<n>" of each process that held a GPU
    holders: Annotated[list[Note], Meta(max_length=MAX_NOTES)] = msgspec.field(default_factory=list)
    notes: Annotated[list[Note], Meta(max_length=MAX_NOTES)] = msgspec.field(default_factory=list)
    checks: Annotated[list[CheckResult], Meta(max_length=MAX_CHECKS)] = msgspec.field(default_factory=list)
    started: Annotated[float, Meta(ge=0)] = 0.0  # Unix time
    ended: Annotated[float, Meta(ge=0)] = 0.0

    def to_details(self) -> dict[str, Any]:
        """The report as a message's ``details`` (JSON-ready builtins)."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)


def decode(data: bytes | str | dict[str, Any]) -> ValidationReport:
    """A report from its JSON or its details dict; raises msgspec.ValidationError past any bound."""
    if isinstance(data, dict):
        return msgspec.convert(data, ValidationReport)
    return msgspec.json.decode(data, type=ValidationReport)
