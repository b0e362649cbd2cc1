# gpufleet: every task of the project. `just --list` shows them.

set shell := ["bash", "-euo", "pipefail", "-c"]
set positional-arguments

# uv must never try to download a Python: only the package registry is reachable here.
export UV_PYTHON_DOWNLOADS := "never"

# Start the whole system locally: NATS, MongoDB, every service, a node agent (--data: storage servers).
up *args: setup
    uv run python -m gpufleet_devstack.up {{args}}

# One job's trace as an indented tree, from the spans `just up` wrote (sampled jobs only).
trace job *args: setup
    uv run python -m gpufleet_devstack.trace {{job}} {{args}}

# The whole suite: lint, types, docs freshness, then unit, integration and e2e tests.
test *args: setup check
    uv run pytest {{args}}

# Only one layer: `just test-layer unit` (or integration, e2e).
test-layer layer *args: setup
    uv run pytest -m {{layer}} {{args}}

# Lint, strict type checking and the generated docs' freshness (AsyncAPI, events, permissions, rules).
check: lint typecheck docs-check

lint: setup
    uv run ruff check .
    uv run ruff format --check .

fmt: setup
    uv run ruff format .
    uv run ruff check --fix .

typecheck: setup
    uv run mypy libs/*/src services/*/src cli/src gateway/src devtools/*/src

# Regenerate docs/asyncapi/*.json, events.md, permissions.md from the apps; rules.md from the docstrings.
docs: setup
    uv run python -m gpufleet_devstack.docs

docs-check: setup
    uv run python -m gpufleet_devstack.docs --check

# Install what the project needs: uv (from PyPI), the workspace, nats-server, and podman, runc
# and mmdebstrap for the node agent's container runtime, docker-registry for images (Debian),
# git's servers (Debian's git and openssh-server: git daemon, git http-backend, sshd) and
# Azurite (npm, into devtools/devstack/node) for the storage servers; the console's uPlot (npm,
# into gateway/web) and chromium (Debian) for its browser tests.
# Prometheus (Debian) keeps the metrics' history under `just up`.
setup:
    #!/usr/bin/env bash
    set -euo pipefail
    if ! command -v uv >/dev/null 2>&1; then
        echo "installing uv from PyPI"
        if ! python3 -m pip install --quiet uv; then
            python3 -m pip install --quiet --user uv
            case ":$PATH:" in
                *":$HOME/.local/bin:"*) ;;
                *) echo "uv went to ~/.local/bin, which is not on your PATH: add it there" ;;
            esac
            export PATH="$HOME/.local/bin:$PATH"
        fi
    fi
    # With pyenv, pip puts uv in the interpreter's own bin/, which `just` sees (pyenv runs it
    # with that directory on PATH) but a new shell reaches only through pyenv's shims.
    if command -v pyenv >/dev/null 2>&1 && [ ! -e "$(pyenv root)/shims/uv" ]; then
        pyenv rehash
    fi
    uv sync --quiet --all-packages --group dev
    uv run python -c "from gpufleet_devstack import ensure_nats_server as e; e()"
    uv run python -c "from gpufleet_devstack.podman import ensure_podman as e; e()"
    uv run python -c "from gpufleet_devstack.registry import ensure_registry as e; e()"
    uv run python -c "from gpufleet_devstack.storage.repos import ensure_git as e; e()"
    uv run python -c "from gpufleet_devstack.storage.azurite import ensure_azurite as e; e()"
    uv run python -c "from gpufleet_devstack.prometheus import ensure_prometheus as e; e()"
    uv run python -c "from gpufleet_devstack.webconsole import ensure_console as e; e()"

# The compose stack's keys, TLS certificates and credentials (deploy/secrets/, git-ignored).
compose-secrets: setup
    uv run python -m gpufleet_devstack.compose_secrets deploy/secrets

# Remove the run directory of `just up` (GPUFLEET_RUN_DIR, default .run): data, logs, images, workers.
clean: setup
    uv run python -m gpufleet_devstack.clean

# Scheduler benchmarks (not part of `just test`): placement engine, cost quality, end to end.
bench-scheduler *args: setup
    uv run python benchmarks/scheduler/run.py {{args}}

# Outbox relay benchmark (not part of `just test`): messages/s and CPU per message.
bench-outbox *args: setup
    uv run python benchmarks/outbox/bench_relay.py {{args}}

# Cross-process transaction lock on nx-27017 (not part of `just test`): its cost and what it prevents.
bench-txlock *args: setup
    uv run python benchmarks/store/bench_txlock.py {{args}}

# Worker runtime benchmark (not part of `just test`): submit->running, containers vs bare processes.
bench-runtime *args: setup
    uv run python benchmarks/runtime/bench_runtime.py {{args}}

# Whole job lifecycle benchmark (not part of `just test`): submit -> billed, N agents, M jobs; --slurm, --idle-agents K.
bench-lifecycle *args: setup
    uv run python benchmarks/lifecycle/bench_lifecycle.py {{args}}

# Seeded chaos (issue 16, not part of `just test`; tests/e2e/test_chaos.py is its short run):
# faults under a steady job load, then the invariants as figures. `just chaos --seconds 600 --seed 7`.
chaos *args: setup
    uv run python -m tests.e2e.chaos {{args}}

# Node agent benchmark (not part of `just test`): one node's CPU and latency per job, and idle.
bench-agent *args: setup
    uv run python benchmarks/node_agent/bench_agent.py {{args}}
