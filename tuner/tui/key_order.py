"""Keys from the terminal routed one at a time, each after the keys before it and all they caused are handled.

Textual routes each key to the widget focused when the app reads it, and a key's binding acts only once the key has
bubbled back up from that widget: so in a burst (typing fast, a paste, tmux's send-keys) the digits after a Tab went
to the box it left, and the letters after the Enter that opens the Model step went to the Start list.  Routed one at
a time, a key lands where the keys before it left the focus.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from textual import events
from textual.app import App, ReturnType
from textual.screen import Screen

KEY_WAIT_S = 20.0  # the longest a key waits for the one before it (a new recipe, a step's first build: seconds)
KEY_ROUNDS = 12  # rounds of that wait: a key's bubbling takes one per widget it passes; a chat's stream never ends


class KeysInOrderApp(App[ReturnType]):
    """An app whose keys from the terminal are handled in the order they were typed (the wizard's base)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._keys: deque[events.Key] = deque()  # keys read from the terminal, not yet routed (on_event)
        # None: in order unless headless (Pilot's press waits for each key itself); True for tests of key bursts
        self.keys_in_order: bool | None = None
        self._key_router: asyncio.Task | None = None
        self._switched: asyncio.Future | None = None  # the last switch_mode's mount

    async def on_event(self, event: events.Event) -> None:
        """A key from the terminal waits until the keys before it are handled, with all they caused (see the
        module's docstring for why)."""
        in_order = self.keys_in_order if self.keys_in_order is not None else not self.is_headless
        if not (in_order and isinstance(event, events.Key) and not event.is_forwarded):
            await super().on_event(event)
        elif self._key_router is None or self._key_router.done():
            screen = self.screen
            await super().on_event(event)  # nothing before it: routed at once, as Textual does
            self._key_router = asyncio.create_task(self._route_keys(screen))
        else:
            self._keys.append(event)

    async def _route_keys(self, screen: Screen) -> None:
        await self._key_handled(screen)
        while self._keys:
            screen = self.screen
            await App.on_event(self, self._keys.popleft())
            await self._key_handled(screen)

    async def _key_handled(self, screen: Screen) -> None:
        """Until the queues a key travels through are empty: the focused widget up to the app (its bubbling, the
        messages its handlers post), and the whole screen when it changed (a new step mounting and taking focus).
        Bounded (KEY_WAIT_S, KEY_ROUNDS), so a busy screen (a chat streaming) slows typing at worst, never
        swallows it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + KEY_WAIT_S
        whole = False  # screen: the one the key was routed on
        for _ in range(KEY_ROUNDS):
            current = self.screen
            if current is not screen:  # a new step: mounted, then its focus is set (ScreenResume, on_mount)
                if self._switched is not None:  # else a dialog pushed: its queue says when it is ready
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(asyncio.shield(self._switched), max(deadline - loop.time(), 0.001))
                while ((self.focused is None or self.focused.screen is not current) and current.focus_chain
                       and loop.time() < deadline):
                    await asyncio.sleep(0.005)  # its focus is set once it is mounted (on_mount, or auto focus)
                screen, whole = current, True
            nodes = [*(current.walk_children(with_self=True) if whole else
                       self.focused.ancestors_with_self if self.focused else [current]), self]
            if not any(node._message_queue.qsize() for node in nodes):
                return
            done, pending = asyncio.Event(), [0]

            def reached() -> None:  # each node's queue, up to what it held now, is handled
                pending[0] -= 1
                if not pending[0]:
                    done.set()
            pending[0] = sum(1 for node in nodes if node.call_later(reached))
            if not pending[0]:
                return
            try:
                await asyncio.wait_for(done.wait(), max(deadline - loop.time(), 0.001))
            except asyncio.TimeoutError:
                return
            await asyncio.sleep(0)

    def switch_mode(self, mode: str):
        """Switch steps, noting the mount to wait for before the next key is routed (:meth:`_key_handled`)."""
        mounted = super().switch_mode(mode)
        self._switched = asyncio.ensure_future(self._mounted(mounted))
        return mounted

    @staticmethod
    async def _mounted(mounted) -> None:
        await mounted
