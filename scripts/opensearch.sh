#!/usr/bin/env bash
# A real single-node OpenSearch (k-NN, lucene engine) for development and CI, from Maven Central.
#
#   scripts/opensearch.sh start|stop|status
#   scripts/opensearch.sh launch|kill|wipe     (cluster members, for fault tests)
#
# Cluster mode: with OPENSEARCH_CLUSTER_PORTS="9230,9231,9232" the node on OPENSEARCH_PORT is one
# member of a cluster of those nodes (every one cluster-manager eligible and a data node) instead
# of a single node. One member alone cannot elect a cluster manager, so members are started with
# `launch` (the process, no wait for health) and the caller waits for the cluster's health;
# `kill` is SIGKILL (a node dying), `wipe` stops the node and deletes its data.
# tests/opensearch_cluster.py drives this for tests/e2e/test_opensearch_cluster_faults.py.
#
# Environment:
#   OPENSEARCH_CLUSTER_PORTS  HTTP ports of every member, comma-separated (unset: single node)
#   OPENSEARCH_VERSION  3.5.0 (default, Temurin 25) or 2.19.1 (JDK 17)
#   OPENSEARCH_PORT     HTTP port on 127.0.0.1 (default 9200); transport uses port+100
#   OPENSEARCH_HEAP     JVM heap options (default "-Xms512m -Xmx1g")
#   OPENSEARCH_START_TIMEOUT  seconds to wait for health (default 180)
#
# Downloads are cached per machine under ~/.cache/querygate/opensearch (QUERYGATE_DOWNLOAD_CACHE
# overrides); the unpacked node lives under $REPO/.cache/opensearch (git-ignored). Why each step
# exists, and what the upstream recipe got wrong, is in docs/opensearch.md.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OS_VER="${OPENSEARCH_VERSION:-3.5.0}"
PLUG_VER="${OS_VER}.0"
PORT="${OPENSEARCH_PORT:-9200}"
HEAP="${OPENSEARCH_HEAP:--Xms512m -Xmx1g}"
START_TIMEOUT="${OPENSEARCH_START_TIMEOUT:-180}"
SERVICE_USER="${OPENSEARCH_USER:-osnode}"

CACHE="$REPO/.cache/opensearch"
# Downloads outlive a checkout (CI clones afresh each run): keep them per machine.
DOWNLOADS="${QUERYGATE_DOWNLOAD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/querygate/opensearch}"
DL="$DOWNLOADS/dl"
M2="$DOWNLOADS/m2"
# Where the unpacked node and its data live: see resolve_node_dirs.
SHARED_NODE_BASE="/var/tmp/querygate-opensearch"
INSTALL="" RUN="" PIDFILE=""
URL="http://127.0.0.1:$PORT"
CLUSTER_PORTS="${OPENSEARCH_CLUSTER_PORTS:-}"
# The log file is named after the cluster.
CLUSTER_NAME="querygate-dev"
[ -n "$CLUSTER_PORTS" ] && CLUSTER_NAME="querygate-cluster-${CLUSTER_PORTS%%,*}"
DEP_PLUGIN="org.apache.maven.plugins:maven-dependency-plugin:3.6.1"

log() { printf '[opensearch] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

java_home() {
  # OpenSearch 2.x installs a SecurityManager (gone in JDK 24+); 3.x needs JDK 21+.
  case "$OS_VER" in
    2.*) echo "${OPENSEARCH_JAVA_HOME:-/usr/lib/jvm/java-17-openjdk-amd64}" ;;
    *) echo "${OPENSEARCH_JAVA_HOME:-/usr/lib/jvm/temurin-25-jdk-amd64}" ;;
  esac
}

ensure_tools() {
  local missing=()
  command -v curl >/dev/null || missing+=(curl)
  command -v unzip >/dev/null || missing+=(unzip)
  command -v mvn >/dev/null || missing+=(maven)
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  [ -x "$(java_home)/bin/java" ] || die "no JDK at $(java_home) (set OPENSEARCH_JAVA_HOME)"
}

