#!/usr/bin/env bash
# Installs what betonbuild needs, idempotently: the Debian build dependencies of ffcv and a
# .venv holding exactly requirements.lock plus this project. The venv is rebuilt only when the
# lock (or pyproject.toml) changed since it was made.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(libopencv-dev libturbojpeg0-dev pkg-config)
VENV=.venv
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

missing_debian_packages() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
    done
}

install_debian_packages() {
    local missing
    missing=$(missing_debian_packages "$@")
    [ -z "$missing" ] && return 0
    # shellcheck disable=SC2086
    if [ "$(id -u)" -ne 0 ]; then
        echo "betonbuild needs Debian packages that are not installed. Run, as root:" >&2
        echo "  apt-get update && apt-get install -y --no-install-recommends $(echo $missing)" >&2
        exit 1
    fi
    echo "bootstrap: installing Debian packages: $(echo $missing)"
    apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
}

venv_stamp() {
    cat requirements.lock pyproject.toml | sha256sum | cut -d' ' -f1
}

pip_install() {
    # This machine's pip config names local indexes that may be absent; its warnings are noise.
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

install_venv() {
    local stamp
    stamp=$(venv_stamp)
    if [ -f "$VENV/.bootstrap-stamp" ] && [ "$(cat "$VENV/.bootstrap-stamp")" = "$stamp" ]; then
        return 0
    fi
    "$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' || {
        echo "betonbuild is pinned for Python 3.11; set PYTHON=/path/to/python3.11" >&2
        exit 1
    }
    echo "bootstrap: building $VENV from requirements.lock (first time: about a minute)"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV"
    pip_install -r requirements.lock
    pip_install --no-build-isolation -e .
    "$VENV/bin/python" -m pip check
    echo "$stamp" > "$VENV/.bootstrap-stamp"
}

install_debian_packages "${DEBIAN_PACKAGES[@]}"
if [ "${1:-}" = "--slurm" ]; then
    install_debian_packages slurm-wlm munge
fi
install_venv
# betonbuild's modules byte-compiled (only those changed since): every workflow job is a fresh Python, and
# where PYTHONDONTWRITEBYTECODE is set (this CI machine sets it) each job compiled them again, ~0.3 s a job.
"$VENV/bin/python" -m compileall -q betonbuild
