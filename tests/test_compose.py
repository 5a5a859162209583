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
