"""The package's layers import only downward, and pure modules load without the compiled extension.

Pure: the graph is read from the source with ``ast``; nothing of ``mtp_bindings`` is imported
except in the subprocess that proves the pure modules need no ``_ffi``. Every import counts:
module-level, inside functions, and under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mtp_bindings"
ROOT = "mtp_bindings"

# Lowest first. A module may import modules of its own layer or of lower layers, never higher.
# A name matches a module and everything under it (``mtp_bindings.server`` covers the package).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("pure", ("exceptions", "config", "models", "chat", "chat.reply", "chat.template_env", "chat.gemma4_template",
              "turns", "hub", "_lazy")),
    ("native", ("_ffi", "native", "low_level", "chat.builtin_templates")),
    ("core", ("llama_context", "llama_model", "embeddings", "core")),
    ("mtp", ("mtp", "chat.template")),
    ("generation", ("generation",)),
    ("api", ("api",)),
    ("apps", ("", "__main__", "server", "cli", "benchmark", "scale_pair", "gguffile")),
]

# Subpackages whose ``__init__`` must stay a docstring: their modules sit in different layers (or
# must import without native code), and a package's ``__init__`` runs before any of its modules.
EMPTY_PACKAGES = ("native", "chat", "config", "gguffile", "scale_pair", "core")

# Modules that must import without the compiled extension (the fast test tier).
PURE_MODULES = ("config", "config.params", "config.limits", "config.presets", "config.env", "config.threads",
                "exceptions", "chat", "chat.reply", "chat.template_env", "chat.gemma4_template", "turns",
                "hub", "_lazy",
                "native", "native._backends",
                "gguffile", "gguffile.tools",
                "generation.sampling", "generation.agreement",
                "generation.rejection", "generation.stats", "generation.results", "generation.text",
                "generation.trace")


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``name`` imports, anywhere in its source."""
    out: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = _resolve(name, is_package, node)
            # "from pkg import sub" imports the submodule; "from pkg import name" the package
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known and "." in t:  # "pkg.mod.attr" -> "pkg.mod"
                t = t.rsplit(".", 1)[0]
            if t in known and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods) | {f"{ROOT}._ffi"}
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def layer_of(module: str) -> int:
    rel = module[len(ROOT) + 1:] if module != ROOT else ""
    best, best_len = -1, -1
    for i, (_, names) in enumerate(LAYERS):
        for n in names:
            if (rel == n or (n and rel.startswith(n + "."))) and len(n) > best_len:
                best, best_len = i, len(n)
    return best


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (c := visit(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_the_graph_sees_function_level_and_type_checking_imports():
    g = graph()
    assert f"{ROOT}.generation.driver" in g[f"{ROOT}.api"]
    assert f"{ROOT}.native._native" in g[f"{ROOT}.llama_context"]


def test_layered_subpackages_import_nothing():
    for name in EMPTY_PACKAGES:
        tree = ast.parse((PACKAGE / name / "__init__.py").read_text())
        body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        assert not body, f"mtp_bindings/{name}/__init__.py: keep it a docstring (its modules are in several layers)"


def test_the_package_root_holds_at_most_a_dozen_modules():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 12, f"{len(root)} modules at the root: {root}; move some into a subpackage"


MAX_MODULE_LINES = 400  # one concern a module, read in one sitting: split a module that grows past this


def test_no_module_exceeds_max_lines():
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"over {MAX_MODULE_LINES} lines (split it along a seam): {long}"


def test_every_module_has_a_declared_layer():
    missing = [m for m in graph() if layer_of(m) < 0]
    assert not missing, f"declare a layer for {missing} in tests/test_import_graph.py LAYERS"


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_imports_a_higher_layer():
    upward = []
    for mod, deps in graph().items():
        for dep in deps:
            if min(layer_of(mod), layer_of(dep)) >= 0 and layer_of(dep) > layer_of(mod):  # undeclared: see above
                upward.append(f"{mod} (layer {LAYERS[layer_of(mod)][0]}) imports {dep} "
                              f"(layer {LAYERS[layer_of(dep)][0]})")
    assert not upward, "upward imports:\n  " + "\n  ".join(sorted(upward))


def test_pure_modules_import_without_the_compiled_extension():
    names = [f"{ROOT}.{m}" for m in PURE_MODULES if f"{ROOT}.{m}" in modules()]
    code = ("import sys; sys.modules['mtp_bindings._ffi'] = None\n"  # any import of it now fails
            f"import importlib\nfor n in {names!r}: importlib.import_module(n)\n"
            "assert 'mtp_bindings.native._native' not in sys.modules\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent,
                       timeout=120)
    assert r.returncode == 0, r.stderr
