"""Message (de)serialization: pickle protocol 5 with out-of-band buffers.

Why two picklers: plain ``pickle`` is 5-20x faster than cloudpickle for the
small messages that make up most traffic, but it cannot ship lambdas or
classes defined in ``__main__``. We try the fast path first and fall back to
cloudpickle only when the message needs it.

Large buffers (numpy arrays natively, CPU torch tensors and big ``bytes``
through our reducers) leave the pickle stream as out-of-band buffers, so the
transport can hand them to ``sendmsg`` untouched.
"""

from __future__ import annotations

import io
import os
import pickle
import sys

import cloudpickle
from ..errors import HpcmeshError

PROTOCOL = 5
#: bytes/bytearray arguments at least this large travel out of band.
OOB_THRESHOLD = 64 * 1024


class SerializationError(HpcmeshError, TypeError):
    """An argument or result could not be pickled; names what and why."""


class _NeedsCloudpickle(Exception):
    pass


def _rebuild_tensor(buf, dtype, shape, requires_grad):
    import torch
    flat = torch.frombuffer(buf, dtype=torch.uint8) if len(buf) else torch.empty(0, dtype=torch.uint8)
    t = flat.view(dtype).reshape(shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _reduce_tensor(t):
    """CPU dense tensors travel as one raw out-of-band buffer instead of torch.save bytes."""
    torch = sys.modules["torch"]
    if type(t) is not torch.Tensor or t.device.type != "cpu" or t.is_sparse or t.is_quantized:
        return NotImplemented
    data = t.detach().contiguous()
    try:
        raw = data.reshape(-1).view(torch.uint8).numpy() if data.numel() else bytearray()
    except (RuntimeError, TypeError):   # no numpy beside torch: torch's own pickling still works
        return NotImplemented
    return _rebuild_tensor, (pickle.PickleBuffer(raw), data.dtype, tuple(data.shape), t.requires_grad)


def _torch_tensor_type():
    """torch.Tensor if torch is imported *and initialized* (another thread may be halfway
    through ``import torch``), else None; never imports torch itself."""
    return getattr(sys.modules.get("torch"), "Tensor", None)


class _BigBytes:
    """Marks a large bytes argument so it is pickled out of band (pickle never offers
    ``bytes`` to ``reducer_override``)."""

    __slots__ = ("data",)

    def __init__(self, data):
        self.data = data

    def __reduce_ex__(self, protocol):
        if protocol < 5:        # (a copy, a pickle of an older protocol): in the stream
            return (bytearray if isinstance(self.data, bytearray) else bytes), \
                (bytes(self.data),)
        if isinstance(self.data, bytearray):
            return bytearray, (pickle.PickleBuffer(self.data),)
        # Over a connection the frame decoder hands a read-only buffer back as ``bytes``
        # (framing.READONLY_FLAG), read in place; ``bytes()`` of a bytes object is that
        # same object, so the payload is not copied again.
        return bytes, (pickle.PickleBuffer(self.data),)


def out_of_band(data: bytes | bytearray | memoryview):
    """``data`` to pickle (protocol 5) as an out-of-band buffer when it is large: inside a
    message it travels as one of the frame's buffers, not copied into the pickle stream,
    and unpickles as ``bytes`` read in place. Small data is returned as it is (a
    memoryview, which pickle refuses, as ``bytes``)."""
    if memoryview(data).nbytes >= OOB_THRESHOLD:
        return _BigBytes(data)
    return data if isinstance(data, (bytes, bytearray)) else bytes(data)


def _wrap_big(obj):
    """Wrap large bytes found at the top levels of args/kwargs containers."""
    t = type(obj)
    if (t is bytes or t is bytearray) and len(obj) >= OOB_THRESHOLD:
        return _BigBytes(obj)
    if t is tuple or t is list:
        if any((type(x) is bytes or type(x) is bytearray) and len(x) >= OOB_THRESHOLD
               or type(x) in (tuple, list, dict) for x in obj):
            return t(_wrap_big(x) for x in obj)
    elif t is dict:
        if any((type(v) is bytes or type(v) is bytearray) and len(v) >= OOB_THRESHOLD
               or type(v) in (tuple, list, dict) for v in obj.values()):
            return {k: _wrap_big(v) for k, v in obj.items()}
    return obj


_by_value_modules: set[str] = {"__main__"}
_checked_modules: dict[str, bool] = {}


def _install_roots() -> tuple[str, ...]:
    import site
    import sysconfig
    roots = [*site.getsitepackages(), site.getusersitepackages(),
             sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]]
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


def is_installed(module_name: str) -> bool:
    """Can a worker import this module the normal way: stdlib, site-packages, or an
    editable install? (A script's ``__main__`` or a test file next to it cannot.)

    Cheap on purpose: asking importlib.metadata scans every installed distribution
    (~0.1 s), which would land on the first spawn of every program."""
    top = module_name.split(".")[0]
    if top == "__main__":
        return False
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return True
    mod = sys.modules.get(top)
    if mod is not None:
        origin = getattr(mod, "__file__", None)
        paths = [origin] if origin else list(getattr(mod, "__path__", []) or [])
    else:
        import importlib.util
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return False
        paths = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
    roots = _install_roots()
    if any(os.path.realpath(p).startswith(roots) for p in paths):
        return True
    for finder in sys.meta_path:      # setuptools' editable installs register a finder
        owner = finder if isinstance(finder, type) else type(finder)
        if owner.__module__.startswith("__editable__"):
            try:
                if finder.find_spec(top, None) is not None:
                    return True
            except Exception:  # noqa: BLE001 - a foreign finder must not break pickling
                continue
    return False


