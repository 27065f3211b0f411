"""Every logit- and attention-level method as a pure numpy function of cached arrays, in
four modules, one job each: :mod:`~ladbench.methods.settings` (what the methods read
besides the arrays), :mod:`~ladbench.methods.kernels` (the numeric steps),
:mod:`~ladbench.methods.registry` (the methods by name) and :mod:`~ladbench.methods.grids`
(the ablation and sweep rows). Their names are all here."""

from ladbench.methods.grids import *  # noqa: F401,F403
from ladbench.methods.grids import __all__ as _grids
from ladbench.methods.kernels import *  # noqa: F401,F403
from ladbench.methods.kernels import __all__ as _kernels
from ladbench.methods.registry import *  # noqa: F401,F403
from ladbench.methods.registry import __all__ as _registry
from ladbench.methods.settings import *  # noqa: F401,F403
from ladbench.methods.settings import __all__ as _settings

__all__ = [*_settings, *_kernels, *_registry, *_grids]
