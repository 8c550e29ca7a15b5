{{- define "attune.name" -}}{{ .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- define "attune.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}
{{- define "attune.labels" -}}
app.kubernetes.io/name: {{ include "attune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
{{- define "attune.selector" -}}
app.kubernetes.io/name: {{ include "attune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "attune.serviceAccount" -}}
{{- if .Values.serviceAccount.create -}}{{ default (include "attune.fullname" .) .Values.serviceAccount.name }}
{{- else -}}{{ default "default" .Values.serviceAccount.name }}{{- end -}}
{{- end -}}
{{- define "attune.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}
{{- define "attune.certName" -}}{{ include "attune.fullname" . }}-webhook{{- end -}}
{{- /* a namespaced install's webhook judges only the namespaces the operator serves */}}
{{- define "attune.webhookScope" }}
    {{- if .Values.operator.namespaces }}
    namespaceSelector:
      matchExpressions:
        - {key: kubernetes.io/metadata.name, operator: In, values: {{ toJson .Values.operator.namespaces }}}
    {{- end }}
{{- end }}
{{- define "attune.certSecret" -}}{{ include "attune.certName" . }}-tls{{- end -}}
{{- define "attune.webhookConfig" -}}{{ include "attune.fullname" . }}-gate{{- end -}}
{{- /* "true" when cert-manager issues the webhook's certificate: webhook.certManager.enabled true, or "auto" (the
default) and the cluster serves cert-manager.io/v1 (helm install and upgrade ask the cluster; helm template assumes
none unless given --api-versions cert-manager.io/v1, so its output stays the same from run to run) */}}
{{- define "attune.certManager" -}}
{{- $want := .Values.webhook.certManager.enabled }}
{{- if and .Values.webhook.enabled (or (eq (toString $want) "true") (and (eq (toString $want) "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1"))) }}true{{ end -}}
{{- end -}}
{{- /* "true" when the operator keeps the webhook's certificates itself (webhook on, cert-manager not used) */}}
{{- define "attune.selfSignedCerts" -}}
{{- if and .Values.webhook.enabled (not (include "attune.certManager" .)) }}true{{ end -}}
{{- end -}}
{{- /* "true" when this release installs kopf's peering CRDs: installPeeringCRDs true, or "auto" (the default) and the
cluster serves none yet (kopf.dev/v1); only with leader election */}}
{{- define "attune.installPeeringCRDs" -}}
{{- $want := .Values.operator.leaderElection.installPeeringCRDs }}
{{- if and .Values.operator.leaderElection.enabled (or (eq (toString $want) "true") (and (eq (toString $want) "auto") (not (.Capabilities.APIVersions.Has "kopf.dev/v1")))) }}true{{ end -}}
{{- end -}}
{{- /* the kopf peering object: release-specific unless named, so two releases never share one */}}
{{- define "attune.peeringName" -}}
{{- default (include "attune.fullname" .) .Values.operator.leaderElection.peeringName -}}
{{- end -}}
{{- /* namespaces where the operator may read Secrets: secretNamespaces, else a namespaced install's own */}}
{{- define "attune.secretNamespaces" -}}
{{- toJson (default .Values.operator.namespaces .Values.operator.secretNamespaces | default list | uniq) -}}
{{- end -}}
