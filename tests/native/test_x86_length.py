"""The x86-64 length decoder of the dlfilter (``_native/x86_length.c``) against capstone.

Every instruction of real binaries (libc, libstdc++, ld.so, the Python interpreter, and
programs the test suite compiles: static glibc, C++, Rust), decoded linearly by capstone
over their executable sections, must get the same length; so must random byte strings
wherever capstone decodes one. The few encodings where capstone departs from the Intel SDM
are listed in ``CAPSTONE_DEPARTS`` (none of them occurs in compiled code).
"""

from __future__ import annotations

import ctypes
import os
import random
import subprocess
import sys
from pathlib import Path

import capstone
import pytest
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile

from support import programs
from support.dlfilter_harness import build_dlfilter

MD = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)


def _departs(code: bytes, mnemonic: str) -> bool:
    """Encodings capstone 5 decodes other than the Intel SDM says."""
    prefixes = code[: len(code) - len(code.lstrip(b"\x66\x67\xf2\xf3\xf0\x2e\x36\x3e\x26\x64\x65"))]
    # UD0 (0F FF /r) and UD1 (0F B9 /r) have a ModRM byte; capstone reads none.
    if mnemonic in ("ud0", "ud1"):
        return True
    # In 64-bit mode near jumps ignore 66 (rel32); capstone reads rel16 for 0F 80 / 0F 81.
    if mnemonic in ("jo", "jno") and b"\x66" in prefixes:
        return True
    # RET imm16 (C2 iw): capstone reads 4 bytes of immediate with 66 and REX.W.
    return mnemonic == "ret" and b"\x66" in prefixes and len(code) == 7


@pytest.fixture(scope="module")
def length() -> ctypes._CFuncPtr:
    fn = ctypes.CDLL(str(build_dlfilter())).ptscope_x86_length
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return fn


def _loaded_library(name: str) -> Path | None:
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if Path(path).name.startswith(name):
            return Path(path)
    return None


def _libstdcxx() -> Path | None:
    out = subprocess.run(
        ["g++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return Path(out) if out.startswith("/") and Path(out).exists() else None


BINARIES = {
    "libc": lambda: _loaded_library("libc.so"),
    "ld.so": lambda: _loaded_library("ld-linux-x86-64"),
    "libstdc++": _libstdcxx,
    "python3": lambda: _loaded_library("libpython3") or Path(os.path.realpath(sys.executable)),
    "static-glibc": lambda: programs.build("basics", static=True),
    "c++": lambda: programs.build("exceptions", opt="-O2"),
    "rust": lambda: programs.build("rust_calls"),
    "leaf100": lambda: programs.build("leaf100"),
}


def _executable_sections(path: Path) -> list[tuple[str, bytes]]:
    with open(path, "rb") as f:
        elf = ELFFile(f)
        return [
            (s.name, s.data())
            for s in elf.iter_sections()
            if s["sh_flags"] & SH_FLAGS.SHF_EXECINSTR and s["sh_type"] == "SHT_PROGBITS"
        ]


@pytest.mark.parametrize("name", sorted(BINARIES))
def test_every_instruction_of_real_binaries(length: ctypes._CFuncPtr, name: str) -> None:
    path = BINARIES[name]()
    if path is None or not path.exists():
        pytest.skip(f"{name} not found")
    total = 0
    wrong: list[str] = []
    for section, data in _executable_sections(path):
        buf = ctypes.create_string_buffer(data, len(data))
        base = ctypes.addressof(buf)
        pos = 0
        while pos < len(data):
            before = pos
            # Linearly, in chunks; where capstone knows no instruction, skip one byte.
            for address, size, mnemonic, _ in MD.disasm_lite(data[pos : pos + 65536], pos):
                total += 1
                ours = length(ctypes.c_char_p(base + address), min(15, len(data) - address))
                code = data[address : address + size]
                if ours != size and not _departs(code, mnemonic):
                    wrong.append(f"{section}+{address:#x} {code.hex()} {mnemonic}: {ours}")
                pos = address + size
            if pos == before:
                pos += 1
    assert total > 100
    assert not wrong, f"{len(wrong)} of {total} instructions differ, e.g. {wrong[:5]}"


def test_random_bytes_where_capstone_decodes(length: ctypes._CFuncPtr) -> None:
    rng = random.Random(11)
    # Random bytes after the prefixes and escapes that select the interesting tables.
    leads = [b"", b"\x66", b"\x67", b"\xf2", b"\xf3", b"\x48", b"\x66\x48", b"\x41", b"\x0f"]
    leads += [b"\x0f\x38", b"\x0f\x3a", b"\x66\x0f", b"\xf3\x0f", b"\xf2\x0f", b"\x66\x0f\x38"]
    leads += [b"\x66\x0f\x3a", b"\xc5", b"\xc4", b"\x62", b"\x8f", b"\xf0", b"\x2e", b"\x64"]
    compared = 0
    wrong: list[str] = []
    for _ in range(60_000):
        code = (rng.choice(leads) + rng.randbytes(15))[:15]
        found = list(MD.disasm_lite(code, 0, 1))
        if not found:
            continue
        _, size, mnemonic, _ = found[0]
        compared += 1
        ours = length(code, len(code))
        if ours != size and not _departs(code[:size], mnemonic):
            wrong.append(f"{code[:size].hex()} {mnemonic}: capstone {size}, ours {ours}")
    assert compared > 20_000
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:5]}"


