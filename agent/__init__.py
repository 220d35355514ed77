"""gpu-node-agent: the GPU data-plane node agent."""

__version__ = "0.1.0"
