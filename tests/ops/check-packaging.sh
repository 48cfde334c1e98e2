#!/usr/bin/env bash
# Validates the packaging that cannot be exercised here (docker does not run on CI machines):
# alert rules, Prometheus config, Grafana dashboard, Kubernetes manifests, systemd unit, the relay
# configs shipped in deploy/, the Dockerfile's contract and docker-compose.yml.
#
#   tests/ops/check-packaging.sh [all|rules|dashboard|metrics|configs|manifests|systemd|docker|compose]...
#
# Prints one "ok: ...", "skip: ..." or "FAIL: ..." line per check; exits 1 if any check failed.
# Environment: OUTBOX_ALERT_RULES, OUTBOX_COMPOSE_FILE (files to check instead of the repo's),
# OUTBOX_RELAY_BIN (default build/bin/outbox-relay), PROMTOOL (default: PATH, then the cache dir
# scripts/install-deps.sh unpacks it to; "none" forces the schema-check fallback).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rules=${OUTBOX_ALERT_RULES:-$root/deploy/prometheus/alerts.yml}
compose=${OUTBOX_COMPOSE_FILE:-$root/docker-compose.yml}
relay_bin=$(realpath -m "${OUTBOX_RELAY_BIN:-$root/build/bin/outbox-relay}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ok, skip, fail, run, the failure count and python
. "$root/tests/ops/checks.sh"

promtool=${PROMTOOL:-$(command -v promtool || true)}
if [ -z "$promtool" ] && [ -x "$HOME/.cache/outbox-relay/bin/promtool" ]; then
  promtool=$HOME/.cache/outbox-relay/bin/promtool
fi
[ "$promtool" = none ] && promtool=""  # PROMTOOL=none: exercise the fallback checks


check_rules() {
  if [ -n "$promtool" ]; then
    run "promtool check rules $rules" "$promtool" check rules "$rules"
    if [ "$rules" = "$root/deploy/prometheus/alerts.yml" ]; then
      run "promtool test rules tests/ops/alerts_test.yml" \
        bash -c 'cd "$1" && "$2" test rules alerts_test.yml' _ "$root/tests/ops" "$promtool"
    fi
    run "promtool check config deploy/prometheus/prometheus.yml" \
      "$promtool" check config "$root/deploy/prometheus/prometheus.yml"
    return
  fi
  [ -n "$python" ] || { fail "alert rules schema check: no python with PyYAML"; return; }
  run "alert rules schema check $rules (promtool not found)" "$python" - "$rules" <<'PY'
import re, sys, yaml
path = sys.argv[1]
doc = yaml.safe_load(open(path))
errors = []
duration = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
def balanced(expr):
    pairs, stack = {")": "(", "]": "[", "}": "{"}, []
    quote = None
    for ch in expr:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'`":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            if not stack or stack.pop() != pairs[ch]:
                return False
    return not stack and quote is None
if not isinstance(doc, dict) or set(doc) != {"groups"} or not isinstance(doc["groups"], list):
    errors.append("top level must be a mapping with only 'groups' (a list)")
names = set()
for g in (doc or {}).get("groups") or []:
    if not isinstance(g, dict) or not isinstance(g.get("name"), str) or not isinstance(g.get("rules"), list):
        errors.append(f"group {g!r}: needs a name and a list of rules"); continue
    if g["name"] in names: errors.append(f"group {g['name']}: duplicate name")
    names.add(g["name"])
    unknown = set(g) - {"name", "interval", "limit", "rules"}
    if unknown: errors.append(f"group {g['name']}: unknown keys {sorted(unknown)}")
    for r in g["rules"]:
        what = r.get("alert") or r.get("record")
        if ("alert" in r) == ("record" in r): errors.append(f"{what}: exactly one of alert/record")
        unknown = set(r) - {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
        if unknown: errors.append(f"{what}: unknown keys {sorted(unknown)}")
        expr = r.get("expr")
        if not isinstance(expr, str) or not expr.strip(): errors.append(f"{what}: expr must be a non-empty string")
        elif not balanced(expr): errors.append(f"{what}: unbalanced brackets in expr {expr!r}")
        if "for" in r and not duration.match(str(r["for"])): errors.append(f"{what}: bad 'for' {r['for']!r}")
        if "record" in r and "annotations" in r: errors.append(f"{what}: recording rules take no annotations")
        for key in ("labels", "annotations"):
            m = r.get(key, {})
            if not isinstance(m, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
                errors.append(f"{what}: {key} must map strings to strings")
if errors:
    sys.exit("\n".join(errors))
PY
}

check_dashboard() {
  local dash=$root/deploy/grafana/dashboards/outbox-relay.json
  [ -n "$python" ] || { fail "dashboard: no python with PyYAML"; return; }
  # Every panel query becomes a recording rule (Grafana's variables replaced by values), so
  # promtool's PromQL parser checks it; without promtool, brackets are checked.
  run "grafana dashboard JSON and provisioning" "$python" - "$dash" "$tmp/dashboard-rules.yml" \
    "$root/deploy/grafana/provisioning" <<'PY'
import json, pathlib, sys, yaml
dash = json.load(open(sys.argv[1]))
errors = []
for key in ("uid", "title", "panels", "schemaVersion"):
    if key not in dash: errors.append(f"dashboard: missing {key}")
exprs, ids = [], set()
def walk(panels):
    for p in panels:
        if p.get("id") in ids: errors.append(f"panel id {p.get('id')} used twice")
        ids.add(p.get("id"))
        walk(p.get("panels", []))
        for t in p.get("targets", []):
            if t.get("expr"): exprs.append((p.get("title"), t["expr"]))
walk(dash.get("panels", []))
if not exprs: errors.append("dashboard: no queries")
subst = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "1m", "$job": ".*", "$instance": ".*"}
rules = []
for i, (title, expr) in enumerate(exprs):
    for k, v in subst.items(): expr = expr.replace(k, v)
    if "$" in expr: errors.append(f"panel {title!r}: unknown variable in {expr!r}")
    rules.append({"record": f"dashboard:query_{i}", "expr": expr})
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
for f in sorted(pathlib.Path(sys.argv[3]).rglob("*.yml")):
    doc = yaml.safe_load(open(f))
    if not isinstance(doc, dict) or doc.get("apiVersion") != 1:
        errors.append(f"{f}: grafana provisioning needs apiVersion: 1")
if errors: sys.exit("\n".join(errors))
PY
  if [ -n "$promtool" ] && [ -s "$tmp/dashboard-rules.yml" ]; then
    run "promtool parses every dashboard query" "$promtool" check rules "$tmp/dashboard-rules.yml"
  fi
}

# The metric names used in deploy/ must be ones the relay exposes: scrape a live relay (its
# HTTP server answers without a database) and compare.
check_metrics() {
  if [ ! -x "$relay_bin" ]; then
    skip "metric names vs live /metrics: no binary at $relay_bin"
    return
  fi
  [ -n "$python" ] || { fail "metric names: no python"; return; }
  local port
  port=$("$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  printf 'http: {listen: "127.0.0.1:%s"}\nsinks: [{name: out, type: stdout}]\n' "$port" > "$tmp/metrics.yaml"
  DATABASE_URL="postgresql://nobody:nothing@127.0.0.1:1/none?connect_timeout=1" \
    "$relay_bin" run --config "$tmp/metrics.yaml" > /dev/null 2> "$tmp/relay.log" &
  local pid=$!
  local scraped=""
  for _ in $(seq 1 50); do
    if "$python" -c "import urllib.request,sys; open(sys.argv[2],'wb').write(urllib.request.urlopen('http://127.0.0.1:%s/metrics' % sys.argv[1], timeout=2).read())" \
      "$port" "$tmp/metrics.txt" 2> /dev/null; then
      scraped=1
      break
    fi
    sleep 0.1
  done
  kill -TERM "$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
  if [ -z "$scraped" ]; then
    fail "metric names vs live /metrics: the relay did not serve /metrics" "$tmp/relay.log"
    return
  fi
  run "metric names in deploy/ exist in the relay's /metrics" "$python" - "$tmp/metrics.txt" \
    "$root/deploy" "$rules" <<'PY'
import pathlib, re, sys
exposed = set()
for line in open(sys.argv[1]):
    if line.startswith("# TYPE "):
        name, kind = line.split()[2:4]
        exposed.add(name)
        if kind == "histogram": exposed |= {name + "_bucket", name + "_count", name + "_sum"}
files = [p for p in pathlib.Path(sys.argv[2]).rglob("*") if p.is_file()] + [pathlib.Path(sys.argv[3])]
used = {}
for f in files:
    for name in re.findall(r"\boutbox_relay_[a-z_]+", f.read_text(errors="replace")):
        used.setdefault(name, f)
unknown = {n: str(f) for n, f in used.items() if n not in exposed}
if unknown: sys.exit(f"not exposed by the relay: {unknown}")
if len(used) < 10: sys.exit(f"suspiciously few metric names found: {sorted(used)}")
PY
}

# The relay configs shipped in deploy/ must parse: `status` loads the config first (exit 2 on a
# config error) and only then connects (exit 1 against a closed port).
check_configs() {
  if [ ! -x "$relay_bin" ]; then
    skip "deploy relay configs: no binary at $relay_bin"
    return
  fi
  [ -n "$python" ] || { fail "deploy relay configs: no python with PyYAML"; return; }
  "$python" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["data"]["config.yaml"], end="")' \
    "$root/deploy/kubernetes/configmap.yaml" > "$tmp/k8s-config.yaml"
  local f code
  for f in "$root/deploy/compose/relay.yaml" "$tmp/k8s-config.yaml"; do
    DATABASE_URL="postgresql://nobody:nothing@127.0.0.1:1/none?connect_timeout=1" KAFKA_BROKERS=kafka:9092 \
      "$relay_bin" --config "$f" status > "$tmp/out" 2>&1
    code=$?
    local name="relay config parses: ${f#"$root"/}"
    [ "$f" = "$tmp/k8s-config.yaml" ] && name="relay config parses: deploy/kubernetes/configmap.yaml"
    if [ "$code" = 1 ] && grep -q "status failed" "$tmp/out"; then ok "$name"; else fail "$name (exit $code)" "$tmp/out"; fi
  done
}

check_manifests() {
  [ -n "$python" ] || { fail "kubernetes manifests: no python with PyYAML"; return; }
  run "kubernetes manifests (structure, probes, secret refs, PDB)" "$python" - "$root/deploy/kubernetes" <<'PY'
import pathlib, sys, yaml
d = pathlib.Path(sys.argv[1])
errors, kinds = [], {}
kustomization = yaml.safe_load(open(d / "kustomization.yaml"))
for res in kustomization["resources"]:
    if not (d / res).exists(): errors.append(f"kustomization: missing {res}")
for f in sorted(d.glob("*.yaml")):
    if f.name == "kustomization.yaml": continue
    for doc in yaml.safe_load_all(open(f)):
        if doc is None: continue
        for key in ("apiVersion", "kind", "metadata"):
            if key not in doc: errors.append(f"{f.name}: missing {key}")
        kinds.setdefault(doc["kind"], []).append(doc)
        if not doc.get("metadata", {}).get("name"): errors.append(f"{f.name}: metadata.name missing")
for kind in ("Deployment", "ConfigMap", "PodDisruptionBudget", "Service", "Secret", "ServiceAccount"):
    if kind not in kinds: errors.append(f"no {kind}")
dep = kinds["Deployment"][0]
pod = dep["spec"]["template"]["spec"]
if dep["spec"]["selector"]["matchLabels"].items() - dep["spec"]["template"]["metadata"]["labels"].items():
    errors.append("Deployment selector does not match the pod labels")
c = pod["containers"][0]
if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz": errors.append("liveness probe must GET /healthz")
if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz": errors.append("readiness probe must GET /readyz")
refs = [e for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})]
if not refs: errors.append("no env from a secretKeyRef")
secret = kinds["Secret"][0]["metadata"]["name"]
if any(e["valueFrom"]["secretKeyRef"]["name"] != secret for e in refs): errors.append("secretKeyRef names an unknown Secret")
cm = kinds["ConfigMap"][0]
if not any(v.get("configMap", {}).get("name") == cm["metadata"]["name"] for v in pod.get("volumes", [])):
    errors.append("the ConfigMap is not mounted")
if "0.0.0.0:9187" not in cm["data"]["config.yaml"]: errors.append("http.listen must be 0.0.0.0:9187 in a pod")
if not pod.get("securityContext", {}).get("runAsNonRoot"): errors.append("pod must run as non-root")
pdb = kinds["PodDisruptionBudget"][0]["spec"]
if pdb["selector"]["matchLabels"] != dep["spec"]["selector"]["matchLabels"]: errors.append("PDB selector differs")
if errors: sys.exit("\n".join(errors))
PY
}

