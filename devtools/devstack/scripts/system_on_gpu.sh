#!/usr/bin/env bash
# The whole gpufleet system on one GPU machine, end to end, in under ~6.5 minutes:
# installs the carried wheels (.devrun/whl, .devrun/whl-gcp) into a target dir, starts the
# stack as `just up` does (python -m gpufleet_devstack.up, without `just setup`'s installs)
# with the node agent reading the real GPU through NVML and running the local account's
# jobs as bare processes, then through the CLI: nodes, one 1-GPU torch job, two 0.5-GPU
# jobs at once, their logs, billing; then stops the stack (SIGTERM: orderly stop_all).
#
#   bash devtools/devstack/scripts/system_on_gpu.sh            # on the GPU machine (carry .devrun)
#   SIM=1 PY=/path/python3.12 EXTRA_SITE=/tmp/site-extra \
#     JOB_PY='python3 -c "..."' bash devtools/devstack/scripts/system_on_gpu.sh   # a local dry run
#
# Env: SIM (1: simulated GPUs; default 0), PY (python, default python3), SITE (default
# /tmp/site), EXTRA_SITE (appended to PYTHONPATH: the device's own packages, for a local
# run), OUT (default /tmp/gpufleet-out), RUN_DIR (default /tmp/gpufleet-run), JOB_PY and
# JOB_PY_HALF (replace the whole-GPU and the 0.5-GPU jobs' torch code), TORCH_PY (the jobs'
# interpreter, default `command -v python3`), GPU_TYPE (default: the node's first GPU model),
# GPUFLEET_GPU_SHARES (default 2), DEADLINE (s, default 390), NATS_PORT/MONGO_PORT (default
# 4533/27227). Exit 0 only when every step passed; RESULT: PASS|FAIL is the last line.
set -uo pipefail

T0=$(date +%s)
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/gpufleet-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1

SIM=${SIM:-0}
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
RUN_DIR=${RUN_DIR:-/tmp/gpufleet-run}
DEADLINE=${DEADLINE:-390} # seconds from start: everything after is skipped to the stop

ts() { printf '[%s +%3ss] ' "$(date -u +%H:%M:%S)" "$(($(date +%s) - T0))"; }
say() { echo "$(ts)== $*"; }
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
FAILFILE="$OUT/failures.txt"
: >"$FAILFILE"
fail() { echo "$*" >>"$FAILFILE"; echo "$(ts)!! FAIL: $*" >&2; } # works in $(...) too

say "repo $REPO, python $($PY --version 2>&1) at $(command -v "$PY"), SIM=$SIM"
command -v nvidia-smi >/dev/null && timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv

# --- 1. packages ---------------------------------------------------------------------
say "installing wheels into $SITE"
rm -rf "$SITE" "$SITE-bin"
WHEELS=(.devrun/whl/*.whl)
[ -d .devrun/whl-gcp ] && WHEELS+=(.devrun/whl-gcp/*.whl)
timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target "$SITE" "${WHEELS[@]}" 2>&1 | grep -v "WARNING: Running pip as" || true
SRC=$(ls -d "$REPO"/libs/*/src "$REPO"/services/*/src "$REPO"/cli/src "$REPO"/gateway/src "$REPO"/devtools/*/src | paste -sd:)
export PYTHONPATH="$SITE:$SRC${EXTRA_SITE:+:$EXTRA_SITE}"
mkdir -p "$SITE-bin"
gunzip -c .devrun/nats-server.gz >"$SITE-bin/nats-server" && chmod +x "$SITE-bin/nats-server"
export PATH="$SITE-bin:$PATH"
export PYTHONUNBUFFERED=1
say "nats-server: $(command -v nats-server) $(nats-server --version 2>&1)"
say "preflight: the services' imports"
timeout 90 "$PY" -c "
import sqlite3, ssl, pydantic, faststream, nats, pymongo, nx_27017, cryptography, nacl, grpc, google.protobuf, typer, rich, httpx, psutil, pynvml, yaml, prometheus_client, zeroconf, fastapi, uvicorn
import gpufleet_provisioner.__main__, gpufleet_scheduler.__main__, gpufleet_billing.__main__, gpufleet_device_fleet.__main__, gpufleet_datastore.__main__, gpufleet_node_agent.__main__, gpufleet_cli.main, gpufleet_devstack.up, gpufleet_gateway.app
print('imports ok: pydantic', pydantic.VERSION, 'grpc', grpc.__version__, 'protobuf', google.protobuf.__version__)
" || fail "preflight imports"

