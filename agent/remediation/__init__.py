"""The node's remediation runtime: policy rules, the engine that plans and audits, plugin loading, the fleet budget."""