def ship_module_by_value(module_name: str) -> None:
    """Make code from a module that workers cannot import (a script, a test file) travel
    by value, for the actor class itself and for instances of its classes in messages."""
    if module_name in _checked_modules:
        return
    installed = is_installed(module_name)
    _checked_modules[module_name] = installed
    if not installed and module_name in sys.modules:
        _by_value_modules.add(module_name)
        try:
            cloudpickle.register_pickle_by_value(sys.modules[module_name])
        except ValueError:
            pass


class _FastPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if getattr(obj, "__module__", None) in _by_value_modules or \
                getattr(type(obj), "__module__", None) in _by_value_modules:
            raise _NeedsCloudpickle
        tensor = _torch_tensor_type()
        if tensor is not None and isinstance(obj, tensor):
            return _reduce_tensor(obj)
        return NotImplemented


class _CloudPickler(cloudpickle.Pickler):
    def reducer_override(self, obj):
        tensor = _torch_tensor_type()
        if tensor is not None and isinstance(obj, tensor):
            r = _reduce_tensor(obj)
            if r is not NotImplemented:
                return r
        return super().reducer_override(obj)


_PLAIN_ATOMS = frozenset({int, float, str, bool, type(None), complex})


def is_plain(obj, depth: int = 0) -> bool:
    """Only builtin atoms, small bytes and small builtin containers of them: the C
    pickler alone is right. (Plain loops, not all(genexpr): this runs on every message.)"""
    t = type(obj)
    if t in _PLAIN_ATOMS:
        return True
    if t is bytes:
        return len(obj) < OOB_THRESHOLD
    if depth > 3:
        return False
    if t is tuple or t is list:
        if len(obj) > 32:
            return False
        for x in obj:
            tx = type(x)
            if tx in _PLAIN_ATOMS:
                continue
            if tx is bytes:
                if len(x) >= OOB_THRESHOLD:
                    return False
            elif not is_plain(x, depth + 1):
                return False
        return True
    if t is dict:
        if len(obj) > 32:
            return False
        for k, v in obj.items():
            if type(k) is not str or (type(v) not in _PLAIN_ATOMS and not is_plain(v, depth + 1)):
                return False
        return True
    return False


_FROZEN_ATOMS = frozenset({int, float, bool, type(None), complex})


def frozen_size(obj, depth: int = 0) -> int:
    """About how many bytes ``obj`` pickles to, if it is made only of immutable builtin
    values (numbers, strings, small bytes, small tuples of them); else -1. Such a message
    can wait in a batch and be pickled with it: nothing can change it meanwhile."""
    t = type(obj)
    if t is bytes:
        n = len(obj)
        return n if n < OOB_THRESHOLD else -1
    if t is str:
        return len(obj)
    if t in _FROZEN_ATOMS:
        return 8
    if t is tuple and depth < 4 and len(obj) <= 32:
        total = 8
        for x in obj:
            n = frozen_size(x, depth + 1)
            if n < 0:
                return -1
            total += n
        return total
    return -1


def dumps_envelope(envelope: tuple) -> bytes:
    """A flat tuple of plain values (message kinds, ids, an already pickled payload)."""
    return pickle.dumps(envelope, PROTOCOL)


def dumps(obj, what: str = "message") -> tuple[bytes, list]:
    """Serialize ``obj``; return (pickle stream, out-of-band buffers)."""
    if is_plain(obj):
        return pickle.dumps(obj, PROTOCOL), []
    obj = _wrap_big(obj)
    buffers: list = []
    f = io.BytesIO()
    try:
        _FastPickler(f, PROTOCOL, buffer_callback=buffers.append).dump(obj)
        return f.getvalue(), buffers
    except (_NeedsCloudpickle, pickle.PicklingError, AttributeError, TypeError):
        pass
    buffers = []
    f = io.BytesIO()
    try:
        _CloudPickler(f, PROTOCOL, buffer_callback=buffers.append).dump(obj)
    except Exception as e:  # noqa: BLE001 - re-raised with what failed
        raise SerializationError(
            f"cannot serialize {what}: {type(e).__name__}: {e}. Arguments and results must be "
            f"picklable (cloudpickle); pass plain data, or open resources inside the actor."
        ) from e
    return f.getvalue(), buffers


def loads(meta, buffers=()):
    return pickle.loads(meta, buffers=buffers)


def loads_batch(meta, count: int) -> list:
    """The ``count`` messages of a batch frame (a pickled list of pickle streams and of
    message tuples pickled with the list)."""
    streams = pickle.loads(meta)
    if type(streams) is not list or len(streams) != count:
        raise pickle.UnpicklingError(f"batch frame announced {count} messages but holds "
                                     f"{len(streams) if type(streams) is list else 'no list'}")
    return [pickle.loads(m) if type(m) is bytes else m for m in streams]


def dumps_by_value(obj) -> bytes:
    """cloudpickle for things sent once (actor classes, bootstrap callables). A class's
    bases travel by value too when their modules cannot be imported by a worker (an actor
    subclassing one from a file next to the script)."""
    classes = obj.__mro__ if isinstance(obj, type) else (obj,)
    for c in classes:
        mod = getattr(c, "__module__", None)
        if mod:
            ship_module_by_value(mod)
    return cloudpickle.dumps(obj, protocol=PROTOCOL)
