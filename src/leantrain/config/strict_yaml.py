"""YAML loading that refuses a key given twice in one mapping (plain YAML keeps the last one silently)."""

from __future__ import annotations

import yaml


class DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: str, first_line: int, second_line: int):
        self.key, self.first_line, self.second_line = key, first_line, second_line
        super().__init__(f"key {key!r} is given twice, on lines {first_line} and {second_line}; keep one")


def check_duplicates(node: yaml.Node | None, path: str = "", seen: set[int] | None = None) -> None:
    """DuplicateKeyError naming the dotted key (``train.lr``) and both lines (1-based) of the first duplicate."""
    seen = set() if seen is None else seen
    if node is None or id(node) in seen:  # an alias points back at a node already checked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[str, int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = f"{path}{key_node.value}"
                line = key_node.start_mark.line + 1
                if key in lines:
                    raise DuplicateKeyError(key, lines[key], line)
                lines[key] = line
                check_duplicates(value_node, key + ".", seen)
            else:
                check_duplicates(value_node, path, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            check_duplicates(item, f"{path.rstrip('.')}[{i}].", seen)


def safe_load_strict(text: str):
    """``yaml.safe_load`` after checking every mapping for duplicate keys."""
    check_duplicates(yaml.compose(text, Loader=yaml.SafeLoader))
    return yaml.safe_load(text)
