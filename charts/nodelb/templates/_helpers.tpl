{{/* The labels every object carries: nodelb's own (the same as manifests/), then Helm's. */}}
{{- define "nodelb.labels" -}}
app.kubernetes.io/name: nodelb
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{- end }}

{{- define "nodelb.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The agent's arguments: `run`, then only the flags whose value differs from the agent's default. */}}
{{- define "nodelb.args" -}}
{{- $args := list "run" }}
{{- if not .Values.ipv4 }}{{ $args = append $args "--ipv4=false" }}{{ end }}
{{- if .Values.ipv6 }}{{ $args = append $args "--ipv6" }}{{ end }}
{{- if not .Values.defaultClass }}{{ $args = append $args "--default-class=false" }}{{ end }}
{{- if ne .Values.lbClass "nodelb.io/nodelb" }}{{ $args = append $args (printf "--lb-class=%s" .Values.lbClass) }}{{ end }}
{{- if not (kindIs "invalid" .Values.reservedPorts) }}{{ $args = append $args (printf "--reserved-ports=%v" .Values.reservedPorts) }}{{ end }}
{{- $args = concat $args .Values.extraArgs }}
{{- toJson $args }}
{{- end }}

{{/* The securityContext of a container that needs NET_ADMIN and nothing else. */}}
{{- define "nodelb.netAdminOnly" -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsUser: 0
runAsNonRoot: false
seccompProfile:
  type: RuntimeDefault
capabilities:
  drop: ["ALL"]
  add: ["NET_ADMIN"]
{{- end }}
