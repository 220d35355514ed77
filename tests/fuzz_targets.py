"""One entry point that feeds arbitrary bytes to every parser (hypothesis and atheris drive it).

Run under atheris: ``python -m tests.fuzz_targets -atheris_runs=100000``.
"""

from __future__ import annotations

import sys

from agent.spool import decode_frames
from collectors import kernel_modules, nccl_env
from collectors.formats import ib_sysfs
from collectors.formats import juicefs_files as juicefs_parse
from collectors.formats import kmsg_records as kmsg_parse
from collectors.nccl import flight_recorder, line, matching, prefilter
from collectors.nccl import ras_protocol as nccl_ras


def fuzz_one(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    decode_frames(data)
    kmsg_parse.parse_record(data)
    for _ in kmsg_parse.iter_text_records(data):
        pass
    kmsg_parse.NvidiaLineParser().feed(text)
    ib_sysfs.parse_enum(text)
    ib_sysfs.parse_rate(text)
    ib_sysfs.parse_counter(data)
    kernel_modules.parse_proc_modules(text)
    juicefs_parse.parse_mounts(text)
    juicefs_parse.parse_stats(text)
    juicefs_parse.parse_config(text, "/m")
    juicefs_parse.parse_mount_argv(["juicefs", "mount", *text.split("\0")])
    juicefs_parse.parse_size(text)
    nccl_env.parse_environ(data)
    for off, raw in prefilter.candidate_lines(data, 0):
        matching.match_line(line.parse_line(off, raw))
    matching.match_line(line.parse_line(0, data))
    try:
        flight_recorder.load_dump(data)
    except flight_recorder.FRDumpError:
        pass  # refusing is the expected answer to most bytes
    nccl_ras.parse_status_text(text)
    nccl_ras.parse_status_json(data)
    nccl_ras.ras_address({"NCCL_RAS_ADDR": text, "NCCL_RAS_ENABLE": text[:4]})


if __name__ == "__main__":  # pragma: no cover - exercised only where atheris installs
    import atheris

    atheris.Setup(sys.argv, fuzz_one)
    atheris.Fuzz()
