"""Remediation plugins, registered as ``gpu_node_agent.remediations`` entry points (see gna_sdk.Remediation)."""
