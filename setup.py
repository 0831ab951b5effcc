"""Build hook: declares the perf dlfilter and the C engine (metadata is in pyproject.toml).

The dlfilter is a plain C shared object that ``perf script --dlfilter`` loads, not a Python
extension module: no ``PyInit_`` symbol, no ABI tag in its name, no libpython. It is built
against the system's ``<perf/perf_dlfilter.h>`` (Debian/Ubuntu package ``linux-perf``),
never a vendored copy. Set ``PTSCOPE_NO_DLFILTER=1`` to skip it (ptscope then decodes with
the slower ``perf script`` text decoder).

``ptscope.record.emulated.recorder`` is the emulated backend's QEMU TCG plugin, also a plain
shared object (QEMU loads it with ``-plugin``); it needs only a C compiler. Set
``PTSCOPE_NO_RECORDER=1`` to skip it (the emulated backend then refuses to record).

``ptscope.reconstruct._cengine`` is an ordinary, optional extension module (the C twin of
the reconstruction engine: the engine in ``_native/engine*.c`` and ``line_set.c``, without
Python, linked with link-time optimisation, and its binding): when it cannot be built the
install still succeeds and ptscope uses the Python engine. ``PTSCOPE_NO_CENGINE=1`` skips it.

``ptscope.fxt._cfxt`` is the FXT writer's slice encoder in C (``_native/fxt_slices.c``),
optional in the same way: without it the writer encodes with numpy. ``PTSCOPE_NO_CFXT=1``
skips it. ``ptscope.decode._crecords`` reads the dlfilter stream's branch runs in C, also
optional (the reader then uses numpy); ``PTSCOPE_NO_CRECORDS=1`` skips it.
"""

import os
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

HEADER = "perf/perf_dlfilter.h"


class SharedObject(Extension):
    """A plain shared object (loaded with dlopen by another program)."""

    needs_perf_header = True


class QemuPlugin(SharedObject):
    """A QEMU TCG plugin: a plain shared object with no header but its own."""

    needs_perf_header = False


class BuildExt(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        ext = self.ext_map.get(fullname)
        if isinstance(ext, SharedObject):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext: Extension) -> list[str]:
        if isinstance(ext, SharedObject):
            return []
        return super().get_export_symbols(ext)

    def build_extension(self, ext: Extension) -> None:
        if (
            isinstance(ext, SharedObject)
            and ext.needs_perf_header
            and not _header_found(ext.include_dirs)
        ):
            raise CompileError(
                f"ptscope: <{HEADER}> not found, so the perf dlfilter cannot be built. "
                "Install perf's headers (Debian/Ubuntu: sudo apt-get install linux-perf), "
                "or set PTSCOPE_NO_DLFILTER=1 to install without it (slower text decoding)."
            )
        super().build_extension(ext)


def _header_found(extra_dirs: list[str]) -> bool:
    dirs = [*extra_dirs, "/usr/local/include", "/usr/include"]
    for var in ("CPATH", "C_INCLUDE_PATH"):
        dirs += [d for d in os.environ.get(var, "").split(os.pathsep) if d]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        dirs.append(f"/usr/include/{multiarch}")
    return any((Path(d) / HEADER).is_file() for d in dirs)


ext_modules = []
NATIVE = "src/ptscope/_native"
# The C files of the dlfilter and of the engine (the tests build their copies from these
# lists: tests/support/dlfilter_harness.py, setup_files).
DLFILTER_FILES = (
    "dlfilter",
    "filter_blocks",
    "filter_inline",
    "filter_output",
    "filter_tables",
    "x86_length",
)
ENGINE_FILES = ("engine", "engine_window", "engine_anchors", "engine_lookahead", "line_set")
# The own Intel PT decoder, layered as libipt is (packets -> flow -> image and session ->
# the engine's input): see "The own decoder" in docs/architecture.md.
DECODER_FILES = (
    "pt_packet",
    "pt_insn",
    "pt_block",
    "pt_image",
    "pt_decoder",
    "pt_session",
    "pt_feed",
    "pt_symtree",
    "x86_length",
)
if not os.environ.get("PTSCOPE_NO_DLFILTER"):
    ext_modules.append(
        SharedObject(
            "ptscope._native.dlfilter",
            sources=[f"{NATIVE}/{name}.c" for name in DLFILTER_FILES],
            depends=[
                f"{NATIVE}/{name}.h"
                for name in (
                    "record_format", "x86_length", "filter_internal", "filter_tables",
                    "inline_runs",
                )
            ],
            # -flto: the files' calls into each other are inlined as within one file;
            # -fno-semantic-interposition: so are the few functions it exports for the
            # tests (ptscope_droppable_flags ran as a call through the PLT per sample)
            extra_compile_args=[
                "-O2",
                "-Wall",
                "-Werror",
                "-std=c11",
                "-fvisibility=hidden",
                "-fno-semantic-interposition",
                "-flto",
            ],
            extra_link_args=["-O2", "-fno-semantic-interposition", "-flto"],
        )
    )

