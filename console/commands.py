"""The command palette lists every action: the App's and the active screen's bindings, by description."""

from __future__ import annotations

from functools import partial

from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider


class ActionCommands(Provider):
    """Every binding with a description becomes a command, so the palette never drifts from the keys."""

    def _commands(self) -> list[tuple[str, str, object]]:
        app = self.app
        screen = self.screen
        found: list[tuple[str, str, object]] = []
        seen: set[str] = set()
        for owner, label in ((screen, screen.__class__.__name__.removesuffix("Screen")), (app, "kdb")):
            for binding in getattr(owner, "BINDINGS", []):
                if isinstance(binding, Binding):
                    # The footer's word, or the tooltip that spells it out ("Next" -> "Next page").
                    key, action, description = binding.key, binding.action, binding.tooltip or binding.description
                else:
                    key, action, description = binding[0], binding[1], binding[2]
                if not description or action in seen:
                    continue
                seen.add(action)
                found.append((f"{label}: {description}", f"key: {key}",
                              partial(owner.run_action, action)))
        return found

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands():
            yield DiscoveryHit(title, callback, help=help_text)  # type: ignore[arg-type]

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)  # type: ignore[arg-type]
