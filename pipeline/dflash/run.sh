#!/usr/bin/env bash
# The launcher a job's `launch` points at: execs train.py with every argument it was given, so the
# job's PID is the training launcher's PID. PYTHON chooses the interpreter (default python3).
# Relative paths in the arguments (--log, --checkpoint-dir) stay relative to the caller's cwd.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python3}" "$here/train.py" "$@"
