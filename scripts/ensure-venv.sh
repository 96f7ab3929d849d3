#!/usr/bin/env bash
# ensure-venv.sh PYTHON VENV: make sure VENV is a virtualenv whose pip works.
# A first `make` interrupted while the venv was made (ensurepip runs last) leaves
# one without pip, on which every later `make` failed: such a venv, or one whose
# interpreter no longer runs, is made again from scratch (--clear).
set -euo pipefail
python=${1:?usage: ensure-venv.sh PYTHON VENV}
venv=${2:?usage: ensure-venv.sh PYTHON VENV}
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
  exit 0
fi
if [ -e "$venv/bin/python" ]; then
  echo "sluice: $venv has no working pip (an interrupted first make?): making it again"
  "$python" -m venv --clear "$venv"
else
  echo "sluice: creating the virtualenv $venv"
  "$python" -m venv "$venv"
fi
