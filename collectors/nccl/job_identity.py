"""Jobs named as operators name them: a pod's training job, a Slurm job -- the commId stays a detail.

Kubernetes: the pod's labels and owner references, read from the API server (``GET
/api/v1/namespaces/<ns>/pods/<name>``, lightkube; RBAC ``get pods``), cached per pod UID. The label keys
the job controllers set on every pod they create, in this order of preference:

- ``training.kubeflow.org/job-name`` (Kubeflow training-operator v1: PyTorchJob, MPIJob, ...; the kind is
  the owner reference's when it is in ``kubeflow.org``),
- ``jobset.sigs.k8s.io/jobset-name`` (JobSet; its pods are owned by a batch Job of the JobSet),
- ``volcano.sh/job-name`` (Volcano's ``batch.volcano.sh`` Job),
- ``batch.kubernetes.io/job-name`` (a batch/v1 Job, Kubernetes 1.27+; ``job-name`` before),
- else the controller owner reference (``kind``/``name``).

Slurm: ``SLURM_JOB_ID`` in the process's environment, then ``scontrol show job --oneliner <id>`` for its
name, user and output files (SchedMD/slurm src/scontrol/info_job.c, read at 284c3b95f0: with --oneliner the
fields are separated by one space -- "JobId=%u ", "JobName=%s", "UserId=%s(%u)", and for a batch job
"StdErr=%s"/"StdOut=%s" as slurm_get_job_stdout renders them), cached per job. A JobName with spaces is
cut at the first one (the pairs are split on spaces).

Names are ``namespace/name (Kind)`` and ``slurm:<id> (<name>)``, bounded; a lookup that fails is counted
(``errors``) and the commId stands alone.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

NAME_MAX = 320  # "namespace/name (Kind)": 63 + 1 + 253 characters at most, then the kind
CACHE_MAX = 4096
TTL_S = 600.0  # a pod's owner never changes; a failure is retried after this
_LABELS = (("training.kubeflow.org/job-name", None), ("jobset.sigs.k8s.io/jobset-name", "JobSet"),
           ("volcano.sh/job-name", "VolcanoJob"), ("batch.kubernetes.io/job-name", "Job"), ("job-name", "Job"))
_KIND = re.compile(r"[A-Za-z][A-Za-z0-9]{0,62}")
_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,252}")
_SLURM_ID = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9})?")
_SCONTROL_KV = re.compile(r"(\w+)=(\S*)")


@dataclass(frozen=True)
class JobName:
    name: str  # "team-a/llama-70b (PyTorchJob)", "slurm:1234 (llama)"
    kind: str  # "PyTorchJob", "JobSet", ..., "slurm"
    owner: str | None = None  # Slurm's user
    uid: int | None = None  # Slurm's user's uid ("UserId=alice(1000)")
    outputs: tuple[str, ...] = ()  # Slurm's StdOut/StdErr: where the job's tasks print (absolute paths)


def job_of_pod(namespace: str, labels: dict[str, Any], owners: list[dict[str, Any]]) -> JobName | None:
    """The training job a pod belongs to, from its labels and owner references; None for a bare pod."""
    controller = next((o for o in owners if isinstance(o, dict) and o.get("controller")), None) or (
        owners[0] if owners and isinstance(owners[0], dict) else None)
    for key, kind in _LABELS:
        value = labels.get(key)
        if isinstance(value, str) and _NAME.fullmatch(value):
            if kind is None:  # Kubeflow: the owner's kind, when the owner is the job
                api = str((controller or {}).get("apiVersion", ""))
                owner_kind = str((controller or {}).get("kind", ""))
                kind = owner_kind if "kubeflow.org" in api and _KIND.fullmatch(owner_kind) else "KubeflowJob"
            return JobName(f"{namespace}/{value} ({kind})"[:NAME_MAX], kind)
    if controller is not None:
        kind, name = str(controller.get("kind", "")), str(controller.get("name", ""))
        if _KIND.fullmatch(kind) and _NAME.fullmatch(name):
            return JobName(f"{namespace}/{name} ({kind})"[:NAME_MAX], kind)
    return None


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job --oneliner``'s Key=Value pairs (the first job's; values without spaces)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    return {k: v[:4096] for k, v in _SCONTROL_KV.findall(first[:65536])}


_UID = re.compile(r"\((\d{1,10})\)")
OUTPUT_MAX = 4096  # PATH_MAX


def slurm_job(job_id: str, fields: dict[str, str]) -> JobName:
    """The job's name, user and output files. A file name pattern scontrol left unexpanded (``%t``: the task,
    ``%N``: the node, ... in sbatch's filename patterns) becomes a glob of its place."""
    name = fields.get("JobName", "")[:128]
    user_field = fields.get("UserId", "")
    user = user_field.split("(")[0][:64] or None
    uid_m = _UID.search(user_field)
    outputs: list[str] = []
    for key in ("StdOut", "StdErr"):
        path = fields.get(key, "")
        if path.startswith("/") and len(path) <= OUTPUT_MAX and path != "/dev/null" and "\0" not in path:
            path = re.sub(r"%%", "%", re.sub(r"%[A-Za-z]", "*", path)) if "%" in path else path
            if path not in outputs and not any(c in path for c in "[]?"):
                outputs.append(path)
    return JobName(f"slurm:{job_id}" + (f" ({name})" if name else ""), "slurm", user,
                   int(uid_m.group(1)) if uid_m else None, tuple(outputs))


