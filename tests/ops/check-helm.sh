#!/usr/bin/env bash
# Checks the Helm chart deploy/helm/outbox-relay: `helm lint --strict`, `helm template` with the
# default values and with each values file of its ci/ folder (plus a few --set variants), every
# rendered manifest checked offline against the Kubernetes API types (tests/ops/k8s-validate),
# and what matters in the output: secrets only in Secrets, the security defaults, the probes, the
# migrate hook on and off, the PrometheusRule equal to deploy/prometheus/alerts.yml, the
# dashboard equal to deploy/grafana/dashboards/outbox-relay.json, and the rendered relay configs
# accepted by the relay binary (`config check`; skipped, saying so, without a binary).
#
#   tests/ops/check-helm.sh
#
# helm (v4.3.2, the version tests/ops/k8s-validate/go.mod requires) and the validator are built
# from the Go module proxy by one `go build` of tests/ops/k8s-validate (so the Kubernetes modules
# they share compile once) into ${OUTBOX_HELM_CACHE:-~/.cache/outbox-relay/helm}/<hash of that
# module's files and the Go version>/, and reused while that hash holds.
# Environment: OUTBOX_RELAY_BIN (default build/bin/outbox-relay), OUTBOX_HELM_CACHE.
# Prints one "ok: ...", "skip: ..." or "FAIL: ..." line per check; exits 1 if any check failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
chart=$root/deploy/helm/outbox-relay
module=$root/tests/ops/k8s-validate
relay_bin=$(realpath -m "${OUTBOX_RELAY_BIN:-$root/build/bin/outbox-relay}")
cache=${OUTBOX_HELM_CACHE:-$HOME/.cache/outbox-relay/helm}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# ok, skip, fail, run, the failure count and python
. "$root/tests/ops/checks.sh"

[ -n "$python" ] || { echo "FAIL: no python with PyYAML (scripts/install-deps.sh makes the venv)"; exit 1; }