# mvn_copy GROUP:ARTIFACT:VERSION:zip -> 0 when the file is (now) in $DL, 1 when Central lacks it.
mvn_copy() {
  local coord="$1" artifact version file
  artifact="$(cut -d: -f2 <<<"$coord")"
  version="$(cut -d: -f3 <<<"$coord")"
  file="$DL/$artifact-$version.zip"
  [ -s "$file" ] && return 0
  # A marker remembers a miss so every start does not ask Central again.
  [ -e "$file.missing" ] && return 1
  mkdir -p "$DL"
  log "downloading $coord"
  if mvn -B -q -Dmaven.repo.local="$M2" "$DEP_PLUGIN:copy" \
    -Dartifact="$coord" -DoutputDirectory="$DL" >"$DL/mvn.log" 2>&1; then
    return 0
  fi
  # "Could not find" on a first miss, "was not found in ... during a previous attempt" when maven
  # cached the miss in its local repository.
  if grep -Eq "Could not find artifact|was not found in" "$DL/mvn.log"; then
    touch "$file.missing"
    return 1
  fi
  cat "$DL/mvn.log" >&2
  die "maven could not fetch $coord"
}

# The node runs as $SERVICE_USER, which must traverse every parent of its files. A checkout under
# a private directory (mode 700, e.g. a CI clone in a mktemp dir) cannot host them, so the node
# then lives under $SHARED_NODE_BASE; downloads stay in the repo's cache either way.
resolve_node_dirs() {
  local base="$SHARED_NODE_BASE"
  if getent passwd "$SERVICE_USER" >/dev/null &&
    runuser -u "$SERVICE_USER" -- test -x "$CACHE" 2>/dev/null; then
    base="$CACHE"
  fi
  INSTALL="$base/install/opensearch-$OS_VER"
  RUN="$base/run-$PORT"
  PIDFILE="$RUN/opensearch.pid"
}

ensure_user() {
  # OpenSearch refuses to run as root, and there is no setting to override it.
  getent passwd "$SERVICE_USER" >/dev/null ||
    useradd --system --no-create-home --shell /usr/sbin/nologin "$SERVICE_USER"
}

ensure_modules() {
  # Integ-test-zips before 3.5 ship only transport-* modules. k-NN extends lang-painless, and the
  # english analyzer and pattern tokenizer of our mapping live in analysis-common: assemble both
  # from their Maven jars when missing. (3.5.0's zip has every module, so this is a no-op there.)
  # reindex backs rebuild_index (build a new index version aside, then swap the alias).
  assemble_module lang-painless lang-painless "" "An easy, safe and fast scripting language"
  assemble_module analysis-common analysis-common lang-painless 'Adds "built in" analyzers'
  assemble_module reindex reindex-client "" "The Reindex module adds APIs to reindex"
}

