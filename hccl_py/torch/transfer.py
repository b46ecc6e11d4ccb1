"""``from torch_npu.contrib import transfer_to_npu``: CUDA code run on the npu cards unchanged, as
torch_npu's own ``transfer_to_npu`` maps it on an Ascend server.

After :func:`transfer_to_npu`:

- ``torch.cuda`` is ``torch.npu`` (hccl_py/torch/npu.py); its functions take "cuda" devices too;
- ``torch.device("cuda:1")``, ``torch.device("cuda", 1)``, ``torch.device(type="cuda")`` are npu
  devices (``torch.device`` stays a class for ``isinstance`` and annotations), so is
  ``with torch.device("cuda"):``;
- "cuda" device arguments become "npu" wherever a device is taken: factories' ``device=``,
  ``Tensor.to``/``new_*``, ``Module.to``/``to_empty``, ``.cuda()``, ``torch.load(map_location=)``
  (a string, a device or a dict), ``torch.Generator``, ``torch.Stream``, ``torch.Event``,
  ``torch.autocast``/``torch.amp.autocast``, ``torch.set_default_device``, ``torch.fft``'s
  ``fftfreq``/``rfftfreq``, ``torch.get_device_module``, ``init_device_mesh``;
- "nccl" becomes "hccl" in ``init_process_group``/``new_group`` (and their ``device_id``).

An int device needs nothing: torch takes it as the current accelerator's, the npu.

Example (a CUDA script, unchanged but for the first two lines)::

    import torch_npu
    from torch_npu.contrib import transfer_to_npu
    device = torch.device(f"cuda:{rank}")     # npu:<rank>
    torch.cuda.set_device(device)
"""

from __future__ import annotations

import functools
import sys

import torch
import torch.distributed as dist
import torch.overrides
import torch.utils._device

from . import install as _install
from . import npu as _npu

_FACTORIES = (
    "tensor",
    "as_tensor",
    "asarray",
    "zeros",
    "ones",
    "empty",
    "empty_permuted",
    "full",
    "rand",
    "randn",
    "randint",
    "arange",
    "linspace",
    "logspace",
    "eye",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "rand_like",
    "randn_like",
    "randint_like",
    "randperm",
    "range",
    "normal",
    "empty_strided",
    "scalar_tensor",
    "tril_indices",
    "triu_indices",
    "frombuffer",
    "from_file",
    "load",
    "hann_window",
    "hamming_window",
    "bartlett_window",
    "blackman_window",
    "kaiser_window",
    "sparse_coo_tensor",
    "sparse_csr_tensor",
    "sparse_csc_tensor",
    "sparse_bsr_tensor",
    "sparse_bsc_tensor",
    "sparse_compressed_tensor",
    "set_default_device",
    "get_device_module",
)
_FFT_FACTORIES = ("fftfreq", "rfftfreq")
_TENSOR_METHODS = ("to", "new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros")
_DEVICE_KWARGS = ("device", "device_type", "map_location", "device_id", "type")
_C_DEVICE = torch.device  # the real class, kept before torch.device becomes the mapping one


def _is_cuda(value) -> bool:
    if isinstance(value, _C_DEVICE):
        return value.type == "cuda"
    return isinstance(value, str) and value.split(":", 1)[0].strip() == "cuda"


def _as_npu(value):
    """ "cuda[:N]" / a cuda torch.device as the same npu device (a dict of them, as ``map_location``
    takes, key and value); anything else as it is."""
    if isinstance(value, dict):
        return {_as_npu(k): _as_npu(v) for k, v in value.items()}
    if not _is_cuda(value):
        return value
    if isinstance(value, _C_DEVICE):
        return _C_DEVICE("npu", value.index) if value.index is not None else _C_DEVICE("npu")
    return value.replace("cuda", "npu", 1)


def _on_npu(fn):
    """``fn`` with 'cuda' device arguments (keywords, and positional strings or devices) made 'npu'."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for name in _DEVICE_KWARGS:
            if name in kwargs:
                kwargs[name] = _as_npu(kwargs[name])
        if any(_is_cuda(a) or isinstance(a, dict) for a in args):
            args = tuple(_as_npu(a) for a in args)
        return fn(*args, **kwargs)

    wrapper.__hccl_py_transfer__ = True
    return wrapper


class _MappedType(type):
    """The metaclass of a stand-in for a torch C type (``torch.device``, ``torch.Generator``, ...)
    whose constructor maps cuda onto npu: ``isinstance``/``issubclass`` see the real type, so
    ``isinstance(x, torch.device)`` stays right for devices made before or after."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, cls.__wrapped__)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, cls.__wrapped__)

    def __getattr__(cls, name):
        return getattr(cls.__wrapped__, name)


