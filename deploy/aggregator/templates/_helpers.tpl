{{/* Chart name. */}}
{{- define "pulse-aggregator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, unless the release already says it. */}}
{{- define "pulse-aggregator.fullname" -}}
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

{{- define "pulse-aggregator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pulse-aggregator.labels" -}}
helm.sh/chart: {{ include "pulse-aggregator.chart" . }}
{{ include "pulse-aggregator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pulse
{{- end }}

{{- define "pulse-aggregator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pulse-aggregator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pulse-aggregator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pulse-aggregator.fullname" .) .Values.serviceAccount.name }}
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
{{- define "pulse-aggregator.suffixed" -}}
{{- $name := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- printf "%s-%s" ($name | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix -}}
{{- end }}

{{/*
The agent DaemonSet the warm-up waits for: namespace/name, or empty.
*/}}
{{- define "pulse-aggregator.agentDaemonSet" -}}
{{- /* null (agentDaemonSet: left empty in a values file) is the default,
as "" is */ -}}
{{- $ds := .Values.warmup.agentDaemonSet | default "" -}}
{{- if eq $ds "" -}}
{{- printf "%s/pulse-agent" .Release.Namespace -}}
{{- else if ne $ds "-" -}}
{{- if not (regexMatch "^[^/]+/[^/]+$" $ds) -}}
{{- fail (printf "warmup.agentDaemonSet %q: NAMESPACE/NAME, \"\" or \"-\"" $ds) -}}
{{- end -}}
{{- $ds -}}
{{- end }}
{{- end }}

{{/*
"true" when the aggregator makes its own certificates (scaler.managedCerts,
unless scaler.tls.secretName gives one).
*/}}
{{- define "pulse-aggregator.managedCerts" -}}
{{- if and .Values.scaler.managedCerts.enabled (not .Values.scaler.tls.secretName) -}}true{{- end -}}
{{- end }}

{{/*
"true" when the ingest port serves TLS with the managed certificates:
ingest.tls.managed, no ingest.tls.secretName, and managed certificates.
*/}}
{{- define "pulse-aggregator.ingestManagedTLS" -}}
{{- if and .Values.ingest.tls.managed (not .Values.ingest.tls.secretName) (include "pulse-aggregator.managedCerts" .) -}}true{{- end -}}
{{- end }}

{{/*
"true" when the ingest port speaks TLS (a Secret's, or the managed one).
*/}}
{{- define "pulse-aggregator.ingestTLS" -}}
{{- if or .Values.ingest.tls.secretName (include "pulse-aggregator.ingestManagedTLS" .) -}}true{{- end -}}
{{- end }}

{{/*
The relays' Secret the aggregator would keep (<fullname>-relay-tls) when
it keeps none: with the managed certificates on and the relay off, or its
certificate the user's (relay.tls.secretName, unless of that very name).
The aggregator removes it if it made it (an upgrade that turned the relay
off left its key, valid, until the release was uninstalled).
*/}}
{{- define "pulse-aggregator.relayTLSSecretRetired" -}}
{{- $name := include "pulse-aggregator.suffixed" (list (include "pulse-aggregator.fullname" .) "relay-tls") -}}
{{- if and (include "pulse-aggregator.managedCerts" .) (not (and .Values.relay.enabled (include "pulse-aggregator.ingestManagedTLS" .) (not .Values.relay.tls.secretName))) (ne .Values.relay.tls.secretName $name) -}}
{{- $name -}}
{{- end -}}
{{- end }}

{{/* The relays' full name, Service and Deployment. */}}
{{- define "pulse-aggregator.relay" -}}
{{- include "pulse-aggregator.suffixed" (list (include "pulse-aggregator.fullname" .) "relay") -}}
{{- end }}

{{- define "pulse-aggregator.relaySelectorLabels" -}}
app.kubernetes.io/name: pulse-relay
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The Secret of the relays' certificate: relay.tls.secretName, or the one the
aggregator makes with the managed ingest TLS; empty when the ingest port
speaks plaintext (the relays then do too).
*/}}
{{- define "pulse-aggregator.relayTLSSecret" -}}
{{- if .Values.relay.tls.secretName -}}
{{- if not .Values.ingest.tls.secretName -}}
{{- fail "relay.tls.secretName goes with ingest.tls.secretName: with the managed ingest TLS the agents trust only the managed CA, which issues the relays' certificate itself (leave relay.tls.secretName empty); with a plaintext ingest port the relays speak plaintext too" -}}
{{- end -}}
{{- if eq .Values.relay.tls.secretName .Values.scaler.managedCerts.secretName -}}
{{- fail "relay.tls.secretName must not be scaler.managedCerts.secretName: the relay pods would mount the managed CA's key" -}}
{{- end -}}
{{- .Values.relay.tls.secretName -}}
{{- else if include "pulse-aggregator.ingestManagedTLS" . -}}
{{- include "pulse-aggregator.suffixed" (list (include "pulse-aggregator.fullname" .) "relay-tls") -}}
{{- else if .Values.ingest.tls.secretName -}}
{{- fail "relay.enabled with ingest.tls.secretName needs relay.tls.secretName (tls.crt, tls.key, ca.crt): the aggregator issues the relays' certificate only with the managed ingest TLS" -}}
{{- end -}}
{{- end }}

{{/*
The agents as a NetworkPolicy peer: networkPolicy.agentPodSelector in
networkPolicy.agentNamespaceSelector's namespaces (empty: those of the
agents' ServiceAccounts with agentAuth.mode tokenreview, else the release's).
*/}}
{{- define "pulse-aggregator.agentPeer" -}}
- podSelector:
    {{- toYaml .Values.networkPolicy.agentPodSelector | nindent 4 }}
  {{- $agentNamespaces := list }}
  {{- if eq .Values.agentAuth.mode "tokenreview" }}
  {{- range .Values.agentAuth.serviceAccounts }}
  {{- if not (regexMatch "^[^/]+/[^/]+$" .) }}
  {{- fail (printf "agentAuth.serviceAccounts: %q is not NAMESPACE/NAME" .) }}
  {{- end }}
  {{- $agentNamespaces = append $agentNamespaces (first (splitList "/" .)) | uniq }}
  {{- end }}
  {{- end }}
  {{- with .Values.networkPolicy.agentNamespaceSelector }}
  namespaceSelector:
    {{- toYaml . | nindent 4 }}
  {{- else }}
  {{- if and $agentNamespaces (ne (join "," $agentNamespaces) .Release.Namespace) }}
  {{- /* The agents' ServiceAccounts' namespaces: the release's alone
       let no agent of another in (NOTES installs them there). */}}
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values: {{ toJson $agentNamespaces }}
  {{- end }}
  {{- end }}
{{- end }}

{{/* The relays' objects' labels: none of the aggregator's selectors (its Services', its ServiceMonitor's) matches them. */}}
{{- define "pulse-aggregator.relayLabels" -}}
helm.sh/chart: {{ include "pulse-aggregator.chart" . }}
{{ include "pulse-aggregator.relaySelectorLabels" . }}
app.kubernetes.io/component: relay
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pulse
{{- end }}

{{/*
An image reference from dict repository, tag, key (the value's name) and
appVersion. A tag of digits (a commit's short hash, 5187467) is a number to
--set and to a values file, and helm upgrade --reuse-values writes a number
back as 5.187467e+06: the pods' image is then not the one asked for
(InvalidImageName). A tag that is not a string is refused, naming the fix.
*/}}
{{- define "pulse-aggregator.image" -}}
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
{{- define "pulse-aggregator.seconds" -}}
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
The durations (and the values that relate to others) the aggregator and
the relays refuse at their start, refused at the render instead, naming
the value (the binaries' Validate; values.schema.json holds the rest;
test/charts holds the chart to the binaries).
*/}}
{{- define "pulse-aggregator.checkValues" -}}
{{- $s := dict -}}
{{- $given := dict "maxWindow" .Values.maxWindow "podExpiry" .Values.podExpiry "shutdownDelay" .Values.shutdownDelay "warmup.duration" .Values.warmup.duration -}}
{{- if include "pulse-aggregator.managedCerts" . -}}
{{- $_ := set $given "scaler.managedCerts.validity" .Values.scaler.managedCerts.validity -}}
{{- end -}}
{{- if .Values.relay.enabled -}}
{{- $_ := set $given "relay.resolveInterval" .Values.relay.resolveInterval -}}
{{- $_ := set $given "relay.shutdownDelay" (.Values.relay.shutdownDelay | default "0s") -}}
{{- end -}}
{{- range $k, $v := $given -}}
{{- $_ := set $s $k (float64 (include "pulse-aggregator.seconds" (list $k $v))) -}}
{{- end -}}
{{- $ints := list (list "maxPods" .Values.maxPods 1 16777216) (list "maxPodsPerNamespace" .Values.maxPodsPerNamespace 0 16777216) (list "gcPercent" .Values.gcPercent 0 10000) (list "provisioning.maxReplicas" .Values.provisioning.maxReplicas 0 10000) -}}
{{- $ints = concat $ints (list (list "scaler.port" .Values.scaler.port 1 65535) (list "scaler.maxStreams" .Values.scaler.maxStreams 1 9223372036854775807) (list "scaler.maxStreamsPerNamespace" .Values.scaler.maxStreamsPerNamespace 0 9223372036854775807) (list "scaler.maxConnectionsPerAddress" .Values.scaler.maxConnectionsPerAddress 1 9223372036854775807)) -}}
{{- $ints = concat $ints (list (list "ingest.port" .Values.ingest.port 1 65535) (list "ingest.maxConnections" .Values.ingest.maxConnections 1 9223372036854775807) (list "ingest.maxConnectionsPerAddress" .Values.ingest.maxConnectionsPerAddress 1 9223372036854775807) (list "http.port" .Values.http.port 1 65535) (list "http.healthPort" .Values.http.healthPort 1 65535) (list "terminationGracePeriodSeconds" .Values.terminationGracePeriodSeconds 0 9223372036854775807)) -}}
{{- if .Values.relay.enabled -}}
{{- $ints = concat $ints (list (list "relay.port" .Values.relay.port 1 65535) (list "relay.httpPort" .Values.relay.httpPort 1 65535) (list "relay.healthPort" .Values.relay.healthPort 1 65535) (list "relay.maxConnections" .Values.relay.maxConnections 1 9223372036854775807) (list "relay.maxConnectionsPerAddress" .Values.relay.maxConnectionsPerAddress 1 9223372036854775807)) -}}
{{- end -}}
{{- range $ints -}}
{{- include "pulse-aggregator.int" . -}}
{{- end -}}
{{- if lt (get $s "maxWindow") 30.0 -}}
{{- fail (printf "maxWindow %s: at least 30s, the longest default trigger window (metric replicas')" (toString .Values.maxWindow)) -}}
{{- end -}}
{{- if le (get $s "podExpiry") 0.0 -}}
{{- fail (printf "podExpiry %s: above 0" (toString .Values.podExpiry)) -}}
{{- end -}}
{{- if gt (get $s "shutdownDelay") 60.0 -}}
{{- fail (printf "shutdownDelay %s: from 0 to 1m" (toString .Values.shutdownDelay)) -}}
{{- end -}}
{{- if hasKey $s "scaler.managedCerts.validity" -}}
{{- $v := get $s "scaler.managedCerts.validity" -}}
{{- if or (lt $v 3600.0) (gt $v 315360000.0) -}}
{{- fail (printf "scaler.managedCerts.validity %s: from 1h to 87600h (its CA is made for three times as long)" (toString .Values.scaler.managedCerts.validity)) -}}
{{- end -}}
{{- end -}}
{{- with .Values.scaler.managedCerts -}}
{{- if and (include "pulse-aggregator.managedCerts" $) (eq .secretName .triggerAuthName) (eq .kedaNamespace $.Release.Namespace) -}}
{{- fail (printf "scaler.managedCerts.secretName %q is KEDA's credentials' Secret (triggerAuthName, with kedaNamespace the release's namespace): name another" .secretName) -}}
{{- end -}}
{{- end -}}
{{- if and (eq (toString .Values.agentAuth.mode) "tokenreview") (not .Values.agentAuth.audience) -}}
{{- fail "agentAuth.audience: required with agentAuth.mode tokenreview (every agent's token would be refused)" -}}
{{- end -}}
{{- if and .Values.relay.enabled (lt (get $s "relay.resolveInterval") 0.1) -}}
{{- fail (printf "relay.resolveInterval %s: at least 100ms" (toString .Values.relay.resolveInterval)) -}}
{{- end -}}
{{- if and .Values.relay.enabled (gt (get $s "relay.shutdownDelay") 60.0) -}}
{{- fail (printf "relay.shutdownDelay %s: from 0 to 1m" (toString .Values.relay.shutdownDelay)) -}}
{{- end -}}
{{- with .Values.provisioning.leaderElection -}}
{{- if $.Values.provisioning.enabled -}}
{{- $lease := float64 (include "pulse-aggregator.seconds" (list "provisioning.leaderElection.leaseDuration" .leaseDuration)) -}}
{{- $renew := float64 (include "pulse-aggregator.seconds" (list "provisioning.leaderElection.renewDeadline" .renewDeadline)) -}}
{{- $retry := float64 (include "pulse-aggregator.seconds" (list "provisioning.leaderElection.retryPeriod" .retryPeriod)) -}}
{{- if and .enabled (or (le $retry 0.0) (le $renew (mulf 1.2 $retry)) (le $lease $renew)) -}}
{{- fail (printf "provisioning.leaderElection: want leaseDuration (%s) > renewDeadline (%s) > 1.2 × retryPeriod (%s) > 0, client-go's rule" (toString .leaseDuration) (toString .renewDeadline) (toString .retryPeriod)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
A number given as a string of digits (--set-string, a quoted value), which
values.schema.json takes without its range: (list KEY VALUE MIN MAX). It
fails, naming KEY, outside the range or past what Go's int holds; a number
is the schema's to check.
*/}}
{{- define "pulse-aggregator.int" -}}
{{- $key := index . 0 -}}
{{- $v := index . 1 -}}
{{- if kindIs "string" $v -}}
{{- $n := int64 $v -}}
{{- if or (ne (toString $n) $v) (lt $n (int64 (index . 2))) (gt $n (int64 (index . 3))) -}}
{{- fail (printf "%s %q: a whole number from %d to %d" $key $v (int64 (index . 2)) (int64 (index . 3))) -}}
{{- end -}}
{{- end -}}
{{- end }}
