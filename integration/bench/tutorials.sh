#!/usr/bin/env bash
# tutorials.sh: the Node.js clustering tutorials' own load tools (loadtest -k
# -n 1200 -c 200, ab -n 1000 -c 100) on the tutorials' Express app (a hello
# route and a ~100 ms CPU-bound /api/intense) in four setups, one after the
# other in one run: one plain node process, node's cluster module (2 workers),
# PM2 cluster mode (pm2 start app.js -i 2) and deployd (instances = 2). The
# cluster app file is the same for the last three: PM2 and deployd make it take
# its worker branch. Steady state first, then (PM2, deployd) the same tool run
# back to back while 3 reloads run. Prints a Markdown table (BENCHMARKS.md
# "Node tutorials' tools").
#
#	integration/bench/tutorials.sh            # from the repository root
#
# Needs go, node, npm and ab (apache2-utils). pm2, loadtest and express come
# from the npm registry into a temporary prefix (NPM_PREFIX=dir reuses one).
# Loopback only; every process it starts is stopped on exit, error or ^C.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/deployd-tutorials.XXXXXX")
run_timeout=${RUN_TIMEOUT:-300} # seconds for one tool run
reloads=3

pgroups=()   # process groups this script started (setsid)
pm2_homes=() # PM2_HOMEs to pm2 kill

cleanup() {
	set +e
	for h in "${pm2_homes[@]}"; do
		PM2_HOME=$h timeout 90 "$pm2" kill >/dev/null 2>&1
	done
	for g in "${pgroups[@]}"; do
		stop_group "$g"
	done
	if [[ -n ${KEEP:-} ]]; then echo "kept $tmp" >&2; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "# $*" >&2; }

# stop_group sends SIGTERM to a process group, waits up to 60 s (the agent
# drains its workers), then SIGKILLs what is left.
stop_group() {
	local g=$1 i
	kill -TERM -- "-$g" 2>/dev/null || return 0
	for ((i = 0; i < 600; i++)); do
		kill -0 -- "-$g" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -KILL -- "-$g" 2>/dev/null || true
}

free_port() {
	node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})"
}

# wait_http waits up to 60 s for URL to answer 200.
wait_http() {
	local i
	for ((i = 0; i < 600; i++)); do
		[[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1") == 200 ]] && return 0
		sleep 0.1
	done
	echo "no answer from $1" >&2
	return 1
}

# --- tools and apps ----------------------------------------------------------

log "building deployd"
mkdir -p "$tmp/bin"
(cd "$repo" && go build -o "$tmp/bin/deployd" ./cmd/deployd)
deployd=$tmp/bin/deployd

prefix=${NPM_PREFIX:-$tmp/npm}
if [[ ! -x $prefix/node_modules/.bin/pm2 || ! -x $prefix/node_modules/.bin/loadtest || ! -d $prefix/node_modules/express ]]; then
	log "npm install pm2 loadtest express@4 into $prefix"
	npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error pm2 loadtest express@4 >&2
fi
pm2=$prefix/node_modules/.bin/pm2
loadtest=$prefix/node_modules/.bin/loadtest
pm2_version=$(node -p "require('$prefix/node_modules/pm2/package.json').version")
lt_version=$(node -p "require('$prefix/node_modules/loadtest/package.json').version")

# The tutorials' app. The one change from them: it listens on 127.0.0.1.
routes='app.get("/", (req, res) => {
  res.send("Hello World!")
})

app.get("/api/intense", (req, res) => {
  let total = 0
  const end = Date.now() + 100
  while (Date.now() < end) total++
  res.send(`Total: ${total}`)
})'

