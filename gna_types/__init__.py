"""The vocabulary node and fleet share: what an entity string is and how it is built and read, the PCI
address's one normal form, the names of the reasons the fleet keys on. It imports nothing else of this
project (an import-linter contract keeps it so): a collector, the node runtime and the fleet all take
their words from here, so ``gpu:<pci>`` built on a node is the ``gpu:<pci>`` the fleet matches.

Modelled on node-problem-detector's ``pkg/types`` (types with no internal dependencies).
"""
