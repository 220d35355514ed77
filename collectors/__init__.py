"""Collectors: one module per thing watched. Registered as ``gpu_node_agent.collectors`` entry points."""
