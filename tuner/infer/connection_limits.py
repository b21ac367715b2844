"""What a connection to ``tuner serve`` may hold before it is a request: uvicorn's h11 protocol with a deadline on
the first request's headers, and a cap on open connections.

uvicorn bounds the wait for a kept-alive connection's next request only while no byte arrives
(``timeout_keep_alive`` is disarmed by any data), and a new connection's first request not at all: a client that
sends one header byte a second holds its socket for as long as it likes, and uvicorn's ``limit_concurrency``
counted such sockets, so 50 of them turned every other client away with 503.  Here a deadline is armed when the
connection opens and after each response, and disarmed when a request's headers are complete: headers not complete
within :data:`HEADER_TIMEOUT_S` close the connection.  A connection that opens while :data:`MAX_OPEN_CONNECTIONS`
are open is closed at once (file descriptors are finite).
Requests, once their headers are in, are counted by :class:`tuner.infer.request_limits.RequestLimits`, which is
where the body's deadline and the cap on requests at once live: an idle socket takes no request's place.
"""
from __future__ import annotations

from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0  # from connect to a complete request line and headers
MAX_OPEN_CONNECTIONS = 1024  # open sockets at once, idle or not; beyond, a new one is closed


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on every request's headers (see the module's docstring)."""

    header_deadline = None  # the timer (an asyncio.TimerHandle) while a request's headers are awaited

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > MAX_OPEN_CONNECTIONS:
            self.connections.discard(self)
            transport.close()
            return
        self._await_headers()

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle:  # a request's headers are in: it is RequestLimits' to bound from here
            self._stop_waiting()

    def on_response_complete(self) -> None:
        self._await_headers()  # first: the next request may already be buffered, and handled right here
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        self._stop_waiting()
        self.header_deadline = self.loop.call_later(HEADER_TIMEOUT_S, self.timeout_keep_alive_handler)

    def _stop_waiting(self) -> None:
        if self.header_deadline is not None:
            self.header_deadline.cancel()
            self.header_deadline = None
