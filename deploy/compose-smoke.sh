#!/usr/bin/env bash
# The CPU profile in containers, for real (`make compose-smoke`; slow, not part of `make test`):
#   1. build the images and bring the profile up (Docker Compose, or podman-compose ≥ 1.6 when no Docker engine
#      answers); `prepare` must finish with 0 (the tiny model, the index, the demonstrations, the step-0 eval);
#   2. wait for every service's /health;
#   3. train SMOKE_STEPS steps; the trainer's log must show real tokens, RL and SFT tokens and a nonzero grad;
#   4. `down` (everything stopped at once, as podman-compose does), `up` again;
#   5. the trainer must resume at its checkpointed step (step and version continue, not 0) and keep training on
#      real tokens; then the held-out eval of the served policy, beside the step-0 one;
#   6. Prometheus must list the rollout among its targets, up (after each `up`), and both replicas after
#      `up --scale rollout=2` (GET /api/v1/targets). Under the smoke's own project the container names that
#      prometheus.yml also looks up (those of project coda-stack) do not exist: this checks the lookup of the
#      service name, the one that works whatever the project is called.
# Every wait has a timeout; the first failed check stops the script with exit status 1.
#
# Settings (environment): SMOKE_STEPS (steps before the stop; default 30: between tiny-cpu's checkpoints at 20
# and 40, so the restart shows whether the trainer checkpointed when stopped or falls back to step 20),
# SMOKE_MORE_STEPS (after the restart; 5), SMOKE_PROJECT (compose project; coda-smoke: its own volumes,
# removed at the start), SMOKE_BUILD=0 (use the images as built), SMOKE_KEEP=1 (leave the stack up at the end),
# SMOKE_EVAL=0 (skip the final eval), SMOKE_PROMETHEUS=0 (leave Prometheus out: its image is upstream, so a host
# without a registry needs one built locally, docs/compose.md ("Podman"); deploy/podman-host.sh builds it),
# SMOKE_BUILD_AT_ONCE=1 (podman: every image in one build call; by default one at a time, faster on a small
# machine), SMOKE_UP_TIMEOUT_S, SMOKE_HEALTH_TIMEOUT_S, SMOKE_TRAIN_TIMEOUT_S,
# COMPOSE ("docker compose" or "podman-compose" to choose), PODMAN_BUILD_ARGS (default "--format docker": an
# OCI image drops HEALTHCHECK), TORCH_CPU_INDEX_URL (a mirror of the CPU wheels).
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT=${SMOKE_PROJECT:-coda-smoke}
STEPS=${SMOKE_STEPS:-30}
MORE_STEPS=${SMOKE_MORE_STEPS:-5}
UP_TIMEOUT=${SMOKE_UP_TIMEOUT_S:-3600}       # includes the image builds on a cold machine
HEALTH_TIMEOUT=${SMOKE_HEALTH_TIMEOUT_S:-600}
TRAIN_TIMEOUT=${SMOKE_TRAIN_TIMEOUT_S:-1800}
# The app services of the cpu profile (built here), and what is brought up: those and Prometheus, whose target
# list is checked (Grafana is left out: nothing here checks it).
SERVICES=(redis prepare retriever policy-cpu searcher rollout trainer-cpu)
UP_SERVICES=("${SERVICES[@]}")
PROMETHEUS=${SMOKE_PROMETHEUS:-1}
if [ "$PROMETHEUS" != 0 ]; then UP_SERVICES+=(prometheus); fi
PROMETHEUS_PORT=${PROMETHEUS_HOST_PORT:-9090}
declare -A PORTS=([retriever]=${RETRIEVER_HOST_PORT:-8000} [searcher]=${SEARCHER_HOST_PORT:-8001}
                  [policy-cpu]=${POLICY_HOST_PORT:-8002} [trainer-cpu]=${TRAINER_HOST_PORT:-8003}
                  [rollout]=$(p=${ROLLOUT_PORTS:-8004:8004}; p=${p%:*}; echo "${p##*:}"))
export RECIPE=tiny-cpu
export REDIS_PASSWORD=${REDIS_PASSWORD:-smoke$RANDOM$RANDOM} GRAFANA_PASSWORD=${GRAFANA_PASSWORD:-smoke$RANDOM}
export CODA_CONTROL_TOKEN=${CODA_CONTROL_TOKEN:-smoke$RANDOM$RANDOM$RANDOM}  # the policy server's weight routes
STARTED=$(date +%s)

say() { printf '[compose-smoke %s +%4ds] %s\n' "$(date +%T)" "$(( $(date +%s) - STARTED ))" "$*"; }
fail() { say "FAILED: $*"; exit 1; }

# ---------------------------------------------------------------- which compose
if [ -n "${COMPOSE:-}" ]; then
    read -ra CMD <<< "$COMPOSE"
