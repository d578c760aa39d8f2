{{/* Common labels. */}}
{{- define "ctrlmesh-agent.labels" -}}
app.kubernetes.io/name: ctrlmesh-agent
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: ctrlmesh
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Labels selecting the agent's pods. */}}
{{- define "ctrlmesh-agent.selectorLabels" -}}
app.kubernetes.io/name: ctrlmesh-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "ctrlmesh-agent.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The subjects of the agent's bindings: its ServiceAccount (agent.ServiceAccount).
*/}}
{{- define "ctrlmesh-agent.subjects" -}}
subjects:
- kind: ServiceAccount
  name: ctrlmesh-agent
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

{{- define "ctrlmesh-agent.proxyImage" -}}
{{ .Values.proxyImage.repository }}:{{ .Values.proxyImage.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The DNS names of the webhook Service, for the serving certificate. */}}
{{- define "ctrlmesh-agent.webhookDNSNames" -}}
{{- $ns := .Release.Namespace -}}
{{- list "ctrlmesh-agent" (printf "ctrlmesh-agent.%s" $ns) (printf "ctrlmesh-agent.%s.svc" $ns) (printf "ctrlmesh-agent.%s.svc.cluster.local" $ns) | toJson -}}
{{- end }}
