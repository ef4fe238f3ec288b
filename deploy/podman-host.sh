#!/usr/bin/env bash
# The compose smoke (deploy/compose-smoke.sh) on a clean Debian host with podman and no container registry: what
# CI runs (`make ci-compose`, .ci/run). As root; each step is skipped when already done and logged with its time:
#   1. packages: apt-get install podman buildah runc slirp4netns uidmap debootstrap curl where missing;
#      podman-compose 1.6 from PyPI into a venv of its own, .podman-compose/ (gitignored), put on PATH;
#   2. /etc/containers/containers.conf: runtime = "runc" (crun refuses hybrid cgroups) and default_ulimits
#      (podman's defaults need CAP_SYS_RESOURCE), merged into what the file holds;
#   3. the upstream base images, built locally (no registry to pull from): debootstrap (the host's extra CA
#      certificates copied in) imported as docker.io/library/debian:bookworm-slim, then deploy/podman-bases/*
#      on it as python:3.11-slim, redis:7.4-alpine, prom/prometheus:v3.1.0 (docs/compose.md, "Podman");
#   4. the torch wheel pyproject.toml pins, as pip resolves it here (this project's machines hold the CPU build),
#      and its dependencies as a PEP 503 index (.podman-compose/torch-index), served on 127.0.0.1 by
#      python -m http.server for the builds (TORCH_CPU_INDEX_URL), stopped at exit;
#   5. deploy/compose-smoke.sh with podman-compose: images built one at a time with --format docker --network
#      host --pull=never, up, train, down, up, resume, eval, Prometheus's targets.
# `deploy/podman-host.sh setup` does 1–4 only (and serves nothing). Settings (environment): TORCH_CPU_INDEX_URL
# (use that index: step 4 is skipped), TORCH_INDEX_PORT (8765: a fixed port keeps the build argument, and so the
# image layers, the same from one run to the next), DEBIAN_MIRROR, PYTHON; SMOKE_* and COMPOSE go to the smoke.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.podman-compose
LOGS=$VENV/logs
PACKAGES=(podman buildah runc slirp4netns uidmap debootstrap curl)
PODMAN_COMPOSE_SPEC='podman-compose==1.6.*'
CONTAINERS_CONF=${CONTAINERS_CONF:-/etc/containers/containers.conf}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
BASES=(python redis prometheus)   # deploy/podman-bases/<name>/Containerfile
declare -A BASE_TAGS=([python]=docker.io/library/python:3.11-slim [redis]=docker.io/library/redis:7.4-alpine
                      [prometheus]=docker.io/prom/prometheus:v3.1.0)
BASE_LABEL=org.coda-stack.podman-base   # the Containerfile's checksum: a changed Containerfile is built again
TORCH_VERSION=$(sed -n 's/^[^#]*"torch==\([^";]*\)".*/\1/p' pyproject.toml | head -1)
INDEX_DIR=$VENV/torch-index
INDEX_PORT=${TORCH_INDEX_PORT:-8765}
STARTED=$(date +%s)

log() { printf '[podman-host %s +%4ds] %s\n' "$(date +%T)" "$(( $(date +%s) - STARTED ))" "$*"; }
fail() { log "FAILED: $*"; exit 1; }

quietly() {  # quietly LOGNAME COMMAND...: the output into $LOGS/LOGNAME.log, its tail when the command fails
    local out=$LOGS/$1.log
    shift
    "$@" > "$out" 2>&1 || { tail -40 "$out"; log "see $out"; return 1; }
}

step() {  # step NAME DONE_CHECK DO [ARGS]: DO ARGS unless DONE_CHECK ARGS succeeds; either way, how long it took
    local name=$1 check=$2 action=$3 t
    shift 3
    t=$(date +%s)
    if "$check" "$@"; then
        log "$name: already done ($(( $(date +%s) - t ))s)"
        return 0
    fi
    log "$name ..."
    "$action" "$@" || fail "$name (after $(( $(date +%s) - t ))s)"
    log "$name: done in $(( $(date +%s) - t ))s"
}

[ "$(id -u)" = 0 ] || fail "run as root (apt-get, /etc/containers, rootful podman)"
[ -n "$TORCH_VERSION" ] || fail "no torch==VERSION pin in pyproject.toml"
mkdir -p "$LOGS"

# ---------------------------------------------------------------- 1. packages
missing_packages() {
    local p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || echo "$p"
    done
}
packages_installed() { [ -z "$(missing_packages)" ]; }
install_packages() {
    local missing
    mapfile -t missing < <(missing_packages)
    log "  apt-get install ${missing[*]}"
    quietly apt-get-update apt-get update \
        && quietly apt-get-install env DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}"
}

