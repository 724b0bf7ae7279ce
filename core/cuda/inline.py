"""Inline the small device helpers TVM writes beside a kernel, so that the kernel holds its whole body.

A kernel-DB row is one function. TVM writes some PTX as `__forceinline__ __device__ void` helpers outside the kernel:
the cp.async copy of a software pipeline (`ptx_cp_async_legacy_cg_16_2_2(dst, dst_off, src, src_off)`) and its
commit/wait groups (`tvm_builtin_ptx_cp_async_commit_group_...()`). Each call statement of such a helper in the kernel
is replaced by the helper's body in a block of its own, the parameters declared as locals initialised from the call's
arguments: what the compiler does with a forced inline, written out. A helper that returns a value, or whose call is
not a statement of its own, is left alone (the kernel then still needs it, and the caller says so).
"""

from __future__ import annotations

import re

from core.cuda.source import find_words, mask, match_close, split_top_commas

_HELPER = re.compile(r"__forceinline__\s+__device__\s+void\s+(\w+)\s*\(")
_PAREN = re.compile(r"[()]")
# TVM's helpers use the fixed-width names of <cstdint>, which NNFusion's generated file does not promise to include.
_FIXED_WIDTH = {"uint8_t": "unsigned char", "uint32_t": "unsigned int", "int32_t": "int"}


def device_helpers(source: str) -> dict[str, tuple[list[tuple[str, str]], str]]:
    """name -> ([(type, parameter)...], body) of each `__forceinline__ __device__ void` function of `source`."""
    masked = mask(source)
    helpers = {}
    for m in _HELPER.finditer(masked):
        close = match_close(masked, m.end() - 1, _PAREN)
        body_open = masked.find("{", close)
        if body_open < 0 or masked[close + 1:body_open].strip():
            continue
        body_close = match_close(masked, body_open)
        params = []
        for param in split_top_commas(source[m.end():close]):
            words = param.strip()
            if not words or words == "void":
                continue
            name = re.search(r"(\w+)\s*$", words)
            if name is None:
                break
            params.append((words[:name.start()].strip(), name.group(1)))
        else:
            helpers[m.group(1)] = (params, source[body_open + 1:body_close])
    return helpers


def inline_device_helpers(code: str, source: str) -> str:
    """`code` (one kernel) with every call statement of a helper `source` defines replaced by the helper's body."""
    helpers = device_helpers(source)
    for name, (params, body) in helpers.items():
        masked = mask(code)
        for pos in reversed(find_words(masked, name)):
            paren = masked.find("(", pos + len(name))
            if paren < 0 or masked[pos + len(name):paren].strip():
                continue
            close = match_close(masked, paren, _PAREN)
            semicolon = close + 1 + (len(masked[close + 1:]) - len(masked[close + 1:].lstrip()))
            if semicolon >= len(masked) or masked[semicolon] != ";":
                continue
            args = [a.strip() for a in split_top_commas(code[paren + 1:close])] if params else []
            if len(args) != len(params):
                continue
            locals_ = "".join(f"{_fixed_width(t)} {p} = ({a}); " for (t, p), a in zip(params, args, strict=True))
            code = f"{code[:pos]}{{ {locals_}{_fixed_width(body.strip())} }}{code[semicolon + 1:]}"
    return code


def _fixed_width(text: str) -> str:
    for name, plain in _FIXED_WIDTH.items():
        text = re.sub(rf"\b{name}\b", plain, text)
    return text
