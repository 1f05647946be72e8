{{/*
Names, labels and image references shared by the templates.
*/}}

{{/* The release's full name, at most 63 characters: "<release>" when it already contains
"tailguard", else "<release>-tailguard". */}}
{{- define "tailguard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Name of the operator's ServiceAccount. */}}
{{- define "tailguard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tailguard.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object of the release. */}}
{{- define "tailguard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: tailguard
{{- end -}}

{{/* Selector labels of the operator's pods (immutable once installed). */}}
{{- define "tailguard.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* "repository:tag" of an image; the tag defaults to the chart's appVersion.
Call with (dict "image" .Values.x.image "root" $). */}}
{{- define "tailguard.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* Whether the operator watches every namespace (no watchNamespaces given). */}}
{{- define "tailguard.clusterWide" -}}
{{- if empty .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/* The labels every runtime pod carries (set by the operator; see manifests.py): the
PodMonitor selects on them. */}}
{{- define "tailguard.runtimePodSelector" -}}
app.kubernetes.io/name: tailguard-runtime
app.kubernetes.io/managed-by: tailguard-operator
{{- end -}}
