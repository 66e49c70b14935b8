"""Make a CUDA build of torch import and run on the CPU without its gigabytes of NVIDIA libraries.

PyPI's Linux builds of torch (every release but 2.13.0, whose +cpu wheel this machine keeps) link
libtorch_cuda.so into libtorch_python.so, so `import torch` needs every library libtorch_cuda names
(cuDNN, cuBLAS, NCCL, cuSPARSELt, NVSHMEM, ...: ~3 GB of nvidia-* wheels) although a CPU run never
calls one. `pip install --no-deps torch==X` plus the few pure-Python libraries torch imports, then
this script, gives a torch that runs on the CPU: for each NVIDIA library torch's shared objects name
and the loader cannot find, it builds a stub with that library's soname and symbol version, in which
every function torch imports from it prints which library and function were called and aborts. A
CPU run that called one would stop loudly, never compute on a stub. The CUDA runtime and CUPTI,
which torch's own static initialisers and `torch.cuda.is_available()` call, are the real NVIDIA
wheels (a few MB; `--runtime-reqs` prints torch's pins of them), and the driver (libcuda.so.1) a
stub without functions: the runtime then finds no device, and `torch.cuda.is_available()` is False.

    python scripts/torch_cpu_stubs.py --runtime-reqs VENV   # the CUDA runtime's requirements
    python scripts/torch_cpu_stubs.py VENV                  # after pip install --no-deps torch==X
                                                            # and those requirements

The stubs go to the first nvidia/ directory torch's RPATH lists (nvidia/cudnn/lib), each named for
the library it stands for; `STUBS.txt` there lists them.
"""
import os
import re
import subprocess
import sys
import tempfile


def torch_lib_dir(venv):
    out = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                          "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    d = os.path.join(out, "torch", "lib")
    if not os.path.isdir(d):
        sys.exit(f"no torch in {venv} ({d} missing): pip install --no-deps torch==X first")
    return out, d


UNVERSIONED = [("nccl", "libnccl.so.2"), ("cusparseLt", "libcusparseLt.so.0"), ("cuFile", "libcufile.so.0"),
               ("curand", "libcurand.so.10"), ("cu", "libcuda.so.1")]


def version_needs(path):
    """{version name: soname} from a shared object's .gnu.version_r (readelf -V)."""
    out = subprocess.run(["readelf", "-V", "-W", path], capture_output=True, text=True).stdout
    needs, soname = {}, None
    for line in out.splitlines():
        m = re.search(r"File: (\S+)\s+Cnt:", line)
        if m:
            soname = m.group(1)
            continue
        m = re.search(r"Name: (\S+)\s+Flags:", line)
        if m and soname:
            needs[m.group(1)] = soname
    return needs


def missing_libs(lib_dir):
    """{soname: (version names, symbols torch imports under them)} for every library ldd cannot find."""
    missing = set()
    sos = sorted(f for f in os.listdir(lib_dir) if f.endswith(".so"))
    for f in sos:
        out = subprocess.run(["ldd", os.path.join(lib_dir, f)], capture_output=True, text=True).stdout
        missing.update(m.group(1) for m in re.finditer(r"^\s*(\S+) => not found", out, re.M))
    wanted = {m: (set(), set()) for m in missing}
    unversioned, defined = set(), set()
    for f in sos:
        path = os.path.join(lib_dir, f)
        needs = version_needs(path)
        for ver, so in needs.items():
            if so in wanted:
                wanted[so][0].add(ver)
        out = subprocess.run(["readelf", "--dyn-syms", "-W", path], capture_output=True, text=True).stdout
        for line in out.splitlines():
            cols = line.split()
            if len(cols) < 8:
                continue
            if cols[6] != "UND":
                defined.add(cols[7].split("@")[0])
                continue
            if "@" not in cols[7]:
                unversioned.add(cols[7])
                continue
            sym, ver = cols[7].split("@")[0], cols[7].split("@")[-1].split(" ")[0]
            so = needs.get(ver)
            if so in wanted:
                wanted[so][1].add((sym, ver))
    # NCCL, cuSPARSELt, cuFile, cuRAND and the driver export unversioned names: they go to the
    # library their prefix names (torch's own libraries' exports are unversioned too: left out)
    for sym in unversioned - defined:
        for prefix, so in UNVERSIONED:
            if sym.startswith(prefix):
                if so in wanted:
                    wanted[so][1].add((sym, None))
                break
    return wanted


