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

{{/*
Checks the values that select what the release renders; every template
includes it, so a bad value fails the render whatever is shown.
*/}}
{{- define "ctrlmesh-hub.validate" -}}
{{- if not (has .Values.target (list "standalone" "host" "karmada")) }}
{{- fail (printf "target %q: want standalone, host or karmada" .Values.target) }}
{{- end }}
{{- if and (eq .Values.target "karmada") .Values.crds.work }}
{{- fail "crds.work=true with target=karmada: Karmada serves works.work.karmada.io itself; leave crds.work false" }}
{{- end }}
{{- end }}

{{/* "true" when the release renders the hub's API objects (CRDs, RBAC, members). */}}
{{- define "ctrlmesh-hub.api" -}}
{{- include "ctrlmesh-hub.validate" . }}{{ if ne .Values.target "host" }}true{{ end }}
{{- end }}

{{/* "true" when the release renders the hub's workload (Deployment, PDB, metrics Service). */}}
{{- define "ctrlmesh-hub.workload" -}}
{{- include "ctrlmesh-hub.validate" . }}{{ if ne .Values.target "karmada" }}true{{ end }}
{{- end }}