podman_compose_installed() {
    "$VENV/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(not m.version("podman-compose").startswith("1.6."))' \
        2>/dev/null && [ -x "$VENV/path/podman-compose" ]
}
install_podman_compose() {
    [ -x "$VENV/bin/pip" ] || quietly venv "$PYTHON" -m venv "$VENV" || return 1
    quietly pip-podman-compose "$VENV/bin/pip" install "$PODMAN_COMPOSE_SPEC" || return 1
    # PATH gets this folder, with podman-compose alone (not the venv's python and pip).
    mkdir -p "$VENV/path" && ln -sf ../bin/podman-compose "$VENV/path/podman-compose"
}

step "apt packages (${PACKAGES[*]})" packages_installed install_packages
step "podman-compose 1.6 in $VENV" podman_compose_installed install_podman_compose
export PATH="$PWD/$VENV/path:$PATH"

# ---------------------------------------------------------------- 2. containers.conf
read -r -d '' CONF_PY <<'PY' || true
"""Set engine.runtime and containers.default_ulimits in a containers.conf, keeping everything else."""
import os, re, sys, tomllib

path, mode = sys.argv[1], sys.argv[2]
WANT = {("engine", "runtime"): "runc",
        ("containers", "default_ulimits"): ["nofile=20000:20000", "nproc=32768:32768"]}
text = open(path).read() if os.path.exists(path) else ""
doc = tomllib.loads(text)
todo = {k: v for k, v in WANT.items() if doc.get(k[0], {}).get(k[1]) != v}
if mode == "check":
    sys.exit(1 if todo else 0)
lines = text.splitlines()
section, headers, spans = None, {}, {}
i = 0
while i < len(lines):
    s = lines[i].strip()
    if m := re.match(r"^\[([^\[\]]+)\]\s*(#.*)?$", s):
        section = m.group(1).strip()
        headers[section] = i
    elif (m := re.match(r"^([A-Za-z0-9_-]+)\s*=\s*(.*)$", s)) and section:
        end, depth = i, m.group(2).count("[") - m.group(2).count("]")
        while depth > 0 and end + 1 < len(lines):  # a multi-line array
            end += 1
            depth += lines[end].count("[") - lines[end].count("]")
        spans[(section, m.group(1))] = (i, end)
        i = end
    i += 1
edits = []  # (line, lines to remove, new lines): applied from the bottom up
appended = {}
for (sec, key), value in todo.items():
    new = f"{key} = " + (
        "[" + ", ".join(f'"{v}"' for v in value) + "]" if isinstance(value, list) else f'"{value}"')
    if (sec, key) in spans:
        start, end = spans[(sec, key)]
        edits.append((start, end - start + 1, [new]))
    elif sec in headers:
        edits.append((headers[sec] + 1, 0, [new]))
    else:
        appended.setdefault(sec, []).append(new)
for start, remove, new in sorted(edits, reverse=True):
    lines[start:start + remove] = new
for sec, new in appended.items():
    lines += ([""] if lines else []) + [f"[{sec}]"] + new
out = "\n".join(lines) + "\n"
assert all(tomllib.loads(out).get(s, {}).get(k) == v for (s, k), v in WANT.items()), out
if text and not os.path.exists(path + ".orig"):
    open(path + ".orig", "w").write(text)
os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
open(path, "w").write(out)
print("set: " + ", ".join(f"{s}.{k}" for s, k in todo))
PY
conf_set() { "$PYTHON" -c "$CONF_PY" "$CONTAINERS_CONF" check; }
conf_write() { "$PYTHON" -c "$CONF_PY" "$CONTAINERS_CONF" write | sed 's/^/  /'; }
step "$CONTAINERS_CONF (runtime runc, default_ulimits)" conf_set conf_write

# ---------------------------------------------------------------- 3. base images
BASE_REBUILT=0
debian_present() { podman image exists "$DEBIAN_IMAGE"; }
build_debian() {
    local root
    root=$(mktemp -d /var/tmp/coda-rootfs.XXXXXX)
    quietly debootstrap debootstrap --variant=minbase --include=ca-certificates bookworm "$root" "$DEBIAN_MIRROR" \
        || { rm -rf "$root"; return 1; }
    # The registries may be reached through a TLS proxy with a CA of its own: apt and pip in the images trust it too.
    if compgen -G '/usr/local/share/ca-certificates/*.crt' > /dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
        chroot "$root" update-ca-certificates > /dev/null 2>&1 || { rm -rf "$root"; return 1; }
    fi
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | podman import --change 'CMD ["bash"]' - "$DEBIAN_IMAGE" > /dev/null
    local rc=$?
    rm -rf "$root"
    BASE_REBUILT=1
    return $rc
}
step "base image $DEBIAN_IMAGE (debootstrap bookworm minbase)" debian_present build_debian