# --- 2. the stack ----------------------------------------------------------------------
export GPUFLEET_RUN_DIR="$RUN_DIR"
export GPUFLEET_CONFIG_DIR="$RUN_DIR/cli-config" # the CLI's context `local`, not ~/.config
export GPUFLEET_NATS_PORT=${NATS_PORT:-4533}
export GPUFLEET_MONGO_PORT=${MONGO_PORT:-27227}
export GPUFLEET_REGISTRY_PORT=${REGISTRY_PORT:-5255}
export GPUFLEET_SIMULATED_GPUS=$SIM
export GPUFLEET_ALLOW_BARE_PROCESSES=own-jobs # no podman: the local account's jobs run bare
# A VM with a real GPU is no marketplace node (no NVMe, no TPM): its R-NODE-4 failures are
# shown in `node show` and do not hold it in maintenance (development only).
export GPUFLEET_WAIVE_HARDWARE_RULES=true
# R-SCHED-4: nodes are undivided by default (a 0.5 job would take the whole GPU and the two
# shares would run one after the other): the agent offers each GPU as 2 shares.
export GPUFLEET_GPU_SHARES=${GPUFLEET_GPU_SHARES:-2}
export GPUFLEET_HEARTBEAT_S=${GPUFLEET_HEARTBEAT_S:-2}
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR"

say "starting the stack: $PY -m gpufleet_devstack.up (log $OUT/up.log)"
setsid "$PY" -m gpufleet_devstack.up >"$OUT/up.log" 2>&1 &
UP_PID=$!
UP_SID=$UP_PID

stop_stack() {
    [ -n "${UP_PID:-}" ] || return 0
    if kill -0 "$UP_PID" 2>/dev/null; then
        say "stopping the stack (SIGTERM to gpufleet_devstack.up, pid $UP_PID)"
        kill -TERM "$UP_PID" 2>/dev/null
        for _ in $(seq 1 60); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 1; done
        if kill -0 "$UP_PID" 2>/dev/null; then
            fail "the stack did not stop in 60 s: SIGKILL to its process group"
            kill -KILL -- "-$UP_PID" 2>/dev/null
        fi
    fi
    wait "$UP_PID" 2>/dev/null
    say "up exited with code $?; its output:"
    tail -n 40 "$OUT/up.log"
    UP_PID=
}
finish() {
    stop_stack
    say "leftover processes of the run dir:"
    ps -eo pid,sid,etimes,args | awk -v s="$UP_SID" '$2 == s || /nvidia-cuda-mps/' | grep -v awk || true
    tar -czf "$OUT/logs.tar.gz" -C "$RUN_DIR" logs agent/workers 2>/dev/null \
        || tar -czf "$OUT/logs.tar.gz" -C "$RUN_DIR" logs 2>/dev/null || true
    local n
    n=$(wc -l <"$FAILFILE")
    say "done in $(($(date +%s) - T0)) s; failures: $n"
    sed 's/^/   - /' "$FAILFILE"
    if [ "$n" -eq 0 ]; then say "RESULT: PASS"; else say "RESULT: FAIL"; fi
    sleep 0.5 # let tee write run.log's last lines
    [ "$n" -eq 0 ] || exit 1
}
trap finish EXIT

# `up` prints what to try once every service answered its health check.
ok=0
for _ in $(seq 1 150); do
    if grep -q "running; Ctrl-C stops everything" "$OUT/up.log"; then ok=1; break; fi
    kill -0 "$UP_PID" 2>/dev/null || break
    sleep 1
done
cat "$OUT/up.log"
if [ $ok -ne 1 ]; then fail "the stack did not come up"; exit 1; fi
say "stack up"

cli() { timeout 60 "$PY" -m gpufleet_cli.main "$@"; }
run() { echo "$(ts)\$ gpufleet $*"; cli "$@"; local rc=$?; [ $rc -eq 0 ] || fail "gpufleet $* (rc $rc)"; return $rc; }