def build_stub(soname, versions, symbols, out_dir, tmp):
    base = re.sub(r"\W", "_", soname)
    c = os.path.join(tmp, base + ".c")
    vs = os.path.join(tmp, base + ".map")
    with open(c, "w") as fh:
        fh.write("#include <stdio.h>\n#include <stdlib.h>\n")
        fh.write("static void om_stub_called(const char *fn) {\n"
                 f"  fprintf(stderr, \"torch called %s in {soname}, a CPU-venv stub "
                 "(scripts/torch_cpu_stubs.py): this venv has no NVIDIA libraries\\n\", fn);\n"
                 "  abort();\n}\n")
        for s in sorted({s for s, _ in symbols}):
            fh.write(f"void {s}(void) {{ om_stub_called(\"{s}\"); }}\n")
    # one version node per name torch requires; each symbol is bound to the version it was asked under
    by_ver = {v: sorted(s for s, sv in symbols if sv == v) for v in sorted(versions)}
    with open(vs, "w") as fh:
        for v, syms in by_ver.items():
            fh.write(f"{v} {{ global: {' '.join(s + ';' for s in syms) or 'om_stub_' + base + ';'} }};\n")
    path = os.path.join(out_dir, soname)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", path, c, f"-Wl,-soname,{soname}"]
                   + ([f"-Wl,--version-script,{vs}"] if versions else []), check=True)
    return path


def runtime_reqs(site):
    """torch's own pins of the CUDA runtime and CUPTI wheels (cu12: nvidia-cuda-runtime-cu12,
    nvidia-cuda-cupti-cu12; cu13: cuda-toolkit[cudart,cupti])."""
    meta = [os.path.join(site, d, "METADATA") for d in os.listdir(site)
            if d.startswith("torch-") and d.endswith(".dist-info")]
    reqs = []
    for line in open(meta[0]).read().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].split(";")[0].strip()
        name = re.split(r"[\[=<>~ ]", req)[0]
        if name in ("nvidia-cuda-runtime-cu12", "nvidia-cuda-cupti-cu12"):
            reqs.append(req)
        elif name == "cuda-toolkit":
            reqs.append("cuda-toolkit[cudart,cupti]" + req[req.index("=="):] if "==" in req else "cuda-toolkit[cudart,cupti]")
    return reqs


def stub_dir(site, lib_dir):
    """The first site-packages/nvidia/... directory in libtorch_cuda.so's RPATH."""
    out = subprocess.run(["readelf", "-d", os.path.join(lib_dir, "libtorch_cuda.so")],
                         capture_output=True, text=True).stdout
    m = re.search(r"R(?:UN)?PATH\)\s+Library r(?:un)?path: \[([^\]]*)\]", out)
    for entry in (m.group(1).split(":") if m else []):
        if entry.startswith("$ORIGIN/../../nvidia/"):
            return os.path.normpath(os.path.join(lib_dir, entry[len("$ORIGIN/"):]))
    sys.exit(f"libtorch_cuda.so's RPATH lists no nvidia/ directory: {m.group(1) if m else 'none'}")


def main():
    args = sys.argv[1:]
    if args[:1] == ["--runtime-reqs"] and len(args) == 2:
        site, _ = torch_lib_dir(os.path.abspath(args[1]))
        print(" ".join(f"'{r}'" for r in runtime_reqs(site)))
        return
    if len(args) != 1:
        sys.exit(__doc__)
    venv = os.path.abspath(args[0])
    site, lib_dir = torch_lib_dir(venv)
    wanted = missing_libs(lib_dir)
    if not wanted:
        print(f"{lib_dir}: every library torch names is found; no stubs needed")
        return
    runtime = sorted(so for so in wanted if so.startswith(("libcudart.", "libcupti.")))
    if runtime:
        sys.exit(f"{' '.join(runtime)} missing: install torch's CUDA runtime wheels first "
                 f"(pip install {' '.join(runtime_reqs(site))})")
    out_dir = stub_dir(site, lib_dir)
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        made = [build_stub(so, vers, syms, out_dir, tmp) for so, (vers, syms) in sorted(wanted.items())]
    with open(os.path.join(out_dir, "STUBS.txt"), "w") as fh:
        fh.write("CPU-venv stubs built by ortmod's scripts/torch_cpu_stubs.py: each function aborts "
                 "with its name\n")
        for p in made:
            fh.write(os.path.basename(p) + f" ({len(wanted[os.path.basename(p)][1])} functions)\n")
    left = [f for f in os.listdir(lib_dir) if f.endswith(".so")]
    for f in left:
        out = subprocess.run(["ldd", os.path.join(lib_dir, f)], capture_output=True, text=True).stdout
        if "not found" in out and f not in ("libtorch_cuda_linalg.so", "libcaffe2_nvrtc.so"):
            sys.exit(f"{f} still misses a library after the stubs:\n{out}")
    print(f"{len(made)} stubs in {out_dir}: " + " ".join(os.path.basename(p) for p in made))


if __name__ == "__main__":
    main()
