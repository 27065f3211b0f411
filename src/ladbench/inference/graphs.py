"""A step of fixed shapes captured once as a CUDA graph and replayed (``--decode graphs``).

An eager decode step of a 3B model launches over a thousand kernels, one by one from Python,
and on a GPU it waits on those launches, not on the arithmetic (docs/performance.md: a step of about 26 ms on
an H200 where reading the weights takes about 1.3 ms). A CUDA graph records the kernels of one
call and replays them with a single launch. Unlike ``torch.compile`` (``--decode static``'s
``reduce-overhead`` mode), nothing is fused or generated: a replay runs the very kernels of the
eager step, so its results are the eager step's, and there is no compilation to wait for.

What a graph needs of the step (the static-shape ring of :mod:`ladbench.inference.decode` is
made so): the same shapes every call, tensors at fixed addresses for everything it reads or
writes besides its inputs, no read back to the host, and nothing on the host that changes from
call to call and decides what it launches (the ring's step traces as one graph with
``fullgraph=True``, which would break on either; tests/test_decode.py).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch

log = logging.getLogger(__name__)

#: ``capture(step, inputs) -> (first, replay, output)``: run ``step(*inputs)`` once as it is (its
#: result ``first``), then record it; ``replay()`` reruns the record on whatever ``inputs`` then
#: hold and leaves its result in ``output``. Raises :class:`CaptureFailed` where only the record failed.
Capture = Callable[[Callable[..., torch.Tensor], Sequence[torch.Tensor]],
                   tuple[torch.Tensor, Callable[[], Any], torch.Tensor]]


class CaptureFailed(RuntimeError):
    """The step ran, but recording it as a graph did not (an operation a graph cannot hold)."""


def capture_on(device: torch.device) -> Capture | None:
    """How a step on ``device`` is captured: CUDA graphs on a GPU; None elsewhere (the CPU has no
    graphs: the step runs as it is)."""
    return capture_cuda_graph if torch.device(device).type == "cuda" else None


def capture_cuda_graph(step: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor]
                       ) -> tuple[torch.Tensor, Callable[[], Any], torch.Tensor]:
    """torch's recipe: one eager run on a side stream (a first run's lazy set-up, such as a
    library handle or a kernel's plan for a new shape, cannot happen inside a capture), then the
    capture. ``thread_local``: another thread's CUDA calls meanwhile (a data loader pinning host
    memory) are left alone rather than failing the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        first = step(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    first.record_stream(torch.cuda.current_stream())    # read there next: not reused before it is
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            output = step(*inputs)
    except RuntimeError as exc:
        lines = str(exc).strip().splitlines()
        raise CaptureFailed(lines[-1] if lines else type(exc).__name__) from exc
    return first, graph.replay, output


class GraphedStep:
    """``step(*inputs)`` (tensors of the same shapes every call) captured on its first call and
    replayed on the next ones: the inputs are copied into the tensors the record reads, and the
    result is the record's output tensor, overwritten by the next replay (read it before the
    next call). If the capture fails the step runs as it is from then on, said in one warning.
    ``on_capture()`` is called once a record is made (the caller's count)."""

    def __init__(self, step: Callable[..., torch.Tensor], capture: Capture,
                 on_capture: Callable[[], None] = lambda: None) -> None:
        self.step, self.capture, self.on_capture = step, capture, on_capture
        self.inputs: list[torch.Tensor] | None = None
        self.replay: Callable[[], Any] | None = None
        self.output: torch.Tensor | None = None
        self.failed: str | None = None          # why the capture failed (then: eager)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if self.failed is not None:
            return self.step(*inputs)
        if self.replay is None:
            return self._first(inputs)
        for held, given in zip(self.inputs, inputs):
            held.copy_(given)
        self.replay()
        return self.output

    def _first(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        self.inputs = [x.clone() for x in inputs]          # the record reads these addresses
        try:
            first, self.replay, self.output = self.capture(self.step, self.inputs)
        except CaptureFailed as exc:
            self.failed = str(exc)
            log.warning("the static shapes' decode step could not be captured as a CUDA graph (%s): it runs "
                        "eagerly", self.failed)
            return self.step(*inputs)
        self.on_capture()
        return first