check_systemd() {
  if ! command -v systemd-analyze > /dev/null; then
    skip "systemd unit: systemd-analyze not installed"
    return
  fi
  mkdir -p "$tmp/systemd"
  # verify checks that ExecStart exists: point it at a binary that does.
  local bin=/bin/true
  [ -x "$relay_bin" ] && bin=$relay_bin
  sed "s#/usr/local/bin/outbox-relay#$bin#g" "$root/deploy/systemd/outbox-relay.service" \
    > "$tmp/systemd/outbox-relay.service"
  run "systemd-analyze verify deploy/systemd/outbox-relay.service" \
    systemd-analyze verify "$tmp/systemd/outbox-relay.service"
}

check_docker() {
  local f=$root/Dockerfile missing=""
  for pattern in '^FROM debian:bookworm[^ ]* AS build' '^FROM debian:bookworm' 'scripts/install-deps.sh --runtime-build' \
    'scripts/build.sh -DOUTBOX_WERROR=ON' '^USER [1-9]' '^HEALTHCHECK ' 'CMD curl [^|]*/healthz' '^COPY --from=build'; do
    grep -Eq "$pattern" "$f" || missing="$missing '$pattern'"
  done
  [ -f "$root/.dockerignore" ] || missing="$missing .dockerignore"
  if [ -z "$missing" ]; then ok "Dockerfile contract (multi-stage bookworm, install-deps, non-root, HEALTHCHECK)"
  else echo "missing:$missing" > "$tmp/out"; fail "Dockerfile contract" "$tmp/out"; fi
}