plain_app() {
	cat <<EOF
const express = require("express")
const app = express()
const port = $1

$routes

app.listen(port, "127.0.0.1", () => {
  console.log(\`App listening on port \${port}\`)
})
EOF
}

cluster_app() {
	cat <<EOF
const cluster = require("cluster")
const express = require("express")
const port = $1
const workers = 2

if (cluster.isPrimary) {
  console.log(\`Primary \${process.pid} is running\`)
  for (let i = 0; i < workers; i++) {
    cluster.fork()
  }
  cluster.on("exit", (worker) => {
    console.log(\`worker \${worker.process.pid} died\`)
    cluster.fork()
  })
} else {
  const app = express()

  $routes

  app.listen(port, "127.0.0.1", () => {
    console.log(\`Worker \${process.pid} listening on port \${port}\`)
  })
}
EOF
}

# app_dir SETUP KIND PORT writes $tmp/SETUP/app.js (KIND plain or cluster).
app_dir() {
	local d=$tmp/$1
	mkdir -p "$d"
	ln -sfn "$prefix/node_modules" "$d/node_modules"
	"${2}_app" "$3" >"$d/app.js"
	echo "$d"
}

# --- the tools' figures ------------------------------------------------------

# loadtest_run URL FILE: one `loadtest -k -n 1200 -c 200` run, output in FILE.
loadtest_run() { timeout "$run_timeout" "$loadtest" -k -n 1200 -c 200 "$1" >"$2" 2>&1 || echo "EXIT $?" >>"$2"; }
# ab_run URL FILE: one `ab -n 1000 -c 100` run.
ab_run() { timeout "$run_timeout" ab -n 1000 -c 100 "$1" >"$2" 2>&1 || echo "EXIT $?" >>"$2"; }

# figures TOOL FILE...: "req/s|mean ms|failed|requests|aborted runs" over the runs.
figures() {
	local tool=$1
	shift
	if [[ $tool == loadtest ]]; then
		awk '/^Effective rps:/ {rps=$3} /^Mean latency:/ {lat=$3} /^Total errors:/ {err+=$3}
			/^Completed requests:/ {n+=$3} /^EXIT/ {ab++}
			END {printf "%s|%s|%d|%d|%d\n", rps, lat, err, n, ab}' "$@"
	else
		# ab: failed = "Failed requests" but for Length (the CPU route's body
		# varies in length, which ab counts as a failure) + "Non-2xx responses"; a run ab aborted
		# ("Connection reset by peer") counts its unfinished requests as failed.
		awk '/^Requests per second:/ {rps=$4} /^Time per request:.*\(mean\)$/ {lat=$4}
			/^Failed requests:/ {f=1; next} {if (!/^ *\(Connect:/) f=0}
			f && /^ *\(Connect:/ {gsub(/[(),]/, ""); err+=$2+$4+$8; f=0}
			/^Non-2xx responses:/ {err+=$3}
			/^Complete requests:/ {n+=$3}
			/^Total of [0-9]+ requests completed/ {err+=1000-$3; n+=1000}
			/^EXIT/ {ab++}
			END {printf "%s|%s|%d|%d|%d\n", rps, lat, err, n, ab}' "$@"
	fi
}

# steady SETUP PORT: the two tools on the two routes, rows of the table.
declare -A steady_fig reload_fig
steady() {
	local s=$1 port=$2 route tool f
	for route in / /api/intense; do
		for tool in loadtest ab; do
			f=$tmp/$s-steady-$tool-${route//\//_}.out
			log "$s steady $tool $route"
			"${tool}_run" "http://127.0.0.1:$port$route" "$f"
			steady_fig[$s,$route,$tool]=$(figures "$tool" "$f")
		done
	done
}

# under_reloads SETUP PORT RELOAD-COMMAND...: each tool on each route, run back to
# back until 3 reloads (one every 2 s after the previous returns) are done.
under_reloads() {
	local s=$1 port=$2 route tool i flag secs
	shift 2
	for route in / /api/intense; do
		for tool in loadtest ab; do
			flag=$tmp/$s-reload-$tool-${route//\//_}.done
			(
				i=0
				while [[ ! -e $flag ]]; do
					i=$((i + 1))
					"${tool}_run" "http://127.0.0.1:$port$route" "$flag.$i.out"
				done
			) &
			local loader=$!
			sleep 2
			secs=()
			for ((i = 1; i <= reloads; i++)); do
				log "$s reload $i under $tool $route"
				local t0=$EPOCHREALTIME
				"$@" >>"$tmp/$s-reload.log" 2>&1 || log "$s reload $i failed: see $tmp/$s-reload.log"
				secs+=("$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b-a}')")
				sleep 2
			done
			touch "$flag"
			wait "$loader"
			reload_fig[$s,$route,$tool]="$(figures "$tool" "$flag".*.out)|$(ls "$flag".*.out | wc -l)|${secs[*]}"
		done
	done
}

# --- the four setups ---------------------------------------------------------

machine="$(nproc) cores, Linux $(uname -r), node $(node --version), pm2 $pm2_version, loadtest $lt_version, $(ab -V | head -1 | awk '{print "ab " $5}')"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

run_node() { # SETUP KIND
	local port d
	port=$(free_port)
	d=$(app_dir "$1" "$2" "$port")
	(cd "$d" && exec setsid node app.js >"$d/out.log" 2>&1) &
	pgroups+=($!)
	wait_http "http://127.0.0.1:$port/"
	steady "$1" "$port"
	stop_group "${pgroups[-1]}"
}

run_pm2() {
	local port d
	port=$(free_port)
	d=$(app_dir pm2 cluster "$port")
	export PM2_HOME=$d/pm2home
	pm2_homes+=("$PM2_HOME")
	(cd "$d" && "$pm2" start app.js -i 2 >"$d/start.log" 2>&1)
	wait_http "http://127.0.0.1:$port/"
	steady pm2 "$port"
	under_reloads pm2 "$port" "$pm2" reload app
	"$pm2" kill >/dev/null 2>&1
	unset PM2_HOME
}

run_deployd() {
	local port d
	port=$(free_port)
	d=$(app_dir deployd cluster "$port")
	cat >"$d/deployd.toml" <<EOF
[agent]
socket = "$d/deployd.sock"
state_dir = "state"
log_dir = "logs"

[apps.web]
command = ["node", "app.js"]
cwd = "$d"
instances = 2
listen = ["tcp://127.0.0.1:$port"]
ready_timeout = "60s"
stop_timeout = "60s"
EOF
	(cd "$d" && DEPLOYD_SOCKET= exec setsid "$deployd" agent -c "$d/deployd.toml" >"$d/agent.log" 2>&1) &
	pgroups+=($!)
	wait_http "http://127.0.0.1:$port/"
	steady deployd "$port"
	under_reloads deployd "$port" env DEPLOYD_SOCKET="$d/deployd.sock" DEPLOYD_CONFIG="$d/deployd.toml" "$deployd" reload web
	stop_group "${pgroups[-1]}"
}

run_node node plain
run_node cluster cluster
run_pm2
run_deployd
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# --- the table -----------------------------------------------------------------

cell() { # FIG: "req/s, mean ms, failed"
	IFS='|' read -r rps lat err n ab <<<"$1"
	[[ -z $rps ]] && rps=?
	local s="$rps | $lat | $err"
	((ab > 0)) && s+=" ($ab aborted)"
	echo "$s"
}
rcell() { # FIG: "failed of requests (runs)"
	[[ -z $1 ]] && { echo "—"; return; }
	IFS='|' read -r rps lat err n ab runs secs <<<"$1"
	local s="$err of $n ($runs runs)"
	((ab > 0)) && s+=", $ab aborted"
	echo "$s"
}

echo
echo "Machine: $machine; load average $load_start at the start, $load_end at the end."
echo
echo "| setup | route | loadtest req/s | mean ms | errors | ab req/s | mean ms | failed | during 3 reloads: loadtest errors | ab failed | reload s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for s in node cluster pm2 deployd; do
	for route in / /api/intense; do
		r_lt=${reload_fig[$s,$route,loadtest]:-}
		r_ab=${reload_fig[$s,$route,ab]:-}
		secs="—"
		[[ -n $r_lt ]] && secs="$(cut -d'|' -f7 <<<"$r_lt"); $(cut -d'|' -f7 <<<"$r_ab")"
		echo "| $s | \`$route\` | $(cell "${steady_fig[$s,$route,loadtest]}") | $(cell "${steady_fig[$s,$route,ab]}") | $(rcell "$r_lt") | $(rcell "$r_ab") | $secs |"
	done
done