elif docker compose version >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    CMD=(docker compose)
elif command -v podman-compose >/dev/null 2>&1; then
    CMD=(podman-compose)
else
    fail "neither docker compose (with a running engine) nor podman-compose found"
fi
case "${CMD[*]}" in
    *podman*) ENGINE=podman ;;
    *) ENGINE=docker ;;
esac
COMPOSE_CMD=("${CMD[@]}" -p "$PROJECT" -f docker-compose.yml --profile cpu)
BUILD_FLAGS=()
[ "$ENGINE" = podman ] && BUILD_FLAGS=(--podman-build-args "${PODMAN_BUILD_ARGS:---format docker}")
say "using: ${CMD[*]} ($("${CMD[@]}" version 2>/dev/null | tr '\n' ' ' | cut -c1-120)), project $PROJECT"

compose() { "${COMPOSE_CMD[@]}" "$@"; }

container() {  # the container id of a service (the newest)
    "$ENGINE" ps -a -q --filter "label=com.docker.compose.project=$PROJECT" \
        --filter "label=com.docker.compose.service=$1" | head -1
}

http_get() { curl -fsS --max-time 5 "$1" 2>/dev/null; }
healthy() { http_get "$1" >/dev/null; }

status_field() {  # the trainer's /status field $1 (empty while it is not ready)
    http_get "http://127.0.0.1:${PORTS[trainer-cpu]}/status" \
        | python3 -c "import json,sys; d=json.load(sys.stdin); print(d.get('$1', '') if d.get('ready') else '')" \
        2>/dev/null || true
}

healthchecks() {  # podman 4.x without systemd runs no healthcheck timers: run them, so `ps` shows the truth
    [ "$ENGINE" = podman ] || return 0
    local id
    for id in $("$ENGINE" ps -q --filter "label=com.docker.compose.project=$PROJECT"); do
        podman healthcheck run "$id" >/dev/null 2>&1 || true
    done
}

wait_until() {  # wait_until SECONDS DESCRIPTION COMMAND...: poll every 5 s
    local timeout=$1 what=$2 deadline=$(( $(date +%s) + $1 ))
    shift 2
    until "$@"; do
        [ "$(date +%s)" -lt "$deadline" ] || fail "$what: not within ${timeout}s"
        healthchecks
        sleep 5
    done
}

read -r -d '' ROLLOUT_TARGETS_PY <<'PY' || true
import json, sys
targets = [t for t in json.load(sys.stdin)["data"]["activeTargets"] if t["labels"].get("job") == "rollout"]
print(sum(t["health"] == "up" for t in targets), len(targets))
PY

rollout_targets() {  # "UP TOTAL": Prometheus's active targets of the rollout job
    http_get "http://127.0.0.1:$PROMETHEUS_PORT/api/v1/targets?state=active" \
        | python3 -c "$ROLLOUT_TARGETS_PY" 2>/dev/null || echo "0 0"
}
check_prometheus() {  # check_prometheus N: exactly N rollout targets, all up (each replica scraped, once)
    [ "$PROMETHEUS" != 0 ] || return 0
    local deadline=$(( $(date +%s) + HEALTH_TIMEOUT )) seen
    until seen=$(rollout_targets); [ "$seen" = "$1 $1" ]; do
        [ "$(date +%s)" -lt "$deadline" ] \
            || fail "Prometheus's rollout targets (up, total): $seen, not $1 up within ${HEALTH_TIMEOUT}s"
        healthchecks
        sleep 5
    done
    say "prometheus: the rollout job has $1 target(s), all up"
}

trainer_ready() { [ -n "$(status_field step)" ]; }
exited() { [ "$("$ENGINE" inspect --format '{{.State.Status}}' "$1")" = exited ]; }
redis_pong() { "$ENGINE" exec -e REDISCLI_AUTH="$REDIS_PASSWORD" "$(container redis)" redis-cli ping | grep -q PONG; }

resumed_at() {  # "STEP VERSION" from the trainer's "resumed" log line (JSON logs), empty before it
    "$ENGINE" logs "$(container trainer-cpu)" 2>&1 | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        doc = json.loads(line)
    except ValueError:
        continue
    if isinstance(doc, dict) and doc.get("msg") == "resumed":
        print(doc["step"], doc["version"])
' | tail -1
}
trainer_resumed() { [ -n "$(resumed_at)" ]; }

trainer_log() {  # the trainer's JSONL log, as the trainer wrote it into the runs volume
    "$ENGINE" exec "$(container trainer-cpu)" sh -c 'cat "${CODA_TRAINER_LOG_DIR:-runs/logs}/train.jsonl"'
}

