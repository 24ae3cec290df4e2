{{/* Chart name, overridable. */}}
{{- define "model-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name of the release's objects: fullnameOverride, else the release name when it already contains
the chart name (e.g. release "model-agent"), else "<release>-<chart>".
*/}}
{{- define "model-agent.fullname" -}}
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

{{/* Labels that select the agent's pods. Never change them on upgrade (DaemonSet selectors are immutable). */}}
{{- define "model-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "model-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "model-agent.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "model-agent.selectorLabels" . }}
app.kubernetes.io/component: model-agent
app.kubernetes.io/part-of: ome
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The ServiceAccount the agent runs as. */}}
{{- define "model-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "model-agent.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The user name the API server sees for the agent's requests. */}}
{{- define "model-agent.username" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "model-agent.serviceAccountName" .) -}}
{{- end -}}

{{/* Image reference: by digest when one is given, else by tag (default: appVersion). */}}
{{- define "model-agent.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The health port (/healthz, /livez, /readyz, /metrics): health.port (OME's value name) when set, else agent.port.
*/}}
{{- define "model-agent.healthPort" -}}
{{- $health := .Values.health | default dict -}}
{{- if kindIs "invalid" $health.port -}}
{{- int .Values.agent.port -}}
{{- else -}}
{{- int $health.port -}}
{{- end -}}
{{- end }}
