{{/*
Names are fixed: the chart is a cluster singleton and the generated ClusterRole
(templates/role.yaml) is named `address-controller`.
*/}}
{{- define "address-controller.name" -}}address-controller{{- end -}}

{{- /*
"true" unless core.enabled is false: a release of the drivers alone (core.enabled: false) renders
none of the core — a platform installs the core and each driver as packages of their own.
*/ -}}
{{- define "address-controller.core" -}}
{{- if ne (toString ((.Values.core | default dict).enabled)) "false" -}}true{{- end -}}
{{- end -}}
{{- define "address-controller.apiServiceName" -}}address-controller-api{{- end -}}
{{- define "address-controller.metricsServiceName" -}}address-controller-metrics{{- end -}}
{{- define "address-controller.tlsSecretName" -}}
{{- if eq .Values.apiService.tls.mode "secret" -}}
{{- required "apiService.tls.existingSecret is required when apiService.tls.mode is secret" .Values.apiService.tls.existingSecret -}}
{{- else -}}
address-controller-api-tls
{{- end -}}
{{- end -}}

{{- define "address-controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "address-controller.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The controller's pods (not the range driver's): Deployment, Services, PDB. */}}
{{- define "address-controller.podSelector" -}}
{{ include "address-controller.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end -}}

{{- /*
  `helm upgrade --reuse-values` takes the previous release's values only: keys this chart
  version added are missing, and the templates would fail with a nil pointer deep inside.
  Say so at once instead: every template includes the labels, so the first one rendered
  refuses. Keep the list at the keys the newest chart versions added.
*/ -}}
{{- define "address-controller.valuesCheck" -}}
{{- $missing := list -}}
{{- if not (hasKey .Values "helmTest") }}{{ $missing = append $missing "helmTest" }}{{ end -}}
{{- if not (hasKey (.Values.controller | default dict) "kubeApi") }}{{ $missing = append $missing "controller.kubeApi" }}{{ end -}}
{{- if not (hasKey ((.Values.metrics | default dict).prometheusRule | default dict) "poolUsage") }}{{ $missing = append $missing "metrics.prometheusRule.poolUsage" }}{{ end -}}
{{- if not (hasKey .Values "entitlementPolicy") }}{{ $missing = append $missing "entitlementPolicy" }}{{ end -}}
{{- if not (hasKey ((.Values.metrics | default dict).prometheusRule | default dict) "quotaReached") }}{{ $missing = append $missing "metrics.prometheusRule.quotaReached" }}{{ end -}}
{{- if not (hasKey .Values "protectionPolicy") }}{{ $missing = append $missing "protectionPolicy" }}{{ end -}}
{{- if not (hasKey .Values "core") }}{{ $missing = append $missing "core" }}{{ end -}}
{{- if $missing -}}
{{- fail (printf "values lack %s, which this chart version added: the values come from an older chart (helm upgrade --reuse-values keeps only the previous release's). Upgrade with --reset-then-reuse-values (Helm >= 3.14) or pass your values file again." (join ", " $missing)) -}}
{{- end -}}
{{- end -}}

{{- define "address-controller.labels" -}}
{{- include "address-controller.valuesCheck" . -}}
{{ include "address-controller.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "address-controller.image" -}}
{{- if and .Values.image.digest .Values.image.tag -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}@{{ .Values.image.digest }}
{{- else if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* DNS names of the serving certificate: both Services, short and qualified. */}}
{{- define "address-controller.dnsNames" -}}
{{- $ns := .Release.Namespace -}}
{{- $names := list -}}
{{- range $svc := list (include "address-controller.apiServiceName" .) (include "address-controller.metricsServiceName" .) -}}
{{- $names = concat $names (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) -}}
{{- end -}}
{{- toJson $names -}}
{{- end -}}

{{- define "address-controller.monitoring" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" -}}true{{- end -}}
{{- end -}}

{{/* Pod-level settings shared by the controller's and the range driver's pods. */}}
{{- define "address-controller.podSettings" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Environment shared by both binaries: the Lease namespace and identity, the log level or filter (--log-level). */}}
{{- define "address-controller.env" -}}
- name: ADDRESS_CONTROLLER_POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: ADDRESS_CONTROLLER_POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
# The serving budgets are sized from the container's memory limit (in bytes).
- name: ADDRESS_CONTROLLER_MEMORY_LIMIT
  valueFrom:
    resourceFieldRef:
      resource: limits.memory
{{- with .Values.logLevel }}
- name: ADDRESS_CONTROLLER_LOG_LEVEL
  value: {{ . | quote }}
{{- end }}
{{- end -}}
