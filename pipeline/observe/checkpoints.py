"""Checkpoints a restart trusts: the job's ``step-NNNNNN`` directories, each checked against its
``manifest.json`` (the convention of :mod:`pipeline.dflash.checkpoints`), and which one a restart
resumes from.

:func:`list_checkpoints` asks the host helper (``checkpoints``); :func:`choose` is pre-flight's
rule (pure): the newest checkpoint must be intact; a person's restart is refused when it is not
(with the fix: ``restart JOB from step S``, the newest intact one), an automatic restart falls back
to the newest intact one by itself; ``restart JOB from step S`` needs step S intact.  A job without
``checkpoint_dir``, or whose directory holds no ``step-NNNNNN`` checkpoint, is not checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline import fmt
from pipeline.config import JobConfig
from pipeline.host.contract import CheckpointDamage, CheckpointsArgs
from pipeline.host.probe import Ops, call_helper
from pipeline.host.remote import RemoteHosts

HASH_TIMEOUT = 120.0  #: seconds the helper may take to hash a checkpoint's files


@dataclass(frozen=True)
class Checkpoint:
    """One ``step-NNNNNN`` checkpoint as the host found it."""

    step: int
    time: float | None  #: when it was written (unix s, host clock): its manifest's, else the directory's
    files: int  #: files its manifest names
    bytes: int  #: their sizes' sum, as the manifest says
    damage: CheckpointDamage | None  #: None: intact
    verified: str | None  #: ``size`` or ``sha256``: how it was found intact; None: not checked

    @property
    def intact(self) -> bool:
        """Its manifest is there and its files match it."""
        return self.damage is None


async def list_checkpoints(
    ssh: RemoteHosts, name: str, job: JobConfig, *, step: int | None = None
) -> list[Checkpoint]:
    """Every ``step-NNNNNN`` checkpoint in job ``name``'s ``checkpoint_dir``, newest step first,
    sizes checked against each manifest; with ``verify_checkpoint = "sha256"`` the files of
    ``step`` (None: of the newest, down to the first intact one) are hashed too.

    :returns: the checkpoints; empty without a ``checkpoint_dir`` or when it holds none.
    :raises RemoteError: if the host cannot be asked.
    """
    if job.checkpoint_dir is None:
        return []
    args: CheckpointsArgs = {
        "dir": job.checkpoint_dir,
        "sha256": job.verify_checkpoint == "sha256",
        "step": step,
    }
    answer = await call_helper(ssh, Ops.checkpoints(args), job=name, timeout=HASH_TIMEOUT)
    return [
        Checkpoint(c["step"], c.get("time"), c["files"], c["bytes"], c.get("damage"), c.get("verified"))
        for c in answer["checkpoints"]
    ]


@dataclass(frozen=True)
class Choice:
    """What pre-flight decided about the checkpoint a restart resumes from."""

    checkpoint: Checkpoint | None  #: the verified checkpoint the run resumes from (None: not checked)
    pass_step: int | None = None  #: the step to hand the launch through ``resume_from`` (None: none)
    refused: str | None = None  #: why the restart is refused (the ``checkpoint`` check's detail)
    fell_back: str | None = None  #: an automatic restart's fallback, as its thread says it


def choose(
    name: str, job: JobConfig, found: Sequence[Checkpoint], asked: int | None, *, auto: bool
) -> Choice:
    """Pre-flight's rule for the checkpoint a (re)start of job ``name`` resumes from (module docstring).

    :param found: :func:`list_checkpoints`, newest first.
    :param asked: the step of ``restart JOB from step S``; None: the newest.
    :param auto: Pitstop's own restart (falls back to the newest intact checkpoint by itself).
    """
    intact = [c for c in found if c.intact]
    if asked is not None:
        if not job.resume_from:
            return Choice(None, refused=no_resume_from(name))
        at = next((c for c in found if c.step == asked), None)
        if at is None or not at.intact:
            return Choice(None, refused=not_intact(asked, at, intact))
        return Choice(at, pass_step=asked)
    if not found or found[0].intact:
        return Choice(found[0] if found else None)
    newest = found[0]
    if not intact:
        return Choice(None, refused=f"{damaged(newest)}; no intact checkpoint to resume from")
    if not auto:
        return Choice(None, refused=f"{damaged(newest)}; fix: restart {name} from step {intact[0].step}")
    step = intact[0].step if job.resume_from else None  # else the job finds the newest whole one itself
    return Choice(intact[0], pass_step=step, fell_back=fell_back(name, newest, intact[0]))


def resume_argv(job: JobConfig, step: int | None) -> list[str]:
    """``launch``, with ``resume_from`` appended (``{step}`` replaced) when ``step`` is given."""
    extra = [a.replace("{step}", str(step)) for a in job.resume_from] if step is not None else []
    return [*job.launch, *extra]


# --- text ---------------------------------------------------------------------------------------


def verified_fact(c: Checkpoint) -> str:
    """``3 files, 2.30 GiB``: what the verdict line says of a verified checkpoint."""
    return f"{c.files} file{'' if c.files == 1 else 's'}, {fmt.size(c.bytes)}"


def damage_text(d: CheckpointDamage) -> str:
    """``drafter.pt is 1.10 GiB of 2.30 GiB``, ``drafter.pt is missing``, ``it has no readable manifest``."""
    file = d.get("file") or "?"
    if d["why"] == "size":
        return f"{file} is {fmt.size(d.get('size') or 0)} of {fmt.size(d.get('expected') or 0)}"
    if d["why"] == "missing":
        return f"{file} is missing"
    if d["why"] == "sha256":
        return f"{file} does not match its SHA-256"
    return "it has no readable manifest.json"


def damaged(c: Checkpoint) -> str:
    """``checkpoint step 540 is incomplete: drafter.pt is 1.10 GiB of 2.30 GiB``."""
    return f"checkpoint step {c.step} is incomplete: {damage_text(c.damage) if c.damage else '?'}"


def steps_list(intact: Sequence[Checkpoint]) -> str:
    """``530, 520`` (or ``none``): the steps that have an intact checkpoint."""
    return ", ".join(str(c.step) for c in intact) or "none"


def not_intact(asked: int, at: Checkpoint | None, intact: Sequence[Checkpoint]) -> str:
    """``restart … from step S`` refused: ``step 540 has no intact checkpoint (…); intact: 530, 520``."""
    why = f" ({damage_text(at.damage)})" if at is not None and at.damage else ""
    return f"step {asked} has no intact checkpoint{why}; steps with one: {steps_list(intact)}"


def no_resume_from(name: str) -> str:
    """``restart … from step S`` of a job that cannot be told the step."""
    return (
        f"{name} has no resume_from: set [jobs.{name}] resume_from to the arguments that make it "
        'resume at a step, e.g. ["--resume-step", "{step}"]'
    )


def fell_back(name: str, newest: Checkpoint, used: Checkpoint) -> str:
    """An automatic restart's fallback, said in its step and thread."""
    return f"{damaged(newest)}; {name} resumes from step {used.step}, the newest intact checkpoint"
