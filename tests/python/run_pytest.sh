#!/bin/sh
# run_pytest.sh PYTHON TESTDIR [pytest args...]: runs pytest on TESTDIR, or
# exits 77 (CTest: skipped) when PYTHON lacks pytest, numpy or torch.
py="$1"; dir="$2"; shift 2
if ! "$py" -c 'import pytest, numpy, torch' 2>/dev/null; then
  echo "test_python: $py lacks pytest, numpy or torch: skipped"
  exit 77
fi
exec "$py" -m pytest "$dir" "$@"