# assemble_module NAME ARTIFACT EXTENDED_PLUGIN DESCRIPTION: build modules/NAME from the runtime
# jars of org.opensearch.plugin:ARTIFACT.
assemble_module() {
  local name="$1" artifact="$2" extends="$3" description="$4"
  local dir="$INSTALL/modules/$name" work="$CACHE/modules/$name-$OS_VER"
  [ -d "$dir" ] && return 0
  log "assembling module $name $OS_VER from Maven jars"
  rm -rf "$work"
  mkdir -p "$work/jars" "$dir"
  cat >"$work/pom.xml" <<EOF
<project><modelVersion>4.0.0</modelVersion>
<groupId>local</groupId><artifactId>$name-module</artifactId><version>1</version>
<dependencies><dependency><groupId>org.opensearch.plugin</groupId><artifactId>$artifact</artifactId>
<version>$OS_VER</version></dependency></dependencies></project>
EOF
  mvn -B -q -Dmaven.repo.local="$M2" -f "$work/pom.xml" "$DEP_PLUGIN:copy-dependencies" \
    -DincludeScope=runtime -DoutputDirectory="$work/jars" >"$work/mvn.log" 2>&1 ||
    {
      cat "$work/mvn.log" >&2
      die "could not fetch the jars of $name $OS_VER"
    }
  local jar base
  for jar in "$work"/jars/*.jar; do
    base="$(basename "$jar")"
    # A jar already on the server classpath or in the extended plugin would be jar hell.
    [ -e "$INSTALL/lib/$base" ] && continue
    [ -n "$extends" ] && [ -e "$INSTALL/modules/$extends/$base" ] && continue
    cp "$jar" "$dir/"
  done
  local classes
  classes="$(unzip -Z1 "$dir/$artifact-$OS_VER.jar" | grep -E 'Plugin\.class$' || true)"
  if [ -z "$classes" ] || [ "$(wc -l <<<"$classes")" -ne 1 ]; then
    die "expected one plugin class in $artifact-$OS_VER.jar, found: ${classes:-none}"
  fi
  cat >"$dir/plugin-descriptor.properties" <<EOF
description=$description
version=$OS_VER
name=$name
classname=$(sed 's#/#.#g; s#\.class$##' <<<"$classes")
java.version=11
opensearch.version=$OS_VER
extended.plugins=$extends
has.native.controller=false
EOF
  if [ "$name" = lang-painless ]; then
    # Painless generates classes at runtime; 2.x runs under a SecurityManager that must allow it.
    printf '%s\n' 'grant {' \
      '  permission java.lang.RuntimePermission "createClassLoader";' \
      '  permission java.lang.RuntimePermission "getClassLoader";' \
      '};' >"$dir/plugin-security.policy"
  fi
}

install_plugin() {
  # --batch accepts the plugin's extra permissions; its warnings go to a log, shown on failure.
  env OPENSEARCH_JAVA_HOME="$(java_home)" JAVA_HOME="$(java_home)" \
    "$INSTALL/bin/opensearch-plugin" install --batch "file://$1" >"$DL/plugin.log" 2>&1 ||
    {
      cat "$DL/plugin.log" >&2
      die "installing $(basename "$1") failed"
    }
}

install_node() {
  [ -e "$INSTALL/.installed" ] && return 0
  mvn_copy "org.opensearch.distribution.integ-test-zip:opensearch:$OS_VER:zip" ||
    die "integ-test-zip $OS_VER is not on Maven Central"
  mvn_copy "org.opensearch.plugin:opensearch-knn:$PLUG_VER:zip" ||
    die "opensearch-knn $PLUG_VER is not on Maven Central"
  rm -rf "$INSTALL"
  mkdir -p "$(dirname "$INSTALL")"
  unzip -q "$DL/opensearch-$OS_VER.zip" -d "$(dirname "$INSTALL")"
  chmod +x "$INSTALL"/bin/*
  ensure_modules
  install_plugin "$DL/opensearch-knn-$PLUG_VER.zip"
  if mvn_copy "org.opensearch.plugin:neural-search:$PLUG_VER:zip"; then
    install_plugin "$DL/neural-search-$PLUG_VER.zip"
  else
    log "neural-search $PLUG_VER is not on Maven Central: hybrid fusion stays client-side"
  fi
  touch "$INSTALL/.installed"
}

write_config() {
  rm -rf "$RUN/config" "$RUN/logs.prev"
  # Fresh logs per start, so a fatal line from an earlier run cannot fail this one.
  [ -d "$RUN/logs" ] && mv "$RUN/logs" "$RUN/logs.prev"
  mkdir -p "$RUN/data" "$RUN/logs"
  cp -r "$INSTALL/config" "$RUN/config"
  # Loopback: bootstrap checks (vm.max_map_count, fd limits) are warnings only.
  # Disk watermarks off: CI disks run nearly full and would turn indices read-only.
  cat >>"$RUN/config/opensearch.yml" <<EOF
cluster.name: $CLUSTER_NAME
node.name: node-$PORT
$(discovery_config)
network.host: 127.0.0.1
http.port: $PORT
transport.port: $((PORT + 100))
path.data: $RUN/data
path.logs: $RUN/logs
cluster.routing.allocation.disk.threshold_enabled: false
action.auto_create_index: true
EOF
}

# One node alone, or (cluster mode) the members to find and, on the very first start, to elect
# the first cluster manager from; a member restarted with its data rejoins from its own state.
discovery_config() {
  if [ -z "$CLUSTER_PORTS" ]; then
    echo "discovery.type: single-node"
    return
  fi
  local p members seeds=() managers=()
  IFS=, read -ra members <<<"$CLUSTER_PORTS"
  for p in "${members[@]}"; do
    seeds+=("\"127.0.0.1:$((p + 100))\"")
    managers+=("\"node-$p\"")
  done
  local IFS=,
  echo "discovery.seed_hosts: [${seeds[*]}]"
  echo "cluster.initial_cluster_manager_nodes: [${managers[*]}]"
}

running_pid() {
  [ -s "$PIDFILE" ] || return 1
  local pid
  pid="$(cat "$PIDFILE")"
  kill -0 "$pid" 2>/dev/null && echo "$pid"
}

healthy() {
  curl -fsS -m 2 -o /dev/null "$URL/_cluster/health?wait_for_status=yellow&timeout=1s" 2>/dev/null
}

wait_healthy() {
  local deadline=$((SECONDS + START_TIMEOUT)) grace=$((SECONDS + 30))
  while ((SECONDS < deadline)); do
    healthy && return 0
    if node_gone "$grace"; then
      log "node process exited before becoming healthy; node log follows"
      show_logs
      return 1
    fi
    sleep 1
  done
  log "node did not become healthy within ${START_TIMEOUT}s; node log follows"
  show_logs
  return 1
}

# node_gone GRACE_DEADLINE: has the starting node died? `opensearch -d` returns before the JVM
# writes its pid file, so a missing pid file means "still booting" until GRACE_DEADLINE (in
# $SECONDS); a fatal line in the log means dead at once.
node_gone() {
  grep -qs "uncaught exception in thread \[main\]" "$RUN/logs/$CLUSTER_NAME.log" && return 0
  running_pid >/dev/null && return 1
  [ -s "$PIDFILE" ] || ((SECONDS > $1))
}

show_logs() {
  tail -n 80 "$RUN/logs/stdout.log" "$RUN/logs/$CLUSTER_NAME.log" >&2 2>/dev/null || true
}

# Install (once), write the config and start the JVM; returns once the process is launched.
launch_node() {
  ensure_tools
  local t0=$SECONDS
  install_node
  log "installed $OS_VER in $((SECONDS - t0))s"
  write_config
  # The service user must traverse every parent of the node dirs; chown what it writes.
  chown -R "$SERVICE_USER:" "$INSTALL" "$RUN"
  # A pid file left by a node that died (a reboot, a kill -9) names a dead process: removed, so
  # the wait below reads the new JVM's, not that one's, as "exited before becoming healthy".
  rm -f "$PIDFILE"
  runuser -u "$SERVICE_USER" -- env OPENSEARCH_JAVA_HOME="$(java_home)" JAVA_HOME="$(java_home)" \
    OPENSEARCH_PATH_CONF="$RUN/config" OPENSEARCH_JAVA_OPTS="$HEAP" \
    "$INSTALL/bin/opensearch" -d -p "$PIDFILE" >"$RUN/logs/stdout.log" 2>&1 ||
    {
      cat "$RUN/logs/stdout.log" >&2
      die "opensearch failed to launch"
    }
}

cmd_launch() {
  ensure_user
  mkdir -p "$CACHE"
  resolve_node_dirs
  if running_pid >/dev/null; then
    log "already running (pid $(running_pid))"
    return 0
  fi
  launch_node
  log "launched node-$PORT of $CLUSTER_NAME"
}

# SIGKILL, as a node dies: no shutdown, the JVM gone at once, its data left as it was.
cmd_kill() {
  local pid
  pid="$(running_pid)" || die "node-$PORT is not running"
  kill -9 "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  log "killed node-$PORT (pid $pid)"
}

cmd_wipe() {
  cmd_stop
  rm -rf "$RUN"
}

cmd_start() {
  ensure_user
  mkdir -p "$CACHE"
  resolve_node_dirs
  if healthy; then
    log "already running at $URL"
    return 0
  fi
  if running_pid >/dev/null; then
    log "starting (pid $(running_pid)); waiting for health"
    wait_healthy
    return
  fi
  local t0=$SECONDS
  launch_node
  wait_healthy || {
    cmd_stop
    exit 1
  }
  log "OpenSearch $OS_VER healthy at $URL after $((SECONDS - t0))s"
  curl -fsS -m 5 "$URL/_cat/plugins?h=component,version" >&2 || true
}

cmd_stop() {
  local pid
  if ! pid="$(running_pid)"; then
    log "not running"
    rm -f "$PIDFILE"
    return 0
  fi
  kill "$pid"
  local deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    log "pid $pid ignored SIGTERM for 30s; killing"
    kill -9 "$pid"
  fi
  rm -f "$PIDFILE"
  log "stopped"
}

cmd_status() {
  if healthy; then
    curl -fsS -m 2 "$URL/_cluster/health?pretty"
    return 0
  fi
  if running_pid >/dev/null; then
    log "process $(running_pid) alive but $URL not healthy"
  else
    log "not running"
  fi
  return 1
}

case "${1:-}" in
  start) cmd_start ;;
  stop) resolve_node_dirs && cmd_stop ;;
  status) resolve_node_dirs && cmd_status ;;
  launch) cmd_launch ;;
  kill) resolve_node_dirs && cmd_kill ;;
  wipe) resolve_node_dirs && cmd_wipe ;;
  *)
    echo "usage: $0 start|stop|status|launch|kill|wipe" >&2
    exit 2
    ;;
esac
