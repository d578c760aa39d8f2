{{/* Common labels. */}}
{{- define "ctrlmesh-hub.labels" -}}
app.kubernetes.io/name: ctrlmesh-hub
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: ctrlmesh
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Labels selecting the hub's pods. */}}
{{- define "ctrlmesh-hub.selectorLabels" -}}
app.kubernetes.io/name: ctrlmesh-hub
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ctrlmesh-hub.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The subjects of the hub's bindings: its ServiceAccount (hub.ServiceAccount).
*/}}
{{- define "ctrlmesh-hub.subjects" -}}
subjects:
- kind: ServiceAccount
  name: ctrlmesh-hub
  namespace: {{ .Release.Namespace }}
{{- end }}

{{/*
A CRD from files/crds, with helm.sh/resource-policy: keep so that an
uninstall never deletes the custom resources. Argument: (list $ path).
*/}}
{{- define "ctrlmesh.crd" -}}
{{- $root := index . 0 -}}
{{- $crd := $root.Files.Get (index . 1) | fromYaml -}}
{{- $annotations := $crd.metadata.annotations | default dict -}}
{{- $_ := set $annotations "helm.sh/resource-policy" "keep" -}}
{{- $_ := set $crd.metadata "annotations" $annotations -}}
{{- $labels := $crd.metadata.labels | default dict -}}
{{- $_ := set $labels "app.kubernetes.io/part-of" "ctrlmesh" -}}
{{- $_ := set $crd.metadata "labels" $labels -}}
{{ toYaml $crd }}
{{- end }}