# --- 3. the node -----------------------------------------------------------------------
NODE=local-node-1
for _ in $(seq 1 60); do
    cli node list 2>/dev/null | grep -q "$NODE" && break
    sleep 1
done
run node list
for _ in $(seq 1 30); do # telemetry comes with the heartbeats
    cli node show "$NODE" --json 2>/dev/null | grep -qi '"telemetry"\|"gpus"' && break
    sleep 1
done
run node show "$NODE"
cli node show "$NODE" --json >"$OUT/node.json" || fail "node show --json"
say "node show --json: gpus and telemetry"
"$PY" - "$OUT/node.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({k: d.get(k) for k in ("gpus", "simulated", "inventory_source", "telemetry", "verified", "verification", "hardware")}, indent=1, default=str)[:12000])
PYEOF
GPU_TYPE=${GPU_TYPE:-$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["gpus"][0]["model"])' "$OUT/node.json" 2>/dev/null)}
say "GPU type for the jobs: '$GPU_TYPE'"
[ -n "$GPU_TYPE" ] || { fail "no GPU model on the node"; exit 1; }

# --- 4. jobs ---------------------------------------------------------------------------
# the jobs' interpreter: the machine's python3 (with torch), resolved now, with a clean PYTHONPATH
TORCH_PY=${TORCH_PY:-$(command -v python3)}
say "jobs' python: $TORCH_PY"
FULL_PY=${JOB_PY:-"PYTHONPATH= $TORCH_PY -c \"
import os, time, torch
print({k: v for k, v in os.environ.items() if k.startswith(('CUDA_', 'GPU_'))}, flush=True)
d = torch.cuda.get_device_name(0); print('device', d, flush=True)
n = 8192; a = torch.randn(n, n, device='cuda', dtype=torch.bfloat16); b = torch.randn(n, n, device='cuda', dtype=torch.bfloat16)
for _ in range(3): a @ b
torch.cuda.synchronize(); t = time.perf_counter(); k = 20
for _ in range(k): a @ b
torch.cuda.synchronize(); dt = time.perf_counter() - t
print('matmul bf16 %d^3 x%d: %.1f TFLOP/s' % (n, k, 2 * n**3 * k / dt / 1e12), flush=True)
\""}
# the shares: their matmuls go on for ~20 s so that both are seen running at once
HALF_PY=${JOB_PY_HALF:-"PYTHONPATH= $TORCH_PY -c \"
import os, time, torch
print({k: v for k, v in os.environ.items() if k.startswith(('CUDA_', 'GPU_'))}, flush=True)
print('device', torch.cuda.get_device_name(0), 'start', time.time(), flush=True)
n = 4096; a = torch.randn(n, n, device='cuda'); b = torch.randn(n, n, device='cuda'); k = 0
t = time.perf_counter()
while time.perf_counter() - t < 20: a @ b; torch.cuda.synchronize(); k += 1
dt = time.perf_counter() - t
print('matmul fp32 %d^3 x%d: %.1f TFLOP/s, end %.1f' % (n, k, 2 * n**3 * k / dt / 1e12, time.time()), flush=True)
\""}

submit() { # name, gpu-count, command: prints the job id
    local name=$1 count=$2 cmd=$3 outj
    echo "$(ts)\$ gpufleet job submit --name $name --gpu-type '$GPU_TYPE' --gpu-count $count --json -- bash -c '<python>'" >&2
    outj=$(cli job submit --name "$name" --gpu-type "$GPU_TYPE" --gpu-count "$count" --json -- bash -c "$cmd")
    local rc=$?
    echo "$outj" >&2
    [ $rc -eq 0 ] || { fail "submit $name (rc $rc)"; return 1; }
    "$PY" -c '
import json, sys
d = json.loads(sys.stdin.read())
for o in (d, d.get("job") or {}, d.get("result") or {}):
    if isinstance(o, dict) and (o.get("job_id") or o.get("id")):
        print(o.get("job_id") or o.get("id")); break
' <<<"$outj"
}
state() { # job id -> its status word
    cli job show "$1" --json 2>/dev/null | "$PY" -c '
import json,sys
try: d=json.loads(sys.stdin.read())
except Exception: print("?"); sys.exit()
print(d.get("status") or d.get("state") or "?")'
}
wait_done() { # job id, seconds
    local id=$1 until=$(($(date +%s) + $2)) s
    while [ "$(date +%s)" -lt "$until" ] && [ "$(left)" -gt 20 ]; do
        s=$(state "$id")
        case "$s" in finished|failed|stopped) echo "$s"; return 0;; esac
        sleep 2
    done
    echo "timeout:$(state "$id")"
}

