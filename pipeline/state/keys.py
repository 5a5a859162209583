"""Every Redis key name Pitstop uses, in one place.  Each function takes the configured prefix
(``[redis] prefix``, default ``pitstop:``) first, so a test can give every case a fresh one."""

from __future__ import annotations


def run_seq(prefix: str) -> str:
    """INCR counter behind run ids ``r-<n>``."""
    return f"{prefix}run:seq"


def run(prefix: str, run_id: str) -> str:
    """String: one run record as JSON (:class:`pipeline.state.runs.RunRecord`)."""
    return f"{prefix}run:{run_id}"


def runs_of_job(prefix: str, job: str) -> str:
    """Sorted set: run ids of a job scored by creation time (unix s)."""
    return f"{prefix}runs:job:{job.lower()}"


def runs_all(prefix: str) -> str:
    """Sorted set: every run id scored by creation time (unix s)."""
    return f"{prefix}runs:all"


def runs_open(prefix: str) -> str:
    """Set: run ids whose sequence has not finished (reconciled as INTERRUPTED at start)."""
    return f"{prefix}runs:open"


def runs_unverified(prefix: str) -> str:
    """Sorted set: launched run ids awaiting their verification, scored by due time (unix s)."""
    return f"{prefix}runs:unverified"


def runs_recovery(prefix: str) -> str:
    """Sorted set: RUNNING run ids whose throughput follow-up is due, scored by due time (unix s)."""
    return f"{prefix}runs:recovery"


def run_owner(prefix: str, run_id: str) -> str:
    """String with TTL: the heartbeat of the process executing a run (its instance id; :class:`~pipeline.state.runs.RunStore`)."""
    return f"{prefix}run-owner:{run_id}"


def verify_claim(prefix: str, run_id: str) -> str:
    """SET NX claim: the one process that posts this run's verdict."""
    return f"{prefix}verify:claim:{run_id}"


def job_current(prefix: str, job: str) -> str:
    """Hash: what is running for a job now (run id, pid, start time, session, patches)."""
    return f"{prefix}job:{job.lower()}:current"


def job_patches(prefix: str, job: str) -> str:
    """Set: patch names in effect in the job's workdir."""
    return f"{prefix}job:{job.lower()}:patches"


def lock(prefix: str, scope: str) -> str:
    """redis-py Lock name for a job (``job:NAME``) or host (``host:NAME``) scope."""
    return f"{prefix}lock:{scope.lower()}"


def lock_holder(prefix: str, scope: str) -> str:
    """Hash beside the lock: user, run id, step, started at."""
    return f"{prefix}lock:{scope.lower()}:holder"


def cancel_request(prefix: str, run_id: str) -> str:
    """String: set when someone asked to cancel a run; read at step boundaries."""
    return f"{prefix}cancel:{run_id}"


def delivery(prefix: str, delivery_id: str) -> str:
    """SET NX with TTL: a Slack delivery (event id, trigger id) already acted on (:mod:`pipeline.state.deliveries`)."""
    return f"{prefix}dedupe:{delivery_id}"


def audit(prefix: str) -> str:
    """Capped stream of every request and its outcome."""
    return f"{prefix}audit"


def incident(prefix: str, job: str) -> str:
    """Hash: the job's open incident (kind, opened at, thread, acked)."""
    return f"{prefix}incident:{job.lower()}"


def watch_state(prefix: str, job: str) -> str:
    """Hash: watcher memory for a job (last seen alive, last pid, log size, degraded since)."""
    return f"{prefix}watch:{job.lower()}"


def watch_off(prefix: str, job: str) -> str:
    """String with TTL: watching paused for the job until it expires."""
    return f"{prefix}watch:{job.lower()}:off"


def auto_restarts(prefix: str, job: str) -> str:
    """Sorted set: times (unix s) of automatic restarts, for the crash-loop bound."""
    return f"{prefix}autorestart:{job.lower()}"


