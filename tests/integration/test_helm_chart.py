"""Issue 46, part 1: the configs the Helm chart renders work. The chart is rendered with a file
sink; its migrate hook's config migrates a fresh database, then the relay runs on the relay's
config with the pod's environment and the probes' paths answer. helm is the one
tests/ops/check-helm.sh builds (scripts/test.sh runs that first)."""
from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import psycopg
import pytest
import yaml

from conftest import ROOT, Database, free_port, http_get, read_jsonl, run_cli, wait_until

CHART = ROOT / "deploy" / "helm" / "outbox-relay"
MOUNT = "/var/lib/outbox-relay/out"


def helm_binary() -> Path | None:
    if os.environ.get("OUTBOX_HELM_BIN"):
        return Path(os.environ["OUTBOX_HELM_BIN"])
    cache = Path(os.environ.get("OUTBOX_HELM_CACHE", Path.home() / ".cache" / "outbox-relay" / "helm"))
    found = sorted(cache.glob("*/helm"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def render(helm: Path, workdir: Path, values: dict) -> list[dict]:
    path = workdir / "values.yaml"
    path.write_text(json.dumps(values))
    out = subprocess.run([str(helm), "template", "outbox-relay", str(CHART), "--namespace", "outbox", "-f", str(path)],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "HELM_CACHE_HOME": str(workdir / "helm"),
                              "HELM_CONFIG_HOME": str(workdir / "helm"), "HELM_DATA_HOME": str(workdir / "helm")})
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def pod_env(container: dict, database_url: str) -> dict:
    """The container's plain variables, and DATABASE_URL (from a Secret in the pod)."""
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    env["DATABASE_URL"] = database_url
    return env


@pytest.fixture
def fresh_database(cluster):
    """A database with no outbox table yet: the chart's hook makes it."""
    name = "t_" + uuid.uuid4().hex[:10]
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield Database(cluster, name)
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        conn.execute(f"DROP DATABASE IF EXISTS {name}")


def test_the_chart_s_configs_migrate_and_run(fresh_database, workdir, relays):
    helm = helm_binary()
    if helm is None or not helm.exists():
        pytest.skip("no helm binary: tests/ops/check-helm.sh builds it (scripts/test.sh runs it before these tests)")
    db = fresh_database
    port = free_port()
    docs = render(helm, workdir, {
        "config": {
            "relay": {"sweep_interval": "1s"},
            "sinks": [{"name": "audit", "type": "file", "path": f"{MOUNT}/events.jsonl"}],
            "routes": [{"topics": ["*"], "sinks": ["audit"]}],
        },
        "env": [{"name": "OUTBOX_EXAMPLE", "value": "1"}],
        "metrics": {"port": port},
        "extraVolumes": [{"name": "out", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "out", "mountPath": MOUNT}],
    })

    def hook(d):
        return "helm.sh/hook" in (d["metadata"].get("annotations") or {})

    # The hook: its own ConfigMap and Job, the Job's config migrates the fresh database.
    job = next(d for d in docs if d["kind"] == "Job")
    hook_config = next(d for d in docs if d["kind"] == "ConfigMap" and hook(d))
    migrate_config = workdir / "migrate.yaml"
    migrate_config.write_text(hook_config["data"]["config.yaml"])
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["--config", "/etc/outbox-relay/config.yaml", "migrate"]
    proc = run_cli("--config", str(migrate_config), "migrate", env=pod_env(container, db.url))
    assert "applied" in proc.stdout, proc.stdout
    assert db.scalar("SELECT to_regclass('outbox_events') IS NOT NULL")

    # The relay: the chart's ConfigMap, the file sink's volume here instead of the pod's.
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    relay_container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "relay")
    assert relay_container["args"] == ["run", "--config", "/etc/outbox-relay/config.yaml"]
    config_map = next(d for d in docs if d["kind"] == "ConfigMap" and not hook(d) and "config.yaml" in d["data"])
    out = workdir / "out"
    out.mkdir()
    config = yaml.safe_load(config_map["data"]["config.yaml"].replace(MOUNT, str(out)))
    relay = relays(config, env=pod_env(relay_container, db.url))

    probes = {p: relay_container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe")}
    assert probes == {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
    wait_until(lambda: http_get(port, probes["readinessProbe"])[0] == 200, message="/readyz 200")
    assert http_get(port, probes["livenessProbe"])[0] == 200

    db.insert([("order.paid", f"key-{i % 10}", {"i": i}) for i in range(200)])
    wait_until(lambda: len(read_jsonl(out / "events.jsonl")) >= 200, message="200 events in the file")
    events = read_jsonl(out / "events.jsonl")
    assert sorted(e["payload"]["i"] for e in events) == list(range(200))
    for key in {e["key"] for e in events}:
        ids = [e["id"] for e in events if e["key"] == key]
        assert ids == sorted(ids), f"key {key} out of order"
    assert relay.stop() == 0
