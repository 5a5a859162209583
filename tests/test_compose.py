"""docker-compose.yml: the Redis service and the bot, wired as the README says."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_compose_services() -> None:
    """Redis has a healthcheck and a volume; the bot is built here, serves, mounts an existing config read-only."""
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    redis = doc["services"]["redis"]
    assert redis["image"].startswith("redis:") and "healthcheck" in redis
    assert any(v.endswith(":/data") for v in redis["volumes"])
    bot = doc["services"]["bot"]
    assert bot["build"] == "." and (ROOT / "Dockerfile").is_file()
    assert bot["command"][0] == "serve" and bot["restart"] == "unless-stopped"
    assert bot["depends_on"]["redis"]["condition"] == "service_healthy"
    mounts = [v for v in bot["volumes"] if v.endswith(":ro") and "/etc/pitstop/" in v]
    assert mounts, bot["volumes"]
    source = mounts[0].split(":")[0]
    assert (ROOT / source).is_file(), f"{source} is mounted but does not exist"
    assert bot["environment"]["PITSTOP_CONFIG"] == mounts[0].split(":")[1]
    assert all("TOKEN" not in k or "${" in str(v) for k, v in bot["environment"].items())


def test_compose_publishes_the_admin_listener_on_loopback_and_prometheus_scrapes_it() -> None:
    """The bot's admin listener is published on the host's loopback only, at the port deploy/prometheus.yml
    scrapes; the README points at that file, and no public port is published in Socket Mode."""
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    bot = doc["services"]["bot"]
    command = bot["command"]
    port = command[command.index("--admin-port") + 1]
    assert "--socket" in command and "--port" not in command
    assert bot["ports"] == [f"127.0.0.1:{port}:{port}"]
    assert "PITSTOP_HEARTBEAT_URL" in bot["environment"]
    scrape = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    (job,) = scrape["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"bot:{port}"]
    prometheus = doc["services"]["prometheus"]
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert all(p.startswith("127.0.0.1:") for p in prometheus["ports"])
    assert "(deploy/prometheus.yml)" in (ROOT / "README.md").read_text()
    assert f"127.0.0.1:{port}/healthz" in (ROOT / "Dockerfile").read_text()
