#!/usr/bin/env bash
# mypy --strict over the installed layout. setuptools maps streaming/, connectors/ and schemas/
# to safepoint.* with an import hook mypy cannot follow, so this builds a symlinked view of the
# package under build/typecheck and checks that.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
view=build/typecheck
rm -rf "$view" && mkdir -p "$view/safepoint"
for f in src/safepoint/*; do ln -s "$root/$f" "$view/safepoint/"; done
for d in streaming connectors schemas; do ln -s "$root/$d" "$view/safepoint/$d"; done
cd "$view"
exec "$root/.venv/bin/mypy" --config-file "$root/pyproject.toml" -p safepoint
