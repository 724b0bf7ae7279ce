# Sourced by the device scripts (bench/device_run.sh, bench/h100_tensorcore.sh): kdb's wheels installed once a machine
# into /tmp/kdb-device/site from the carried .device/n (pycuda, the console's), .device/s23w (sqlmodel, sqlalchemy,
# pydantic for cp312: the state file's) and .netrun/carry/whl (onnxconverter-common), then on PYTHONPATH.
if [ ! -f /tmp/kdb-device/kdb-wheels ]; then  # (not env.sh: the TVM bundle's stage2 writes that one too)
  mkdir -p /tmp/kdb-device/site
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kdb-device/site .device/n/wheels/*.whl \
    .device/s23w/*.whl .netrun/carry/whl/*.whl || exit 3
  echo "export PYTHONPATH=/tmp/kdb-device/site:\$PWD\${PYTHONPATH:+:\$PYTHONPATH}" > /tmp/kdb-device/env.sh
  touch /tmp/kdb-device/kdb-wheels
fi
# shellcheck disable=SC1091
. /tmp/kdb-device/env.sh
export PYTHONUNBUFFERED=1