class JobNames:
    """Looks jobs up, in the background, once per pod or Slurm job; ``get`` never waits."""

    def __init__(self, *, kube: Any = None, scontrol: str | None = "scontrol", timeout: float = 5.0) -> None:
        self.kube = kube  # a lightkube AsyncClient, or None (no API server: pods are not named)
        self.scontrol = scontrol
        self.timeout = timeout
        self._cache: OrderedDict[str, tuple[float, JobName | None]] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.errors: dict[str, int] = {}

    def get(self, key: str) -> JobName | None:
        hit = self._cache.get(key)
        return hit[1] if hit else None

    def _known(self, key: str) -> bool:
        hit = self._cache.get(key)
        return hit is not None and (hit[1] is not None or time.monotonic() - hit[0] < TTL_S)

    def _put(self, key: str, value: JobName | None) -> None:
        self._cache[key] = (time.monotonic(), value)
        self._cache.move_to_end(key)
        while len(self._cache) > CACHE_MAX:
            self._cache.popitem(last=False)

    def _error(self, why: str) -> None:
        self.errors[why] = self.errors.get(why, 0) + 1

    def want_pod(self, namespace: str, pod: str, uid: str) -> None:
        if self.kube is None or self._known(f"pod:{uid}"):
            return
        self._put(f"pod:{uid}", None)  # asked once per TTL, however many lines arrive meanwhile
        self._spawn(self._pod(namespace, pod, uid))

    def want_slurm(self, job_id: str) -> None:
        if not self.scontrol or not _SLURM_ID.fullmatch(job_id) or self._known(f"slurm:{job_id}"):
            return
        self._put(f"slurm:{job_id}", JobName(f"slurm:{job_id}", "slurm"))  # named by id until scontrol answers
        self._spawn(self._slurm(job_id))

    def _spawn(self, coro: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Wait for the lookups in flight (``check``: the names before the report)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.timeout + 1)

    async def _pod(self, namespace: str, pod: str, uid: str) -> None:
        try:
            from lightkube import ApiError
            from lightkube.resources.core_v1 import Pod

            try:
                got = await asyncio.wait_for(self.kube.get(Pod, pod, namespace=namespace), self.timeout)
            except ApiError as exc:
                self._error(f"api_{exc.status.code}")
                return
            meta = got.metadata
            if meta is None or meta.uid != uid:
                self._error("uid_mismatch")  # a pod of the same name, not the one whose log this is
                return
            owners = [{"kind": o.kind, "name": o.name, "apiVersion": o.apiVersion, "controller": o.controller}
                      for o in (meta.ownerReferences or [])]
            self._put(f"pod:{uid}", job_of_pod(namespace, dict(meta.labels or {}), owners))
        except (TimeoutError, OSError) as exc:
            self._error(type(exc).__name__)
        except Exception as exc:  # a client library's own error: counted, the commId stands alone
            self._error(type(exc).__name__)

    async def _slurm(self, job_id: str) -> None:
        exe = shutil.which(self.scontrol) if self.scontrol else None
        if exe is None:
            self._error("no_scontrol")
            return
        try:
            proc = await asyncio.create_subprocess_exec(exe, "show", "job", "--oneliner", job_id,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.DEVNULL)
            out, _ = await asyncio.wait_for(proc.communicate(), self.timeout)
        except (TimeoutError, OSError) as exc:
            self._error(type(exc).__name__)
            return
        if proc.returncode != 0:
            self._error("scontrol_failed")
            return
        fields = parse_scontrol(out[:1 << 20].decode("utf-8", "replace"))
        if fields.get("JobId", "").split("_")[0] != job_id.split("_")[0]:
            self._error("scontrol_other_job")
            return
        self._put(f"slurm:{job_id}", slurm_job(job_id, fields))
