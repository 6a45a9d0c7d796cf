{{/* Chart name, truncated to the 63 characters of a DNS label. */}}
{{- define "dflash-triton.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name prefix: "<release>-<chart>", or the release alone when it already contains the chart name. */}}
{{- define "dflash-triton.fullname" -}}
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

{{- define "dflash-triton.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dflash-triton.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dflash-triton.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dflash-triton.labels" -}}
helm.sh/chart: {{ include "dflash-triton.chart" . }}
{{ include "dflash-triton.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: inference-server
{{- end }}

{{- define "dflash-triton.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Directory name shared by engines/<name> and model_repository/<name>. */}}
{{- define "dflash-triton.modelName" -}}
{{- .Values.model.name | default (printf "%s-tp%d" .Values.model.preset (int .Values.tensorParallel)) }}
{{- end }}

{{/* Where the storage volume is mounted; DFLASH_DATA of the images. */}}
{{- define "dflash-triton.dataPath" -}}
/data
{{- end }}

{{- define "dflash-triton.enginePath" -}}
{{- printf "%s/engines/%s" (include "dflash-triton.dataPath" .) (include "dflash-triton.modelName" .) }}
{{- end }}

{{- define "dflash-triton.repositoryPath" -}}
{{- printf "%s/model_repository/%s" (include "dflash-triton.dataPath" .) (include "dflash-triton.modelName" .) }}
{{- end }}

{{/* requests/limits from .Values.resources, plus nvidia.com/gpu = tensorParallel when gpu.enabled. */}}
{{- define "dflash-triton.resources" -}}
{{- $requests := deepCopy (.Values.resources.requests | default dict) }}
{{- $limits := deepCopy (.Values.resources.limits | default dict) }}
{{- if .Values.gpu.enabled }}
{{- $_ := set $requests "nvidia.com/gpu" (int .Values.tensorParallel) }}
{{- $_ := set $limits "nvidia.com/gpu" (int .Values.tensorParallel) }}
{{- end }}
{{- $resources := dict }}
{{- if $requests }}{{ $_ := set $resources "requests" $requests }}{{ end }}
{{- if $limits }}{{ $_ := set $resources "limits" $limits }}{{ end }}
{{- toYaml $resources }}
{{- end }}

{{/* Environment shared by the init and Triton containers. */}}
{{- define "dflash-triton.env" -}}
- name: DFLASH_DATA
  value: {{ include "dflash-triton.dataPath" . | quote }}
- name: HOME
  value: /tmp
- name: TMPDIR
  value: /tmp
- name: HF_HUB_OFFLINE
  value: "1"
{{- if .Values.checkpoints.existingClaim }}
- name: HF_HOME
  value: {{ .Values.checkpoints.mountPath | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Volume mounts shared by the init and Triton containers; the claim is read-only in pvc mode. */}}
{{- define "dflash-triton.volumeMounts" -}}
- name: data
  mountPath: {{ include "dflash-triton.dataPath" . }}
  {{- with .Values.storage.subPath }}
  subPath: {{ . }}
  {{- end }}
  readOnly: {{ eq .Values.storage.mode "pvc" }}
- name: dshm
  mountPath: /dev/shm
- name: tmp
  mountPath: /tmp
{{- if .Values.checkpoints.existingClaim }}
- name: checkpoints
  mountPath: {{ .Values.checkpoints.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* An httpGet probe: include with (list <path> <probe values> <port name>). */}}
{{- define "dflash-triton.httpProbe" -}}
{{- $path := index . 0 }}
{{- $probe := index . 1 -}}
httpGet:
  path: {{ $path }}
  port: {{ index . 2 }}
{{- range $key := list "initialDelaySeconds" "periodSeconds" "timeoutSeconds" "failureThreshold" }}
{{- if hasKey $probe $key }}
{{ $key }}: {{ index $probe $key }}
{{- end }}
{{- end }}
{{- end }}