PLUGIN = "src/ptscope/record/emulated/plugin"
if not os.environ.get("PTSCOPE_NO_RECORDER"):
    ext_modules.append(
        QemuPlugin(
            "ptscope.record.emulated.recorder",
            sources=[
                f"{PLUGIN}/{name}.c"
                for name in ("recorder", "perf_file", "x86_branch", "elf_facts", "code_pages")
            ]
            + ["src/ptscope/_native/x86_length.c"],
            include_dirs=["src/ptscope/_native"],
            depends=[
                f"{PLUGIN}/{name}.h"
                for name in (
                    "qemu_plugin_api",
                    "pt_writer",
                    "perf_file",
                    "x86_branch",
                    "elf_facts",
                    "code_pages",
                )
            ]
            + ["src/ptscope/_native/x86_length.h"],
            extra_compile_args=["-O2", "-Wall", "-Werror", "-std=gnu11", "-fvisibility=hidden"],
            extra_link_args=["-pthread"],
        )
    )


def optional_extension(
    skip: str,
    name: str,
    sources: list[str],
    depends: list[str],
    lto: bool = False,
    libraries: list[str] | None = None,
) -> None:
    """An ordinary extension module that may fail to build: ptscope then installs anyway
    and uses the module's Python (numpy) twin. Set the environment variable ``skip`` to
    leave it out. Each shares code with the dlfilter: headers of ``_native``. ``lto``:
    link-time optimisation, for a library cut into files whose calls across files are on
    the hot path (the engine)."""
    if not os.environ.get(skip):
        # Only the module's PyInit is exported (PyMODINIT_FUNC): the calls between its
        # files bind locally (no PLT), and with LTO they inline.
        flags = ["-fvisibility=hidden", "-fno-semantic-interposition"]
        flags += ["-flto"] if lto else []
        ext_modules.append(
            Extension(
                name,
                sources=sources,
                include_dirs=["src/ptscope/_native"],
                depends=depends,
                extra_compile_args=["-O2", "-Wall", "-Werror", "-std=c11", *flags],
                extra_link_args=["-O2", *flags],
                libraries=libraries or [],
                optional=True,
            )
        )


# The C twin of the trace-segment engine (reconstruct/engine.py is the Python one): the
# engine itself (_native/engine*.c and line_set.c, no Python in them) and its Python binding.
optional_extension(
    "PTSCOPE_NO_CENGINE",
    "ptscope.reconstruct._cengine",
    ["src/ptscope/reconstruct/_cengine.c", *(f"{NATIVE}/{name}.c" for name in ENGINE_FILES)],
    [f"{NATIVE}/{name}.h" for name in ("engine", "engine_internal", "line_set")],
    lto=True,
)
# The dlfilter stream's branch runs read in C (the common case of the numpy reader,
# which stays the reference).
optional_extension(
    "PTSCOPE_NO_CRECORDS",
    "ptscope.decode._crecords",
    ["src/ptscope/decode/_crecords.c"],
    ["src/ptscope/_native/record_format.h"],
)
# The own Intel PT decoder (decode/native.py drives it; perf's decoder is its reference).
optional_extension(
    "PTSCOPE_NO_PTDECODE",
    "ptscope.decode._ptdecode",
    ["src/ptscope/decode/_ptdecode.c", *(f"{NATIVE}/{name}.c" for name in DECODER_FILES)],
    [
        f"{NATIVE}/{name}.h"
        for name in (
            "pt_packet", "pt_insn", "pt_block", "pt_image", "pt_decoder", "pt_session",
            "pt_feed", "pt_symtree", "x86_length",
        )
    ],
    lto=True,
)
# Symbol names demangled as perf demangles them: libiberty (Debian's libiberty-dev), the
# library perf links. Without it names go through c++filt (demangle.py says how).
optional_extension(
    "PTSCOPE_NO_DEMANGLE",
    "ptscope._demangle",
    ["src/ptscope/_demangle.c"],
    [],
    libraries=["iberty"],
)
# The FXT writer's slice encoder in C (fxt/writer.py's numpy encoder is its reference).
optional_extension(
    "PTSCOPE_NO_CFXT",
    "ptscope.fxt._cfxt",
    ["src/ptscope/fxt/_cfxt.c", "src/ptscope/_native/fxt_slices.c"],
    ["src/ptscope/_native/fxt_slices.h"],
)

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExt})
