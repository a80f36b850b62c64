"""A griffe extension for the API reference (mkdocs.yml loads it; the site does not ship it).

The docstrings are written in reST's inline vocabulary (``:class:`~rheo_flow.Rheo```,
``:meth:`Rheo.fetch```, ``text::`` before a literal block), which Markdown would show
verbatim. This rewrites each role to a Markdown cross-reference to the object's public
name (``[`Rheo`][rheo_flow.Rheo]``), which mkdocs-autorefs links to its entry in the
reference, or to plain code when the object has no entry (a private helper, a name of
another library); and it drops reST's ``::`` marker, leaving the indented block that
follows it as a code block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):`(~?)([\w.]+)(\(\))?`")
LITERAL_MARKER = re.compile(r"(?m)(\S)::$|^\s*::$")


def _public(path: str) -> bool:
    return not any(part.startswith("_") for part in path.split("."))


def _target(obj: griffe.Object | griffe.Alias) -> str:
    try:
        return obj.final_target.path if obj.is_alias else obj.path
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return obj.path


class RolesToCrossRefs(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        self.collection = loader.modules_collection
        self.public = self._public_names(pkg)
        for obj in self._walk(pkg, set()):
            if obj.docstring is not None:
                obj.docstring.value = self._rewrite(obj, obj.docstring.value)

    def _public_names(self, pkg: griffe.Module) -> dict[str, str]:
        """Map the path of every object with a reference entry to that entry's name."""
        public: dict[str, str] = {}
        modules = [m for m in self._walk(pkg, set()) if m.is_module and _public(m.path)]
        for module in sorted(modules, key=lambda m: (m.path.count("."), m.path)):
            public.setdefault(module.path, module.path)
            for name in [str(e) for e in module.exports or ()]:
                if name not in module.members:
                    continue
                member = module.members[name]
                entry = f"{module.path}.{name}"
                public.setdefault(entry, entry)
                public.setdefault(_target(member), entry)
                try:
                    target = member.final_target if member.is_alias else member
                except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                    continue
                if target.is_class:
                    for sub in target.members:
                        if not sub.startswith("_"):
                            public.setdefault(f"{entry}.{sub}", f"{entry}.{sub}")
                            public.setdefault(f"{target.path}.{sub}", f"{entry}.{sub}")
        return public

    def _walk(self, obj: griffe.Object, seen: set[str]) -> list[griffe.Object]:
        if obj.path in seen:
            return []
        seen.add(obj.path)
        found = [obj]
        for member in obj.members.values():
            if not member.is_alias:
                found += self._walk(member, seen)
        return found

    def _resolve(self, scope: griffe.Object, name: str) -> str | None:
        head, _, rest = name.partition(".")
        candidates = [name]
        try:
            resolved = scope.resolve(head)
            candidates.insert(0, f"{resolved}.{rest}" if rest else resolved)
        except griffe.NameResolutionError:
            pass
        for path in candidates:
            if path in self.public:
                return self.public[path]
            try:
                found = self.collection[path]
            except (KeyError, ValueError, griffe.AliasResolutionError):
                continue
            if _target(found) in self.public:
                return self.public[_target(found)]
        return None

    def _rewrite(self, obj: griffe.Object, text: str) -> str:
        def role(match: re.Match[str]) -> str:
            tilde, name, parens = match.groups()
            shown = (name.rsplit(".", 1)[-1] if tilde else name) + (parens or "")
            entry = self._resolve(obj, name)
            return f"[`{shown}`][{entry}]" if entry else f"`{shown}`"

        text = ROLE.sub(role, text)
        return LITERAL_MARKER.sub(lambda m: f"{m.group(1)}:" if m.group(1) else "", text)
