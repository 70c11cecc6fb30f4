{{/* Names, labels and the pieces every stage's objects share. */}}

{{- define "lipline.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The object name of one stage: <fullname>-<stage>. Call with (dict "root" $ "stage" "lipsync"). */}}
{{- define "lipline.stageName" -}}
{{- printf "%s-%s" (include "lipline.fullname" .root) .stage -}}
{{- end -}}

{{- define "lipline.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "lipline.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .stage }}
{{- end -}}

{{- define "lipline.stageLabels" -}}
{{ include "lipline.labels" .root }}
app.kubernetes.io/component: {{ .stage }}
app.kubernetes.io/part-of: lipline
{{- end -}}

{{- define "lipline.image" -}}
{{- printf "%s/lipline-%s:%s" .root.Values.image.registry .stage (.root.Values.image.tag | default .root.Chart.AppVersion) -}}
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
{{- printf "dns:///%s.%s.svc:%d" (include "lipline.stageName" .) .root.Release.Namespace (int $s.port) -}}
{{- end -}}

{{/* A settings map as LIPLINE_<NAME> variables (lists joined by commas, as the services parse them). */}}
{{- define "lipline.configEnv" -}}
{{- range $key, $value := . }}
- name: {{ printf "LIPLINE_%s" (upper $key) }}
  value: {{ if kindIs "slice" $value }}{{ join "," $value | quote }}{{ else }}{{ toString $value | quote }}{{ end }}
{{- end }}
{{- end -}}

{{/* True (non-empty) when KEDA, not a chart HPA, scales this stage: only GPU-metric or queue stages. */}}
{{- define "lipline.kedaScales" -}}
{{- $s := index .root.Values.stages .stage -}}
{{- if and .root.Values.keda.enabled $s.autoscaling.enabled (ne $s.autoscaling.metric "cpu") -}}true{{- end -}}
{{- end -}}

{{/* The per-stage PromQL of the autoscaling metric for KEDA's Prometheus trigger. gpu and queue: averaged
over the stage's pods (metricType Value). segments: the job store's segments waiting, which every
worker exports alike, so max() and not sum() (metricType AverageValue: the HPA divides by the pods). */}}
{{- define "lipline.scalingQuery" -}}
{{- $s := index .root.Values.stages .stage -}}
{{- $match := printf "namespace=\"%s\",pod=~\"%s-.*\"" .root.Release.Namespace (include "lipline.stageName" .) -}}
{{- if eq $s.autoscaling.metric "gpu" -}}
avg(avg_over_time(lipline_gpu_utilization_ratio{ {{- $match -}} }[1m]))
{{- else if eq $s.autoscaling.metric "segments" -}}
max(lipline_queue_depth{kind="segment", {{- $match -}} })
{{- else -}}
sum(rate(lipline_stage_queue_seconds_sum{ {{- $match -}} }[2m])) / clamp_min(sum(rate(lipline_stage_queue_seconds_count{ {{- $match -}} }[2m])), 1e-9)
{{- end -}}
{{- end -}}

{{/* The stages whose `dials` list names this stage: who may call it (NetworkPolicy). A comma-joined
list, empty when nobody dials it. Call with (dict "root" $ "stage" "lipsync"). */}}
{{- define "lipline.callers" -}}
{{- $callers := list -}}
{{- range $name, $s := .root.Values.stages -}}
{{- if has $.stage (default list $s.dials) -}}
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
