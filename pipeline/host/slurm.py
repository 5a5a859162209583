"""Talking to a Slurm cluster through its login node: job state, submit, cancel, requeue, per-node tasks.

Every command runs on the job's ``host`` (the login node) behind its ``exec`` prefix
(:meth:`pipeline.host.remote.SSHPool.run_job`).  State comes from ``squeue`` (live jobs),
``scontrol show job -o`` (``StdOut``, ``ExitCode``; a finished job while the controller keeps
it) and ``sacct`` (where accounting is on); per-node processes from the host helper
(:func:`pipeline.host.helper.op_slurm_tasks`) run once on each node under ``srun --overlap``.
This module also owns the Slurm engine's texts (verdict lines, step details, incidents).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline import fmt
from pipeline.errors import RemoteCommandError
from pipeline.host.contract import ReadArgs, SlurmTasksArgs
from pipeline.host.probe import LogChunk, helper_argv, parse_int
from pipeline.host.remote import RemoteHosts, RemoteResult

QUERY_TIMEOUT = 30.0  #: seconds for one squeue/scontrol/sacct call
TASKS_TIMEOUT = 60.0  #: seconds for the per-node helper under srun

#: states in which a job still holds (or waits for) its allocation
ACTIVE = frozenset(
    "PENDING RUNNING SUSPENDED COMPLETING CONFIGURING REQUEUED REQUEUE_HOLD REQUEUE_FED RESIZING"
    " SIGNALING STAGE_OUT STOPPED".split()
)

_QUERY = r"""
mapfile -d '' -t args; set -- "${args[@]}"
ids="$1"; limit="$2"; n="$3"; shift 3
helper=("${@:1:$n}"); shift "$n"
declare -A tasks
while [ $# -gt 0 ] && [ "$1" != "@@reads" ]; do tasks[$1]="$2"; shift 2; done
[ $# -gt 0 ] && shift
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT; running=()
q=$(squeue -h -t all -j "$ids" -o '%i|%T|%D|%N|%r|%M' 2>"$dir/squeue.err") \
  || grep -q 'Invalid job id' "$dir/squeue.err" || { tail -c 300 "$dir/squeue.err" >&2; exit 3; }
[ -n "$q" ] && printf '%s\n' "$q"
while IFS='|' read -r id st nodes _; do
  [ "$st" = RUNNING ] && [ -n "${tasks[$id]:-}" ] || continue
  timeout -k 5 "$limit" srun --jobid="$id" --overlap -N"$nodes" --ntasks-per-node=1 --label \
    --quiet --input=all "${helper[@]}" <<< "${tasks[$id]}" >"$dir/$id.out" 2>"$dir/$id.err" &
  running+=("$id:$!")
done <<< "$q"
echo '@@scontrol'
for id in ${ids//,/ }; do scontrol show job -o "$id" 2>/dev/null; done
echo '@@sacct'
sacct -X -n -P -j "$ids" -o JobID,State,ExitCode,Reason,NNodes,NodeList 2>/dev/null
echo '@@requeues'
sacct -D -X -n -P -j "$ids" -o JobID,State,End,NodeList 2>/dev/null
echo '@@reads'
while [ $# -ge 4 ]; do
  p="$1"; off="$2"; max="$3"; want="$4"; shift 4
  st=$(stat -c '%s|%i' "$p" 2>/dev/null) || { echo "E|$p"; continue; }
  size="${st%|*}"; ino="${st#*|}"; reset=0
  if [ "$off" -gt "$size" ] || { [ -n "$want" ] && [ "$want" != "$ino" ]; }; then off=0; reset=1; fi
  echo "R|$off|$size|$ino|$reset|$p"
  [ "$max" = 0 ] || tail -c "+$((off + 1))" "$p" 2>/dev/null | head -c "$max" | base64 -w0; echo
done
for r in "${running[@]}"; do
  id="${r%%:*}"; wait "${r#*:}"; rc=$?
  echo "@@tasks|$id|$rc|$(base64 -w0 <"$dir/$id.out")|$(base64 -w0 <"$dir/$id.err")"
done
true
"""


@dataclass(frozen=True)
class Requeue:
    """One earlier run of a requeued job, as accounting keeps it (``sacct -D``)."""

    state: str  #: how that run ended: ``PREEMPTED``, ``NODE_FAIL``, ``REQUEUED`` (``scontrol requeue``)
    ended: str = ""  #: when (Slurm's ``End``, ``2024-05-01T12:00:03``)
    nodes: tuple[str, ...] = ()  #: where it ran


@dataclass(frozen=True)
class SlurmJob:
    """One job as the cluster reports it (None: unknown)."""

    id: int
    state: str  #: ``PENDING``, ``RUNNING``, ``FAILED``… (``squeue %T``; sacct's ``CANCELLED by 0`` cut)
    nodes: int = 0  #: allocated node count (``%D``); requested count while pending
    nodelist: tuple[str, ...] = ()  #: allocated nodes, expanded (``n[1-2]`` → ``n1``, ``n2``)
    reason: str = ""  #: the pending reason or why it ended (``Resources``, ``NonZeroExitCode``…)
    elapsed: float | None = None  #: seconds it has run (``%M``/``RunTime``)
    exit_code: int | None = None  #: the batch script's exit code (``ExitCode`` ``3:0`` → 3)
    signal: int | None = None  #: the signal that ended it (``0:15`` → 15), None if none
    stdout: str | None = None  #: its output file (``StdOut``)
    restarts: int = 0  #: how many times Slurm requeued it (``scontrol``'s ``Restarts``)
    partition: str = ""  #: its partition (``scontrol``'s ``Partition``)
    started: str = ""  #: when its current run started (``StartTime``, ``2024-05-01T12:00:03``)
    submitted: str = ""  #: when it was (re)queued: Slurm resets ``SubmitTime`` at a requeue
    preempting: bool = False  #: a preemption is under way (``PreemptTime`` set): it is about to be requeued
    #: its ended records before the current one (``sacct -D``), oldest first: why it was requeued
    requeues: tuple[Requeue, ...] = ()

    @property
    def active(self) -> bool:
        """Still holding or waiting for an allocation."""
        return self.state in ACTIVE


@dataclass(frozen=True)
class NodeTasks:
    """The job's task processes on one node (from the host helper under ``srun``)."""

    node: str
    pids: tuple[int, ...] = ()
    error: str | None = None

    @property
    def count(self) -> int:
        """How many task processes."""
        return len(self.pids)


TasksOrError = list[NodeTasks] | RemoteCommandError
"""One RUNNING job's tasks per node, or why its srun gave none."""


def parse_elapsed(text: str) -> float | None:
    """Seconds from Slurm's ``[days-][hours:]minutes:seconds`` (``1-02:03:04``, ``2:03``); None
    for ``INVALID``/``UNLIMITED``/anything else."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text.strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def expand_nodelist(text: str) -> tuple[str, ...]:
    """``n[1-3,5],gpu7`` → ``("n1", "n2", "n3", "n5", "gpu7")`` (Slurm's hostlist syntax, one
    bracket per name); ``""``/``(null)``/``None assigned`` → ``()``."""
    text = text.strip()
    if not text or text in ("(null)", "None assigned"):
        return ()
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?([^,]*)", text):
        head, ranges, tail = m.groups()
        for part in (ranges or "").split(","):  # no brackets: one part, ""
            lo, _, hi = part.partition("-")
            nums = [f"{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)] if hi else [lo]
            out.extend(f"{head}{n}{tail}" for n in nums)
    return tuple(out)


def _exit(text: str | None) -> dict[str, int | None]:
    """``ExitCode`` ``3:0`` as ``exit_code`` 3 and ``signal`` None (None each when unreadable)."""
    code, _, sig = (text or "").partition(":")
    ok = code.isdigit() and sig.isdigit()
    return {"exit_code": int(code) if ok else None, "signal": (int(sig) or None) if ok else None}


def parse_scontrol(line: str) -> dict[str, str]:
    """``scontrol show job -o`` (one line of ``Key=Value``) as a dict; a value runs to the next key."""
    key = r"[A-Za-z][A-Za-z0-9_:/]*"
    return {m.group(1): m.group(2) for m in re.finditer(rf"(?:^|\s)({key})=(.*?)(?=\s+{key}=|$)", line)}


def _sections(text: str) -> dict[str, list[str]]:
    """The lines of a ``_QUERY`` answer by section: ``@@squeue`` (its first), ``@@scontrol``,
    ``@@sacct``, ``@@reads`` (then the ``@@tasks|…`` lines)."""
    parts: dict[str, list[str]] = {"@@squeue": []}
    target = parts["@@squeue"]
    for line in text.split("\n"):
        if line.startswith("@@") and "|" not in line:
            target = parts.setdefault(line.strip(), [])
        else:
            target.append(line)
    return parts


def parse_reads(text: str) -> dict[str, LogChunk | None]:
    """The ``@@reads`` section of a ``_QUERY`` answer: path → its bytes from the range's ``offset``
    (the chunk's ``offset``: where the next read starts; None: unreadable)."""
    out: dict[str, LogChunk | None] = {}
    lines = iter(_sections(text).get("@@reads", []))
    for head in lines:
        if head.startswith("E|"):
            out[head[2:]] = None
        elif head.startswith("R|") and (body := next(lines, None)) is not None:
            f = head.split("|", 5)
            try:
                data = base64.b64decode(body.strip())
                out[f[5]] = LogChunk(data, int(f[1]) + len(data), int(f[2]), parse_int(f[3]), f[4] == "1")
            except (ValueError, IndexError):
                continue
    return out


def _ended_run(state: str) -> bool:
    """Whether a ``sacct -D`` record's state is that of a run that ended (``REQUEUED``: by an admin)."""
    word = (state.split() or [""])[0]
    return word == "REQUEUED" or word not in ACTIVE


def parse_query(text: str) -> dict[int, SlurmJob]:
    """The jobs in one ``_QUERY`` answer: each field from squeue if it has it, else scontrol, else sacct."""
    parts = _sections(text)
    jobs: dict[int, dict[str, object]] = {}

    def add(jid: str, state: str, nodes: str, nodelist: str, reason: str, /, **more: object) -> None:
        """Job ``jid`` as one more source reports it: what a source before it gave stays."""
        if jid.isdigit():
            fields = {
                "state": (state.split() or ["UNKNOWN"])[0],  # sacct's ``CANCELLED by 0``: cut
                "nodes": parse_int(nodes) or 0,
                "nodelist": expand_nodelist(nodelist),
                "reason": "" if reason == "None" else reason,
                **more,
            }
            jobs[int(jid)] = {**fields, **jobs.get(int(jid), {})}

    for f in (row.strip().split("|") for row in parts["@@squeue"]):
        if len(f) >= 6:
            add(*f[:5], elapsed=parse_elapsed(f[5]))
    for d in map(parse_scontrol, parts.get("@@scontrol", [])):
        fields = (d.get(k, "") for k in ("JobId", "JobState", "NumNodes", "NodeList", "Reason"))
        add(
            *fields,
            elapsed=parse_elapsed(d.get("RunTime", "")),
            stdout=d.get("StdOut"),
            restarts=parse_int(d.get("Restarts")) or 0,
            partition=d.get("Partition", ""),
            started=d.get("StartTime", ""),
            submitted=d.get("SubmitTime", ""),
            preempting=d.get("PreemptTime", "None") not in ("", "None", "Unknown"),
            **_exit(d.get("ExitCode")),
        )
    for f in (row.strip().split("|") for row in parts.get("@@sacct", [])):
        if len(f) >= 6:
            add(f[0], f[1], f[4], f[5], f[3], **_exit(f[2]))
    earlier: dict[int, list[Requeue]] = {}
    for f in (row.strip().split("|") for row in parts.get("@@requeues", [])):
        if len(f) >= 4 and f[0].isdigit() and int(f[0]) in jobs and _ended_run(f[1]):
            state = f[1].split()[0]
            earlier.setdefault(int(f[0]), []).append(Requeue(state, f[2], expand_nodelist(f[3])))
    for jid, runs in earlier.items():
        jobs[jid]["requeues"] = tuple(runs[: int(str(jobs[jid].get("restarts") or 0))])  # not its own end
    return {jid: SlurmJob(id=jid, **v) for jid, v in jobs.items()}  # type: ignore[arg-type]


def _by_task(stdout: str) -> list[list[str]]:
    """The lines of ``srun --label`` output, label cut, grouped by task (unlabelled lines dropped)."""
    tasks: dict[str, list[str]] = {}
    for label, _, body in (line.partition(": ") for line in stdout.splitlines()):
        if label.strip().isdigit():
            tasks.setdefault(label.strip(), []).append(body)
    return list(tasks.values())


def _srun_failed(
    host: str, job_id: int, what: Sequence[str], status: int | None, stderr: str
) -> RemoteCommandError:
    """An srun into job ``job_id`` on login node ``host`` that gave no answer (``what``: what it ran)."""
    why = "timed out" if status in (124, 137) else "failed"
    message = f"on {host}: srun into job {job_id} {why}: {stderr.strip()[-300:] or 'no output'}"
    argv = ["srun", f"--jobid={job_id}", "--overlap", *what]
    return RemoteCommandError(host, argv, message, exit_status=status, stderr=stderr)


def _node_tasks(host: str, job_id: int, status: int | None, stdout: str, stderr: str) -> list[NodeTasks]:
    """The per-node answers of the helper under ``srun --label`` (one JSON object per node).
    :raises RemoteCommandError: if none came back and srun exited non-zero."""
    out: list[NodeTasks] = []
    for lines in _by_task(stdout):
        for chunk in re.findall(r"\{.*?\}(?=\{|$)", "".join(lines).strip()):
            try:
                answer = json.loads(chunk)
            except ValueError:
                continue
            err = str(answer["error"]) if answer.get("error") else None
            out.append(NodeTasks(str(answer.get("node") or "?"), () if err else tuple(answer["pids"]), err))
    if not out and status != 0:
        raise _srun_failed(host, job_id, ["<pitstop host helper>", "slurm_tasks"], status, stderr)
    return sorted(out, key=lambda n: n.node)


def parse_tasks(host: str, text: str) -> dict[int, TasksOrError]:
    """The ``@@tasks|ID|STATUS|STDOUT|STDERR`` lines of a ``_QUERY`` answer (output base64): by job
    id, its tasks per node, or the :class:`RemoteCommandError` of its srun on ``host``."""
    found: dict[int, TasksOrError] = {}
    for line in text.splitlines():
        if line.startswith("@@tasks|") and len(f := line.split("|")) == 5 and f[1].isdigit():
            try:
                out, err = (base64.b64decode(x).decode(errors="replace") for x in f[3:5])
                found[int(f[1])] = _node_tasks(host, int(f[1]), parse_int(f[2]), out, err)
            except ValueError:
                continue
            except RemoteCommandError as exc:
                found[int(f[1])] = exc
    return found


@dataclass(frozen=True)
class SlurmNode:
    """One node of a cluster as Slurm shows it."""

    name: str
    state: str  #: ``scontrol show node``'s ``State``: ``MIXED+DRAIN``, ``IDLE``, ``DOWN*``…
    short: str = ""  #: ``sinfo``'s ``%t``: ``mix``, ``drng``, ``idle``, ``down*``…
    reason: str = ""  #: why it is drained or down (``Reason``), empty when none
    jobs: tuple[int, ...] = ()  #: the ids of the jobs running on it


_NODES = """scontrol show node -o || exit 3
echo '@@sinfo'; sinfo -h -N -o '%N|%t'
echo '@@squeue'; squeue -h -t RUNNING,COMPLETING,SUSPENDED -o '%i|%N'
"""


def parse_nodes(text: str) -> list[SlurmNode]:
    """The nodes of one ``_NODES`` answer (``scontrol show node -o``, then ``@@sinfo`` and
    ``@@squeue`` lines), sorted by name; a node ``sinfo`` lists in several partitions counts once."""
    parts = _sections(text)
    short = dict(line.split("|", 1) for line in parts.get("@@sinfo", []) if line.count("|") == 1)
    jobs: dict[str, list[int]] = {}
    for line in parts.get("@@squeue", []):
        jid, _, nodelist = line.partition("|")
        for node in expand_nodelist(nodelist) if jid.isdigit() else ():
            jobs.setdefault(node, []).append(int(jid))
    out = []
    for d in map(parse_scontrol, parts["@@squeue"]):  # _sections' first section: scontrol's lines
        if name := d.get("NodeName", "").strip():
            reason = re.sub(r"\s*\[[^\]]*@[^\]]*\]$", "", d.get("Reason", "").strip())  # [root@time]: cut
            out.append(
                SlurmNode(
                    name,
                    d.get("State", "UNKNOWN").strip(),
                    short.get(name, "").strip(),
                    "" if reason in ("", "(null)", "None") else reason,
                    tuple(sorted(jobs.get(name, []))),
                )
            )
    return sorted(out, key=lambda n: n.name)


#: what the cluster still shows of a requeue: the running jobs, each partition's tier, each node's state
_WHY = """squeue -h -t RUNNING -o '%i|%P|%S|%N' || exit 3
echo '@@tiers'; sinfo -h -o '%R|%p'
echo '@@nodes'; sinfo -h -N -o '%N|%T'
"""

_FAILED_NODE = ("DOWN", "NOT_RESPONDING", "FAIL", "FAILING")  #: ``sinfo %T`` words of a failed node


def requeue_cause(text: str, j: SlurmJob, nodes: Sequence[str], since: str) -> str | None:
    """Why Slurm requeued ``j``, read from what the cluster still shows (one ``_WHY`` answer), for a
    cluster without accounting: ``preempted by job 13 (partition high) on n1`` when a job of a
    partition of a higher tier than ``j``'s now RUNS on one of ``nodes`` (where ``j`` last ran) and
    started at or after ``since`` (``j``'s last ``StartTime``); else ``node n2 failed`` when one of
    ``nodes`` is down, not responding or failing; else None (requeued by an admin or by Slurm)."""
    parts = _sections(text)
    tiers = {p: parse_int(t) or 0 for p, _, t in (ln.partition("|") for ln in parts.get("@@tiers", [])) if t}
    mine, where = tiers.get(j.partition, 0), set(nodes)
    found: dict[int, tuple[str, list[str]]] = {}
    for f in (ln.strip().split("|") for ln in parts["@@squeue"]):
        if len(f) == 4 and f[0].isdigit() and int(f[0]) != j.id and tiers.get(f[1], 0) > mine:
            on = [n for n in expand_nodelist(f[3]) if n in where]
            if on and (not since or f[2] >= since):  # Slurm's ISO times compare as strings
                found[int(f[0])] = (f[1], on)
    if found:
        jid, (partition, on) = min(found.items())
        return f"preempted by job {jid} (partition {partition}) on {', '.join(on)}"
    failed = sorted(
        n
        for n, _, st in (ln.partition("|") for ln in parts.get("@@nodes", []))
        if n in where and ("*" in st or any(word in st.upper() for word in _FAILED_NODE))  # *: not responding
    )
    return f"node {', '.join(dict.fromkeys(failed))} failed" if failed else None


class SlurmClient:
    """Slurm's clients on a job's login node: every call is :meth:`SSHPool.run_job` for ``job``."""

    def __init__(self, ssh: RemoteHosts) -> None:
        self.ssh = ssh

    async def _run(
        self, job: str, argv: Sequence[str], timeout: float = QUERY_TIMEOUT, stdin: str | None = None
    ) -> RemoteResult:
        return await self.ssh.run_job(job, list(argv), timeout=timeout, stdin=stdin)

    async def query_with_reads(
        self,
        job: str,
        ids: Sequence[int],
        paths: Sequence[str],
        reads: Sequence[ReadArgs],
        tasks: Mapping[int, str] | None = None,
    ) -> tuple[dict[int, SlurmJob], dict[str, int], dict[str, LogChunk | None], dict[int, TasksOrError]]:
        """:meth:`query`, the sizes of ``paths``, the byte ranges ``reads`` (the jobs' metric lines)
        and, for each job of ``tasks`` (id → ``match``) that squeue reports RUNNING, its task
        processes on every node (:meth:`node_tasks`' srun, all at once), in one call on the login
        node: what a watch cycle needs of the cluster.
        :returns: the jobs by id, sizes in bytes by path (a missing file is absent), each read's
            bytes by path (None: unreadable), and by RUNNING job id its tasks per node, or the
            :class:`RemoteCommandError` of its srun.
        :raises RemoteError: if the login node cannot be reached, or squeue fails but for an id
            the cluster no longer knows (no controller answers: no job is taken for gone).
        """
        joined = ",".join(str(i) for i in ids) or "0"
        extra: list[str] = []
        for r in [*(ReadArgs(path=p, offset=0, max_bytes=0) for p in paths), *reads]:  # a size: no bytes
            inode = "" if r.get("inode") is None else str(r.get("inode"))
            extra += [r["path"], str(max(0, r["offset"])), str(max(0, r["max_bytes"])), inode]
        helper = helper_argv("slurm_tasks") if tasks else []
        wanted_tasks = [
            x for i, m in (tasks or {}).items() for x in (str(i), json.dumps(SlurmTasksArgs(job=i, match=m)))
        ]
        head = [joined, f"{TASKS_TIMEOUT:.0f}", str(len(helper)), *helper, *wanted_tasks, "@@reads"]
        argv = ["bash", "-c", _QUERY, "pitstop-slurm-query"]  # its arguments on stdin, NUL-ended
        stdin = "".join(f"{a}\0" for a in [*head, *extra])
        result = await self._run(job, argv, QUERY_TIMEOUT + (TASKS_TIMEOUT + 5 if tasks else 0), stdin)
        if result.exit_status != 0:  # squeue failed, and not only for an id no longer known
            why = f"on {result.host}: squeue failed: {result.stderr.strip()[-300:] or 'no output'}"
            raise result.error(["squeue", "-j", joined], why)
        chunks = parse_reads(result.stdout)
        return (
            {i: j for i, j in parse_query(result.stdout).items() if i in ids},
            {path: chunk.size for path, chunk in chunks.items() if chunk is not None},
            {r["path"]: chunks.get(r["path"]) for r in reads},
            parse_tasks(result.host, result.stdout),
        )

    async def one(self, job: str, job_id: int) -> SlurmJob | None:
        """State of job ``job_id`` (squeue, scontrol, sacct, in one call); None if the cluster no
        longer knows it.  :raises RemoteError: as :meth:`query_with_reads`."""
        return (await self.query_with_reads(job, [job_id], (), ()))[0].get(job_id)

    async def checked(self, job: str, argv: Sequence[str], timeout: float = QUERY_TIMEOUT) -> RemoteResult:
        """Run ``argv``; a non-zero exit raises :class:`RemoteCommandError` (with its stderr)."""
        result = await self._run(job, argv, timeout)
        if result.exit_status != 0:
            err = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()
            why = f"{argv[0]} exited with status {result.exit_status}: {' '.join(err[-3:])[:400]}"
            raise result.error(argv, f"on {result.host}: {why}")
        return result

    async def submit(self, job: str, workdir: str, script: str, args: Sequence[str]) -> int:
        """``sbatch --parsable --hold -D WORKDIR ARGS SCRIPT``: the new job id (returned at once, held:
        it waits for ``scontrol release ID``).  :raises RemoteCommandError: if sbatch refuses."""
        result = await self.checked(job, ["sbatch", "--parsable", "--hold", "-D", workdir, *args, script])
        head = result.stdout.strip().split(";")[0]
        if not head.isdigit():
            raise result.error(
                ["sbatch"], f"on {result.host}: sbatch gave no job id: {result.stdout[:200]!r}"
            )
        return int(head)

    async def nodes(self, job: str) -> list[SlurmNode]:
        """Every node of the cluster ``job`` runs on: its state, reason and the jobs running on it.
        :raises RemoteError: if the login node cannot be reached or ``scontrol`` fails."""
        result = await self.checked(job, ["bash", "-c", _NODES, "pitstop-slurm-nodes"])
        return parse_nodes(result.stdout)

    async def requeue_cause(self, job: str, j: SlurmJob, nodes: Sequence[str], since: str) -> str | None:
        """:func:`requeue_cause` of ``j`` on ``job``'s cluster (one call: squeue, sinfo).
        :raises RemoteError: if the login node cannot be reached or ``squeue`` fails."""
        result = await self.checked(job, ["bash", "-c", _WHY, "pitstop-slurm-why"])
        return requeue_cause(result.stdout, j, nodes, since)

    async def drain(self, job: str, node: str, reason: str) -> None:
        """``scontrol update NodeName=NODE State=DRAIN Reason=REASON`` on ``job``'s cluster.
        :raises RemoteCommandError: if scontrol refuses (an unknown node, no right to update)."""
        await self.checked(job, ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])

    async def resume(self, job: str, node: str) -> None:
        """``scontrol update NodeName=NODE State=RESUME`` on ``job``'s cluster.
        :raises RemoteCommandError: if scontrol refuses (an unknown node, one not drained or down)."""
        await self.checked(job, ["scontrol", "update", f"NodeName={node}", "State=RESUME"])

    async def file_size(self, job: str, path: str) -> int:
        """Size of ``path`` on the login node in bytes (0 if it does not exist yet)."""
        result = await self._run(job, ["stat", "-c", "%s", path])
        text = result.stdout.strip()
        return int(text) if result.exit_status == 0 and text.isdigit() else 0

    async def node_tasks(self, job: str, job_id: int, match: str) -> list[NodeTasks]:
        """The job's task processes on each of its nodes, if it is RUNNING (:meth:`query_with_reads`).
        :raises RemoteCommandError: if srun fails (its stderr in the message)."""
        found = (await self.query_with_reads(job, [job_id], (), (), {job_id: match}))[3].get(job_id, [])
        if isinstance(found, RemoteCommandError):
            raise found
        return found

    async def node_gpus(self, job: str, job_id: int, nodes: int, argv: Sequence[str]) -> dict[str, str]:
        """``argv`` (an ``nvidia-smi`` query) run once on each of the job's ``nodes`` nodes, inside its
        allocation: its output by node name.
        :raises RemoteCommandError: if srun fails on every node (its stderr in the message)."""
        srun = f"srun --jobid={job_id} --overlap -N{nodes} --ntasks-per-node=1 --label --quiet".split()
        script = 'echo "@@node $SLURMD_NODENAME"; exec "$@"'
        result = await self._run(job, [*srun, "bash", "-c", script, "pitstop-gpus", *argv], TASKS_TIMEOUT)
        out = {
            ls[0][7:].strip(): "\n".join(ls[1:]) + "\n"
            for ls in _by_task(result.stdout)
            if ls[0].startswith("@@node ")
        }
        if not out:
            raise _srun_failed(result.host, job_id, argv, result.exit_status, result.stderr)
        return dict(sorted(out.items()))


# --- texts of the Slurm engine ----------------------------------------------------------------------


def job_ended(j: SlurmJob) -> str:
    """``job 4242 ended FAILED (exit code 3, reason NonZeroExitCode)``."""
    how = f"signal {j.signal}" if j.signal else None if j.exit_code is None else f"exit code {j.exit_code}"
    bits = [bit for bit in (how, j.reason and f"reason {j.reason}") if bit]
    return f"job {j.id} ended {j.state}" + (f" ({', '.join(bits)})" if bits else "")


def state_cause(j: SlurmJob) -> str:
    """Why a job no longer runs, as the cluster has it: ``Slurm job 12 is CANCELLED (ExitCode 0:15, Reason None)``."""
    code = f"{j.exit_code if j.exit_code is not None else '?'}:{j.signal or 0}"
    return f"Slurm job {j.id} is {j.state} (ExitCode {code}, Reason {j.reason or 'None'})"


def status_line(job: str, j: SlurmJob) -> str:
    """``dflash: Slurm job 4242 RUNNING on 2 nodes (n1, n2), elapsed 3 min`` (a pending reason when queued)."""
    where = f" on {j.nodes} node{'s' if j.nodes != 1 else ''}" + (
        f" ({', '.join(j.nodelist)})" if j.nodelist else ""
    )
    elapsed = f", elapsed {fmt.duration(j.elapsed)}" if j.elapsed else ""
    reason = f", reason {j.reason}" if j.reason and j.state != "RUNNING" else ""
    return f"{job}: Slurm job {j.id} {j.state}{where}{elapsed}{reason}"


REQUEUED_UNKNOWN = "requeued by an admin or by Slurm"  #: a requeue whose cause the cluster no longer shows
_REQUEUED_WHY = {"PREEMPTED": "preempted", "NODE_FAIL": "a node failed", "REQUEUED": "requeued by an admin"}


def requeue_why(j: SlurmJob, cause: str | None = None) -> str:
    """Why Slurm requeued ``j``: ``cause`` (:func:`requeue_cause`), else its last earlier run as
    accounting keeps it (``preempted on n1, n2``, ``node n2 failed``), else :data:`REQUEUED_UNKNOWN`."""
    last = j.requeues[-1] if j.requeues else None
    if cause is not None:
        return cause
    if last is None:
        return REQUEUED_UNKNOWN
    if last.state == "NODE_FAIL" and last.nodes:
        return f"node {', '.join(last.nodes)} failed"
    on = f" on {', '.join(last.nodes)}" if last.nodes else ""
    return _REQUEUED_WHY.get(last.state, last.state.lower()) + on


def requeued_line(job: str, j: SlurmJob, cause: str | None = None) -> str:
    """The post of a job Slurm requeued: why, when, and what it is now: ``requeued: dflash (Slurm
    job 12, restart 1): preempted by job 13 (partition high) on n1 at 2024-05-01T12:00:03; now
    PENDING, reason BeginTime``.

    Why: ``cause`` (:func:`requeue_cause`, what the cluster still shows), else the last earlier run
    as accounting keeps it (``sacct -D``: ``preempted on n1, n2 … (Slurm: PREEMPTED)``), else
    ``requeued by an admin or by Slurm``.  When: that run's end, else the requeue's ``SubmitTime``.
    """
    last = j.requeues[-1] if j.requeues else None
    why = requeue_why(j, cause)
    at = last.ended if last is not None and last.ended not in ("", "Unknown") else j.submitted
    when = f" at {at}" if at and at != "Unknown" else ""
    slurm_said = f" (Slurm: {last.state})" if last is not None else ""
    now = f"{j.state}" + (f", reason {j.reason}" if j.reason and j.state != "RUNNING" else "")
    where = f" on {', '.join(j.nodelist)}" if j.state == "RUNNING" and j.nodelist else ""
    return (
        f"requeued: {job} (Slurm job {j.id}, restart {j.restarts}): {why}{when}{slurm_said}; now {now}{where}"
    )


def gpus_not_running(job: str, why: str) -> str:
    """``gpus JOB`` for a Slurm job that holds no nodes now."""
    return f"{job} holds no nodes now ({why}); `status {job}` shows its state"
