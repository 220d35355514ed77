"""NCCL and PyTorch as a training job writes them: the nccl_logs collector and what it is made of.

Sources -> transforms -> sinks, one module each:

- ``line``: NCCL's line prefix (src/debug.cc) split off a raw line, every prefix field bounded.
- ``prefilter``: the byte scan that decides which lines are decoded at all; its needles (and
  bench/nccl_ingest.py's grep pattern) are the union of the rules' own.
- ``repeats``: the lines NCCL repeats (a channel per connection, ``Using network`` per communicator): the
  first of each kind per process decoded, the rest counted by a byte-level key and applied at once.
- ``rules/``: one module per rule -- its needles, its pattern, the fields it yields with their bounds, how
  it changes a process's state and which typed message it emits. ``rules.RULES`` is the ordered registry.
- ``matching``: a line against the registry: the first rule that matches, or a rejection (a field longer
  than NCCL or PyTorch print), or an ``NCCLWarning`` for a WARN line no rule explains.
- ``process``: what one NCCL process said so far (communicators, transport, NICs, PyTorch's progress).
- ``hca_names``: NCCL_IB_HCA's prefix matching, and HCA names in natural order.
- ``rank_paths``: a rank's GPU, its NICs and NCCL_NET_GDR_LEVEL against the node's PCIe tree.
- ``hang_evidence``: what a hung job offers live (NCCL's RAS port, PyTorch's Flight Recorder dumps).
- Format libraries, pure (no I/O policy, no emitting): ``ras_protocol`` (NCCL's RAS client protocol and
  its reports), ``flight_recorder`` (PyTorch's Flight Recorder dumps).
- ``plugin``: the collector (``NCCLLogsCollector``): tails the logs, keeps per-process state, emits the
  rules' messages with severity and action from gna_types.policy, and judges conditions over the state.
"""
