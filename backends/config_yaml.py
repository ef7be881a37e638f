"""Reading a configuration file's YAML in work bounded by the file's own size.

YAML aliases repeat a node without repeating its text: a few lines, each level an alias of the
one below repeated ten times, spell a document of billions of nodes (an "alias bomb": 1.5 KB
built 1.4 GB of objects, holding the interpreter for seconds, before validation could refuse
it). Here the document is composed as a graph first (each aliased node once), its expanded size
counted over that graph, and objects are built only when the aliases add at most
MAX_ALIAS_NODES nodes: a config's anchors reuse a section or two, never thousands.
"""

from __future__ import annotations

from typing import Any

import yaml

# What aliases may add to the nodes a document spells out.
MAX_ALIAS_NODES = 10_000
# A file past this is refused unread: parsing is pure Python, and a reload's parse shares the
# interpreter with the requests being served. 8 MiB holds tens of thousands of tenants.
MAX_CONFIG_BYTES = 8 * 1024 * 1024


class UnboundedYaml(yaml.YAMLError):
    """The document would cost far more to build than its text suggests."""


def load_yaml(text: str) -> Any:
    """`yaml.safe_load`, refusing (UnboundedYaml) a text over MAX_CONFIG_BYTES, aliases that
    would add more than MAX_ALIAS_NODES nodes, a recursive alias, or nesting too deep to
    compose."""
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise UnboundedYaml(f"over {MAX_CONFIG_BYTES // (1024 * 1024)} MiB")
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError as exc:
            raise UnboundedYaml("nested too deeply") from exc
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Counts the document's nodes as built (an aliased node once per use) over the composed
    graph, where each node is visited once; iterative, so no nesting overflows it."""
    sizes: dict[int, int] = {}
    entered: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            sizes[key] = 1 + sum(sizes[id(child)] for child in _children(node))
            continue
        if key in sizes:
            continue
        if key in entered:  # reached again before it was done: it contains itself
            raise UnboundedYaml("an alias refers to a node that contains it (recursive alias)")
        entered.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
    added = sizes[id(root)] - len(sizes)
    if added > MAX_ALIAS_NODES:
        raise UnboundedYaml(
            f"aliases would repeat {added:,} nodes (at most {MAX_ALIAS_NODES:,}): refused "
            "before building it, as an alias bomb; write repeated sections out instead"
        )
