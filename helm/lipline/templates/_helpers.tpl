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

{{/* The gRPC address the gateway dials for a stage: client-side round-robin over a headless Service. */}}
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

{{/* The per-stage PromQL of the autoscaling metric, averaged over the stage's pods (KEDA's trigger). */}}
{{- define "lipline.scalingQuery" -}}
{{- $s := index .root.Values.stages .stage -}}
{{- $match := printf "namespace=\"%s\",pod=~\"%s-.*\"" .root.Release.Namespace (include "lipline.stageName" .) -}}
{{- if eq $s.autoscaling.metric "gpu" -}}
avg(avg_over_time(lipline_gpu_utilization_ratio{ {{- $match -}} }[1m]))
{{- else -}}
sum(rate(lipline_stage_queue_seconds_sum{ {{- $match -}} }[2m])) / clamp_min(sum(rate(lipline_stage_queue_seconds_count{ {{- $match -}} }[2m])), 1e-9)
{{- end -}}
{{- end -}}
