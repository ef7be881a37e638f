{{/*
Names and labels, as the Helm starter chart and the community charts lay them out.
*/}}
{{- define "querygate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "querygate.fullname" -}}
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

{{- define "querygate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: fixed for the life of a release (a Deployment's selector is immutable). */}}
{{- define "querygate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "querygate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "querygate.labels" -}}
helm.sh/chart: {{ include "querygate.chart" . }}
{{ include "querygate.selectorLabels" . }}
app.kubernetes.io/version: {{ (.Values.image.tag | default .Chart.AppVersion) | toString | trunc 63 | quote }}
app.kubernetes.io/component: gateway
app.kubernetes.io/part-of: querygate
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "querygate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "querygate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "querygate.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion | toString }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Fixed paths inside the pod; the Dockerfile creates the same ones. */}}
{{- define "querygate.configDir" -}}/etc/querygate{{- end }}
{{- define "querygate.dataDir" -}}/var/lib/querygate{{- end }}

{{/*
The gateway's configuration as the pods read it: config.querygate with what the chart owns
written over it. Keys the chart owns are refused in config.querygate rather than silently
replaced.
*/}}
{{- define "querygate.config" -}}
{{- $user := deepCopy (.Values.config.querygate | default dict) }}
{{- if hasKey $user "data_dir" }}
{{- fail "config.querygate.data_dir: the chart owns it (/var/lib/querygate, see persistence)" }}
{{- end }}
{{- $server := $user.server | default dict }}
{{- range $owned := list "host" "port" }}
{{- if hasKey $server $owned }}
{{- fail (printf "config.querygate.server.%s: the chart owns it (containerPort, service.port)" $owned) }}
{{- end }}
{{- end }}
{{- $_ := set $server "host" "0.0.0.0" }}
{{- $_ := set $server "port" (int .Values.containerPort) }}
{{- if .Values.config.liveReload }}
{{- if and (hasKey $server "reload_poll_s") (not $server.reload_poll_s) }}
{{- fail "config.liveReload needs config.querygate.server.reload_poll_s > 0 (the gateway's file watch)" }}
{{- end }}
{{- else }}
{{- if hasKey $server "reload_poll_s" }}
{{- fail "config.querygate.server.reload_poll_s: the chart sets it to 0 when config.liveReload is false (rolling mode); set config.liveReload: true to use it" }}
{{- end }}
{{- $_ := set $server "reload_poll_s" 0 }}
{{- end }}
{{- $_ := set $user "server" $server }}
{{- $_ := set $user "data_dir" (include "querygate.dataDir" .) }}
{{- if .Values.redis.enabled }}
{{- $cache := $user.cache | default dict }}
{{- $_ := set $cache "backend" "redis" }}
{{- $_ := set $user "cache" $cache }}
{{- end }}
{{- if .Values.opensearch.enabled }}
{{- $retrieval := $user.retrieval | default dict }}
{{- $_ := set $retrieval "backend" "opensearch" }}
{{- if .Values.opensearch.hosts }}
{{- $os := $retrieval.opensearch | default dict }}
{{- $_ := set $os "hosts" .Values.opensearch.hosts }}
{{- $_ := set $retrieval "opensearch" $os }}
{{- end }}
{{- $_ := set $user "retrieval" $retrieval }}
{{- end }}
{{- toYaml $user }}
{{- end }}

{{/*
The sections of the configuration that a running gateway cannot reload (gateway/server/live_keys.py,
RESTART_ONLY; a test keeps the two lists equal). Their checksum is on the pod template in both
modes, so changing one rolls the pods instead of being refused by every running gateway.
*/}}
{{- define "querygate.restartOnlyConfig" -}}
{{- $c := include "querygate.config" . | fromYaml }}
{{- $server := $c.server | default dict }}
{{- $retrieval := $c.retrieval | default dict }}
{{- $cache := $c.cache | default dict }}
{{- $rerank := $retrieval.rerank | default dict }}
{{- $picked := dict
  "server" (pick $server "host" "port" "max_body_bytes" "shutdown_grace_s" "worker_max_pause_s" "reload_poll_s")
  "data_dir" $c.data_dir
  "embeddings" ($c.embeddings | default dict)
  "retrieval" (pick $retrieval "backend" "opensearch")
  "rerank" (pick $rerank "reranker" "remote" "opensearch")
  "cache" (pick $cache "backend" "max_entries" "memory_max_bytes" "redis_socket_timeout_s"
    "redis_connect_timeout_s" "redis_max_connections" "redis_request_budget_s")
  "models" ($c.models | default dict)
  "quotas" ($c.quotas | default dict)
  "tracing" ($c.tracing | default dict)
}}
{{- toYaml $picked }}
{{- end }}

{{/* The configured server.shutdown_grace_s, or the gateway's default (60). */}}
{{- define "querygate.shutdownGraceSeconds" -}}
{{- $c := include "querygate.config" . | fromYaml }}
{{- $grace := dig "server" "shutdown_grace_s" 60 $c }}
{{- ceil $grace | int }}
{{- end }}

{{/* The pod's termination grace: preStop sleep + the gateway's drain + a margin. */}}
{{- define "querygate.terminationGracePeriodSeconds" -}}
{{- add (int .Values.termination.preStopSleepSeconds) (include "querygate.shutdownGraceSeconds" . | int) (int .Values.termination.marginSeconds) }}
{{- end }}

{{/*
Every api_key_env of a tier and its fallbacks, one a line (recursive: fallbacks are tiers).
*/}}
{{- define "querygate.tierKeyEnvs" -}}
{{- if .api_key_env }}
{{ .api_key_env }}
{{- end }}
{{- range (.fallbacks | default list) }}
{{- include "querygate.tierKeyEnvs" . }}
{{- end }}
{{- end }}

{{/* Refuses a configuration whose model tiers read a key from a variable nobody sets. */}}
{{- define "querygate.checkModelKeys" -}}
{{- $c := include "querygate.config" . | fromYaml }}
{{- $provided := list }}
{{- range .Values.secrets.modelApiKeys }}
{{- $provided = append $provided .env }}
{{- end }}
{{- range .Values.env }}
{{- $provided = append $provided .name }}
{{- end }}
{{- $models := $c.models | default dict }}
{{- range $tier := list "small" "large" }}
{{- with (get $models $tier) }}
{{- range $name := (include "querygate.tierKeyEnvs" . | trim | splitList "\n") }}
{{- if and $name (not (has $name $provided)) }}
{{- fail (printf "config.querygate.models.%s reads its API key from %s, which neither secrets.modelApiKeys nor env sets" $tier $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The embedded index lives in each pod: replicas of it would each answer from their own. */}}
{{- define "querygate.checkReplicas" -}}
{{- $c := include "querygate.config" . | fromYaml }}
{{- $backend := dig "retrieval" "backend" "embedded" $c }}
{{- if and (eq $backend "embedded") (or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1)) }}
{{- fail "retrieval.backend embedded keeps its index inside each pod: more than one replica (replicaCount > 1 or autoscaling.enabled) needs shared retrieval (opensearch.enabled: true)" }}
{{- end }}
{{- if and (or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1)) (not $c.tenants) (not .Values.secrets.tenants.existingSecret) (not .Values.secrets.demoApiKey.existingSecret) }}
{{- fail "with no tenant configured each pod would generate its own demo key: more than one replica needs tenants (config.querygate.tenants or secrets.tenants) or secrets.demoApiKey" }}
{{- end }}
{{- /* Quotas are shared only through Redis (quotas.backend auto with the cache in Redis, or
redis); otherwise every pod enforces each tenant's rate_limit and daily_budget_usd alone. The
gateway warns of that for its own --workers, but cannot see the replicas. */}}
{{- $quotasShared := and .Values.redis.enabled (ne (dig "quotas" "backend" "auto" $c) "memory") }}
{{- if and (or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1)) (not $quotasShared) (not .Values.redis.acceptPerPodQuotas) }}
{{- fail "more than one replica without quotas in Redis (redis.enabled, quotas.backend not memory): each pod would enforce every tenant's rate_limit and daily_budget_usd on its own (N pods: up to N times each limit and budget) and keep its own response cache. Set redis.enabled, or redis.acceptPerPodQuotas: true if that is intended (e.g. no tenant has limits)" }}
{{- end }}
{{- end }}

{{/*
The Redis URL reaches the pods only from redis.existingSecret: a cache or quota store in Redis
asked for in config.querygate without it would dial the gateway's default, 127.0.0.1:6379,
inside the pod (every cache call an error, quotas degraded to per process, for ever).
*/}}
{{- define "querygate.checkRedis" -}}
{{- $c := include "querygate.config" . | fromYaml }}
{{- $urlGiven := dig "cache" "redis_url" "" $c }}
{{- range .Values.env }}
{{- if eq .name "QUERYGATE_CACHE__REDIS_URL" }}
{{- $urlGiven = true }}
{{- end }}
{{- end }}
{{- if and (not .Values.redis.enabled) (not $urlGiven) }}
{{- range $section := list "cache" "quotas" }}
{{- if eq (dig $section "backend" "" $c) "redis" }}
{{- fail (printf "config.querygate.%s.backend: redis needs redis.enabled (the URL comes from redis.existingSecret); without it the pods would dial 127.0.0.1:6379" $section) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* A Secret key reference as an EnvVar's valueFrom. */}}
{{- define "querygate.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secret | quote }}
      key: {{ .key | quote }}
{{- end }}

{{/* OpenSearch needs somewhere to connect. */}}
{{- define "querygate.checkOpenSearch" -}}
{{- if and .Values.opensearch.enabled (not .Values.opensearch.hosts) (not .Values.opensearch.existingSecret) }}
{{- fail "opensearch.enabled needs opensearch.hosts or opensearch.existingSecret (a JSON list of URLs)" }}
{{- end }}
{{- end }}

{{/* The container's environment: Secret references, then `env` as given. */}}
{{- define "querygate.env" -}}
{{- range .Values.secrets.modelApiKeys }}
{{- include "querygate.secretEnv" (dict "name" .env "secret" .secretName "key" .key) | nindent 0 }}
{{- end }}
{{- with .Values.secrets.tenants.existingSecret }}
{{- include "querygate.secretEnv" (dict "name" "QUERYGATE_TENANTS" "secret" . "key" $.Values.secrets.tenants.key) | nindent 0 }}
{{- end }}
{{- with .Values.secrets.demoApiKey.existingSecret }}
{{- include "querygate.secretEnv" (dict "name" "QUERYGATE_DEMO_API_KEY" "secret" . "key" $.Values.secrets.demoApiKey.key) | nindent 0 }}
{{- end }}
{{- with .Values.secrets.adminApiKeySha256.existingSecret }}
{{- include "querygate.secretEnv" (dict "name" "QUERYGATE_ADMIN_API_KEY_SHA256" "secret" . "key" $.Values.secrets.adminApiKeySha256.key) | nindent 0 }}
{{- end }}
{{- if .Values.redis.enabled }}
{{- include "querygate.secretEnv" (dict "name" "QUERYGATE_CACHE__REDIS_URL" "secret" (required "redis.enabled needs redis.existingSecret: a Secret whose key redis.urlKey holds the Redis URL" .Values.redis.existingSecret) "key" .Values.redis.urlKey) | nindent 0 }}
{{- end }}
{{- if and .Values.opensearch.enabled .Values.opensearch.existingSecret }}
{{- include "querygate.secretEnv" (dict "name" "QUERYGATE_RETRIEVAL__OPENSEARCH__HOSTS" "secret" .Values.opensearch.existingSecret "key" .Values.opensearch.hostsKey) | nindent 0 }}
{{- end }}
{{- with .Values.env }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}

{{/*
Secrets never go into the ConfigMap (readable by anyone who may read the namespace's
ConfigMaps, and kept in `helm get values`): a demo key or a URL carrying credentials there is
refused, naming where it belongs.
*/}}
{{- define "querygate.checkInlineSecrets" -}}
{{- $c := include "querygate.config" . | fromYaml }}
{{- $credentials := "^[a-zA-Z][a-zA-Z0-9+.-]*://[^/?#]*@" }}
{{- if hasKey $c "demo_api_key" }}
{{- fail "config.querygate.demo_api_key: a secret in the ConfigMap; use secrets.demoApiKey (an existing Secret)" }}
{{- end }}
{{- if regexMatch $credentials (dig "cache" "redis_url" "" $c | toString) }}
{{- fail "config.querygate.cache.redis_url carries credentials into the ConfigMap; use redis.enabled with redis.existingSecret" }}
{{- end }}
{{- range $host := (dig "retrieval" "opensearch" "hosts" list $c) }}
{{- if regexMatch $credentials (toString $host) }}
{{- fail "an OpenSearch host URL carries credentials into the ConfigMap (opensearch.hosts or config.querygate.retrieval.opensearch.hosts); use opensearch.existingSecret" }}
{{- end }}
{{- end }}
{{- end }}
