{{/*
Kafka security flags, mounts and volumes: one definition for every ragpulse command the chart
runs (serve, and the review page).
*/}}
{{- define "ragpulse.kafkaSecurityArgs" -}}
{{- with .Values.kafka.security }}
{{- if .propertiesSecret }}
- --kafka-properties=/etc/ragpulse/kafka/properties/{{ .propertiesKey }}
{{- end }}
- --kafka-security-protocol={{ .protocol }}
{{- if not .checkHostname }}
- --kafka-ssl-no-check-hostname
{{- end }}
{{- if .tls.secretName }}
{{- if .tls.caKey }}
- --kafka-ssl-cafile=/etc/ragpulse/kafka/tls/{{ .tls.caKey }}
{{- end }}
{{- if .tls.certKey }}
- --kafka-ssl-certfile=/etc/ragpulse/kafka/tls/{{ .tls.certKey }}
{{- end }}
{{- if .tls.keyKey }}
- --kafka-ssl-keyfile=/etc/ragpulse/kafka/tls/{{ .tls.keyKey }}
{{- end }}
{{- if .tls.keyPasswordKey }}
- --kafka-ssl-key-password-file=/etc/ragpulse/kafka/tls/{{ .tls.keyPasswordKey }}
{{- end }}
{{- end }}
{{- if .sasl.mechanism }}
- --kafka-sasl-mechanism={{ .sasl.mechanism }}
{{- end }}
{{- if .sasl.username }}
- {{ printf "--kafka-sasl-username=%s" .sasl.username | quote }}
{{- end }}
{{- if .sasl.secretName }}
{{- if .sasl.oauthTokenKey }}
- --kafka-sasl-oauth-token-file=/etc/ragpulse/kafka/sasl/{{ .sasl.oauthTokenKey }}
{{- else }}
- --kafka-sasl-password-file=/etc/ragpulse/kafka/sasl/{{ .sasl.passwordKey }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ragpulse.kafkaSecurityMounts" -}}
{{- if .Values.kafka.security.tls.secretName }}
- {name: kafka-tls, mountPath: /etc/ragpulse/kafka/tls, readOnly: true}
{{- end }}
{{- if .Values.kafka.security.sasl.secretName }}
- {name: kafka-sasl, mountPath: /etc/ragpulse/kafka/sasl, readOnly: true}
{{- end }}
{{- if .Values.kafka.security.propertiesSecret }}
- {name: kafka-properties, mountPath: /etc/ragpulse/kafka/properties, readOnly: true}
{{- end }}
{{- end }}

{{- define "ragpulse.kafkaSecurityVolumes" -}}
{{- if .Values.kafka.security.tls.secretName }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.security.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- if .Values.kafka.security.sasl.secretName }}
- name: kafka-sasl
  secret:
    secretName: {{ .Values.kafka.security.sasl.secretName }}
    defaultMode: 0440
{{- end }}
{{- if .Values.kafka.security.propertiesSecret }}
- name: kafka-properties
  secret:
    secretName: {{ .Values.kafka.security.propertiesSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}
