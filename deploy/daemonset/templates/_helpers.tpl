{{/* Chart name. */}}
{{- define "pulse-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, unless the release already says it. */}}
{{- define "pulse-agent.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pulse-agent.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pulse-agent.labels" -}}
helm.sh/chart: {{ include "pulse-agent.chart" . }}
{{ include "pulse-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pulse
{{- end }}

{{- define "pulse-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pulse-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pulse-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pulse-agent.fullname" .) .Values.serviceAccount.name }}
{{- else if .Values.serviceAccount.name }}
{{- .Values.serviceAccount.name }}
{{- else if .Values.rbac.create }}
{{- fail "serviceAccount.create=false with rbac.create=true needs serviceAccount.name: the roles would be bound to the namespace's default ServiceAccount, and every pod running as it" }}
{{- else }}
{{- "default" }}
{{- end }}
{{- end }}

{{/*
The full name with a suffix, within the 63 bytes of a Service's name (the
full name cut to make room).
*/}}
{{- define "pulse-agent.suffixed" -}}
{{- $name := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- printf "%s-%s" ($name | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix -}}
{{- end }}
