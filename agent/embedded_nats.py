"""The embedded nats-server a node without a NATS URL runs (``[embedded_nats]``; the demo, a single node).

Started once, as the agent's child (it dies with its parent); its URL is written to
``<state_dir>/nats.url`` for the node's own commands (``events``, ``top`` with ``--state-dir``), and the
port of the last run is reused so that those commands keep finding it. A configured port that is busy is
an error; a remembered one that is busy is replaced by a free one (logged).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import structlog

from agent.config import EmbeddedNatsConfig
from agent.nats_server import NatsServerProcess, free_port

log = structlog.get_logger(__name__)


def start_embedded_nats(emb: EmbeddedNatsConfig, state_dir: Path) -> NatsServerProcess:
    url_file = state_dir / "nats.url"
    port = emb.port
    if not port and url_file.exists():
        with contextlib.suppress(ValueError):
            port = int(url_file.read_text().strip().rsplit(":", 1)[1])
    server = NatsServerProcess(state_dir / "nats", host=emb.host, port=port or free_port(emb.host),
                               die_with_parent=True)
    try:
        server.start()
    except (OSError, RuntimeError, TimeoutError):
        if emb.port:
            raise
        log.warning("embedded_nats_port_busy", port=server.port)
        server.port = free_port(emb.host)
        server.start()
    url_file.write_text(server.url + "\n")
    log.info("embedded_nats_started", url=server.url, store=str(server.store_dir))
    return server