def _mapped_type(real: type) -> type:
    """A stand-in for the C type ``real`` whose construction maps 'cuda' device arguments onto npu
    and returns a ``real`` object (C types cannot be subclassed or have their constructor replaced)."""
    construct = _on_npu(real)

    def __new__(cls, *args, **kwargs):
        return construct(*args, **kwargs)

    namespace = {"__new__": __new__, "__wrapped__": real, "__doc__": real.__doc__, "__module__": real.__module__}
    stand_in = _MappedType(real.__name__, (), namespace)
    stand_in.__qualname__ = real.__qualname__
    return stand_in


def _to_hccl(name):
    return name.replace("nccl", "hccl") if isinstance(name, str) else name


def _nccl_to_hccl(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _to_hccl(kwargs["backend"])
        if "device_id" in kwargs:
            kwargs["device_id"] = _as_npu(kwargs["device_id"])
        args = tuple(_to_hccl(a) if isinstance(a, str) and "nccl" in a else a for a in args)
        return fn(*args, **kwargs)

    wrapper.__hccl_py_transfer__ = True
    return wrapper


def _cuda(self, device=None, non_blocking: bool = False, **kwargs):
    """tensor.cuda() / module.cuda() under transfer_to_npu: .npu()."""
    return self.npu(_as_npu(device)) if device is not None else self.npu()


def _autocast_on_npu(autocast: type) -> None:
    """``torch.autocast("cuda")`` (one class, also ``torch.amp.autocast``) autocasts on the npu."""
    init = autocast.__init__
    if getattr(init, "__hccl_py_transfer__", False):
        return

    @functools.wraps(init)
    def __init__(self, device_type, *args, **kwargs):
        init(self, _as_npu(device_type), *args, **kwargs)

    __init__.__hccl_py_transfer__ = True
    autocast.__init__ = __init__


def _freeze_torch_tables() -> None:
    """Build, before the factories are wrapped, torch's cached tables of its own functions: torch
    fills them on first use and compares by identity against the functions a mode sees (always
    the originals). Built after the wrapping, ``with torch.device("meta"):`` would no longer see
    ``torch.empty`` as a factory, and FSDP2's deferred init would build on the CPU."""
    torch.utils._device._device_constructors()
    torch.overrides.get_ignored_functions()
    torch.overrides.get_default_nowrap_functions()
    torch.overrides._get_tensor_methods()


_patched = False


def transfer_to_npu() -> None:
    """What ``from torch_npu.contrib import transfer_to_npu`` does here (see the module doc)."""
    global _patched
    _install.install()
    if _patched:
        return
    _patched = True
    _freeze_torch_tables()
    torch.cuda = sys.modules[_npu.__name__]
    for name in _FACTORIES:
        if hasattr(torch, name):
            setattr(torch, name, _on_npu(getattr(torch, name)))
    for name in _FFT_FACTORIES:
        setattr(torch.fft, name, _on_npu(getattr(torch.fft, name)))
    for name in ("device", "Generator", "Stream", "Event"):
        setattr(torch, name, _mapped_type(getattr(torch, name)))
    _autocast_on_npu(torch.amp.autocast_mode.autocast)
    for name in _TENSOR_METHODS:
        setattr(torch.Tensor, name, _on_npu(getattr(torch.Tensor, name)))
    torch.Tensor.cuda = _cuda
    torch.nn.Module.cuda = _cuda
    torch.nn.Module.to = _on_npu(torch.nn.Module.to)
    torch.nn.Module.to_empty = _on_npu(torch.nn.Module.to_empty)
    dist.init_process_group = _nccl_to_hccl(dist.init_process_group)
    dist.new_group = _nccl_to_hccl(dist.new_group)
    dist.is_nccl_available = lambda: True
    _npu.patch_when_imported("torch.distributed.device_mesh", _device_mesh_on_npu)


def _device_mesh_on_npu(module) -> None:
    module.init_device_mesh = _on_npu(module.init_device_mesh)
