#!/usr/bin/env bash
# Installs the peers virtualenv (default .venv-peers) in one go; `make bench-peers` runs it.
# FFCV builds its C extension from source against libjpeg-turbo and OpenCV: on Debian/Ubuntu that
# is libturbojpeg0-dev, libopencv-dev and pkg-config, installed here when run as root.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
VENV=${PEERS_VENV:-.venv-peers}
DEBS="libturbojpeg0-dev libopencv-dev pkg-config"

have_libs() {
  command -v pkg-config >/dev/null && pkg-config --exists libturbojpeg &&
    { pkg-config --exists opencv4 || pkg-config --exists opencv; }
}
if ! have_libs; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $DEBS
  else
    echo "FFCV needs libjpeg-turbo and OpenCV headers; install them first:" >&2
    echo "  sudo apt-get install -y $DEBS" >&2
    exit 1
  fi
fi

"$PY" -m venv "$VENV"
PIP="$VENV/bin/pip install -q --disable-pip-version-check -c benchmarks/peers/constraints.txt"
$PIP torch==2.13.0
$PIP -r benchmarks/peers/requirements.txt -r benchmarks/peers/requirements-nodeps-needs.txt
# LitData and Mosaic declare torchvision (no CPU wheel here): no deps, their needs listed above.
"$VENV/bin/pip" install -q --disable-pip-version-check --no-deps \
  -r benchmarks/peers/requirements-nodeps.txt
$PIP -e '.[demo]'
"$VENV/bin/python" -c "import ffcv.loader, webdataset, litdata, feedpipe" >/dev/null
echo "peers installed in $VENV"
