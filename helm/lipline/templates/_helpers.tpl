{{/* Names, labels and the pieces every stage's objects share. */}}

{{/* The chart's name (nameOverride): the app.kubernetes.io/name label. */}}
{{- define "lipline.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-<name>, or the release name when it contains the name, or fullnameOverride. 50 characters
at most: a stage's objects add "-<stage>" and must stay within 63. */}}
{{- define "lipline.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "lipline.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The object name of one stage: <fullname>-<stage><suffix> (suffix optional: a Job's "-warm-<n>"), at
most 63 characters: the fullname is shortened, never the stage's name, so two stages' names never
meet (a 50-character fullname and lipsync-musetalk would make 67). Call with (dict "root" $ "stage"
"lipsync"), and "suffix" where one follows. */}}
{{- define "lipline.stageName" -}}
{{- $suffix := .suffix | default "" -}}
{{- $room := sub 62 (add (len .stage) (len $suffix)) -}}
{{- printf "%s-%s%s" (include "lipline.fullname" .root | trunc (int $room) | trimSuffix "-") .stage $suffix -}}
{{- end -}}

{{/* Non-empty when a stage is deployed: `enabled` unset or true (an optional stage, lipsync-musetalk,
sets it false by default). Every template that ranges over `stages` skips the others; call with the
stage's values. */}}
{{- define "lipline.enabled" -}}
{{- if or (not (hasKey . "enabled")) .enabled -}}true{{- end -}}
{{- end -}}

{{/* What the stage's container runs: `python -m services.<module>` (module defaults to the stage's
name; lipsync-musetalk runs services.lipsync.musetalk). Call with (dict "root" $ "stage" name). */}}
{{- define "lipline.module" -}}
{{- $s := default dict (index .root.Values.stages .stage) -}}
{{- printf "services.%s" ($s.module | default .stage) -}}
{{- end -}}

{{/* The config keys of a stage that name a checkpoint file or model folder on the models volume
(one list: the stages' config and the models-download Job's `--require` read it). */}}
{{- define "lipline.modelPathKeys" -}}
{{- list "checkpoint" "unet" "unet_config" "vae" "whisper" "face_parser" "dwpose" | toJson -}}
{{- end -}}

{{/* A stage's settings as the pod gets them: its `config` with the checkpoint paths (the keys of
`lipline.modelPathKeys`) on the models volume: relative ones under models.mountPath, all of them left out
without models.existingClaim (the stage then runs its weight-free stand-in). */}}
{{- define "lipline.stageConfig" -}}
{{- $s := index .root.Values.stages .stage -}}
{{- $config := deepCopy (default dict $s.config) -}}
{{- range $key := include "lipline.modelPathKeys" . | fromJsonArray -}}
{{- if hasKey $config $key -}}
{{- if not $.root.Values.models.existingClaim -}}
{{- $_ := unset $config $key -}}
{{- else if not (hasPrefix "/" (index $config $key)) -}}
{{- $_ := set $config $key (printf "%s/%s" (trimSuffix "/" $.root.Values.models.mountPath) (index $config $key)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The labels of every object: the chart's, then commonLabels (the schema keeps those off the chart's keys). */}}
{{- define "lipline.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "lipline.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* What a stage's selectors match: immutable, so never anything a value adds. Call with (dict "root" $ "stage" name). */}}
{{- define "lipline.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lipline.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .stage }}
{{- end -}}

{{- define "lipline.stageLabels" -}}
{{ include "lipline.labels" .root }}
app.kubernetes.io/component: {{ .stage }}
app.kubernetes.io/part-of: lipline
{{- end -}}

{{/* A stage's image: its own, or the one of the stage its `image` names (lipsync-musetalk runs lipsync's). */}}
{{- define "lipline.image" -}}
{{- $s := default dict (index .root.Values.stages .stage) -}}
{{- printf "%s/lipline-%s:%s" .root.Values.image.registry ($s.image | default .stage) (.root.Values.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{- define "lipline.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "lipline.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* The gRPC address a caller (a stage's `dials`) uses for a stage: client-side round-robin over a headless Service. */}}
{{- define "lipline.stageAddress" -}}
{{- $s := index .root.Values.stages .stage -}}
{{- if .root.Values.discovery.kubernetes -}}
{{- printf "k8s:///%s.%s:%d" (include "lipline.stageName" .) .root.Release.Namespace (int $s.port) -}}
{{- else -}}
{{- printf "dns:///%s.%s.svc:%d" (include "lipline.stageName" .) .root.Release.Namespace (int $s.port) -}}
{{- end -}}
{{- end -}}

{{/* A settings map as LIPLINE_<NAME> variables (lists joined by commas, as the services parse them;
whole numbers as integers: Helm reads YAML numbers as float64, which toString would print as 8.589934592e+09). */}}
{{- define "lipline.configEnv" -}}
{{- range $key, $value := . }}
- name: {{ printf "LIPLINE_%s" (upper $key) }}
  value: {{ if kindIs "slice" $value }}{{ join "," $value | quote }}{{ else if and (kindIs "float64" $value) (eq $value (floor $value)) }}{{ int64 $value | toString | quote }}{{ else }}{{ toString $value | quote }}{{ end }}
{{- end }}
{{- end -}}

{{/* True (non-empty) when KEDA, not a chart HPA, scales this stage: only GPU-metric or queue stages. */}}
{{- define "lipline.kedaScales" -}}
{{- $s := index .root.Values.stages .stage -}}
{{- if and .root.Values.keda.enabled $s.autoscaling.enabled (ne $s.autoscaling.metric "cpu") -}}true{{- end -}}
{{- end -}}

{{/* The per-stage PromQL of the autoscaling metric for KEDA's Prometheus trigger. gpu, sessions and queue:
averaged over the stage's pods (metricType Value). segments: the job store's segments waiting, which every
worker exports alike, so max() and not sum() (metricType AverageValue: the HPA divides by the pods). */}}
{{- define "lipline.scalingQuery" -}}
{{- $s := index .root.Values.stages .stage -}}
{{- $match := printf "namespace=\"%s\",pod=~\"%s-.*\"" .root.Release.Namespace (include "lipline.stageName" .) -}}
{{- if eq $s.autoscaling.metric "gpu" -}}
avg(avg_over_time(lipline_gpu_utilization_ratio{ {{- $match -}} }[1m]))
{{- else if eq $s.autoscaling.metric "sessions" -}}
avg(avg_over_time(lipline_live_sessions{state="active", {{- $match -}} }[1m]))
{{- else if eq $s.autoscaling.metric "segments" -}}
max(lipline_queue_depth{kind="segment", {{- $match -}} })
{{- else -}}
sum(rate(lipline_stage_queue_seconds_sum{ {{- $match -}} }[2m])) / clamp_min(sum(rate(lipline_stage_queue_seconds_count{ {{- $match -}} }[2m])), 1e-9)
{{- end -}}
{{- end -}}

{{/* The stages whose `dials` or `reaches` list names this stage: who may call it (NetworkPolicy). A
comma-joined list, empty when nobody calls it. Call with (dict "root" $ "stage" "lipsync"). */}}
{{- define "lipline.callers" -}}
{{- $callers := list -}}
{{- range $name, $s := .root.Values.stages -}}
{{- if and (include "lipline.enabled" $s) (has $.stage (concat (default list $s.dials) (default list $s.reaches))) -}}
{{- $callers = append $callers $name -}}
{{- end -}}
{{- end -}}
{{- join "," $callers -}}
{{- end -}}

{{/* ---- Stores (values `store:`) ---- */}}

{{/* The Secret and key that hold the PostgreSQL DSN; empty when the job store is the local SQLite file. */}}
{{- define "lipline.jobStoreSecretName" -}}
{{- if .Values.store.jobStore.existingSecret -}}
{{- .Values.store.jobStore.existingSecret -}}
{{- else if .Values.store.jobStore.url -}}
{{- include "lipline.fullname" . }}-store
{{- end -}}
{{- end -}}

{{- define "lipline.jobStoreSecretKey" -}}
{{- if .Values.store.jobStore.existingSecret -}}
{{- .Values.store.jobStore.secretKey -}}
{{- else -}}
job-store-url
{{- end -}}
{{- end -}}

{{/* Non-empty when a store is not configured and lives on the single-node local volume. */}}
{{- define "lipline.localStore" -}}
{{- $job := or .Values.store.jobStore.existingSecret .Values.store.jobStore.url -}}
{{- $blob := or .Values.store.blobStore.url .Values.store.blobStore.persistence.existingClaim -}}
{{- if not (and $job $blob) -}}true{{- end -}}
{{- end -}}

{{/* Refuse contradictory or missing store settings with a message that says what to set. */}}
{{- define "lipline.validateStore" -}}
{{- $st := .Values.store -}}
{{- if and $st.jobStore.existingSecret $st.jobStore.url -}}
{{- fail "store.jobStore: set existingSecret (a Secret with the PostgreSQL DSN) or url, not both" -}}
{{- end -}}
{{- if and $st.blobStore.url $st.blobStore.persistence.existingClaim -}}
{{- fail "store.blobStore: set url (s3://bucket/prefix) or persistence.existingClaim (a ReadWriteMany claim), not both" -}}
{{- end -}}
{{- if and (not $st.blobStore.url) (or $st.blobStore.s3.existingSecret $st.blobStore.s3.endpoint $st.blobStore.s3.region) -}}
{{- fail "store.blobStore.s3 is set but store.blobStore.url is empty: set url to s3://bucket/prefix" -}}
{{- end -}}
{{- if and (include "lipline.localStore" .) (not $st.local.enabled) -}}
{{- $missing := list -}}
{{- if not (or $st.jobStore.existingSecret $st.jobStore.url) -}}{{- $missing = append $missing "store.jobStore.existingSecret (a Secret with a PostgreSQL DSN)" -}}{{- end -}}
{{- if not (or $st.blobStore.url $st.blobStore.persistence.existingClaim) -}}{{- $missing = append $missing "store.blobStore.url (s3://...) or store.blobStore.persistence.existingClaim (ReadWriteMany)" -}}{{- end -}}
{{- fail (printf "store.local.enabled is false, so the gateway and render pods need shared stores: set %s" (join " and " $missing)) -}}
{{- end -}}
{{- end -}}

{{/* The store variables of a stage with `stores: true`. */}}
{{- define "lipline.storeEnv" -}}
{{- $st := .Values.store -}}
{{- $local := trimSuffix "/" $st.local.mountPath -}}
{{- if include "lipline.jobStoreSecretName" . }}
- name: LIPLINE_JOB_STORE
  valueFrom:
    secretKeyRef:
      name: {{ include "lipline.jobStoreSecretName" . }}
      key: {{ include "lipline.jobStoreSecretKey" . }}
{{- else }}
- name: LIPLINE_JOB_STORE
  value: {{ printf "sqlite:///%s/lipline.db" $local | quote }}
{{- end }}
{{- if $st.blobStore.url }}
- name: LIPLINE_BLOB_STORE
  value: {{ $st.blobStore.url | quote }}
{{- with $st.blobStore.s3.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef: {name: {{ . }}, key: AWS_ACCESS_KEY_ID}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef: {name: {{ . }}, key: AWS_SECRET_ACCESS_KEY}
{{- end }}
{{- with $st.blobStore.s3.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with $st.blobStore.s3.region }}
- name: AWS_REGION
  value: {{ . | quote }}
{{- end }}
{{- else if $st.blobStore.persistence.existingClaim }}
- name: LIPLINE_BLOB_STORE
  value: {{ $st.blobStore.persistence.mountPath | quote }}
{{- else }}
- name: LIPLINE_BLOB_STORE
  value: {{ printf "%s/blobs" $local | quote }}
{{- end }}
{{- end -}}

{{/* ---- A stage's pod (deployments.yaml) ---- */}}

{{/* The OTEL_* variables of a stage (values `tracing`): the SDK's own configuration. Disabled:
OTEL_SDK_DISABLED=true and nothing else. Call with (dict "root" $ "stage" name). */}}
{{- define "lipline.tracingEnv" -}}
{{- $t := .root.Values.tracing -}}
{{- if not $t.enabled }}
- name: OTEL_SDK_DISABLED
  value: "true"
{{- else }}
{{- if not $t.endpoint }}
{{- fail "tracing.enabled needs tracing.endpoint: the OTLP collector, e.g. http://otel-collector.observability.svc:4317" }}
{{- end }}
{{- $attributes := list (printf "k8s.namespace.name=%s" .root.Release.Namespace) "k8s.pod.name=$(K8S_POD_NAME)"
  (printf "k8s.deployment.name=%s" (include "lipline.stageName" .))
  (printf "service.version=%s" (.root.Values.image.tag | default .root.Chart.AppVersion)) }}
{{- range $key, $value := $t.resourceAttributes }}
{{- $attributes = append $attributes (printf "%s=%v" $key $value) }}
{{- end }}
- name: OTEL_SDK_DISABLED
  value: "false"
- name: OTEL_SERVICE_NAME
  value: {{ printf "lipline-%s" .stage | quote }}
- name: OTEL_TRACES_EXPORTER
  value: otlp
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $t.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $t.protocol | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $t.sampler | quote }}
{{- if ne (toString $t.samplerArg) "" }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ toString $t.samplerArg | quote }}
{{- end }}
- name: K8S_POD_NAME
  valueFrom:
    fieldRef: {fieldPath: metadata.name}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ join "," $attributes | quote }}
{{- end }}
{{- end -}}

{{/* The variables the chart sets in a stage's container, before extraEnv. Call with
(dict "root" $ "stage" name "config" <the stage's config, checkpoint resolved>). */}}
{{- define "lipline.stageEnv" -}}
{{- $root := .root -}}
{{- $s := index $root.Values.stages .stage -}}
{{- $gpu := gt (int $s.gpu) 0 }}
- name: LIPLINE_PORT
  value: {{ $s.port | quote }}
- name: LIPLINE_METRICS_PORT
  value: {{ $s.metricsPort | quote }}
{{- if $s.httpPort }}
- name: LIPLINE_HTTP_PORT
  value: {{ $s.httpPort | quote }}
{{- end }}
- name: HOME
  value: /tmp
{{- /* commonConfig, less the keys the stage's own config sets (those come below, once). */}}
{{- $common := dict }}
{{- range $key, $value := $root.Values.commonConfig }}
{{- if not (hasKey $.config $key) }}{{ $_ := set $common $key $value }}{{ end }}
{{- end }}
{{- include "lipline.configEnv" $common }}
{{- if $gpu }}
- name: LIPLINE_DEVICE
  value: cuda
- name: LIPLINE_COMPILE_CACHE_DIR
  value: {{ $root.Values.compileCache.mountPath | quote }}
- name: TORCHINDUCTOR_CACHE_DIR
  value: /tmp/inductor
- name: TRITON_CACHE_DIR
  value: /tmp/triton
{{- end }}
{{- range $target := $s.dials }}
{{- /* A stage not deployed gets no address: its callers run without it (the gateway then refuses its tier). */}}
{{- if include "lipline.enabled" (index $root.Values.stages $target) }}
- name: {{ printf "LIPLINE_%s_ADDRESS" (upper (replace "-" "_" $target)) }}
  {{- if and (index $root.Values.stages $target).public $root.Values.tls.existingSecret }}
  {{- /* Over TLS the public stage is one channel to its Service's DNS name (k8s:/// discovery is plaintext only). */}}
  value: {{ printf "dns:///%s.%s.svc:%d" (include "lipline.stageName" (dict "root" $root "stage" $target)) $root.Release.Namespace (int (index $root.Values.stages $target).port) | quote }}
  {{- else }}
  value: {{ include "lipline.stageAddress" (dict "root" $root "stage" $target) | quote }}
  {{- end }}
{{- end }}
{{- end }}
{{- if $s.stores }}
{{- include "lipline.storeEnv" $root }}
{{- end }}
{{- if $s.outputs }}
- name: LIPLINE_OUTPUT_TTL_S
  value: {{ int64 $root.Values.store.outputTtlSeconds | toString | quote }}
{{- end }}
{{- if $s.cache }}
- name: LIPLINE_CACHE_DIR
  value: /cache
{{- end }}
{{- if $s.advertise }}
{{- /* Its callers find it in the job store at this address; POD_IP first, so that $(POD_IP) expands. */}}
- name: POD_IP
  valueFrom:
    fieldRef: {fieldPath: status.podIP}
- name: LIPLINE_ADVERTISE_ADDRESS
  value: {{ printf "$(POD_IP):%d" (int $s.port) | quote }}
{{- end }}
{{- $auth := include "lipline.stageAuth" . | fromYaml }}
{{- if $auth.apiKeys }}
- name: LIPLINE_API_KEYS_FILE
  value: /etc/lipline/api-keys/keys
{{- end }}
{{- if $auth.webhookSecrets }}
- name: LIPLINE_WEBHOOK_SECRETS_FILE
  value: /etc/lipline/webhook-secrets/secrets
{{- end }}
{{- if $auth.internalToken }}
- name: LIPLINE_INTERNAL_TOKEN_FILE
  value: /etc/lipline/internal/token
{{- end }}
{{- if $auth.gatewayCa }}
- name: LIPLINE_GATEWAY_TLS_CA_FILE
  value: /etc/lipline/gateway-ca/ca.crt
- name: LIPLINE_GATEWAY_TLS_SERVER_NAME
  value: {{ include "lipline.gatewayServerName" $root | quote }}
{{- end }}
{{- if $auth.tls }}
- name: LIPLINE_TLS_CERT_FILE
  value: /etc/lipline/tls/tls.crt
- name: LIPLINE_TLS_KEY_FILE
  value: /etc/lipline/tls/tls.key
{{- end }}
{{- include "lipline.configEnv" .config }}
{{- include "lipline.tracingEnv" . }}
{{- end -}}

{{/* A stage's container env as a list: the chart's variables, then the chart-wide extraEnv, then the
stage's; a later entry replaces an earlier one of the same name, in its place at the end (so no
duplicate names). Call like lipline.stageEnv; renders YAML for fromYamlArray. */}}
{{- define "lipline.env" -}}
{{- $s := index .root.Values.stages .stage -}}
{{- $env := include "lipline.stageEnv" . | fromYamlArray -}}
{{- range $extra := list (default list .root.Values.extraEnv) (default list $s.extraEnv) -}}
{{- $names := list -}}
{{- range $extra }}{{ $names = append $names .name }}{{ end -}}
{{- $kept := list -}}
{{- range $env }}{{ if not (has .name $names) }}{{ $kept = append $kept . }}{{ end }}{{ end -}}
{{- $env = concat $kept $extra -}}
{{- end -}}
{{- toYaml $env -}}
{{- end -}}

{{/* Where a stage's pods may run, as a YAML map of pod-spec keys: nodeSelector, tolerations, affinity,
topologySpreadConstraints, priorityClassName, runtimeClassName. A stage's own value replaces the
chart-wide one (and the gpu.* one of a GPU stage): lipsync and superres can go to different GPU
pools. Call with (dict "root" $ "stage" name "local" <uses the single-node local store>). */}}
{{- define "lipline.placement" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $s := index $v.stages .stage -}}
{{- $gpu := gt (int $s.gpu) 0 -}}
{{- $out := dict -}}
{{- $nodeSelector := $s.nodeSelector | default (merge (dict) (deepCopy $v.nodeSelector) (ternary $v.gpu.nodeSelector (dict) $gpu)) -}}
{{- with $nodeSelector }}{{ $_ := set $out "nodeSelector" . }}{{ end -}}
{{- $tolerations := $s.tolerations | default (concat $v.tolerations (ternary $v.gpu.tolerations (list) $gpu)) -}}
{{- with $tolerations }}{{ $_ := set $out "tolerations" . }}{{ end -}}
{{- $affinity := deepCopy ($s.affinity | default $v.affinity) -}}
{{- if .local -}}
{{- /* The local store is one ReadWriteOnce volume holding a SQLite file: every pod that uses it runs on
the node of the others (the first one anywhere). */ -}}
{{- $podAffinity := default dict $affinity.podAffinity -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (dict "lipline.io/local-store" $root.Release.Name)) -}}
{{- $_ := set $podAffinity "requiredDuringSchedulingIgnoredDuringExecution" (append (default list $podAffinity.requiredDuringSchedulingIgnoredDuringExecution) $term) -}}
{{- $_ := set $affinity "podAffinity" $podAffinity -}}
{{- end -}}
{{- with $affinity }}{{ $_ := set $out "affinity" . }}{{ end -}}
{{- $spread := list -}}
{{- range ($s.topologySpreadConstraints | default $v.topologySpreadConstraints) -}}
{{- $c := deepCopy . -}}
{{- if not (hasKey $c "labelSelector") -}}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "lipline.selectorLabels" $ | fromYaml)) -}}
{{- end -}}
{{- $spread = append $spread $c -}}
{{- end -}}
{{- with $spread }}{{ $_ := set $out "topologySpreadConstraints" . }}{{ end -}}
{{- with ($s.priorityClassName | default $v.priorityClassName) }}{{ $_ := set $out "priorityClassName" . }}{{ end -}}
{{- if $gpu -}}
{{- with ($s.runtimeClassName | default $v.gpu.runtimeClassName) }}{{ $_ := set $out "runtimeClassName" . }}{{ end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}


{{/* ---- Auth (values `auth:`, `tls:`) ---- */}}

{{/* The Secret holding the API keys file (the chart's generated one unless existingSecret). */}}
{{- define "lipline.apiKeysSecretName" -}}
{{- .Values.auth.apiKeys.existingSecret | default (printf "%s-api-keys" (include "lipline.fullname" .)) -}}
{{- end -}}

{{- define "lipline.internalTokenSecretName" -}}
{{- .Values.auth.internalToken.existingSecret | default (printf "%s-internal-token" (include "lipline.fullname" .)) -}}
{{- end -}}

{{/* A stage's auth: which of api keys, internal token and TLS it gets, as a YAML map of booleans.
Call with (dict "root" $ "stage" name). */}}
{{- define "lipline.stageAuth" -}}
{{- $s := index .root.Values.stages .stage -}}
apiKeys: {{ and $s.public .root.Values.auth.apiKeys.enabled }}
webhookSecrets: {{ and $s.public $s.stores (not (empty .root.Values.auth.webhookSecrets.existingSecret)) }}
internalToken: {{ .root.Values.auth.internalToken.enabled }}
tls: {{ and $s.public (not (empty .root.Values.tls.existingSecret)) }}
gatewayCa: {{ and (has "gateway" (default list $s.dials)) (not (empty .root.Values.tls.existingSecret)) }}
{{- end -}}

{{/* The web page's public origins (LIPLINE_PUBLIC_ORIGINS) of a stage with an httpPort, as a YAML list:
its own config's public_origins, else one per webIngress host as browsers will show it (https:// where
webIngress.tls names the host, http:// otherwise); empty without webIngress (the page's loopback origins:
kubectl port-forward). Only these pages may open the live WebSocket, so a webIngress that answers any
host, or a wildcard one, must name them. Call with (dict "root" $ "config" <the stage's config>). */}}
{{- define "lipline.publicOrigins" -}}
{{- $ing := .root.Values.webIngress -}}
{{- $origins := default list .config.public_origins -}}
{{- if and (not $origins) $ing.enabled -}}
{{- $tlsHosts := list -}}
{{- range $ing.tls }}{{ $tlsHosts = concat $tlsHosts (default list .hosts) }}{{ end -}}
{{- range $host := $ing.hosts -}}
{{- if contains "*" $host }}{{ fail (printf "webIngress.hosts has the wildcard %q: set stages.web.config.public_origins to the page's origins (https://try.example.com), the only pages the live WebSocket accepts" $host) }}{{ end -}}
{{- $origins = append $origins (printf "%s://%s" (ternary "https" "http" (has $host $tlsHosts)) $host) -}}
{{- end -}}
{{- if not $origins }}{{ fail "webIngress answers any host (webIngress.hosts is empty): set stages.web.config.public_origins to the page's origins (https://try.example.com), the only pages the live WebSocket accepts" }}{{ end -}}
{{- end -}}
{{- toYaml $origins -}}
{{- end -}}

{{/* The name the chart's own callers of a TLS gateway (the web page, helm test) check its certificate
against: tls.serverName, else the gateway Service's name. */}}
{{- define "lipline.gatewayServerName" -}}
{{- .Values.tls.serverName | default (include "lipline.stageName" (dict "root" . "stage" "gateway")) -}}
{{- end -}}