say "job 1: one whole GPU"
J1=$(submit full-gpu 1 "$FULL_PY")
say "job id: $J1"
if [ -n "$J1" ]; then
    s=$(wait_done "$J1" 150); say "$J1: $s"
    case "$s" in finished) ;; *) fail "job $J1 ended $s";; esac
    run job show "$J1"
    run job logs "$J1"
fi

# The node agent's /metrics (its port from the agent's environment, as `just up` gave it):
# no sample of a GPU that jobs hold lacks a job label, and each named job has its own.
scrape_agent() { # file, job ids...
    local file=$1 pid port
    shift
    pid=$(pgrep -f "gpufleet_node_agent" | head -1)
    port=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^GPUFLEET_METRICS_PORT=//p')
    [ -n "$port" ] || { fail "no metrics port in the node agent's environment"; return; }
    timeout 10 "$PY" -c 'import sys, urllib.request as u; sys.stdout.write(u.urlopen(sys.argv[1], timeout=8).read().decode())' \
        "http://127.0.0.1:$port/metrics" >"$file" || { fail "scrape :$port"; return; }
    say "agent /metrics on :$port: $(grep -c '^gpufleet_' "$file") samples; the GPU ones:"
    grep -E '^gpufleet_gpu_(utilization_percent|temperature_celsius|power_watts|ecc_errors|remapped_rows|retired_pages|last_xid|xid_errors_total)' "$file" | head -40
    "$PY" - "$file" "$@" <<'PYEOF' || fail "GPU samples without their job"
import re, sys
text, jobs = open(sys.argv[1]).read(), sys.argv[2:]
util = [l for l in text.splitlines() if l.startswith("gpufleet_gpu_utilization_percent{")]
labels = [dict(re.findall(r'(\w+)="([^"]*)"', l)) for l in util]
held = {l["gpu_uuid"] for l in labels if l.get("job")}
unlabelled = [l for l in labels if l["gpu_uuid"] in held and not l.get("job")]
seen = {l.get("job") for l in labels}
print(f"utilization samples {len(util)}, of held GPUs without a job {len(unlabelled)}, "
      f"held GPUs {len(held)}, jobs {sorted(j for j in seen if j)}")
missing = [j for j in jobs if j not in seen]
sys.exit(1 if unlabelled or missing else 0)
PYEOF
}

say "jobs 2 and 3: two 0.5-GPU shares at once"
J2=$(submit half-a 0.5 "$HALF_PY")
J3=$(submit half-b 0.5 "$HALF_PY")
say "job ids: $J2 $J3"
both=0
[ -n "$J2" ] && [ -n "$J3" ] || fail "a 0.5-GPU job was not submitted"
for _ in $(seq 1 60); do
    [ -n "$J2" ] && [ -n "$J3" ] || break
    [ "$(left)" -gt 60 ] || break
    s2=$(state "$J2"); s3=$(state "$J3")
    echo "$(ts)$J2=$s2 $J3=$s3"
    if [ "$s2" = running ] && [ "$s3" = running ]; then both=1; break; fi
    case "$s2$s3" in *finished*|*failed*|*stopped*) break;; esac
    sleep 2
done
if [ $both -eq 1 ]; then
    say "both shares running at once:"
    run job show "$J2"; run job show "$J3"
    run node show "$NODE"
    scrape_agent "$OUT/metrics-shared.txt" "$J2" "$J3"
else
    fail "the two 0.5-GPU jobs were not seen running at the same time"
fi
for j in $J2 $J3; do
    s=$(wait_done "$j" 120); say "$j: $s"
    case "$s" in finished) ;; *) fail "job $j ended $s";; esac
    run job show "$j"
    run job logs "$j"
done
run job list

# --- 5. billing ------------------------------------------------------------------------
sleep 3 # the metering of the last workers
run billing balance
run billing entries
