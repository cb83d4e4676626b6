"""requirements.py PYPROJECT [EXTRA ...]: print the requirements of the project and of the extras named,
from its pyproject.toml alone (its dependencies and optional-dependencies; the extras' references to the
project itself left out). scripts/images.sh gathers their wheels with it, and the image installs them in a
layer of their own, before the sources."""

import sys
import tomllib
from pathlib import Path

if len(sys.argv) < 2:
    sys.exit(__doc__.splitlines()[0])
project = tomllib.loads(Path(sys.argv[1]).read_text())["project"]
extras = project["optional-dependencies"]
unknown = [e for e in sys.argv[2:] if e not in extras]
if unknown:
    sys.exit(f"requirements.py: no extra {unknown} in {sys.argv[1]} ({sorted(extras)})")
for req in [*project["dependencies"], *(r for e in sys.argv[2:] for r in extras[e])]:
    if not req.startswith("safepoint["):
        print(req)
