"""Double-buffered host-to-device streaming of fixed-shape batches.

``DevicePrefetcher`` pulls host batches (pytrees of numpy arrays) from an iterator on a
background thread and starts their transfer with ``jax.device_put`` (asynchronous), keeping up
to ``depth`` batches in flight: while the consumer works on batch k, batch k+1 is already
moving to the device. Every batch must have the shapes and dtypes of the first one (fixed-shape
device buffers; a change would recompile every consumer), otherwise a readable error is raised
in the consumer. float64 leaves are cast to float32 on the host (JAX runs without x64).

It is for user loops that stream fixed-shape array batches (``ArrayEnvPool`` observations,
pre-collated token data) into a jitted step. The trainer does not use it: its batches are
built once per iteration after the rollout ends (``pack_episodes``), so there is nothing to
overlap a transfer with.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import jax
import numpy as np

_END = object()


def _host_prepare(batch: Any) -> Any:
    def cast(x):
        x = np.asarray(x)
        return x.astype(np.float32) if x.dtype == np.float64 else x

    return jax.tree.map(cast, batch)


def _signature(batch: Any):
    leaves, treedef = jax.tree.flatten(batch)
    return treedef, tuple((np.shape(x), np.asarray(x).dtype.str) for x in leaves)


class DevicePrefetcher(Iterator):
    """Iterate device copies of ``batches``, with ``depth`` transfers in flight.

    Args:
      batches: an iterable of pytrees of numpy arrays (all with the same shapes and dtypes).
      sharding: a ``jax.sharding.Sharding`` (or pytree of them) for ``jax.device_put``;
        default: the first local device.
      depth: device batches queued ahead of the consumer (the producer may prepare one more);
        1 is classic double buffering (one in use, one arriving).
    """

    def __init__(self, batches: Iterable[Any], sharding=None, depth: int = 1):
        if depth < 1:
            raise ValueError(f"DevicePrefetcher depth={depth} must be >= 1 (1 = double buffering)")
        self._source = iter(batches)
        self._sharding = sharding if sharding is not None else jax.local_devices()[0]
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._signature = None
        self.pulled = 0  # host batches taken from the source so far (for tests and metrics)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="device-prefetch", daemon=True)
        self._thread.start()

    def _run(self):
        try:
            for batch in self._source:
                if self._stop.is_set():
                    return
                self.pulled += 1
                host = _host_prepare(batch)
                sig = _signature(host)
                if self._signature is None:
                    self._signature = sig
                elif sig != self._signature:
                    raise ValueError(
                        f"batch {self.pulled - 1} has shapes/dtypes {sig[1]} but the device "
                        f"buffers were fixed by batch 0 as {self._signature[1]}; pad to the "
                        "same bucket (jaxagent.buckets) before prefetching"
                    )
                self._put(jax.device_put(host, self._sharding))
            self._put(_END)
        except BaseException as exc:  # re-raised in the consumer
            self._put(exc)

    def _put(self, item):
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __next__(self):
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
