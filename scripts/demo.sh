#!/usr/bin/env bash
# Set up, then run the demo on the embedded broker: broker + simulated cluster + job + live view.
# Extra arguments go to `safepoint demo` (e.g. --duration 90 --nodes 8).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/safepoint demo "$@"
