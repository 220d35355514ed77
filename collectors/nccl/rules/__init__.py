"""The registry: every NCCL and PyTorch line the nccl_logs collector reads, one module per rule.

Order is priority: a line is decided by the first rule that matches it (``Using network`` before
``NET/IB : ...``; a channel line before anything else that could appear in its text). Adding a rule is
adding its module and its line here; the prefilter's needles, the bench's grep pattern, the bounds and the
documentation follow from the rules themselves. Strings checked against NCCL's sources 2.18-2.30 and
PyTorch 2.1-2.14 (tests/golden/, tests/test_nccl_formats.py).
"""

from __future__ import annotations

from collectors.nccl.rule import Rule
from collectors.nccl.rules import (
    channel_net,
    channel_shm,
    env_hca,
    env_param,
    gdr,
    heartbeat,
    ib_async,
    ib_completion,
    ib_no_device,
    ib_no_verbs,
    ib_using,
    init,
    network,
    pg_dump_signal,
    pg_periodic,
    pg_progress,
    socket_error,
    socket_using,
    version,
    warn,
    watchdog,
)

RULES: tuple[Rule, ...] = (
    network.RULE,
    ib_no_device.RULE,
    ib_no_verbs.RULE,
    ib_using.RULE,
    socket_using.RULE,
    gdr.RULE,
    channel_net.RULE,
    channel_shm.RULE,
    version.RULE,
    init.RULE,
    env_hca.RULE,
    env_param.RULE,
    ib_completion.RULE,
    ib_async.RULE,
    socket_error.RULE,
    watchdog.RULE,
    heartbeat.RULE,
    pg_progress.RULE,
    pg_dump_signal.RULE,
    pg_periodic.RULE,
)
WARNING_RULE: Rule = warn.RULE  # a WARN line no rule in RULES explains
RULES_BY_NAME: dict[str, Rule] = {r.name: r for r in (*RULES, WARNING_RULE)}
assert len(RULES_BY_NAME) == len(RULES) + 1, "two rules of one name"
