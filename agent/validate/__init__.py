"""Active validation of a GPU node: NCCL all-reduce, nvbandwidth, DCGM diagnostics, GPUDirect RDMA loopback
and the passive checks, judged against a per-SKU table (docs/validate.md).

``gpu-node-agent validate`` (agent/validate/cli.py) and the daemon's validation service (after a repair, on a
schedule: agent/validate/service.py) call ``agent.validate.checks.run_validation``; the report's types, levels
and check names are in gna_types/validation.py. Neither imports the checks before a run needs them: the daemon
does not carry the tool runners and their parsers while it only waits (bench/node_footprint.py).
"""

from gna_types.validation import CHECKS, LEVELS, NODE_VALIDATION, CheckResult, ValidationReport

__all__ = ["CHECKS", "LEVELS", "NODE_VALIDATION", "CheckResult", "ValidationReport"]
