{{/* Names and labels shared by every template. */}}

{{- define "orchestrator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "orchestrator.operatorName" -}}
{{- printf "%s-operator" (include "orchestrator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "orchestrator.catalogName" -}}
{{- printf "%s-catalog" (include "orchestrator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "orchestrator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "orchestrator.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "orchestrator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "orchestrator.labels" -}}
{{ include "orchestrator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: orchestrator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "orchestrator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- /*
The namespaces the operator watches, comma-separated; empty: every namespace. watchNamespace is
the one-namespace shorthand of watchNamespaces (setting both is refused).
*/ -}}
{{- define "orchestrator.watchNamespaces" -}}
{{- $list := .Values.watchNamespaces | default list -}}
{{- if .Values.watchNamespace -}}
{{- if $list -}}
{{- fail (printf "set watchNamespaces or watchNamespace, not both (watchNamespace: %s is watchNamespaces: [%s]; got watchNamespaces: %s too)" .Values.watchNamespace .Values.watchNamespace (toJson $list)) -}}
{{- end -}}
{{- $list = list .Values.watchNamespace -}}
{{- end -}}
{{- join "," (uniq $list) -}}
{{- end -}}

{{- /* The shared MCP proxy (sharedProxy.*): its Deployment, ServiceAccount and Service. */ -}}
{{- define "orchestrator.sharedProxyName" -}}
{{- printf "%s-mcp-proxy" (include "orchestrator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "orchestrator.sharedProxySelectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: shared-mcp-proxy
{{- end -}}

{{- define "orchestrator.sharedProxyLabels" -}}
{{ include "orchestrator.sharedProxySelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: orchestrator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- /* The shared proxy's MCP URL as task pods reach it: sharedProxy.url, else its Service. */ -}}
{{- define "orchestrator.sharedProxyUrl" -}}
{{- if .Values.sharedProxy.url -}}
{{- .Values.sharedProxy.url -}}
{{- else if .Values.sharedProxy.service.clusterIP -}}
{{- printf "http://%s:8080/mcp" .Values.sharedProxy.service.clusterIP -}}
{{- else -}}
{{- printf "http://%s.%s.svc:8080/mcp" (include "orchestrator.sharedProxyName" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}
