"""Active validation of a GPU node: NCCL all-reduce, nvbandwidth, DCGM diagnostics, GPUDirect RDMA loopback
and the passive checks, judged against a per-SKU table (docs/validate.md).

``gpu-node-agent validate`` (agent/validate/cli.py) and the remediation engine (after a repair) call
:func:`run_validation`; the report's types are in gna_types/validation.py.
"""

from agent.validate.checks import LEVELS, run_validation
from gna_types.validation import NODE_VALIDATION, CheckResult, ValidationReport

__all__ = ["LEVELS", "NODE_VALIDATION", "CheckResult", "ValidationReport", "run_validation"]
