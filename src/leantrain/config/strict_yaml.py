"""YAML loading that refuses a key given twice in one mapping (plain YAML keeps the last one silently)."""

from __future__ import annotations

import yaml


class DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: object, first_line: int, second_line: int, path: str):
        self.key, self.first_line, self.second_line, self.path = key, first_line, second_line, path
        where = f"{path}.{key}" if path else str(key)
        super().__init__(f"key {where!r} is given twice, on lines {first_line} and {second_line}; keep one")


class StrictSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` whose mappings reject duplicate keys, naming the key and both lines (1-based)."""

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 - yaml's signature
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                line = key_node.start_mark.line + 1
                if first is not None:
                    raise DuplicateKeyError(key, first, line, "")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def safe_load_strict(text: str):
    return yaml.load(text, Loader=StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
