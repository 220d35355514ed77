"""The ``details`` of the messages the fleet reads field by field, as typed, bounded Structs.

A node's NCCL messages (collector nccl_logs) carry the process summary the correlator lives on and,
per type, the fields that decide a verdict. They are declared here once: the node writes them
(collectors/nccl_logs.py, collectors/nccl_live.py), the fleet decodes them at its boundary
(fleet/wire.py: a field of the wrong type or out of its bound is refused, counted, and shown), and
agent/schema/details.schema.json and docs/messages.md's typed-details table are generated from these
classes (``python -m gna_types.generate``; tests/test_vocabulary_generated.py keeps them equal).

Every bound is the widest a real job reaches, not a guess at a typical one: a job id is NCCL's commId
(``0x`` + 16 hex digits) or an operator's namespace/name (Kubernetes: 253 + 63); ranks up to 2^18
(262,144: larger than any job a fleet of this kind runs); a host is a DNS name (RFC 1035: 253); an HGX
node has 8-10 NICs. Only what the fleet reads is declared (a declared field of the wrong type refuses the
message); the rest is carried as it came (a message's own evidence: file, offset, line, PyTorch's
pg_desc, ...) and shown, never read.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec
from msgspec import Meta

JOB_MAX: Final = 320  # characters of a job id (gna_types/subjects.py and the fleet's wire checks use this one)
MAX_RANKS: Final = 1 << 18

JobId = Annotated[str, Meta(max_length=JOB_MAX, description="the job: the largest communicator's NCCL commId")]
Host = Annotated[str, Meta(max_length=253)]
Rank = Annotated[int, Meta(ge=0, le=MAX_RANKS - 1)]
Size = Annotated[int, Meta(ge=1, le=MAX_RANKS)]
Pid = Annotated[int, Meta(ge=0, le=(1 << 31) - 1)]
Port = Annotated[int, Meta(ge=0, le=255)]
Seq = Annotated[int, Meta(ge=-1, le=(1 << 63) - 1)]  # PyTorch prints -1 for "none yet"
Word = Annotated[str, Meta(max_length=64)]  # an HCA "mlx5_3", an HCA port "mlx5_3/1"
Words = Annotated[list[Word], Meta(max_length=64)]
PgId = Annotated[str, Meta(max_length=128)]


# gc=False (inherited by every type below, and on RasSuspect): decoded from JSON, these hold no cycle, and the
# fleet keeps one per message it files (fleet/typed_details.py; issue 21: the cycle collector's pauses)
class ProcessSummary(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """What every NCCL message's details carry about the process that wrote the line
    (collectors/nccl/process.py ``ProcessState.summary``; the job's name from collectors/nccl/job_identity.py)."""

    job: JobId | None = None
    host: Host | None = None
    pid: Pid | None = None
    world_rank: Rank | None = None
    world_size: Size | None = None
    pci: Annotated[str, Meta(max_length=32, description="the rank's GPU, NCCL's busId in PCI form")] | None = None
    hcas: Words | None = None  # what "NET/IB : Using" listed, "mlx5_0/1"
    nics: Words | None = None  # the NICs this process's channels really use
    transport: Annotated[str, Meta(max_length=32)] | None = None
    oob: Annotated[str, Meta(max_length=256)] | None = None
    # the job as operators name it, once the node's lookup answered: "team-a/llama-70b (PyTorchJob)",
    # "slurm:1234 (llama)"; shown beside the commId, never a key (a node's word about a job is not evidence)
    job_name: Annotated[str, Meta(max_length=JOB_MAX)] | None = None
    job_kind: Annotated[str, Meta(max_length=64)] | None = None
    # the line was written by another node's process (``host``) and read here in a job-wide file (srun's
    # forwarded output, a launcher's aggregated log): this node's word about another, shown and corroborated,
    # never this node's own finding (collectors/nccl/writers.py; fleet/job_facts.py files it under ``host``)
    relayed: bool = False


class JobMember(ProcessSummary, kw_only=True, omit_defaults=True):
    """``NCCLJobMember``: a process joined a communicator (NCCL's "Init COMPLETE")."""

    comm_id: JobId | None = None
    rank: Rank | None = None
    size: Size | None = None


class CollectiveTimeout(ProcessSummary, kw_only=True, omit_defaults=True):
    """``NCCLCollectiveTimeout``: PyTorch's watchdog (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp,
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=..., OpType=..., Timeout(ms)=...)")."""

    seq_num: Seq | None = None
    rank: Rank | None = None  # the world rank; None for a subgroup's
    pg_id: PgId | None = None
    # read by the fleet as for NCCLWatchdogProgress (fleet/job_facts.py JobFacts._watchdog) where a timeout
    # carries them; the node's watchdog rule writes neither (collectors/nccl/rules/watchdog.py)
    last_enqueued: Seq | None = None
    implausible: bool = False
    # "OpType=%s" (opTypeToString: ALLREDUCE, BROADCAST, _ALLGATHER_BASE, ...): a rank that issued another
    # collective than the others at the same SeqNum is desynchronised (fleet/correlator.py ``desync``)
    op_type: Annotated[str, Meta(max_length=64)] | None = None


class WatchdogProgress(ProcessSummary, kw_only=True, omit_defaults=True):
    """``NCCLWatchdogProgress``: a process group's progress as PyTorch printed it (docs/formats.md,
    "PyTorch PG status"); ``at_seq`` None for a rank that only heard of another's timeout."""

    rank: Rank | None = None
    pg_id: PgId | None = None
    at_seq: Seq | None = None
    last_enqueued: Seq | None = None
    last_completed: Seq | None = None
    signal_from_rank: Seq | None = None  # the parser keeps PyTorch's -1 .. 2^53 (collectors/nccl_parse.py)
    implausible: bool = False


class IBAsyncEvent(ProcessSummary, kw_only=True, omit_defaults=True):
    """``NCCLIBAsyncEvent``: NCCL's "NET/IB : [hca:port] Got async event : ..." (src/transport/net_ib.cc)."""

    hca: Word | None = None
    port: Port | None = None


class IBCompletionError(ProcessSummary, kw_only=True, omit_defaults=True):
    """``NCCLIBCompletionError``: NCCL's "Got completion from peer ... with status=" (src/transport/net_ib.cc)."""

    peer: Annotated[str, Meta(max_length=256)] | None = None
    hca: Word | None = None


class SocketError(ProcessSummary, kw_only=True, omit_defaults=True):
    """``NCCLSocketError``: a socket NCCL used failed (src/misc/socket.cc WARN lines); ``peer`` the other end as
    ncclSocketToString printed it (a host name or an address), ``peer_port`` its port."""

    peer: Host | None = None
    peer_port: Annotated[int, Meta(ge=0, le=65535)] | None = None


class RasSuspect(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One process NCCL's RAS points at (collectors/nccl_ras.py ``RasSuspect``)."""

    reason: Annotated[str, Meta(max_length=32)]
    host: Host | None = None
    pid: Pid | None = None
    comm_hash: Annotated[str, Meta(max_length=64)] | None = None
    rank: Rank | None = None


class RASReport(ProcessSummary, kw_only=True, omit_defaults=True):
    """``NCCLRASReport``: what NCCL's RAS port said about a hung job (docs/ras.md)."""

    suspects: Annotated[list[RasSuspect], Meta(max_length=4096)] = []


class FlightRecord(ProcessSummary, kw_only=True, omit_defaults=True):
    """``TorchFlightRecord``: a hung rank's PyTorch Flight Recorder dump, per process group
    (docs/flight_recorder.md); ``pgs`` as the fleet reads it, values checked where read."""

    rank: Rank | None = None
    pgs: Annotated[dict[Annotated[str, Meta(max_length=128)], dict[str, Any]], Meta(max_length=4096)] | None = None


class RankFailure(ProcessSummary, kw_only=True, omit_defaults=True):
    """``TorchRankFailed``: torchrun's failure report on a worker process that exited while the job ran
    (torch.distributed.elastic's ChildFailedError, collectors/formats/torch_failures.py): its rank, how it ended
    (an exit code, or a signal), the report's time; ``explanation`` what the node's own kernel log says ended
    it (the OOM killer on that pid). The summary is the worker's NCCL process where its pid is known."""

    rank: Rank | None = None  # the report's global rank (shown; the fleet takes ranks from membership)
    local_rank: Rank | None = None
    exitcode: Annotated[int, Meta(ge=-255, le=255)] | None = None
    signal: Annotated[str, Meta(max_length=16)] | None = None  # "SIGKILL"
    failed_at: Annotated[str, Meta(max_length=64)] | None = None  # the report's own "time" field
    root_cause: bool = False  # torchrun's "Root Cause (first observed failure)"
    error: Annotated[str, Meta(max_length=512)] | None = None  # the exception's first line, where printed
    explanation: Annotated[str, Meta(max_length=512)] | None = None


class BackendError(ProcessSummary, kw_only=True, omit_defaults=True):
    """``NCCLBackendError``: PyTorch raised an NCCL error on this rank (torch.distributed.DistBackendError,
    "NCCL error in: <file>:<line>, <ncclGetErrorString>, NCCL version <v>"): ``nccl_error`` the result's name
    (ncclRemoteError: a peer process exited or the network failed; ncclUnhandledCudaError: this rank's GPU),
    ``peer`` where its "Last error" names the socket's other end."""

    nccl_error: Annotated[str, Meta(max_length=40)] | None = None
    remote: bool = False  # "remote process exited or there was a network error"
    nccl_version: Annotated[str, Meta(max_length=40)] | None = None
    rank: Rank | None = None
    peer: Host | None = None
    peer_port: Annotated[int, Meta(ge=0, le=65535)] | None = None


# message type -> its details (every type of collector nccl_logs the fleet reads by field)
DETAILS_BY_TYPE: Final[dict[str, type[ProcessSummary]]] = {
    "NCCLJobMember": JobMember,
    "NCCLProcessEnded": ProcessSummary,
    "NCCLCollectiveTimeout": CollectiveTimeout,
    "NCCLWatchdogProgress": WatchdogProgress,
    "NCCLIBAsyncEvent": IBAsyncEvent,
    "NCCLIBCompletionError": IBCompletionError,
    "NCCLSocketError": SocketError,
    "NCCLRASReport": RASReport,
    "TorchFlightRecord": FlightRecord,
    "TorchRankFailed": RankFailure,
    "NCCLBackendError": BackendError,
}


def declared_bounds() -> tuple[dict[str, int], dict[str, tuple[int, int]], dict[str, int]]:
    """Every declared field's bound by name, read from the Structs above: (text -> longest, integer ->
    (lowest, highest), list or object -> most items). A consumer that cannot decode a message as its type
    (another collector's message naming a ``job`` or a ``rank``) still holds these fields to them."""
    import msgspec.inspect as mi

    text: dict[str, int] = {}
    ints: dict[str, tuple[int, int]] = {}
    lists: dict[str, int] = {}

    def bare(t: Any) -> Any:
        if isinstance(t, mi.UnionType):
            t = next((u for u in t.types if not isinstance(u, mi.NoneType)), t)
        return t.type if isinstance(t, mi.Metadata) else t

    for cls in {ProcessSummary, *DETAILS_BY_TYPE.values()}:
        info = mi.type_info(cls)
        assert isinstance(info, mi.StructType)
        for f in info.fields:
            t = bare(f.type)
            if isinstance(t, mi.StrType) and t.max_length is not None:
                text[f.name] = min(text.get(f.name, t.max_length), t.max_length)
            elif isinstance(t, mi.IntType) and t.ge is not None and t.le is not None:
                ints[f.name] = (t.ge, t.le)
            elif isinstance(t, mi.ListType | mi.DictType) and t.max_length is not None:
                lists[f.name] = t.max_length
    return text, ints, lists