def requeue_told(prefix: str, job: str, slurm_job: int, restarts: int) -> str:
    """String with TTL: Slurm's requeue number ``restarts`` of ``slurm_job`` has been told."""
    return f"{prefix}requeued:{job.lower()}:{slurm_job}:{restarts}"


def incident_history(prefix: str, job: str) -> str:
    """Sorted set: the job's resolved incidents (JSON :class:`~pipeline.state.incidents.IncidentSpan`),
    scored by when each resolved (unix s), for goodput."""
    return f"{prefix}incidents-done:{job.lower()}"


def digest_offset(prefix: str, job: str) -> str:
    """Hash: byte offset and inode of the metric log read by the last scheduled digest."""
    return f"{prefix}digest:{job.lower()}:offset"


def digest_ranks(prefix: str, job: str) -> str:
    """Hash: every rank a digest has seen for the job → JSON ``{"role", "last_ts"}`` (silent ranks)."""
    return f"{prefix}digest-ranks:{job}"


def digest_last(prefix: str, job: str) -> str:
    """String: the last scheduled digest's summary (JSON), for the ±% change."""
    return f"{prefix}digest:{job.lower()}:last"


def rank_progress(prefix: str, job: str) -> str:
    """String: the job's per-rank progress (JSON :class:`pipeline.observe.progress.ProgressState`)."""
    return f"{prefix}progress:{job.lower()}"


def last_crash(prefix: str, job: str) -> str:
    """Hash: the job's last classified crash (``crash_*`` fields, ``run_id``, ``repeat``)."""
    return f"{prefix}crash:{job.lower()}"


def leader(prefix: str) -> str:
    """String with TTL: the scheduler leader lease (holder id)."""
    return f"{prefix}scheduler:leader"


def posts(prefix: str, run_or_incident: str) -> str:
    """Hash: where a run's or incident's message lives (channel, ts) so it can be updated."""
    return f"{prefix}posts:{run_or_incident}"


def delivery_failure(prefix: str) -> str:
    """Hash: the last post Slack refused (``at`` unix s, ``where``, ``error``, ``line``), for ``status``."""
    return f"{prefix}slack:last_failure"


def undelivered_alert(prefix: str) -> str:
    """String: JSON of the last alert refused in its channel (:mod:`pipeline.state.deliveries`)."""
    return f"{prefix}slack:undelivered_alert"


def events(prefix: str) -> str:
    """Stream: events (verdict, alert, resolved, digest, step) for surfaces and scripts to await."""
    return f"{prefix}events"


def run_events(prefix: str, run_id: str) -> str:
    """Stream with TTL: one run's events (its steps, its verdict), from its first, for ``follow r-N``."""
    return f"{prefix}events:{run_id}"


def confirmation(prefix: str, token: str) -> str:
    """String with TTL: a request waiting for its requester's confirmation (JSON)."""
    return f"{prefix}confirm:{token}"


def approval(prefix: str, request_id: str) -> str:
    """String: a request under the two-person rule, by its reserved run id (JSON, :mod:`pipeline.state.approvals`)."""
    return f"{prefix}approval:{request_id}"


def approvals_open(prefix: str) -> str:
    """Sorted set: ids of approval requests still pending, scored by when they expire (unix s)."""
    return f"{prefix}approvals:open"


def watched_at(prefix: str) -> str:
    """String: unix s at which a leader last finished a watch cycle (gaps in watching show here)."""
    return f"{prefix}watch:last_cycle"


def outage_told(prefix: str) -> str:
    """String: unix s at which the last state-store outage that was posted ended (:mod:`pipeline.state.redisconn`)."""
    return f"{prefix}store:outage_told"


def node_notes(prefix: str, cluster: str) -> str:
    """Hash: node name → what Pitstop holds against it on one Slurm cluster (JSON, :class:`pipeline.state.nodes.NodeNote`)."""
    return f"{prefix}nodes:{cluster}"


def node_suspects(prefix: str, cluster: str) -> str:
    """Hash: node name → why it is suspect on one Slurm cluster, until when (JSON, :class:`pipeline.state.nodes.Suspicion`)."""
    return f"{prefix}suspects:{cluster}"
