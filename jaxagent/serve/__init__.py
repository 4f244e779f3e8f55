"""An OpenAI-compatible policy server that records exact token trajectories.

``jaxagent serve CONFIG [--checkpoint RUN_DIR]`` puts a policy behind ``POST
/v1/chat/completions`` so an existing agent harness (the ``openai`` client, LangChain, its own
loop) runs unchanged against it, and turns each conversation into a training episode with the
exact ids, loss mask and log-probs the built-in driver records.

- ``protocol``: the wire format (request checking, OpenAI error bodies, responses, chunks);
- ``render``: messages to token ids, as the rollout driver renders them;
- ``sessions``: per-conversation token trajectories, divergence, episodes;
- ``backend``: the device thread (continuous batching over KV slots, KV kept per session);
- ``app``: the ASGI app (Starlette); ``server``: wiring and uvicorn.
"""