@pytest.mark.parametrize(
    ("hex_code", "expected"),
    [
        ("90", 1),
        ("c3", 1),
        ("e8 00 00 00 00", 5),
        ("66 e8 00 00 00 00", 6),  # 66 is ignored by near calls in 64-bit mode
        ("48 b8 01 02 03 04 05 06 07 08", 10),  # MOV r64, imm64
        ("66 b8 01 02", 4),
        ("a1 01 02 03 04 05 06 07 08", 9),  # MOV eAX, moffs64
        ("67 a1 01 02 03 04", 6),  # 32-bit moffs
        ("f6 c0 01", 3),  # TEST r/m8, imm8
        ("f6 d0", 2),  # NOT r/m8: no immediate
        ("f7 c0 01 02 03 04", 6),
        ("66 f7 c0 01 02", 5),
        ("c8 10 00 01", 4),  # ENTER imm16, imm8
        ("0f 20 c0", 3),  # MOV r, CR0: the mod field is ignored
        ("0f 20 00", 3),
        ("8b 04 25 00 00 00 00", 7),  # SIB without a base: disp32
        ("8b 05 00 00 00 00", 6),  # RIP-relative
        ("8b 44 24 08", 4),
        ("8b 84 24 00 01 00 00", 7),
        ("c5 fc 77", 3),  # VZEROALL: no ModRM
        ("c4 e3 7d 18 c1 01", 6),  # VINSERTF128: map 0F3A, imm8
        ("62 f1 7c 48 58 c0", 6),  # EVEX VADDPS
        ("62 f3 7d 48 19 c1 01", 7),  # EVEX map 0F3A: imm8
        ("f3 0f 1e fa", 4),  # ENDBR64
        ("0f 0f c1 9e", 4),  # 3DNow! PFADD: the opcode is an imm8 at the end
        ("66 0f 78 c0 01 02", 6),  # SSE4a EXTRQ imm8, imm8
        ("8f c0", 2),  # POP r/m
        ("8f e8 78 a2 c1 20", 6),  # XOP map 8: imm8
    ],
)
def test_known_encodings(length: ctypes._CFuncPtr, hex_code: str, expected: int) -> None:
    code = bytes.fromhex(hex_code)
    assert length(code + b"\xcc" * 15, 15 + len(code)) == expected
    # Shorter input than the instruction: "give me more".
    assert length(code[:-1], len(code) - 1) == -1


@pytest.mark.parametrize("hex_code", ["06", "0f 04", "9a 00 00 00 00 00 00", "d6", "c4 e0 00 00"])
def test_invalid_in_64_bit_mode(length: ctypes._CFuncPtr, hex_code: str) -> None:
    code = bytes.fromhex(hex_code)
    assert length(code + b"\x00" * 15, 15) == 0


def test_longer_than_15_bytes_is_invalid(length: ctypes._CFuncPtr) -> None:
    code = b"\x66" * 14 + b"\x05\x01\x02"
    assert length(code, len(code)) == 0
