"""The one change the CUDA emulator makes to a cuda/*.cu file before g++ compiles it as C++:
every kernel launch

    kernel<T><<<grid, block, shmem, stream>>>(args);

becomes a call into the emulator's launcher (tests/cuda_emu/include/emu.h)

    emu_launch("kernel<T>", grid, block, shmem, stream, [=]() { kernel<T>(args); });

The lambda copies the arguments as a launch does. Line breaks inside the launch are kept, and
a #line directive names the .cu file, so compiler messages point into cuda/*.cu.
"""
import os
import re

_CALLEE = re.compile(r"([A-Za-z_][A-Za-z0-9_:]*(?:<[^<>;]*(?:<[^<>;]*>[^<>;]*)*>)?)\s*<<<")


def _split_top_level(s):
    """Splits at the commas that are not inside brackets."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _matching_paren(src, open_at):
    depth = 0
    for i in range(open_at, len(src)):
        if src[i] == "(":
            depth += 1
        elif src[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError("unbalanced parentheses in a kernel launch")


def rewrite(src, path="?"):
    """The source with every <<<...>>> launch replaced by an emu_launch call."""
    out, pos = [f'#line 1 "{path}"\n'], 0
    while True:
        m = _CALLEE.search(src, pos)
        if not m:
            out.append(src[pos:])
            return "".join(out)
        out.append(src[pos:m.start()])
        callee = m.group(1)
        cfg_end = src.index(">>>", m.end())
        config = [" ".join(c.split()) for c in _split_top_level(src[m.end():cfg_end])]
        if not 2 <= len(config) <= 4:
            raise ValueError(f"{path}: a launch of {callee} with {len(config)} configuration values")
        config += ["0"] * (4 - len(config))
        open_at = cfg_end + 3
        while src[open_at] in " \t\r\n\\":
            open_at += 1
        if src[open_at] != "(":
            raise ValueError(f"{path}: no argument list after the launch of {callee}")
        close_at = _matching_paren(src, open_at)
        args = src[open_at + 1:close_at]
        skipped_lines = "\n" * src.count("\n", m.start(), open_at)   # keep the line count
        name = " ".join(callee.split())
        out.append(f'emu_launch("{name}", {", ".join(config)}, [=]() {{ {callee}({args}); }}){skipped_lines}')
        pos = close_at + 1


def rewrite_file(src_path, dst_path, shown_path=None):
    with open(src_path) as f:
        text = rewrite(f.read(), shown_path or src_path)
    with open(dst_path + ".tmp", "w") as f:
        f.write(text)
    os.replace(dst_path + ".tmp", dst_path)   # a concurrent build never sees half a file
