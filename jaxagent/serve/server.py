"""Wiring: a run's policy behind the HTTP app, served by uvicorn.

``build_state`` turns the pieces ``jaxagent.train.run.build_run`` made from a config (chat,
policy, budgets, rollout sampling settings) into a ``ServerState`` over a ``SlotBackend``;
``serve`` runs it in the foreground (``jaxagent serve``); ``ServerThread`` runs it in a
background thread on a free port (tests, benchmarks, a trainer driving a harness).
"""

from __future__ import annotations

import socket
import threading
import time

from jaxagent.generate import SamplingConfig
from jaxagent.generate.grammar import GrammarTable, token_texts
from jaxagent.models.api import model_config
from jaxagent.serve.app import ServerState, create_app
from jaxagent.serve.backend import SlotBackend, pool_capacity
from jaxagent.serve.render import Renderer
from jaxagent.serve.sessions import EpisodeFile, SessionStore


def build_state(
    *,
    chat,
    graphdef,
    params,
    sampling: SamplingConfig,
    max_total_tokens: int,
    max_seq_len: int,
    model_id: str,
    policy_version: int = 0,
    slots: int = 16,
    decode_steps: int = 8,
    seed: int = 0,
    episodes: str = "",
) -> ServerState:
    """A server over a policy: ``slots`` KV rows of the episode budget each; a request whose
    context and ``max_tokens`` exceed ``max_total_tokens`` is refused
    (``context_length_exceeded``), where the rollout driver ends an episode; ``episodes``:
    a file every ended session's episode is appended to (``sessions.EpisodeFile``)."""
    backend = SlotBackend(
        graphdef,
        params,
        sampling,
        slots=slots,
        capacity=pool_capacity(max_total_tokens, max_seq_len),
        decode=chat.decode,
        pad_id=chat.pad_id,
        decode_steps=decode_steps,
        seed=seed,
        version=policy_version,
        grammar=lambda: GrammarTable(
            token_texts(chat.tokenizer, model_config(graphdef).vocab_size), chat.stop_ids
        ),
    )
    return ServerState(
        backend=backend,
        renderer=Renderer(chat),
        model_id=model_id,
        policy_version=policy_version,
        max_context=max_total_tokens,
        store=SessionStore(out=EpisodeFile(episodes) if episodes else None),
    )


def state_for_run(run, *, model_id: str, params=None, **options) -> ServerState:
    """``build_state`` over a built run (``jaxagent.train.run.build_run``): its chat, model,
    episode budget and the rollout's own sampling settings (``run.sampler.sampling``);
    ``params`` default to the run's; ``options``: ``build_state``'s policy_version, slots,
    decode_steps, seed, episodes."""
    return build_state(
        chat=run.chat,
        graphdef=run.graphdef,
        params=run.params if params is None else params,
        sampling=run.sampler.sampling,
        max_total_tokens=run.budget.max_total_tokens,
        max_seq_len=run.model_config.max_seq_len,
        model_id=model_id,
        **options,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    """uvicorn serving ``state`` on ``host:port`` in a daemon thread (``close`` stops it)."""

    def __init__(self, state: ServerState, host: str = "127.0.0.1", port: int | None = None):
        import uvicorn

        self.state, self.host, self.port = state, host, port or free_port()
        config = uvicorn.Config(
            create_app(state), host=host, port=self.port, log_level="warning", lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, name="jaxagent-serve-http", daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the server did not start on {host}:{self.port}")
            time.sleep(0.02)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.state.backend.close()
        if self.state.store.out is not None:
            self.state.store.out.close()


def serve(state: ServerState, host: str, port: int) -> None:
    """Serve in the foreground until interrupted. Ctrl-C (SIGINT) or SIGTERM stops taking
    connections, lets the requests under way finish (a second Ctrl-C cuts them off) and then
    raises the signal again, as uvicorn's own ``Server`` does: SIGINT reaches the caller as
    ``KeyboardInterrupt`` (``jaxagent serve`` exits 130 with one line; ``uvicorn.run`` would
    swallow it and return as if the server had ended normally)."""
    import logging

    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # uvicorn's shutdown lines ("Shutting down", "Finished server process") would
            # bury the one line the command prints about what was kept
            logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
            super().handle_exit(sig, frame)

    state.backend.wait_ready()
    config = uvicorn.Config(
        create_app(state), host=host, port=port, log_level="info", lifespan="off"
    )
    try:
        _Server(config).run()
    finally:
        state.backend.close()
