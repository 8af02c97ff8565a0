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

{{/*
An image reference from dict repository, tag, key (the value's name) and
appVersion. A tag of digits (a commit's short hash, 5187467) is a number to
--set and to a values file, and helm upgrade --reuse-values writes a number
back as 5.187467e+06: the pods' image is then not the one asked for
(InvalidImageName). A tag that is not a string is refused, naming the fix.
*/}}
{{- define "pulse-agent.image" -}}
{{- if not (or (kindIs "string" .tag) (kindIs "invalid" .tag)) }}
{{- fail (printf "%s is a number, not a string: a tag of digits is read as a number (and helm upgrade --reuse-values writes 5187467 back as 5.187467e+06); quote it in a values file, or pass it with --set-string %s=TAG" .key .key) }}
{{- end }}
{{- printf "%s:%s" .repository (.tag | default .appVersion) }}
{{- end }}

{{/*
A Go duration, as the binaries' duration flags take it (1m30s, 500ms, 0),
in seconds (a float): (list KEY VALUE). A value of another form fails,
naming KEY: a number without its unit, a sign.
*/}}
{{- define "pulse-agent.seconds" -}}
{{- $key := index . 0 -}}
{{- $v := toString (index . 1) -}}
{{- $part := "(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(ns|us|µs|μs|ms|s|m|h)" -}}
{{- if not (regexMatch (printf "^(0|(%s)+)$" $part) $v) -}}
{{- fail (printf "%s %q: a duration, such as 30s, 1m30s or 500ms (a unit, no sign)" $key $v) -}}
{{- end -}}
{{- $unit := dict "ns" 1e-9 "us" 1e-6 "µs" 1e-6 "μs" 1e-6 "ms" 1e-3 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll $part $v -1 -}}
{{- $n := regexFind "^[0-9.]+" . -}}
{{- $total = addf $total (mulf (float64 $n) (get $unit (trimPrefix $n .))) -}}
{{- end -}}
{{- if gt $total 9223372036.0 -}}
{{- fail (printf "%s %q: past the longest duration Go holds (about 292 years)" $key $v) -}}
{{- end -}}
{{- $total -}}
{{- end }}

{{/*
The durations the agent refuses at its start, refused at the render
instead, naming the value (the agent's Validate; values.schema.json holds
the rest; test/charts holds the chart to the binary).
*/}}
{{- define "pulse-agent.checkValues" -}}
{{- range list (list "maxPods" .Values.maxPods 1 9223372036854775807) (list "httpPort" .Values.httpPort 1 65535) (list "healthPort" .Values.healthPort 1 65535) (list "auth.expirationSeconds" .Values.auth.expirationSeconds 600 4294967296) -}}
{{- include "pulse-agent.int" . -}}
{{- end -}}
{{- $interval := float64 (include "pulse-agent.seconds" (list "scrapeInterval" .Values.scrapeInterval)) -}}
{{- if lt $interval 0.1 -}}
{{- fail (printf "scrapeInterval %s: at least 100ms" (toString .Values.scrapeInterval)) -}}
{{- end -}}
{{- with .Values.scrapeTimeout -}}
{{- if gt (float64 (include "pulse-agent.seconds" (list "scrapeTimeout" .))) $interval -}}
{{- fail (printf "scrapeTimeout %s: at most scrapeInterval (%s)" (toString .) (toString $.Values.scrapeInterval)) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
A number given as a string of digits (--set-string, a quoted value), which
values.schema.json takes without its range: (list KEY VALUE MIN MAX). It
fails, naming KEY, outside the range or past what Go's int holds; a number
is the schema's to check.
*/}}
{{- define "pulse-agent.int" -}}
{{- $key := index . 0 -}}
{{- $v := index . 1 -}}
{{- if kindIs "string" $v -}}
{{- $n := int64 $v -}}
{{- if or (ne (toString $n) $v) (lt $n (int64 (index . 2))) (gt $n (int64 (index . 3))) -}}
{{- fail (printf "%s %q: a whole number from %d to %d" $key $v (int64 (index . 2)) (int64 (index . 3))) -}}
{{- end -}}
{{- end -}}
{{- end }}