check_compose() {
  if ! command -v docker-compose > /dev/null; then
    echo "docker-compose is not installed (scripts/install-deps.sh installs it)" > "$tmp/out"
    fail "docker-compose config" "$tmp/out"
    return
  fi
  run "docker-compose config ${compose#"$root"/}" \
    docker-compose -f "$compose" --project-directory "$root" config -q
  if docker-compose -f "$compose" --project-directory "$root" config --services > "$tmp/services" 2> /dev/null; then
    local missing=""
    for s in postgres kafka relay writer prometheus grafana; do grep -qx "$s" "$tmp/services" || missing="$missing $s"; done
    if [ -z "$missing" ]; then ok "docker-compose services: $(tr '\n' ' ' < "$tmp/services")"
    else echo "missing services:$missing" > "$tmp/out"; fail "docker-compose services" "$tmp/out"; fi
  fi
}

checks=("$@")
[ "${#checks[@]}" -eq 0 ] && checks=(all)
for c in "${checks[@]}"; do
  case "$c" in
    all) check_rules; check_dashboard; check_metrics; check_configs; check_manifests; check_systemd; check_docker; check_compose ;;
    rules) check_rules ;;
    dashboard) check_dashboard ;;
    metrics) check_metrics ;;
    configs) check_configs ;;
    manifests) check_manifests ;;
    systemd) check_systemd ;;
    docker) check_docker ;;
    compose) check_compose ;;
    *) echo "usage: $0 [all|rules|dashboard|metrics|configs|manifests|systemd|docker|compose]..." >&2; exit 2 ;;
  esac
done
if [ "$failures" -gt 0 ]; then
  echo "$failures packaging check(s) failed"
  exit 1
fi
echo "all packaging checks passed"