# --- helm and the validator ------------------------------------------------------------------
go=$(command -v go || true)
[ -z "$go" ] && [ -x /usr/local/go/bin/go ] && go=/usr/local/go/bin/go
[ -n "$go" ] || { echo "FAIL: no go toolchain (helm and the validator are built from the Go module proxy)"; exit 1; }
export GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"
helm_version=$(sed -n 's#^[[:space:]]*helm.sh/helm/v4 \(v[^ ]*\).*#\1#p' "$module/go.mod")
key=$( (cd "$module" && cat go.mod go.sum ./*.go && "$go" version) | sha256sum | cut -c1-16)
bin=$cache/$key
if [ ! -x "$bin/helm" ] || [ ! -x "$bin/k8s-validate" ]; then
  echo "building helm $helm_version and tests/ops/k8s-validate into $bin (one go build; minutes on a cold Go cache)"
  start=$(date +%s)
  mkdir -p "$cache"
  rm -rf "$bin.tmp"
  mkdir -p "$bin.tmp"
  # -s -w: no symbol tables or DWARF (less to link); the version is what helm's Makefile sets.
  if (cd "$module" && "$go" build -trimpath -o "$bin.tmp/" \
    -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$helm_version" \
    helm.sh/helm/v4/cmd/helm .) > "$tmp/build.log" 2>&1; then
    rm -rf "$bin"
    mv "$bin.tmp" "$bin"
    # Other keys' builds are of older versions of these files: drop them.
    find "$cache" -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +
    ok "built helm $helm_version and k8s-validate in $(($(date +%s) - start)) s"
  else
    fail "go build of helm $helm_version and tests/ops/k8s-validate" "$tmp/build.log"
    exit 1
  fi
fi
helm=$bin/helm
validate=$bin/k8s-validate
"$helm" version --template '{{.Version}}' > "$tmp/version" 2>&1
if [ "$(cat "$tmp/version")" = "$helm_version" ]; then
  ok "helm $(cat "$tmp/version")"
else
  fail "helm version is not $helm_version" "$tmp/version"
fi
# helm keeps no state for lint and template, but give it its own dirs all the same.
export HELM_CACHE_HOME=$tmp/helm/cache HELM_CONFIG_HOME=$tmp/helm/config HELM_DATA_HOME=$tmp/helm/data

# --- one source for the rules, the dashboard and the version ---------------------------------
for pair in "deploy/prometheus/alerts.yml files/alerts.yml" \
  "deploy/grafana/dashboards/outbox-relay.json files/outbox-relay.json"; do
  set -- $pair
  if cmp -s "$root/$1" "$chart/$2"; then
    ok "chart's $2 is identical to $1"
  else
    echo "copy it again: cp $1 deploy/helm/outbox-relay/$2" > "$tmp/out"
    fail "chart's $2 differs from $1" "$tmp/out"
  fi
done
cmake_version=$(sed -n 's/^project(outbox_relay VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
app_version=$(sed -n 's/^appVersion: "\(.*\)"/\1/p' "$chart/Chart.yaml")
if [ -n "$cmake_version" ] && [ "$cmake_version" = "$app_version" ]; then
  ok "Chart.yaml appVersion $app_version is CMakeLists.txt's project VERSION"
else
  echo "Chart.yaml appVersion '$app_version', CMakeLists.txt VERSION '$cmake_version'" > "$tmp/out"
  fail "Chart.yaml appVersion" "$tmp/out"
fi

# --- lint and render ---------------------------------------------------------------------------
run "helm lint --strict (default values)" "$helm" lint --strict "$chart"
values_files=("$chart"/ci/*-values.yaml)
for f in "${values_files[@]}"; do
  run "helm lint --strict -f ci/$(basename "$f")" "$helm" lint --strict "$chart" -f "$f"
done

# render NAME ARGS...: $tmp/render/NAME.yaml
mkdir -p "$tmp/render"
render() {
  local name=$1
  shift
  run "helm template: $name" bash -c '"$@" > "$0"' "$tmp/render/$name.yaml" \
    "$helm" template outbox-relay "$chart" --namespace outbox "$@"
}
render default
for f in "${values_files[@]}"; do
  render "$(basename "$f" .yaml)" -f "$f"
done
render full-no-hook -f "$chart/ci/full-values.yaml" --set migrate.enabled=false
render default-no-hook --set migrate.enabled=false
render one-replica --set replicaCount=1
render no-config-check -f "$chart/ci/full-values.yaml" --set configCheck.enabled=false

# Values the chart must refuse, each with a message naming the key.
refuse() {
  local name=$1 want=$2
  shift 2
  if "$helm" template outbox-relay "$chart" --namespace outbox "$@" > "$tmp/out" 2>&1; then
    echo "rendered, but should have been refused" >> "$tmp/out"
    fail "refused: $name" "$tmp/out"
  elif grep -q "$want" "$tmp/out"; then
    ok "refused: $name"
  else
    fail "refused: $name, but without '$want'" "$tmp/out"
  fi
}
refuse "a database URL in config" "config.database.url" --set config.database.url=postgresql://u:p@db/app
refuse "config.http.listen" "config.http.listen" --set config.http.listen=127.0.0.1:9187
refuse "config.http.enabled=false" "config.http.enabled" --set config.http.enabled=false
refuse "no sinks" "config.sinks" --set config.sinks=null
refuse "no database secret" "database:" --set database.existingSecret=
refuse "ServiceMonitor without the Service" "service.enabled" \
  --set metrics.serviceMonitor.enabled=true --set service.enabled=false
refuse "an unknown values key" "additional properties" --set replicas=3

# --- the Kubernetes schemas, offline -----------------------------------------------------------
rendered=("$tmp"/render/*.yaml)
if "$validate" "${rendered[@]}" > "$tmp/out" 2>&1; then
  ok "every rendered document decodes strictly into the k8s.io/api and monitoring.coreos.com/v1 types" \
    "($(tail -n1 "$tmp/out"))"
else
  fail "offline schema check (tests/ops/k8s-validate)" "$tmp/out"
fi
# The validator itself must refuse what it is there to find.
cat > "$tmp/bad.yaml" << 'EOF'
apiVersion: apps/v1
kind: Deployment
metadata: {name: bad, namespace: outbox}
spec:
  replicas: "two"
---
apiVersion: v1
kind: ConfigMap
metadata: {name: bad, namespace: outbox}
data: {a: b}
datas: {a: b}
---
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: bad, namespace: outbox}
spec:
  selector: {matchLabels: {a: b}}
  endpoints: [{port: metrics, interval: 30 seconds}]
---
apiVersion: v1
kind: Service
metadata: {name: Bad_Name, namespace: outbox}
spec:
  ports: [{name: metrics}]
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: bad, namespace: outbox}
---
apiVersion: batch/v1
kind: Job
metadata: {name: bad, namespace: outbox}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: c
          image: x
          securityContext: {readOnlyRootFileSystem: true}
EOF
"$validate" "$tmp/bad.yaml" > "$tmp/out" 2>&1
if [ "$(grep -c '^FAIL: ' "$tmp/out")" = 6 ] && grep -q 'unknown field "datas"' "$tmp/out" \
  && grep -q 'unknown field "spec.template.spec.containers\[0\].securityContext.readOnlyRootFileSystem"' "$tmp/out" \
  && grep -q 'spec.ports\[0\].port: required field missing' "$tmp/out"; then
  ok "the validator refuses a wrong type, unknown fields, a bad duration, a bad name, a missing field," \
    "an unknown kind"
else
  fail "the validator let through what it should refuse" "$tmp/out"
fi

# --- what matters in the output ----------------------------------------------------------------
mkdir -p "$tmp/configs"
# A certificate to stand in for the files the pods mount from Secrets (a sink's tls.ca_file is read
# and parsed by the relay's config check).
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=stand-in -days 2 \
  -keyout /dev/null -out "$tmp/stand-in.pem" > /dev/null 2>&1 || echo "stand-in" > "$tmp/stand-in.pem"
run "rendered output: secrets, security defaults, probes, hook, monitoring, dashboard" \
  "$python" - "$tmp/render" "$chart" "$root" "$tmp/configs" "$tmp/stand-in.pem" << 'PY'
import base64, json, pathlib, sys, yaml
render, chart, root, configs, stand_in = (pathlib.Path(p) for p in sys.argv[1:6])
errors = []
def err(msg): errors.append(msg)

def load(name):
    return [d for d in yaml.safe_load_all(open(render / f"{name}.yaml")) if d]
def of_kind(docs, kind): return [d for d in docs if d["kind"] == kind]
def one(docs, kind, name=None):
    found = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    if len(found) != 1: raise SystemExit(f"expected one {kind} {name or ''}, found {len(found)}")
    return found[0]
def hooks(docs): return [d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {})]
def pod_specs(docs):
    for d in docs:
        if d["kind"] in ("Deployment", "Job"): yield d, d["spec"]["template"]["spec"]

# The secret values of the values files: none may appear outside a Secret.
full_values = yaml.safe_load(open(chart / "ci/full-values.yaml"))
secret_values = [full_values["database"]["url"], full_values["migrate"]["url"],
                 *full_values["secrets"]["create"].values()]
passwords = ["fake-db-password-5f1c", "fake-owner-password-9e04"]

renders = {p.stem: load(p.stem) for p in render.glob("*.yaml")}
for name, docs in renders.items():
    for d in docs:
        if d["kind"] == "Secret": continue
        text = yaml.safe_dump(d)
        for s in secret_values + passwords:
            if s in text: err(f"{name}: {d['kind']} {d['metadata']['name']} holds the secret value {s!r}")
    for owner, spec in pod_specs(docs):
        where = f"{name}: {owner['kind']} {owner['metadata']['name']}"
        # Security defaults.
        psc = spec.get("securityContext") or {}
        if psc.get("runAsNonRoot") is not True: err(f"{where}: pod securityContext.runAsNonRoot is not true")
        if spec.get("automountServiceAccountToken") is not False: err(f"{where}: a service account token is mounted")
        for c in spec.get("initContainers", []) + spec["containers"]:
            sc = c.get("securityContext") or {}
            if sc.get("allowPrivilegeEscalation") is not False: err(f"{where}/{c['name']}: allowPrivilegeEscalation")
            if sc.get("readOnlyRootFilesystem") is not True: err(f"{where}/{c['name']}: root filesystem writable")
            if (sc.get("capabilities") or {}).get("drop") != ["ALL"]:
                err(f"{where}/{c['name']}: capabilities not dropped")
            if sc.get("privileged"): err(f"{where}/{c['name']}: privileged")
            # No secret on a command line, and DATABASE_URL only from a Secret.
            for arg in c.get("args", []) + c.get("command", []):
                if "://" in arg or "password" in arg.lower(): err(f"{where}/{c['name']}: secret-like argument {arg!r}")
            env = {e["name"]: e for e in c.get("env", [])}
            db = env.get("DATABASE_URL", {})
            if "secretKeyRef" not in (db.get("valueFrom") or {}):
                err(f"{where}/{c['name']}: DATABASE_URL not from a Secret")
            for e in c.get("env", []):
                if "://" in str(e.get("value", "")) and "@" in str(e.get("value", "")):
                    err(f"{where}/{c['name']}: env {e['name']} carries credentials in plain text")
    # Every Secret a pod refers to is rendered here or named by the values (an existing one).
    rendered_secrets = {d["metadata"]["name"] for d in of_kind(docs, "Secret")}
    for owner, spec in pod_specs(docs):
        for c in spec.get("initContainers", []) + spec["containers"]:
            for e in c.get("env", []):
                ref = (e.get("valueFrom") or {}).get("secretKeyRef")
                if not ref: continue
                made = [d for d in of_kind(docs, "Secret") if d["metadata"]["name"] == ref["name"]]
                if made and ref["key"] not in made[0].get("data", {}):
                    err(f"{name}: {c['name']} env {e['name']} names key {ref['key']} missing from Secret {ref['name']}")
                if not made and ref["name"] not in ("outbox-relay-db", "orders-db", "orders-relay-secrets"):
                    err(f"{name}: {c['name']} env {e['name']} names Secret {ref['name']}, "
                        "neither rendered nor existing")
    # Hook Secrets and ConfigMaps belong to the hook; the Job must not use the release's own
    # objects, which do not exist yet at pre-install.
    release_objects = {(d["kind"], d["metadata"]["name"]) for d in docs if d not in hooks(docs)}
    for job in of_kind(docs, "Job"):
        spec = job["spec"]["template"]["spec"]
        for v in spec.get("volumes", []):
            if "configMap" in v and ("ConfigMap", v["configMap"]["name"]) in release_objects:
                err(f"{name}: the migrate Job mounts the release's ConfigMap, absent at pre-install")
        for e in spec["containers"][0].get("env", []):
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref and ("Secret", ref["name"]) in release_objects:
                err(f"{name}: the migrate Job reads the release's Secret {ref['name']}, absent at pre-install")
        sa = spec.get("serviceAccountName")
        if sa and ("ServiceAccount", sa) in release_objects:
            err(f"{name}: the migrate Job runs as the release's ServiceAccount, absent at pre-install")
        # Its pod is no relay: no selector of the relays' may count it.
        job_labels = job["spec"]["template"]["metadata"]["labels"].items()
        for d in docs:
            sel = {"Service": lambda d: d["spec"].get("selector"),
                   "Deployment": lambda d: d["spec"]["selector"]["matchLabels"],
                   "PodDisruptionBudget": lambda d: d["spec"]["selector"]["matchLabels"],
                   "PodMonitor": lambda d: d["spec"]["selector"]["matchLabels"]}.get(d["kind"])
            if sel and not (sel(d).items() - job_labels):
                err(f"{name}: {d['kind']} {d['metadata']['name']} selects the migrate Job's pod")

    # The relay's config: http.listen on the metrics port, no database URL; written out for the
    # relay binary's own check below, with the environment the pod gives it.
    for cm in of_kind(docs, "ConfigMap"):
        if "config.yaml" not in cm.get("data", {}): continue
        config = yaml.safe_load(cm["data"]["config.yaml"])
        if "url" in (config.get("database") or {}): err(f"{name}: ConfigMap {cm['metadata']['name']} has database.url")
        hook = cm in hooks(docs)
        user = next(d for d in (of_kind(docs, "Job") if hook else of_kind(docs, "Deployment")))
        spec = user["spec"]["template"]["spec"]
        container = spec["containers"][0]
        if not hook:
            port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
            if config.get("http", {}).get("listen") != f"0.0.0.0:{port}":
                err(f"{name}: http.listen {config.get('http', {}).get('listen')} is not 0.0.0.0:{port}")
        # Variables from a Secret rendered here get its value, from a Secret of the user's a stand-in.
        made = {(d["metadata"]["name"], k): base64.b64decode(v).decode()
                for d in of_kind(docs, "Secret") for k, v in d.get("data", {}).items()}
        env = {}
        for e in container.get("env", []):
            ref = (e.get("valueFrom") or {}).get("secretKeyRef") or {}
            env[e["name"]] = e["value"] if "value" in e else made.get((ref.get("name"), ref.get("key")), "stand-in")
        if "DATABASE_URL" in env: env["DATABASE_URL"] = "postgresql://nobody:nothing@127.0.0.1:1/none?connect_timeout=1"
        for source in container.get("envFrom", []):
            if "secretRef" in source: env["ENV_FROM_SECRET"] = source["secretRef"]["name"]
        stem = f"{name}--{'migrate' if hook else 'relay'}"
        # The pod's other mounts (CA files, a file sink's directory) as directories here, their
        # paths in the config pointed at them; a Secret's or ConfigMap's items as stand-in files.
        text = cm["data"]["config.yaml"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = [m for m in container.get("volumeMounts", []) if m["name"] != "config"]
        for m in sorted(mounts, key=lambda m: -len(m["mountPath"])):
            local = configs / f"{stem}.root" / m["mountPath"].lstrip("/")
            local.mkdir(parents=True, exist_ok=True)
            source = volumes[m["name"]].get("secret") or volumes[m["name"]].get("configMap") or {}
            for item in source.get("items", []):
                (local / item["path"]).write_text(stand_in.read_text())
            text = text.replace(m["mountPath"], str(local))
        (configs / f"{stem}.yaml").write_text(text)
        (configs / f"{stem}.env").write_text(json.dumps(env))

    deployments = of_kind(docs, "Deployment")
    if len(deployments) != 1: err(f"{name}: {len(deployments)} Deployments"); continue
    dep = deployments[0]
    pod = dep["spec"]["template"]
    relay = next(c for c in pod["spec"]["containers"] if c["name"] == "relay")
    if relay["args"][:1] != ["run"]: err(f"{name}: the relay container does not run `run`")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        if relay.get(probe, {}).get("httpGet", {}).get("path") != path: err(f"{name}: {probe} is not GET {path}")
    if "checksum/config" not in pod["metadata"].get("annotations", {}): err(f"{name}: no checksum/config annotation")
    if dep["spec"]["selector"]["matchLabels"].items() - pod["metadata"]["labels"].items():
        err(f"{name}: the selector does not match the pod's labels")
    init = [c["name"] for c in pod["spec"].get("initContainers", [])]
    want_check = name != "no-config-check"
    if (init == ["config-check"]) != want_check: err(f"{name}: init containers {init}")
    # PDB: as the Deployment's selector, and none over a single replica.
    pdbs = of_kind(docs, "PodDisruptionBudget")
    if dep["spec"]["replicas"] > 1:
        if len(pdbs) != 1 or pdbs[0]["spec"]["selector"] != dep["spec"]["selector"]:
            err(f"{name}: expected one PodDisruptionBudget with the Deployment's selector")
    elif pdbs:
        err(f"{name}: a PodDisruptionBudget over a single replica blocks node drains")
    # The migrate hook: present by default, on pre-install and pre-upgrade; absent when off.
    jobs = of_kind(docs, "Job")
    hook_off = name.endswith("no-hook") or name == "existing-secret-values"
    if hook_off:
        if jobs or hooks(docs):
            err(f"{name}: the migrate hook is off, yet rendered: {[d['kind'] for d in hooks(docs)]}")
    else:
        if len(jobs) != 1: err(f"{name}: expected the migrate Job"); continue
        job = jobs[0]
        ann = job["metadata"]["annotations"]
        if ann.get("helm.sh/hook") != "pre-install,pre-upgrade":
            err(f"{name}: migrate Job hook is {ann.get('helm.sh/hook')!r}")
        if job["spec"]["template"]["spec"]["containers"][0]["args"][-1:] != ["migrate"]:
            err(f"{name}: the Job does not run migrate")
        for d in hooks(docs):
            a = d["metadata"]["annotations"]
            if a["helm.sh/hook"] != "pre-install,pre-upgrade": err(f"{name}: {d['kind']} hook {a['helm.sh/hook']}")
            if d is not job and int(a.get("helm.sh/hook-weight", 0)) >= int(ann.get("helm.sh/hook-weight", 0)):
                err(f"{name}: {d['kind']} {d['metadata']['name']} is not made before the Job")

# Defaults: no monitoring objects, no dashboard, no Secret; the full values: each of them.
default = renders["default"]
kinds = sorted(d["kind"] for d in default)
if kinds != sorted(["ConfigMap", "ConfigMap", "Deployment", "Job", "PodDisruptionBudget", "Service", "ServiceAccount"]):
    err(f"default: unexpected set of objects {kinds}")
full = renders["full-values"]
for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "Secret"):
    if not of_kind(full, kind): err(f"full-values: no {kind}")

# The PrometheusRule carries exactly the groups of deploy/prometheus/alerts.yml.
alerts = yaml.safe_load(open(root / "deploy/prometheus/alerts.yml"))["groups"]
for name in ("full-values", "existing-secret-values"):
    rule = one(renders[name], "PrometheusRule")
    if rule["spec"]["groups"] != alerts: err(f"{name}: PrometheusRule groups differ from deploy/prometheus/alerts.yml")
    rendered_alerts = [r.get("alert") for g in rule["spec"]["groups"] for r in g["rules"]]
    if len(rendered_alerts) < 5: err(f"{name}: only {rendered_alerts} in the PrometheusRule")

# The dashboard ConfigMap: the dashboard as it is, labelled for the sidecar, in its namespace.
dash = one(full, "ConfigMap", "orders-outbox-dashboard")
dashboard = json.load(open(root / "deploy/grafana/dashboards/outbox-relay.json"))
if json.loads(dash["data"]["outbox-relay.json"]) != dashboard:
    err("full-values: the dashboard ConfigMap differs from deploy/grafana/dashboards/outbox-relay.json")
if dash["metadata"]["labels"].get("grafana_dashboard") != "1":
    err("full-values: dashboard without grafana_dashboard label")
if dash["metadata"]["namespace"] != "monitoring": err("full-values: dashboard namespace not honoured")

# ServiceMonitor selects the Service, PodMonitor the pods, both on the metrics port.
svc = one(full, "Service")
sm, pm = one(full, "ServiceMonitor"), one(full, "PodMonitor")
if sm["spec"]["selector"]["matchLabels"].items() - svc["metadata"]["labels"].items():
    err("ServiceMonitor does not select the Service")
if sm["spec"]["endpoints"][0]["port"] != svc["spec"]["ports"][0]["name"]:
    err("ServiceMonitor port is not the Service's")
pod_labels = one(full, "Deployment")["spec"]["template"]["metadata"]["labels"]
if pm["spec"]["selector"]["matchLabels"].items() - pod_labels.items(): err("PodMonitor does not select the pods")
for m in (sm, pm):
    if m["metadata"]["labels"].get("release") != "kube-prometheus-stack": err(f"{m['kind']}: labels not applied")

# The chart-made Secret holds exactly the values' secrets; the migrate hook Secret the owner's URL.
secrets = {d["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in d["data"].items()}
           for d in of_kind(full, "Secret")}
want = {"DATABASE_URL": full_values["database"]["url"], **full_values["secrets"]["create"]}
if secrets.get("orders-outbox") != want:
    err(f"full-values: the chart's Secret holds {sorted(secrets.get('orders-outbox', {}))}")
if secrets.get("orders-outbox-migrate") != {"DATABASE_URL": full_values["migrate"]["url"]}:
    err("full-values: the migrate hook Secret")
existing = renders["existing-secret-values"]
if of_kind(existing, "Secret"): err("existing-secret-values: the chart made a Secret")

if errors: sys.exit("\n".join(errors))
PY

# Every values key is in the README's table, and every key the table names is a values key.
run "chart README documents every values key" "$python" - "$chart" << 'PY'
import pathlib, re, sys, yaml
chart = pathlib.Path(sys.argv[1])
values = yaml.safe_load(open(chart / "values.yaml"))
keys = set()
def walk(prefix, v):
    # config is the relay's file (docs/configuration.md); maps of the user's own are leaves.
    if isinstance(v, dict) and v and prefix not in ("config", "resources", "podSecurityContext", "securityContext",
            "livenessProbe", "readinessProbe", "startupProbe", "updateStrategy", "grafanaDashboard.labels"):
        for k, sub in v.items(): walk(f"{prefix}.{k}" if prefix else k, sub)
    else:
        keys.add(prefix)
walk("", values)
readme = (chart / "README.md").read_text()
table = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", readme, re.M))
missing, unknown = sorted(keys - table), sorted(table - keys)
if missing or unknown: sys.exit(f"not in the README's values table: {missing}; in it but not a values key: {unknown}")
PY

# The configs the chart renders, checked by the relay itself with the environment the pod gives
# it: the relay's with `config check` (exit 0), the migrate hook's (a database section only, so no
# sinks for `config check`) with `migrate` against a closed port (exit 1 after the config loaded,
# 2 on a config error).
if [ ! -x "$relay_bin" ]; then
  skip "rendered relay configs: no binary at $relay_bin"
else
  for f in "$tmp"/configs/*.yaml; do
    [ -e "$f" ] || continue
    stem=$(basename "$f" .yaml)
    if grep -q ENV_FROM_SECRET "$tmp/configs/$stem.env"; then
      skip "relay config of $stem: its variables come from a whole Secret (envFrom), unknown here"
      continue
    fi
    mapfile -t env_args < <("$python" -c 'import json, sys
for k, v in json.load(open(sys.argv[1])).items(): print(f"{k}={v}")' "$tmp/configs/$stem.env")
    case "$stem" in
      *--relay)
        run "outbox-relay config check: ${stem%--relay}" env -i PATH="$PATH" "${env_args[@]}" \
          "$relay_bin" --config "$f" config check
        ;;
      *--migrate)
        env -i PATH="$PATH" "${env_args[@]}" "$relay_bin" --config "$f" migrate > "$tmp/out" 2>&1
        code=$?
        if [ "$code" = 1 ] && grep -q "migrate failed: connection" "$tmp/out"; then
          ok "outbox-relay migrate loads the hook's config: ${stem%--migrate}"
        else
          fail "outbox-relay migrate with the hook's config of ${stem%--migrate} (exit $code)" "$tmp/out"
        fi
        ;;
    esac
  done
fi

if [ "$failures" -gt 0 ]; then
  echo "$failures helm check(s) failed"
  exit 1
fi
echo "all helm checks passed"
