"""The workdir steps (patches and caches) and reading a job's files.

Patch texts are read here, on the controller (:func:`patch_plan`), for every engine.  The steps
on the workdir themselves are the engine's (:class:`~pipeline.engines.base.Engine`);
:class:`WorkdirSteps` does them on the job's workdir over SSH (its host's, or the cluster's shared
one) through the host helper, for the ssh and Slurm engines.  Patch texts go on stdin, never on a
command line.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from pipeline import fmt, verdict
from pipeline.config import JobConfig
from pipeline.engines.base import Plan, Target
from pipeline.engines.steplog import StepLog
from pipeline.errors import HostKeyRejected, PatchChanged, RemoteError, patch_changed
from pipeline.host.contract import HangAnswer, PreflightAnswer, PreflightArgs, TailArgs
from pipeline.host.probe import JobProbe, LogChunk, Ops, call_helper, probe_args, read_log_chunk
from pipeline.host.remote import RemoteHosts
from pipeline.observe import evidence
from pipeline.observe.checkpoints import choose, list_checkpoints, verified_fact
from pipeline.state.approvals import PatchDigest
from pipeline.state.runs import RunRecord, StepRecord
from pipeline.verdict import Outcome, Step

CALL_TIMEOUT = 30.0  #: seconds for a pre-flight, cache or patch call


async def patch_plan(
    steps: StepLog, run: RunRecord, t: Target, add: Sequence[str], remove: Sequence[str]
) -> Plan:
    """What a restart does to the job's patches: every configured patch's text by name (read on the
    controller); the patches asked (``add``, ``remove``) must be known and readable.  An approved
    patch (``run.approved_patches``) must still have its SHA-256, taken of the very bytes whose
    text is returned.

    :raises PatchChanged: (check ``approval``) if an approved patch's bytes no longer match.
    :raises PreflightFailed: (check ``patch``) for an unknown patch or an unreadable asked one.
    """
    name, job, asked = t.name, t.job, [*add, *remove]
    if unknown := [p for p in asked if p not in job.patches]:
        known = ", ".join(job.patches) or "none"
        await _refuse(steps, run, name, f"unknown patch {', '.join(unknown)} for {name} (known: {known})")
    texts: dict[str, str] = {}
    for patch, path in job.patches.items():
        try:
            raw = await asyncio.to_thread(Path(path).read_bytes)
        except OSError as exc:
            if patch in run.approved_patches:
                await _changed(steps, run, name, patch, "")
            if patch not in asked:
                continue
            await _refuse(steps, run, name, f"{patch}: cannot read {path}: {exc.strerror}")
        approved = run.approved_patches.get(patch)
        if approved is not None and hashlib.sha256(raw).hexdigest() != approved:
            await _changed(steps, run, name, patch, hashlib.sha256(raw).hexdigest())
        texts[patch] = patch_text(raw)
    if missing := [p for p in run.approved_patches if p not in job.patches]:
        await _changed(steps, run, name, missing[0], "")
    wants = (
        dict.fromkeys(job.patches, "state") | dict.fromkeys(remove, "revert") | dict.fromkeys(add, "apply")
    )
    return Plan(texts, wants, add, remove)


async def _refuse(steps: StepLog, run: RunRecord, name: str, detail: str) -> NoReturn:
    """Fail pre-flight with check ``patch``.  :raises PreflightFailed:"""
    rec = await steps.begin(run, Step.PREFLIGHT)
    raise await steps.refuse(run, rec, name, "patch", detail) from None


async def _changed(steps: StepLog, run: RunRecord, name: str, patch: str, found: str) -> None:
    """Fail pre-flight: ``patch`` is not the file that was approved.  :raises PatchChanged:"""
    approved = run.approved_patches[patch]
    rec = await steps.begin(run, Step.PREFLIGHT)
    detail = patch_changed(patch, approved, found)
    await steps.end(run, rec, Outcome.FAILED, detail)
    raise PatchChanged(name, patch, approved, found, line=verdict.preflight_failed("approval", detail))


def patch_text(raw: bytes) -> str:
    """A patch file's bytes as the text sent to ``git apply``: UTF-8, universal newlines (as
    :meth:`pathlib.Path.read_text` reads it).  :raises UnicodeDecodeError:"""
    return raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


def patch_digest(name: str, path: Path) -> PatchDigest:
    """A patch file as shown for approval: its SHA-256, diffstat and size (blocking: read it in a
    thread).  :raises OSError: if the file cannot be read."""
    raw = path.read_bytes()
    return PatchDigest(name, hashlib.sha256(raw).hexdigest(), diffstat(patch_text(raw)), len(raw))


_HUNK = re.compile(r"^@@ -[0-9]+(?:,(?P<old>[0-9]+))? \+[0-9]+(?:,(?P<new>[0-9]+))? @@")


def diffstat(text: str) -> tuple[str, ...]:
    """``git diff --stat``'s lines of a unified diff: ``path | +3 -1``, one per file, in order.

    Lines are counted hunk by hunk, as many as each ``@@ -a,b +c,d @@`` header says (the unified
    diff format, as ``git apply`` reads it), so an added line that itself reads ``+++ b/README.md``
    is counted in its own file, not taken for another file's header.
    """
    files: dict[str, list[int]] = {}
    current: list[int] | None = None
    old = new = 0  # lines the current hunk still holds, of the old and of the new file
    for line in text.splitlines():
        if current is not None and (old > 0 or new > 0):
            if line.startswith("+"):
                current[0], new = current[0] + 1, new - 1
            elif line.startswith("-"):
                current[1], old = current[1] + 1, old - 1
            elif not line.startswith("\\"):  # "\ No newline at end of file" is no line
                old, new = old - 1, new - 1
            continue
        if line.startswith("+++ "):
            target = line[4:].split("\t")[0].strip()
            current = files.setdefault(target.removeprefix("b/"), [0, 0])
        elif current is not None and (m := _HUNK.match(line)):
            old = 1 if m["old"] is None else int(m["old"])
            new = 1 if m["new"] is None else int(m["new"])
    return tuple(f"{path} | +{add} -{rem}" for path, (add, rem) in files.items())


class WorkdirSteps:
    """The workdir steps of :class:`~pipeline.engines.base.Engine` over SSH, through the host helper
    on the job's ``host``: the ssh and Slurm engines' (the cluster's workdir is shared)."""

    min_free_bytes = 100 * 10**6  #: pre-flight: free bytes needed where the log is written
    #: the job's processes run on ``host``, so its kernel log (``dmesg``) says whether it OOM-killed them
    kernel_log = True
    #: its jobs run on cluster nodes Pitstop can name, drain and leave out (``nodes``, ``excluding``)
    nodes = False
    #: its launch can be told a step to resume from (``restart JOB from step S``: ``resume_from``)
    resume_step = True

    def __init__(self, ssh: RemoteHosts, steps: StepLog) -> None:
        self.ssh = ssh
        self.steps = steps

    async def clear_cache(self, run: RunRecord, t: Target) -> None:
        """The ``clear_cache`` step: empty the job's ``clear_cache`` paths when ``run.fresh_cache``
        (else SKIPPED).

        :raises LaunchFailed: if the host cannot be reached or a path cannot be cleared.
        """
        rec = await self.steps.begin(run, Step.CLEAR_CACHE)
        if not run.fresh_cache or not t.job.clear_cache:
            why = "asked for, but the job has no clear_cache paths" if run.fresh_cache else "not asked for"
            await self.steps.end(run, rec, Outcome.SKIPPED, why)
            return
        try:
            answer = await call_helper(
                self.ssh, Ops.clear({"paths": list(t.job.clear_cache)}), job=t.name, timeout=CALL_TIMEOUT * 4
            )
        except RemoteError as exc:
            raise await self.steps.launch_failed(run, rec, t.name, exc.message) from None
        cleared = answer.get("cleared") or []
        parts = []  # per path: "/srv/cache: 120 files, 3.4 GiB removed" or "/srv/cache: not present"
        for c in cleared:
            removed = f"{int(c.get('files', 0))} files, {fmt.size(int(c.get('bytes', 0)))} removed"
            parts.append(f"{c['path']}: {'not present' if c.get('missing') else removed}")
        detail = "; ".join(parts)
        if errors := [e for c in cleared for e in c.get("errors", [])]:
            why = f"cannot clear cache: {'; '.join(errors[:3])}"
            raise await self.steps.launch_failed(run, rec, t.name, why, detail)
        await self.steps.end(run, rec, Outcome.OK, detail)

    async def patch(self, run: RunRecord, t: Target, plan: Plan, applied: Mapping[str, bool]) -> None:
        """The ``patch`` step: apply ``plan.add`` and revert ``plan.remove`` in the job's workdir
        (``git apply``); ``applied`` is what pre-flight found in effect.  The patches in effect are
        recorded.

        :raises LaunchFailed: if a patch does not apply or the host cannot be reached.
        """
        rec = await self.steps.begin(run, Step.PATCH)
        to_apply = [p for p in plan.add if not applied.get(p)]
        to_revert = [p for p in plan.remove if applied.get(p)]
        answer: Mapping[str, Any] = {"in_effect": sorted(n for n, on in applied.items() if on)}
        if to_apply or to_revert:
            try:
                patch = Ops.patch({"workdir": t.job.workdir, "apply": to_apply, "revert": to_revert})
                stdin = json.dumps(dict(plan.texts))
                asked = call_helper(self.ssh, patch, job=t.name, stdin=stdin, timeout=CALL_TIMEOUT * 2)
                answer = dict(await asked)
            except RemoteError as exc:
                shown = patch_failed(exc.message)
                raise await self.steps.launch_failed(run, rec, t.name, exc.message, shown=shown) from None
        run.patches = sorted(answer.get("in_effect") or [])
        await self.steps.records.store_patches(t.name, run.patches)
        detail = step_patches(answer.get("applied") or [], answer.get("reverted") or [], run.patches)
        if answer.get("failed"):
            raise await self.steps.launch_failed(
                run, rec, t.name, patch_failed("; ".join(answer["failed"])), detail
            )
        await self.steps.end(run, rec, Outcome.OK if to_apply or to_revert else Outcome.SKIPPED, detail)

    async def read_chunk(self, name: str, job: JobConfig, offset: int, length: int, *, path: str) -> LogChunk:
        """:func:`~pipeline.host.probe.read_log_chunk` on the job's host."""
        return await read_log_chunk(self.ssh, name, job, offset, length, path=path)

    async def patches_applied(self, name: str, job: JobConfig, texts: Mapping[str, str]) -> list[str]:
        """The names of ``texts`` (patch name → text) applied in the workdir now (``git apply
        --reverse --check``).  :raises RemoteError: if the host cannot be reached or git fails."""
        stdin = json.dumps(dict(texts))
        answer = await call_helper(
            self.ssh, Ops.patches({"workdir": job.workdir}), job=name, stdin=stdin, timeout=CALL_TIMEOUT
        )
        return sorted(n for n, on in (answer.get("applied") or {}).items() if on)

    async def log_tail(self, t: Target, lines: int) -> str:
        """The last ``lines`` lines of the job's output (the recorded run's ``log``, else the configured
        one; the helper reads at most its last 64 KiB).  :raises RemoteCommandError: if it cannot be read."""
        args: TailArgs = {"path": t.current.get("log") or t.job.log, "lines": max(0, lines)}
        return (await call_helper(self.ssh, Ops.tail(args), host=t.job.host, exec_prefix=t.job.exec))["text"]

    async def crash_evidence(self, t: Target, offset: int, seen: JobProbe | None) -> JobProbe:
        """:func:`pipeline.observe.evidence.crash_evidence` of the recorded run: its session, its
        output (the recorded ``log``: a Slurm job's ``StdOut``; else the configured one) since
        ``offset``."""
        job = t.job.model_copy(update={"log": t.current.get("log") or t.job.log})
        return await evidence.crash_evidence(
            self.ssh, t.name, job, t.current, offset, seen, kernel=self.kernel_log
        )

    async def hang_evidence(self, t: Target, pids: Sequence[int]) -> HangAnswer:
        """The helper's ``hang`` on the job's host (on Slurm the login node, not the allocation)."""
        return await evidence.hang_evidence(self.ssh, t.name, t.job, t.current, pids)

    async def checkpoint_check(self, run: RunRecord, rec: StepRecord, t: Target) -> str | None:
        """Pre-flight's ``checkpoint`` check (:func:`pipeline.observe.checkpoints.choose`): the
        checkpoint the run resumes from is intact (``run.from_step``'s, else the newest; an
        automatic restart, ``run.auto``, falls back to the newest intact one).  Records on ``run``
        the step handed to the launch (``resume_step``) and the checkpoint verified.

        :returns: the check's note for the step's detail (``checkpoint step 540 verified``, the
            fallback), or None when the job has no ``step-NNNNNN`` checkpoint to check.
        :raises PreflightFailed: (check ``checkpoint``) if it is damaged, or the host cannot be asked.
        """
        if t.job.checkpoint_dir is None and run.from_step is None:
            return None
        try:
            found = await list_checkpoints(self.ssh, t.name, t.job, step=run.from_step)
        except RemoteError as exc:
            raise await self.steps.refuse(run, rec, t.name, "checkpoint", exc.message) from None
        chosen = choose(t.name, t.job, found, run.from_step, auto=run.auto)
        if chosen.refused is not None:
            raise await self.steps.refuse(run, rec, t.name, "checkpoint", chosen.refused)
        if (ckpt := chosen.checkpoint) is None:
            return None
        run.resume_step, run.verified_step, run.verified = chosen.pass_step, ckpt.step, verified_fact(ckpt)
        if chosen.fell_back is not None:
            run.warning = chosen.fell_back
            return chosen.fell_back
        return f"checkpoint step {ckpt.step} verified ({ckpt.verified or 'size'}: {run.verified})"

    async def _preflight_call(
        self, run: RunRecord, rec: StepRecord, t: Target, program: str, plan: Plan
    ) -> PreflightAnswer:
        """The host helper's pre-flight checks on the job's host (workdir, ``program``, the patches
        ``plan.wants``, log directory, free space and, for a start, that the run recorded in
        ``t.current`` is gone).

        :raises PreflightFailed: (check ``host`` or ``host_key``) if the host cannot be asked.
        """
        args: PreflightArgs = {
            "workdir": t.job.workdir,
            "program": program,
            "log": t.job.log,
            "min_free": self.min_free_bytes,
            "patches": dict(plan.wants) if plan.texts else {},
            "running": {**probe_args(t.name, t.job, t.current), "log": None} if plan.start else None,
        }
        stdin = json.dumps(dict(plan.texts)) if plan.texts else None
        try:
            return await call_helper(
                self.ssh, Ops.preflight(args), job=t.name, stdin=stdin, timeout=CALL_TIMEOUT
            )
        except RemoteError as exc:
            check = "host_key" if isinstance(exc, HostKeyRejected) else "host"
            raise await self.steps.refuse(run, rec, t.name, check, exc.message) from None


def step_patches(applied: Sequence[str], reverted: Sequence[str], in_effect: Sequence[str]) -> str:
    """What the patch step changed and what is in effect after it."""
    done = [f"{verb} {', '.join(ps)}" for verb, ps in (("applied", applied), ("reverted", reverted)) if ps]
    return "; ".join([*(done or ["no change"]), "in effect: " + (", ".join(in_effect) or "none")])


def patch_failed(detail: str) -> str:
    """A patch did not apply after the stop (pre-flight had passed)."""
    return f"patch step failed, job not relaunched: {detail}"
