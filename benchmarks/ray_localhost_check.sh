#!/bin/bash
# Checks docs/deployment.md's Ray walkthrough on this host, from the repository root:
#   bash benchmarks/ray_localhost_check.sh [CONFIG]        (default src/fedfew/configs/demo.yaml)
# 1. `ray start --head --node-ip-address=127.0.0.1` as is: which address Ray reports, which sockets it listens on.
# 2. The walkthrough's one-machine form: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, `ray start --head --block` in the
#    background, a 2-round flower-sim run joined to it, then `kill` of the one PID `ray start` left.
# 3. A second raylet asked to join that 127.0.0.1-only head.
# Every Ray process here is started in a private temp folder and stopped by PID (never `ray stop`);
# the script ends by listing any process still holding a file in those folders (none expected).
set -u
CONFIG=${1:-src/fedfew/configs/demo.yaml}
PATH=$PWD/.venv/bin:$PATH
free_port() { python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
listening() {  # the TCP sockets the processes below PID $1 listen on
    local pids; pids=$(pgrep -d'|' -P "$1")
    ss -ltnpH | grep -E "pid=($pids)," | awk '{print "    " $4, $6}' | sed 's/,fd=[0-9]*//'
}
start_head() {  # $1 folder, $2 port; ray start --block in the background; its PID in $1/ray-head.pid
    ray start --head --block --port="$2" --node-ip-address=127.0.0.1 --num-cpus=2 --include-dashboard=false \
        --disable-usage-stats --temp-dir="$1/ray" > "$1/ray-head.log" 2>&1 &
    echo $! > "$1/ray-head.pid"
    for _ in $(seq 120); do grep -q "block forever" "$1/ray-head.log" && return 0; sleep 1; done
    echo "  the head did not start within 120 s"; return 1
}
stop_head() {  # SIGTERM to the one PID; report what is left of that node
    local pid; pid=$(cat "$1/ray-head.pid")
    kill "$pid"; wait "$pid" 2>/dev/null
    sleep 3
    echo "  after kill $pid: processes still holding files under its temp folder:" \
        "$(for p in /proc/[0-9]*; do ls -l "$p/fd" 2>/dev/null | grep -q "$1/ray" && basename "$p"; done | tr '\n' ' ')"
}
uptime
python -c "import ray; print('ray', ray.__version__)"
echo "interfaces: $(ip -4 -o addr 2>/dev/null | awk '{print $2, $4}' | tr '\n' ' ')"

echo "== 1. ray start --head --node-ip-address=127.0.0.1 (Ray's default)"
W1=$(mktemp -d /tmp/rchkXXXX)
start_head "$W1" "$(free_port)" && {
    grep -E "Local node IP|ray start --address" "$W1/ray-head.log" | sed 's/^.*-- /  /'
    echo "  listening:"; listening "$(cat "$W1/ray-head.pid")"
}
stop_head "$W1"

echo "== 2. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: the same command, then a flower-sim run joined to it"
W2=$(mktemp -d /tmp/rchkXXXX)
PORT=$(free_port)
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
start_head "$W2" "$PORT" && {
    grep "Local node IP" "$W2/ray-head.log" | sed 's/^.*-- /  /'
    echo "  listening:"; listening "$(cat "$W2/ray-head.pid")"
    fedfew run "$CONFIG" --set runtime.engine=flower-sim --set "flower.sim.address=127.0.0.1:$PORT" \
        --set federation.rounds=2 --out "$W2/runs" --quiet 2>&1 | sed 's/^/  /'
    echo "  fedfew exit ${PIPESTATUS[0]}; replies by Ray node (messages.jsonl):"
    grep -ho '"ray_node": "[0-9a-f]*"' "$W2"/runs/*/flower/messages.jsonl | sort | uniq -c | sed 's/^/  /'
    echo "== 3. a second raylet joining 127.0.0.1:$PORT"
    timeout 60 ray start --address="127.0.0.1:$PORT" --node-ip-address=127.0.0.1 --num-cpus=1 --disable-usage-stats \
        2>&1 | grep -E "Error|PANIC" | head -1 | cut -c1-160 | sed 's/^/  /'
}
stop_head "$W2"
unset RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER
rm -rf "$W1" "$W2"
uptime
