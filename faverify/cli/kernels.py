"""faverify kernels."""
from __future__ import annotations

from faverify.cli.app import app
from faverify.cli.common import show


@app.command()
def kernels() -> int:
    """List the built-in subjects and what each supports."""
    from faverify.reports.tables import table
    from faverify.subjects import builtin_names, resolve

    rows = []
    for name in builtin_names():
        try:
            s = resolve(name)
        except Exception as e:  # a subject that cannot load is listed with the reason
            rows.append([name, "unavailable", "", "", "", "", "", f"{type(e).__name__}: {e}"])
            continue
        c = s.caps
        dims = ",".join(map(str, c.head_dims)) if c.head_dims else \
            f"{c.min_head_dim}..{c.max_head_dim}" + (f" x{c.head_dim_multiple}" if c.head_dim_multiple > 1 else "")
        rows.append([name, ",".join(c.dtypes), ",".join(c.devices), dims,
                     "yes" if c.gqa else "no", ",".join(c.init_modes) if c.init_modes else "n/a",
                     ",".join(c.features()) or "dense", s.description])
    # head dims "8..256 x8": from 8 to 256, multiples of 8 (Capabilities.head_dim_multiple); "64,128,256":
    # those alone (Capabilities.head_dims)
    show(table(rows, ["kernel", "dtypes", "devices", "head dims", "GQA", "init", "variants", "description"],
                     "table"))
    return 0
