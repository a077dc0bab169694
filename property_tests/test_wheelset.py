"""devtools/wheelset.py, the recipe that carries kernel libraries to the lent GPU machine: its --trim."""
import csv
import importlib.util
import pathlib
import zipfile

WHEELSET = pathlib.Path(__file__).resolve().parent.parent / "devtools" / "wheelset.py"


def _module():
    spec = importlib.util.spec_from_file_location("wheelset", WHEELSET)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trim_sheds_flashinfers_other_kernels_sources_and_rewrites_the_record(tmp_path):
    """FlashInfer's attention JIT reads the top-level files of data/csrc and data/include: those stay, with
    every Python file and the metadata; the subfolders of data/csrc, other packages' csrc/ and kernel_src/
    and experimental/ go, and RECORD lists exactly what stays, with each file's hash."""
    files = {"flashinfer/__init__.py": b"x", "flashinfer/data/csrc/batch_prefill.cu": b"keep",
             "flashinfer/data/include/flashinfer/attention/prefill.cuh": b"keep",
             "flashinfer/data/csrc/fused_moe/moe.cu": b"drop", "flashinfer/cake_fmha/csrc/k.cu": b"drop",
             "flashinfer/moe_ep/kernel_src/k.cuh": b"drop", "flashinfer/experimental/cake/k.cu": b"drop",
             "flashinfer/experimental/cake/mod.py": b"keep", "flashinfer/cake_fmha/csrc/helper.py": b"keep",
             "flashinfer_python-0.7.4.dist-info/METADATA": b"Name: flashinfer-python"}
    wheel = tmp_path / "flashinfer_python-0.7.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("flashinfer_python-0.7.4.dist-info/RECORD", "stale\n")
    _module().trim(str(wheel))
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        lines = z.read("flashinfer_python-0.7.4.dist-info/RECORD").decode().splitlines()
        record = [row[0] for row in csv.reader(lines)]
    kept = {name for name, data in files.items() if data != b"drop"}
    assert names == kept | {"flashinfer_python-0.7.4.dist-info/RECORD"}
    assert set(record) == names


def test_trim_leaves_other_wheels_as_they_are(tmp_path):
    wheel = tmp_path / "apache_tvm_ffi-0.1.15-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("tvm_ffi/csrc/x.cc", b"kept: no rule for this package")
    before = wheel.read_bytes()
    _module().trim(str(wheel))
    assert wheel.read_bytes() == before
