# Sourced by benchmarks/lease/device_check.sh and device_profile.sh (each runs as its own device call, in a fresh
# shell): offline, unbuffered, and the wheels of .whl/ (benchmarks/lease/device_wheels.sh: datasets for the
# engine's data, torchao for fp8) installed into /tmp/site ($PRECSWITCH_SITE) when the image lacks them, then this
# checkout's src/ first on PYTHONPATH. Expects to run in the repository root.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
SITE=${PRECSWITCH_SITE:-/tmp/site}
if compgen -G ".whl/*.whl" > /dev/null; then
  if [[ ! -f $SITE/.precswitch-wheels ]]; then  # a warm machine keeps $SITE: install once
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
      && touch $SITE/.precswitch-wheels
  fi
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  # datasets needs pyarrow >= 24 and fsspec <= 2026.9.0 (not checked by --no-deps): if the image's
  # pyarrow is older, or datasets cannot import, add the fallback wheels (device_wheels.sh)
  if compgen -G ".whl/fallback/*.whl" > /dev/null && ! python3 -c "import pyarrow, datasets, sys; sys.exit(int(pyarrow.__version__.split('.')[0]) < 24)" 2>/dev/null; then
    echo "# datasets cannot use this machine's pyarrow: installing .whl/fallback"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/fallback/*.whl
  fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
