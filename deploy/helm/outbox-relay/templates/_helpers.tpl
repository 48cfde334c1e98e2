{{/* Names: at most 63 characters (DNS labels), as Kubernetes wants them. */}}
{{- define "outbox-relay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "outbox-relay.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "outbox-relay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
instanceLabels name the release's objects; selectorLabels its relay pods only (the migrate hook's
pod has component "migrate", so no Service, budget or monitor of the relays counts it).
*/}}
{{- define "outbox-relay.instanceLabels" -}}
app.kubernetes.io/name: {{ include "outbox-relay.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "outbox-relay.selectorLabels" -}}
{{ include "outbox-relay.instanceLabels" . }}
app.kubernetes.io/component: relay
{{- end -}}

{{- define "outbox-relay.labels" -}}
helm.sh/chart: {{ include "outbox-relay.chart" . }}
{{ include "outbox-relay.instanceLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: outbox
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "outbox-relay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "outbox-relay.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "outbox-relay.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/*
The relay's config file: .Values.config with http.listen set to the metrics port. A database URL
in it would land in a ConfigMap, so it is refused; so is a listen address or a disabled HTTP
server (the probes need it).
*/}}
{{- define "outbox-relay.config" -}}
{{- $config := deepCopy (.Values.config | default dict) -}}
{{- $database := $config.database | default dict -}}
{{- if hasKey $database "url" -}}
{{- fail "config.database.url: the database URL would land in a ConfigMap; set database.existingSecret (or database.url) instead" -}}
{{- end -}}
{{- $http := $config.http | default dict -}}
{{- if hasKey $http "listen" -}}
{{- fail "config.http.listen: the chart sets it (0.0.0.0:<metrics.port>); set metrics.port instead" -}}
{{- end -}}
{{- if and (hasKey $http "enabled") (not $http.enabled) -}}
{{- fail "config.http.enabled: the probes and metrics need the HTTP server; it cannot be false here" -}}
{{- end -}}
{{- $_ := set $http "listen" (printf "0.0.0.0:%d" (int .Values.metrics.port)) -}}
{{- $_ := set $config "http" $http -}}
{{- if not $config.sinks -}}
{{- fail "config.sinks: expected at least one sink (docs/sinks.md)" -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* Whether the chart makes a Secret, and the Secret and key DATABASE_URL comes from. */}}
{{- define "outbox-relay.secretName" -}}
{{- include "outbox-relay.fullname" . -}}
{{- end -}}

{{- define "outbox-relay.createsSecret" -}}
{{- if or .Values.database.url .Values.secrets.create -}}true{{- end -}}
{{- end -}}

{{- define "outbox-relay.databaseSecretName" -}}
{{- if .Values.database.url -}}
{{- include "outbox-relay.secretName" . -}}
{{- else if .Values.database.existingSecret -}}
{{- .Values.database.existingSecret -}}
{{- else -}}
{{- fail "database: set existingSecret (a Secret holding the URL) or url (the chart makes the Secret)" -}}
{{- end -}}
{{- end -}}

{{- define "outbox-relay.databaseSecretKey" -}}
{{- if .Values.database.url -}}DATABASE_URL{{- else -}}{{ .Values.database.existingSecretKey }}{{- end -}}
{{- end -}}

{{/*
The relay's environment, shared by the relay, the config check and (its secret variables) the
migrate hook: DATABASE_URL, the secret variables, then the plain ones.
*/}}
{{- define "outbox-relay.secretEnv" -}}
{{- $secret := include "outbox-relay.secretName" . -}}
{{- range $name, $_ := .Values.secrets.create }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $name }}
{{- end }}
{{- if .Values.secrets.existingSecret }}
{{- range .Values.secrets.existingSecretKeys }}
- name: {{ . }}
  valueFrom:
    secretKeyRef:
      name: {{ $.Values.secrets.existingSecret }}
      key: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "outbox-relay.env" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "outbox-relay.databaseSecretName" . }}
      key: {{ include "outbox-relay.databaseSecretKey" . }}
{{- include "outbox-relay.secretEnv" . }}
{{- with .Values.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "outbox-relay.envFrom" -}}
{{- if and .Values.secrets.existingSecret (not .Values.secrets.existingSecretKeys) }}
- secretRef:
    name: {{ .Values.secrets.existingSecret }}
{{- end }}
{{- with .Values.envFrom }}
{{ toYaml . }}
{{- end }}
{{- end -}}