read -r -d '' CHECK_LOG_PY <<'PY' || true
import json, sys
start = int(sys.argv[1])
rows = [json.loads(line) for line in sys.stdin if line.strip()]
rows = [r for r in rows if r.get("step", 0) > start]
assert rows, f"no log row after step {start}"
bad = [r["step"] for r in rows if not r.get("tokens", 0) > 0]
assert not bad, f"steps without tokens: {bad}"
assert any(r.get("rl_tokens", 0) > 0 for r in rows), "no step trained an RL token"
assert any(r.get("sft_tokens", 0) > 0 for r in rows), "no step trained a demonstration token (RED/SFT)"
assert any(r.get("grad_norm", 0) > 0 for r in rows), "every gradient norm is 0"
last = rows[-1]
print(f"log rows of steps {rows[0]['step']}..{last['step']}: {len(rows)}, each with tokens > 0; last: "
      f"tokens={last['tokens']:.0f} rl_tokens={last.get('rl_tokens', 0):.0f} "
      f"sft_tokens={last.get('sft_tokens', 0):.0f} grad_norm={last.get('grad_norm', 0):.4f} "
      f"reward_mean={last.get('reward_mean', 0):.3f}")
PY

check_log() {  # check_log FROM_STEP: every row after that step trained real tokens; RL, SFT, a gradient
    trainer_log | python3 -c "$CHECK_LOG_PY" "$1"
}

latest_checkpoint() {  # the step of the newest complete checkpoint (0 when none)
    "$ENGINE" exec "$(container trainer-cpu)" sh -c 'ls "${CODA_TRAINER_CHECKPOINT_DIR:-runs/checkpoints}"' \
        | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1 | grep . || echo 0
}

bring_up() {
    local started
    started=$(date +%s)
    say "up -d ${UP_SERVICES[*]}"
    timeout "$UP_TIMEOUT" "${COMPOSE_CMD[@]}" up -d "${UP_SERVICES[@]}" || fail "up did not succeed"
    local id code
    id=$(container prepare)
    [ -n "$id" ] || fail "no prepare container"
    wait_until "$UP_TIMEOUT" "prepare to finish" exited "$id"
    code=$("$ENGINE" inspect --format '{{.State.ExitCode}}' "$id")
    # Its first run (podman starts it again with each dependent: the later runs find everything and exit).
    "$ENGINE" logs "$id" 2>&1 | grep '^\[prepare' | awk '/run folder/ {runs++} runs == 1 {print "    " $0}
        END {if (runs > 1) print "    (and " runs - 1 " more start(s) of prepare, each finding it all done)"}' || true
    [ "$code" = 0 ] || { "$ENGINE" logs --tail 40 "$id"; fail "prepare exited with $code"; }
    for service in "${!PORTS[@]}"; do
        wait_until "$HEALTH_TIMEOUT" "$service /health" healthy "http://127.0.0.1:${PORTS[$service]}/health"
        say "$service: /health 200"
    done
    wait_until "$HEALTH_TIMEOUT" "redis ping" redis_pong
    say "redis: PONG; all up in $(( $(date +%s) - started ))s"
    check_prometheus 1
}

wait_step() {  # wait_step N: until the trainer's step reaches N, a line per new step
    local target=$1 shown=-1 deadline=$(( $(date +%s) + TRAIN_TIMEOUT )) step
    while :; do
        step=$(status_field step)
        if [ -n "$step" ] && [ "$step" != "$shown" ]; then
            say "training: step $step/$target version $(status_field version) tokens $(status_field tokens)"
            shown=$step
        fi
        [ -n "$step" ] && [ "$step" -ge "$target" ] && return 0
        [ "$(date +%s)" -lt "$deadline" ] || fail "the trainer did not reach step $target within ${TRAIN_TIMEOUT}s"
        healthchecks
        sleep 5
    done
}

remove_containers() {  # every container of the project, scaled replicas included: podman-compose's `down`
    # removes only the containers the compose file names (replica 1), and a leftover replica keeps its volumes
    # from being removed and stays on the network, where Prometheus finds it as one more rollout target.
    local ids
    ids=$("$ENGINE" ps -a -q --filter "label=com.docker.compose.project=$PROJECT")
    [ -z "$ids" ] || "$ENGINE" rm -f $ids >/dev/null 2>&1 || true
}

