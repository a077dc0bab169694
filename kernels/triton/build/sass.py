"""A compiled kernel's machine code (SASS), read without a GPU: the resources cuobjdump reports for a cubin,
its disassembly by nvdisasm (both the tools Triton ships with its ptxas), and the facts of it the tests
hold: the wgmma groups of each loop, the copy engine's instructions, local memory, setmaxnreg's counts."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"^(@!?U?P\d+\s+)?BRA\s+`\((\.L_x_\d+)\)")
_HGMMA = re.compile(r"HGMMA\.(\d+x\d+x\d+)\.")


def tool(name: str) -> str:
    """The path of a CUDA binary tool that Triton ships beside its ptxas (cuobjdump, nvdisasm)."""
    from triton.backends.nvidia import compiler as nv
    return os.path.join(os.path.dirname(nv.__file__), "bin", name)


def _run_on(cubin: bytes, args: list) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([*args, f.name], capture_output=True, text=True).stdout


def resources(cubin: bytes) -> dict:
    """Registers a thread (the launch's cap where setmaxnreg moves them), stack frame and local memory in bytes
    (ptxas puts spilled registers there), from cuobjdump -res-usage; -1 where it reports none."""
    found = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", _run_on(cubin, [tool("cuobjdump"), "-res-usage"])))
    return {"registers": int(found.get("REG", -1)), "stack": int(found.get("STACK", -1)),
            "local": int(found.get("LOCAL", -1))}


def disassemble(cubin: bytes) -> str:
    """nvdisasm's listing of the cubin's code: one instruction a line, its address in a /*...*/ comment, and the
    labels that branches name."""
    return _run_on(cubin, [tool("nvdisasm"), "-c"])


@dataclass(frozen=True)
class Listing:
    """The instructions of a listing in order, (address, text), and each label's address."""
    instructions: tuple
    labels: dict

    @classmethod
    def of(cls, sass: str) -> Listing:
        instructions, labels, pending = [], {}, []
        for line in sass.splitlines():
            label = _LABEL.match(line.strip())
            if label:
                pending.append(label.group(1))
                continue
            found = _INSTRUCTION.search(line)
            if found:
                address = int(found.group(1), 16)
                labels.update({name: address for name in pending})
                pending = []
                instructions.append((address, found.group(2)))
        return cls(tuple(instructions), labels)

    def opcodes(self) -> list:
        """Each instruction's opcode with its modifiers, the predicate left off."""
        return [re.sub(r"^@!?U?P\w+\s+", "", text).split()[0] for _, text in self.instructions]

    def loops(self) -> list:
        """(first, last) addresses of each loop: a conditional branch back to a label at or before it. (An
        unconditional branch back is the way home from code laid out after its loop, such as an mbarrier
        wait's retry, not a loop of its own.)"""
        out = []
        for address, text in self.instructions:
            branch = _BRANCH.match(text)
            if branch and branch.group(1) and self.labels[branch.group(2)] <= address:
                out.append((self.labels[branch.group(2)], address))
        return out

    def groups(self, first: int = 0, last: int | None = None) -> list:
        """The wgmma groups between two addresses, in order: each a WARPGROUP.ARRIVE, its HGMMA instructions
        and the last of them, which carries the group's scoreboard (gsb0). Each as (shape, instructions):
        ("64x128x16", 4) is one wgmma of N 128 over K 64."""
        out, shape, count = [], None, 0
        for address, text in self.instructions:
            if address < first or (last is not None and address > last):
                continue
            found = _HGMMA.search(text)
            if found:
                shape, count = found.group(1), count + 1
                if "gsb0" in text:
                    out.append((shape, count))
                    shape, count = None, 0
        return out

    def setmaxnreg(self) -> list:
        """The register counts of every setmaxnreg, in order."""
        return [int(n, 16) for n in re.findall(r"USETMAXREG\.\w+\.CTAPOOL (?:UP\d, )?(0x[0-9a-f]+)",
                                               "\n".join(text for _, text in self.instructions))]

    def highest_register(self) -> int:
        """The highest general register any instruction names (RZ, the zero register, left out)."""
        return max(int(n) for _, text in self.instructions for n in re.findall(r"\bR(\d+)\b", text))