base_sum() { cksum < "deploy/podman-bases/$1/Containerfile" | cut -d' ' -f1; }
base_current() {  # present and not stale; an image this script did not build (no label) is kept as it is
    local label
    podman image exists "${BASE_TAGS[$1]}" || return 1
    [ "$BASE_REBUILT" = 0 ] || return 1
    label=$(podman image inspect --format "{{index .Labels \"$BASE_LABEL\"}}" "${BASE_TAGS[$1]}")
    [ -z "$label" ] || [ "$label" = "<no value>" ] || [ "$label" = "$(base_sum "$1")" ]
}
build_base() {
    quietly "base-$1" podman build --format docker --network host --pull=never \
        --label "$BASE_LABEL=$(base_sum "$1")" -t "${BASE_TAGS[$1]}" "deploy/podman-bases/$1"
}
for base in "${BASES[@]}"; do
    step "base image ${BASE_TAGS[$base]} (deploy/podman-bases/$base)" base_current build_base "$base"
done

# ---------------------------------------------------------------- 4. the torch index
index_ready() {
    compgen -G "$INDEX_DIR/files/torch-${TORCH_VERSION}[-+]*.whl" > /dev/null && [ -f "$INDEX_DIR/simple/torch/index.html" ]
}
read -r -d '' INDEX_PY <<'PY' || true
"""A PEP 503 simple index (simple/<project>/index.html) over the wheels in files/."""
import html, os, re, sys

root = sys.argv[1]
projects = {}
for name in sorted(os.listdir(os.path.join(root, "files"))):
    if name.endswith(".whl"):
        projects.setdefault(re.sub(r"[-_.]+", "-", name.split("-")[0]).lower(), []).append(name)
for project, names in projects.items():
    os.makedirs(os.path.join(root, "simple", project), exist_ok=True)
    links = "".join(f'<a href="../../files/{html.escape(n)}">{html.escape(n)}</a>\n' for n in names)
    with open(os.path.join(root, "simple", project, "index.html"), "w") as f:
        f.write(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
with open(os.path.join(root, "simple", "index.html"), "w") as f:
    f.write("<!DOCTYPE html><html><body>\n"
            + "".join(f'<a href="{p}/">{p}</a>\n' for p in sorted(projects)) + "</body></html>\n")
print(" ".join(sorted(projects)))
PY
build_index() {
    rm -rf "$INDEX_DIR" && mkdir -p "$INDEX_DIR/files"
    # pip's own configuration decides where torch comes from (here: find-links holding the CPU wheel).
    quietly pip-download-torch "$VENV/bin/pip" download --only-binary=:all: -d "$INDEX_DIR/files" \
        "torch==$TORCH_VERSION" || return 1
    local wheel
    wheel=$(cd "$INDEX_DIR/files" && ls torch-"$TORCH_VERSION"*.whl)
    case "$wheel" in
        *+cpu*) log "  $wheel" ;;
        *) log "  WARNING: $wheel is not a +cpu build: the images get torch's CUDA build" ;;
    esac
    "$PYTHON" -c "$INDEX_PY" "$INDEX_DIR" | sed 's/^/  projects: /'
}
serving() { curl -fsS --max-time 5 "http://127.0.0.1:$INDEX_PORT/simple/torch/" 2>/dev/null | grep -q "torch-$TORCH_VERSION"; }
INDEX_PID=
stop_index() { [ -z "$INDEX_PID" ] || kill "$INDEX_PID" 2>/dev/null || true; }
trap stop_index EXIT
trap 'exit 130' INT TERM   # the EXIT trap stops the index on a signal too
serve_index() {
    # The interpreter itself (not a wrapper such as a pyenv shim, which forks): $! is then the server's pid.
    local python
    python=$("$PYTHON" -c 'import sys; print(sys.executable)') || return 1
    "$python" -m http.server "$INDEX_PORT" --bind 127.0.0.1 --directory "$INDEX_DIR" > "$LOGS/torch-index.log" 2>&1 &
    INDEX_PID=$!
    local _
    for _ in $(seq 50); do
        serving && return 0
        kill -0 "$INDEX_PID" 2>/dev/null || { cat "$LOGS/torch-index.log"; return 1; }
        sleep 0.2
    done
    return 1
}

if [ "${1:-}" = setup ]; then
    [ -n "${TORCH_CPU_INDEX_URL:-}" ] || step "torch $TORCH_VERSION index ($INDEX_DIR)" index_ready build_index
    log "setup done"
    exit 0
fi
if [ -z "${TORCH_CPU_INDEX_URL:-}" ]; then
    step "torch $TORCH_VERSION index ($INDEX_DIR)" index_ready build_index
    step "serving it on http://127.0.0.1:$INDEX_PORT/simple" serving serve_index
    export TORCH_CPU_INDEX_URL=http://127.0.0.1:$INDEX_PORT/simple
fi

# ---------------------------------------------------------------- 5. the smoke
log "setup done; deploy/compose-smoke.sh (podman-compose, torch from $TORCH_CPU_INDEX_URL)"
export COMPOSE=${COMPOSE:-podman-compose}
export PODMAN_BUILD_ARGS=${PODMAN_BUILD_ARGS:---format docker --network host --pull=never}
t=$(date +%s)
deploy/compose-smoke.sh || fail "the compose smoke (after $(( $(date +%s) - t ))s)"
log "compose smoke passed in $(( $(date +%s) - t ))s; all in $(( $(date +%s) - STARTED ))s"
