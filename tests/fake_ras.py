"""A loopback stand-in for a NCCL RAS thread's client socket (src/ras/client_support.cc rasClientEventLoop).

It answers the way the real server does, command by command (case-insensitive, "\\r\\n" accepted):
``CLIENT PROTOCOL x`` -> ``SERVER PROTOCOL <protocol>``; ``TIMEOUT n`` -> ``OK`` or ``ERROR: Invalid timeout value``;
``SET FORMAT text|json`` -> ``OK`` / ``ERROR: Invalid format`` (2.28.7+, ``json=True``) or ``ERROR: Unknown command``
(older); ``STATUS`` / ``VERBOSE STATUS`` -> the transcript for the chosen format, then it closes; anything else ->
``ERROR: Unknown command <cmd>``. ``mode`` makes it misbehave (see MODES). Every command it got is in ``commands``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from types import TracebackType

MODES = (
    "normal",
    "silent",  # accepts, reads, never answers
    "close_on_connect",  # closes as soon as a client connects
    "close_mid_report",  # sends half the report, then closes
    "stall_mid_report",  # sends half the report, then neither sends nor closes
    "junk_greeting",  # answers CLIENT PROTOCOL with binary junk
    "half_greeting",  # answers CLIENT PROTOCOL with half a line, then closes
    "endless_line",  # answers CLIENT PROTOCOL with a line that never ends
    "junk_report",  # sends random bytes instead of the report
    "huge",  # sends 10 MB of report-looking text
    "bad_timeout",  # refuses TIMEOUT
    "odd_format_reply",  # answers SET FORMAT with something that is neither OK nor ERROR
    "trickle",  # sends the report a few bytes at a time, slowly
    "no_close",  # sends the whole report but never closes
)


class FakeRas:
    def __init__(self, text: str = "", *, json: str | None = None, protocol: int = 2, mode: str = "normal",
                 host: str = "127.0.0.1", chunk: int = 1024) -> None:
        assert mode in MODES, mode
        self.text = text
        self.json = json
        self.protocol = protocol
        self.mode = mode
        self.bind = host
        self.chunk = chunk
        self.commands: list[str] = []
        self.host = host
        self.port = 0
        self.connections = 0
        self.closed_by_client = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> FakeRas:
        self._server = await asyncio.start_server(self._serve, self.bind, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        assert self._server is not None
        self._server.close()
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self._server.wait_closed()

    def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._session(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _session(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self._talk(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.transport.abort()

    async def _drain_until_eof(self, reader: asyncio.StreamReader) -> None:
        while await reader.read(65536):
            pass
        self.closed_by_client.set()

    async def _talk(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "close_on_connect":
            return
        if self.mode == "silent":
            await self._drain_until_eof(reader)
            return
        fmt = "text"
        while True:
            raw = await reader.readline()
            if not raw:
                self.closed_by_client.set()
                return
            cmd = raw.decode("latin-1").rstrip("\n").rstrip("\r")
            self.commands.append(cmd)
            low = cmd.lower()
            if low.startswith("client protocol "):
                if self.mode == "junk_greeting":
                    writer.write(os.urandom(64).replace(b"\n", b"\0") + b"\n")
                elif self.mode == "half_greeting":
                    writer.write(b"SERVER PROT")
                    await writer.drain()
                    return
                elif self.mode == "endless_line":
                    for _ in range(64):
                        writer.write(b"S" * 4096)
                        await writer.drain()
                    await self._drain_until_eof(reader)
                    return
                else:
                    writer.write(f"SERVER PROTOCOL {self.protocol}\n".encode())
            elif low.startswith("timeout "):
                arg = cmd[len("timeout "):]
                if self.mode == "bad_timeout" or not arg.isdigit():
                    writer.write(f"ERROR: Invalid timeout value {arg}\n".encode())
                else:
                    writer.write(b"OK\n")
            elif low.startswith("set format ") and self.json is not None:
                arg = cmd[len("set format "):]
                if self.mode == "odd_format_reply":
                    writer.write(b"MAYBE\n")
                elif arg.lower() in ("text", "json"):
                    fmt = arg.lower()
                    writer.write(b"OK\n")
                else:
                    writer.write(f"ERROR: Invalid format {arg}\n".encode())
            elif low in ("status", "verbose status"):
                await self._report(reader, writer, self.json if fmt == "json" and self.json is not None else self.text)
                return
            else:
                writer.write(f"ERROR: Unknown command {cmd}\n".encode())
            await writer.drain()

    async def _report(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: str) -> None:
        data = body.encode()
        if self.mode == "junk_report":
            data = os.urandom(4096)
        elif self.mode == "huge":
            line = b"  Rank 1 -- GPU 1 managed by process 4001 on node 10.10.1.10\n"
            data = data + line * (10_000_000 // len(line))
        elif self.mode in ("close_mid_report", "stall_mid_report"):
            data = data[: len(data) // 2]
        step = 7 if self.mode == "trickle" else self.chunk
        for i in range(0, len(data), step):
            writer.write(data[i : i + step])
            await writer.drain()
            if self.mode == "trickle":
                await asyncio.sleep(0.05)
        if self.mode in ("stall_mid_report", "no_close"):
            await self._drain_until_eof(reader)
            return
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
