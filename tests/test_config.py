"""The config file: validation, error lines naming TOML paths, and `pitstop check-config`."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pipeline.config import load_config, parse_config, resolve_path
from pipeline.config.base import seconds_setting
from pipeline.engines import ENGINES
from pipeline.engines.base import check_engines
from pipeline.engines.slurm import expected_processes
from pipeline.errors import ConfigError, ExitCode

ROOT = Path(__file__).resolve().parent.parent

MINIMAL = """
[hosts.gpu1]
address = "127.0.0.1"

[jobs.dflash]
host = "gpu1"
workdir = "/srv/dflash"
launch = ["./run.sh"]
log = "/srv/dflash/train.log"
match = "^dflash-worker "
processes = 8
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pitstop.toml"
    path.write_text(text)
    return path


def check_config(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "check-config", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_example_config_is_valid() -> None:
    """The shipped example config passes check-config with exit 0 and a one-line summary."""
    done = check_config("pitstop.example.toml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1 and "1 host(s), 1 job(s)" in done.stdout


def test_minimal_config_defaults(tmp_path: Path) -> None:
    """Defaults apply: /train, pace 1 s, watch every 15 s, embedded Redis, job lookup ignores case."""
    config = load_config(write(tmp_path, MINIMAL))
    assert config.slack.command == "/train" and config.slack.pace == 1.0
    assert config.redis.url is None and config.redis.prefix == "pitstop:"
    job = config.job("DFLASH")
    assert job.watch.interval == 15 and job.watch.stall_after == 600 and job.start_window == 10
    assert job.stop_timeout == 30 and job.lock_scope == "job" and job.metrics == "jsonl"


def test_bad_file_names_every_problem(tmp_path: Path) -> None:
    """An unknown host, a bad type and an unknown key are each reported on a line naming its path."""
    text = MINIMAL.replace('host = "gpu1"', 'host = "gpu2"').replace("processes = 8", 'processes = "eight"')
    done = check_config(str(write(tmp_path, text + "bogus = 1\n")))
    assert done.returncode == ExitCode.USAGE
    assert "jobs.dflash.host: unknown host 'gpu2' (known: gpu1)" in done.stderr
    assert "jobs.dflash.processes:" in done.stderr
    assert "jobs.dflash.bogus: unknown key" in done.stderr
    assert "Traceback" not in done.stderr


def test_misspelt_keys_get_a_did_you_mean_from_their_own_table(tmp_path: Path) -> None:
    """A misspelt key (in [slack], a job, a job's watch table) is named with the key of its own table it is
    closest to; a key like none gets no guess."""
    text = MINIMAL.replace(
        "processes = 8", "processes = 8\nstop_timout = 3\nzzzz = 1\n[jobs.dflash.watch]\nintervall = 5"
    )
    done = check_config(str(write(tmp_path, "[slack]\nanounce_channel = 'C1'\n" + text)))
    assert done.returncode == ExitCode.USAGE
    assert (
        "jobs.dflash.stop_timout: unknown key (see pitstop.example.toml for the keys) - did you mean stop_timeout?"
        in done.stderr
    )
    assert (
        "slack.anounce_channel: unknown key" in done.stderr
        and "did you mean announce_channel?" in done.stderr
    )
    assert (
        "jobs.dflash.watch.intervall: unknown key" in done.stderr and "did you mean interval?" in done.stderr
    )
    (zzzz,) = [line for line in done.stderr.splitlines() if "zzzz" in line]
    assert "did you mean" not in zzzz


def test_check_config_warns_when_alerts_reach_no_channel(tmp_path: Path) -> None:
    """check-config passes a config with no announce channel and no job channel, with a warning naming the
    key to set; an announce channel silences it."""
    done = check_config(str(write(tmp_path, MINIMAL)))
    assert done.returncode == 0 and "warning: alerts of dflash would reach no channel" in done.stderr
    assert "set [slack] announce_channel" in done.stderr
    quiet = check_config(str(write(tmp_path, "[slack]\nannounce_channel = 'C0123'\n" + MINIMAL)))
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_toml_syntax_error_names_line(tmp_path: Path) -> None:
    """A TOML syntax error exits 2 with the line it is on, no traceback."""
    done = check_config(str(write(tmp_path, MINIMAL + "\n[jobs.x\n")))
    assert done.returncode == ExitCode.USAGE
    assert "TOML syntax error" in done.stderr and "(at line " in done.stderr
    assert "Traceback" not in done.stderr


def test_missing_file(tmp_path: Path) -> None:
    """A missing file is one line saying what to do."""
    done = check_config(str(tmp_path / "nope.toml"))
    assert done.returncode == ExitCode.USAGE
    assert done.stderr.strip().count("\n") == 0 and "config file not found" in done.stderr


@pytest.mark.parametrize(
    ("snippet", "expected"),
    [
        ('clear_cache = ["/"]', "jobs.dflash.clear_cache"),
        ('clear_cache = ["tmp/cache"]', "jobs.dflash.clear_cache"),
        ('clear_cache = ["/srv/../etc"]', "jobs.dflash.clear_cache"),
        ('lock_scope = "job"\nstart_window = "soon"', "jobs.dflash.start_window"),
        ('workdir2 = "x"', "jobs.dflash.workdir2: unknown key"),
        ('lock_scope = "cluster"', "jobs.dflash.lock_scope"),
        ('patches = { topk = "missing.diff" }', "jobs.dflash.patches.topk: file not found"),
        ('metrics = { pattern = "no groups" }', "jobs.dflash.metrics.pattern: needs named groups"),
        ('owners = ["alice"]', "jobs.dflash.owners: owner 'alice'"),
        ("notify_last_actor = 3", "jobs.dflash.notify_last_actor"),
        ("max_lost = -5", "jobs.dflash.max_lost: a number of steps"),
        ('max_lost = "soon"', "jobs.dflash.max_lost"),
        ("total_steps = 0", "jobs.dflash.total_steps"),
        ("[jobs.dflash.watch]\nslow_after_restart = 1.5", "jobs.dflash.watch.slow_after_restart"),
        ("[jobs.dflash.watch]\nidle_gpu_below = 5", "jobs.dflash.watch: set both idle_gpu_below"),
        ("[jobs.dflash.watch]\nno_progress_after = 0", "jobs.dflash.watch.no_progress_after"),
    ],
)
def test_rejected_values(tmp_path: Path, snippet: str, expected: str) -> None:
    """Unsafe or malformed job keys are refused with a line naming the key."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, MINIMAL + snippet + "\n"))
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_loss_and_recovery_keys(tmp_path: Path) -> None:
    """max_lost reads an integer as steps and a duration as seconds; the recovery and idle-GPU watch
    keys take their documented defaults (idle GPUs off)."""
    steps = load_config(write(tmp_path, MINIMAL + "max_lost = 500\ntotal_steps = 9000\n")).jobs["dflash"]
    assert steps.max_lost == 500 and steps.total_steps == 9000
    timed = load_config(write(tmp_path, MINIMAL + 'max_lost = "10m"\n')).jobs["dflash"]
    assert not isinstance(timed.max_lost, int) and timed.max_lost is not None
    assert timed.max_lost.seconds == 600
    w = timed.watch
    assert (w.recovery_window, w.slow_after_restart, w.no_progress_after, w.min_progress) == (300, 0.8, 3, 1)
    assert w.idle_gpu_below is None and w.idle_gpu_for is None


def test_names_unique_ignoring_case(tmp_path: Path) -> None:
    """Two jobs whose names differ only in case are refused."""
    twin = MINIMAL.split("[jobs.dflash]")[1]
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, MINIMAL + "\n[jobs.DFlash]" + twin))
    assert "jobs.DFlash: same name as jobs.dflash (names ignore case)" in info.value.problems


def test_durations() -> None:
    """Durations accept seconds and 30m / 1h / 2.5s forms, and refuse the rest."""
    assert seconds_setting(90) == 90 and seconds_setting("30m") == 1800 and seconds_setting("1h") == 3600
    assert seconds_setting("2.5s") == 2.5
    for bad in ("soon", "-1", 0, True, float("nan"), float("inf"), 10**400, "9" * 400):
        with pytest.raises(ValueError):
            seconds_setting(bad)


@pytest.mark.parametrize("value", ["nan", "inf", "1e400", "9" * 400])
def test_non_finite_and_huge_durations_are_refused_by_check_config(tmp_path: Path, value: str) -> None:
    """`interval = nan` (a watch loop that would spin) or a 400-digit number exits 2 naming the key."""
    path = write(tmp_path, MINIMAL + f"\n[jobs.dflash.watch]\ninterval = {value}\n")
    done = check_config(str(path))
    assert done.returncode == 2 and "jobs.dflash.watch.interval" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("zone", ["Europe", "Not/AZone", "x" * 300])
def test_unknown_timezone_is_refused(tmp_path: Path, zone: str) -> None:
    """A timezone that is not an IANA zone is refused at scheduler.timezone (it would break every clock shown)."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, f'[scheduler]\ntimezone = "{zone}"\n' + MINIMAL))
    assert any(p.startswith("scheduler.timezone") and "unknown timezone" in p for p in info.value.problems), (
        info.value.problems
    )


def test_resolve_path_order(tmp_path: Path) -> None:
    """--config wins over PITSTOP_CONFIG, which wins over ./pitstop.toml."""
    assert resolve_path("a.toml", "b.toml") == Path("a.toml")
    assert resolve_path(None, "b.toml") == Path("b.toml")
    assert resolve_path(None, None) == Path("pitstop.toml")


def test_bad_match_regex(tmp_path: Path) -> None:
    """A `match` that is not a regular expression is refused, naming the key."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, MINIMAL.replace('"^dflash-worker "', '"(unclosed"')))
    assert any(p.startswith("jobs.dflash.match: not a regular expression") for p in info.value.problems)


def test_example_slurm_job_block_is_valid() -> None:
    """The commented Slurm job at the end of the example config validates once uncommented."""
    text = Path("pitstop.example.toml").read_text()
    head, _, block = text.partition("# --- A multi-node job on Slurm")
    lines = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in block.splitlines()[1:]]
    config = parse_config(tomllib.loads(head + "\n".join(lines) + "\n"), "example", Path.cwd())
    job = config.job("dflash-multi")
    check_engines(config, ENGINES)
    assert job.engine == "slurm" and expected_processes(job) == 8
    assert config.job("dflash").engine == "ssh"


def test_slurm_engine_needs_its_table_and_the_table_needs_the_engine(tmp_path: Path) -> None:
    """engine = "slurm" without [jobs.NAME.slurm], a bad key in it, the table on an ssh job, an ssh
    job without launch: each a clear error naming its key, from the engines' check (and check-config)."""
    base = MINIMAL.replace('launch = ["./run.sh"]\n', "")
    slurm = base.replace("[jobs.dflash]\n", '[jobs.dflash]\nengine = "slurm"\n')
    cases = {
        slurm: 'jobs.dflash: engine "slurm" needs a [jobs.NAME.slurm] table with at least script',
        slurm + '\n[jobs.dflash.slurm]\nscript = "job.sbatch"\n': (
            "jobs.dflash.slurm.script: must be an absolute path on the login node"
        ),
        MINIMAL + '\n[jobs.dflash.slurm]\nscript = "/srv/job.sbatch"\n': (
            'jobs.dflash: [jobs.NAME.slurm] is set but engine is "ssh" (set engine = "slurm")'
        ),
        base: "jobs.dflash: launch: required key is missing",
    }
    for text, problem in cases.items():
        with pytest.raises(ConfigError) as refused:
            check_engines(load_config(write(tmp_path, text)), ENGINES)
        assert refused.value.problems == [problem]
    done = check_config(str(write(tmp_path, slurm)))
    assert done.returncode == ExitCode.USAGE and 'engine "slurm" needs' in done.stderr
    done = check_config(str(write(tmp_path, slurm.replace('engine = "slurm"', 'engine = "k8s"'))))
    assert done.returncode == ExitCode.USAGE
    assert 'jobs.dflash.engine: unknown engine \'k8s\': use one of "slurm", "ssh"' in done.stderr


def test_check_config_refuses_a_fallback_channel_that_is_not_a_channel_id(tmp_path: Path) -> None:
    """check-config refuses [slack] fallback_channel = "#ml-ops" (exit 2) naming the key; a C… id passes."""
    done = check_config(str(write(tmp_path, '[slack]\nfallback_channel = "#ml-ops"\n' + MINIMAL)))
    assert done.returncode == ExitCode.USAGE
    assert "slack.fallback_channel: '#ml-ops' is not a channel id" in done.stderr
    config = load_config(write(tmp_path, '[slack]\nfallback_channel = "C0FALLBACK1"\n' + MINIMAL))
    assert config.slack.fallback_channel == "C0FALLBACK1"


def test_example_approval_table_is_valid() -> None:
    """The commented [jobs.dflash.approval] table of the example config validates once uncommented."""
    text = Path("pitstop.example.toml").read_text()
    head, _, rest = text.partition("# [jobs.dflash.approval]\n")
    block, _, tail = rest.partition("\n\n")
    lines = ["[jobs.dflash.approval]"] + [ln[2:] for ln in block.splitlines() if not ln.startswith("# # ")]
    config = parse_config(tomllib.loads(head + "\n".join(lines) + "\n\n" + tail), "example", Path.cwd())
    rule = config.job("dflash").approval
    assert rule is not None and rule.actions == ["restart_with_patch", "stop"] and rule.expires == 900
    assert rule.approvers == ["admin", "S0MLONCALL1"]


def test_check_config_names_a_bad_approval_key(tmp_path: Path) -> None:
    """check-config refuses an unknown approval action (exit 2), naming its key; a good table passes."""
    bad = MINIMAL + '\n[jobs.dflash.approval]\nactions = ["reboot"]\napprovers = ["admin"]\n'
    done = check_config(str(write(tmp_path, bad)))
    assert done.returncode == ExitCode.USAGE and "jobs.dflash.approval.actions[0]" in done.stderr
    good = MINIMAL + '\n[jobs.dflash.approval]\nactions = ["restart"]\napprovers = ["admin", "S0ONCALL1"]\n'
    assert check_config(str(write(tmp_path, good))).returncode == 0