# ---------------------------------------------------------------- 1–2. build, up, health
say "removing what an earlier smoke left (project $PROJECT, its containers and volumes)"
remove_containers
compose down -v >/dev/null 2>&1 || true
if [ "${SMOKE_BUILD:-1}" != 0 ]; then
    started=$(date +%s)
    BUILD_CMD=(timeout "$UP_TIMEOUT" "${CMD[@]}" "${BUILD_FLAGS[@]}" -p "$PROJECT" -f docker-compose.yml
               --profile cpu build)
    if [ "$ENGINE" = podman ] && [ "${SMOKE_BUILD_AT_ONCE:-0}" = 0 ]; then
        # One image at a time: podman-compose builds them all at once, slower on a small machine (README).
        for service in "${SERVICES[@]}"; do
            [ "$service" != redis ] || continue      # an upstream image, nothing to build
            t=$(date +%s)
            "${BUILD_CMD[@]}" "$service" || fail "the build of $service failed"
            say "$service: image built in $(( $(date +%s) - t ))s"
        done
    else
        "${BUILD_CMD[@]}" "${SERVICES[@]}" || fail "build failed"
    fi
    say "images built in $(( $(date +%s) - started ))s"
    "$ENGINE" images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep '^[a-z./]*coda-stack/' | sed 's/^/    /' || true
fi
bring_up

# ---------------------------------------------------------------- 3. training on real tokens
wait_step "$STEPS"
check_log 0 | sed 's/^/    /' || fail "the trainer's log: see above"
before_step=$(status_field step)
before_version=$(status_field version)
checkpoint=$(latest_checkpoint)
say "before the stop: step $before_step, version $before_version, newest checkpoint step $checkpoint"
[ "$checkpoint" -gt 0 ] || fail "no checkpoint after $before_step steps"

# ---------------------------------------------------------------- 4. everything down at once, up again
started=$(date +%s)
# All at once (podman-compose's `down` does so; Docker's stops dependents first): the trainer gets its grace.
say "stopping every container at once, then down (volumes kept)"
mapfile -t running < <("$ENGINE" ps -q --filter "label=com.docker.compose.project=$PROJECT")
timeout 600 "$ENGINE" stop -t 120 "${running[@]}" >/dev/null || fail "stop did not succeed"
timeout 600 "${COMPOSE_CMD[@]}" down || fail "down did not succeed"
[ -z "$("$ENGINE" ps -q --filter "label=com.docker.compose.project=$PROJECT")" ] || fail "containers left running"
say "down in $(( $(date +%s) - started ))s"
bring_up

# ---------------------------------------------------------------- 5. resumed, and still training
wait_until "$HEALTH_TIMEOUT" "the trainer's \"resumed\" log line" trainer_resumed
read -r resumed_step resumed_version <<< "$(resumed_at)"
say "after the restart: step $resumed_step, version $resumed_version (before the stop: step $before_step, newest" \
    "checkpoint then: step $checkpoint)"
if [ "${resumed_step:-0}" -ge "$before_step" ]; then
    say "the trainer checkpointed when it was stopped: nothing trained before the stop was lost"
else
    say "resumed from the last periodic checkpoint: steps $resumed_step..$before_step are trained again"
fi
[ -n "$resumed_step" ] && [ "$resumed_step" -ge "$checkpoint" ] \
    || fail "the trainer restarted at step ${resumed_step:-?}, not at its checkpoint ($checkpoint)"
[ "$resumed_version" -gt 0 ] || fail "the policy version went back to 0"
wait_step $(( resumed_step + MORE_STEPS ))
check_log "$resumed_step" | sed 's/^/    /' || fail "training after the restart: see above"
after_version=$(status_field version)
[ "$after_version" -gt "$resumed_version" ] || fail "the version did not move after the restart"

if [ "${SMOKE_EVAL:-1}" != 0 ]; then
    say "held-out eval of the served policy (python -m launcher eval)"
    timeout 900 "${COMPOSE_CMD[@]}" run --rm --no-deps prepare eval --label smoke 2>&1 \
        | grep -E '^\[eval|ALL|failed' | sed 's/^/    /' || fail "the eval failed"
fi

# ---------------------------------------------------------------- 6. a second rollout replica, scraped too
if [ "$PROMETHEUS" != 0 ]; then
    # ROLLOUT_PORTS=:8004: each replica gets a free host port (two cannot both publish 8004); the rollout is
    # recreated with it. Prometheus reaches the replicas inside the network (deploy/prometheus/prometheus.yml).
    say "up --scale rollout=2"
    ROLLOUT_PORTS=:8004 timeout "$UP_TIMEOUT" "${COMPOSE_CMD[@]}" up -d --no-deps --scale rollout=2 rollout \
        || fail "scaling the rollout to 2 did not succeed"
    check_prometheus 2
fi

if [ "${SMOKE_KEEP:-0}" = 0 ]; then
    compose down >/dev/null 2>&1 || true
    remove_containers
    say "stack stopped (volumes of project $PROJECT kept; \`${CMD[*]} -p $PROJECT down -v\` removes them)"
fi
say "PASSED in $(( $(date +%s) - STARTED ))s: steps $before_step → down/up → resumed at $resumed_step, trained to $(( resumed_step + MORE_STEPS ))+"
