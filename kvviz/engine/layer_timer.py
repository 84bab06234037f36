"""The time each decoder layer of a model takes in a forward, measured with forward hooks (the decode loop's per-layer
times)."""

from __future__ import annotations

import time

import torch

from kvviz.engine.geometry import Geometry


def decoder_layers(model) -> list[torch.nn.Module]:
    """The model's decoder layers, in order: the ModuleList as long as the layer count."""
    n_layers = Geometry.of(model.config, model.dtype).num_layers
    owner = model.get_decoder() if model.config.is_encoder_decoder else model  # not an encoder's layers
    for module in owner.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n_layers:
            return list(module)
    return []


class LayerTimer:
    """Forward hooks that time every decoder layer.

    On the CPU the layers run synchronously, so wall time around each layer is honest. On CUDA
    kernels run asynchronously, so CUDA events are recorded around each layer and read once the
    step has synchronised. Inside a torch.compile'd forward hooks would be traced into the graph
    and time nothing real, so a compiled run is created with `enabled=False` and reports no
    layer times.
    """

    def __init__(self, model, device: torch.device, enabled: bool = True):
        self.layers = decoder_layers(model) if enabled else []
        self.cuda = device.type == "cuda"
        self.starts: list = [None] * len(self.layers)
        self.ends: list = [None] * len(self.layers)
        self.handles = []
        for i, layer in enumerate(self.layers):
            self.handles.append(layer.register_forward_pre_hook(self._pre(i)))
            self.handles.append(layer.register_forward_hook(self._post(i)))

    def _now(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _pre(self, i):
        def hook(module, args):
            self.starts[i] = self._now()

        return hook

    def _post(self, i):
        def hook(module, args, output):
            self.ends[i] = self._now()

        return hook

    def collect(self) -> list[float | None]:
        times = []
        for start, end in zip(self.starts, self.ends, strict=True):
            if start is None or end is None:
                times.append(None)
            elif self.cuda:
                times.append(start.elapsed_time(end))
            else:
                times.append((end - start) * 1000.0)
        self.starts = [None] * len(self.layers)
        self.ends = [None] * len(self.layers)
        return times

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
