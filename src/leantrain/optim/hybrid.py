"""Several optimizers over disjoint parameters, seen as one torch Optimizer (Muon + AdamW).

Schedulers, gradient clipping and Accelerate only need ``param_groups``, ``state``, ``step``, ``zero_grad`` and
``state_dict``/``load_state_dict``: the groups and state are views of the parts' own (a scheduler that changes
``group["lr"]`` changes the part's group), and the state dict is the parts' state dicts side by side.
"""

from __future__ import annotations

import torch


class CombinedOptimizer(torch.optim.Optimizer):
    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        if not optimizers:
            raise ValueError("CombinedOptimizer needs at least one optimizer")
        self.optimizers = list(optimizers)
        params = [p for o in self.optimizers for g in o.param_groups for p in g["params"]]
        if len({id(p) for p in params}) != len(params):
            raise ValueError("CombinedOptimizer: a parameter belongs to more than one optimizer")
        self._ready = False
        super().__init__(params, {})  # sets up the hooks; the groups stay the parts' own (add_param_group below)
        self._ready = True

    @property
    def param_groups(self) -> list[dict]:  # the parts' own group dicts, so lr changes reach them
        return [g for o in self.optimizers for g in o.param_groups]

    @param_groups.setter
    def param_groups(self, _value) -> None:  # the base __init__ assigns a list of its own: ignored
        pass

    @property
    def state(self) -> dict:
        """A merged view (built on each access; the per-parameter dicts are the parts' own). Not a ChainMap:
        its lookups would create empty entries in the parts' defaultdicts."""
        return {p: s for o in self.optimizers for p, s in o.state.items()}

    @state.setter
    def state(self, _value) -> None:
        pass

    def add_param_group(self, param_group: dict) -> None:
        if not self._ready:
            return  # called by the base __init__: the parts already hold the groups
        raise NotImplementedError("add a parameter group to one of CombinedOptimizer.optimizers instead")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for o in self.optimizers:
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        parts = state_dict["optimizers"]
        if len(parts) != len(self.optimizers):
            raise ValueError(f"state dict has {len(parts)} optimizers, this CombinedOptimizer {len(self.optimizers)}")
        for o, s in zip(self.optimizers, parts):
            o.load_state_dict(s)

    def __repr__(self) -> str:
        return f"CombinedOptimizer({', '.join(type(o).__name__ for o in self.optimizers)})"
