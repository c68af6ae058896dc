#!/usr/bin/env bash
# `pip install .` on a clean clone, in a fresh virtual environment, then a stage run on NumPy arrays from the
# installed package (docs/python.md). It builds every stage, so it is not part of `./flashlab test`; run it by
# hand after a change to the packaging (pyproject.toml, python/CMakeLists.txt):
#   bash tests/pip_install.sh [--keep DIR]
# Needs the packages the driver's build needs (./flashlab setup) and PyPI (or a wheel folder through pip's
# PIP_FIND_LINKS) for scikit-build-core, nanobind and NumPy.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
scratch=$(mktemp -d /tmp/flashlab-pip.XXXXXX)
if [[ "${1:-}" == "--keep" ]]; then scratch="$2"; mkdir -p "$scratch"; else trap 'rm -rf "$scratch"' EXIT; fi

echo "== a clean clone of $(git -C "$root" rev-parse --short HEAD) in $scratch/clone"
git clone --quiet --no-hardlinks "$root" "$scratch/clone"
echo "== a fresh virtual environment"
python3 -m venv "$scratch/venv"
started=$(date +%s)
echo "== pip install . (CMake through scikit-build-core: the module's target only)"
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$scratch/venv/bin/pip" install --quiet "$scratch/clone"
echo "   built and installed in $(( $(date +%s) - started )) s"
echo "== import flashlab, outside the checkout, and run stages on NumPy arrays"
cd "$scratch"
"$scratch/venv/bin/python" - <<'PY'
import numpy as np
import flashlab
print("   flashlab from", flashlab.__file__)
names = [i["name"] for i in flashlab.implementations()]
print(f"   {len(names)} implementations, e.g. {', '.join(names[:3])}")
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 100, 4, 32), dtype=np.float32) for _ in range(3))
o, lse = flashlab.attention(q, k, v, impl="cpu_tiled/forward", causal=True)
three, _ = flashlab.attention(q, k, v, impl="naive/three_pass", causal=True)
gap = float(np.abs(o - three).max())
print(f"   cpu_tiled/forward: O {o.shape} {o.dtype}, LSE {lse.shape}; {gap:.1e} from naive/three_pass")
assert o.shape == q.shape and lse.shape == (1, 4, 100) and gap < 1e-5
try:
    flashlab.attention(q, k, v, impl="naive/three_pass", softcap=30)
    raise SystemExit("an unsupported option was not refused")
except ValueError as error:
    print(f"   refused by name: {error}")
PY
echo "== pip install . works on a clean clone"
