# Sourced at the start of every run on the lent GPU machine (no network there): install faverify from
# this checkout without dependencies (the image has torch, triton, hypothesis, typer, rich, tabulate).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
  || { echo "editable install failed:"; tail -5 "$OUT/install.log"; }
python3 - <<'PY'
import torch, triton, typer, hypothesis
print("torch", torch.__version__, "triton", triton.__version__, "typer", typer.__version__,
      "hypothesis", hypothesis.__version__, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))
PY
