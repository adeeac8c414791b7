"""A small YAML writer for rule files: block mappings and lists, every string in
double quotes (JSON's escapes are YAML's), so no expression or template can be read
back as another type or break the document."""

from __future__ import annotations

import json
import re

Node = None | bool | int | float | str | list["Node"] | dict[str, "Node"]

_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")


def _scalar(v: Node) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return json.dumps(v)
    return json.dumps(v, ensure_ascii=False)


def _key(k: str) -> str:
    return k if _PLAIN_KEY.fullmatch(k) else json.dumps(k, ensure_ascii=False)


def _lines(node: Node, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, dict | list) and v:
                out.append(f"{pad}{_key(k)}:")
                out += _lines(v, indent + 2)
            else:
                out.append(
                    f"{pad}{_key(k)}: {_scalar(v) if not isinstance(v, dict | list) else '{}' if isinstance(v, dict) else '[]'}"
                )
        return out
    if isinstance(node, list):
        for item in node:
            sub = _lines(item, indent + 2)
            if isinstance(item, dict | list) and item:
                out.append(f"{pad}- {sub[0].lstrip()}")
                out += sub[1:]
            else:
                out.append(f"{pad}- {_scalar(item)}")
        return out
    return [f"{pad}{_scalar(node)}"]


def dump_yaml(node: Node) -> str:
    return "\n".join(_lines(node, 0)) + "\n"
