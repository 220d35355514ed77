"""Simulated GPU nodes (a host-root tree laid out like real /sys, /proc, /dev) and the demo fleet."""
