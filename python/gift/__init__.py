"""
gift: Python binding of libgiftclient, the worker side of giftd.

    import gift
    c = gift.Client()                       # GIFT_SERVERS, RANK, WORLD_SIZE from the environment
    c.declare([gift.Tensor("w", 256, 512, codec="fp8", geometry=True),
               gift.Tensor("b", 1, 256)])
    c.push_pull(0, step, grad, out).wait()   # out = mean over the workers

Buffers are passed to the C library without copies: a float32, C-contiguous
numpy array or CPU torch tensor of rows*cols elements (any shape). A
gradient that is not contiguous is copied once; an output must be
contiguous. Buffers are kept alive by the returned Op until it completes
and must not be changed before then.

Errors from the C side raise gift.GiftError (a RuntimeError) whose text is
gift_strerror's sentence and whose .code is the negative code of
common/gift_error.h. Arguments the C side cannot check (buffer size, dtype)
raise TypeError or ValueError here.

Threads: one I/O thread per client runs the sockets and the codec (with
codec_threads, the pushes' transform and encode run beside it); callbacks
given to push/pull/push_pull run there, holding the GIL, and must be short.
Calls on one client are serialised by the caller.
"""
import ctypes
import itertools
import os
import sys
import threading
import traceback

from . import _lib
from ._lib import GiftError, strerror
from .policy import parse_metrics, policy_table

__all__ = ["Client", "Tensor", "Op", "GiftError", "strerror", "version", "codec_of",
           "MEMORY_HOST", "MEMORY_CUDA", "TRANSFORM_NONE", "TRANSFORM_HADAMARD", "transform_of",
           "F32", "BF16", "FP8_E4M3", "FP8_E5M2", "NVFP4", "library_path", "policy_table",
           "parse_metrics"]

F32, BF16, FP8_E4M3, FP8_E5M2, NVFP4 = 0, 1, 2, 3, 4
_CODECS = {"f32": F32, "fp32": F32, "bf16": BF16, "fp8": FP8_E4M3, "fp8-e4m3": FP8_E4M3,
           "e4m3": FP8_E4M3, "fp8-e5m2": FP8_E5M2, "e5m2": FP8_E5M2, "nvfp4": NVFP4}
CODEC_NAMES = {F32: "f32", BF16: "bf16", FP8_E4M3: "fp8-e4m3", FP8_E5M2: "fp8-e5m2",
               NVFP4: "nvfp4"}
library_path = _lib.path


def version():
    """libgiftclient's version string."""
    return _lib.version()


def codec_of(c):
    """A codec number from a number or a name (f32, bf16, fp8, fp8-e4m3,
    fp8-e5m2, nvfp4)."""
    if isinstance(c, str):
        try:
            return _CODECS[c.lower()]
        except KeyError:
            raise ValueError(f"unknown codec {c!r}; one of {sorted(_CODECS)}") from None
    return int(c)


MEMORY_HOST, MEMORY_CUDA = _lib.MEMORY_HOST, _lib.MEMORY_CUDA
TRANSFORM_NONE, TRANSFORM_HADAMARD = _lib.TRANSFORM_NONE, _lib.TRANSFORM_HADAMARD
_TRANSFORMS = {"none": TRANSFORM_NONE, "euclidean": TRANSFORM_NONE,
               "hadamard": TRANSFORM_HADAMARD}


def transform_of(t):
    """gift_tensor_desc_t.transform from None, a number or a name (none,
    euclidean, hadamard)."""
    if t is None:
        return TRANSFORM_NONE
    if isinstance(t, str):
        try:
            return _TRANSFORMS[t.lower()]
        except KeyError:
            raise ValueError(f"gift: unknown transform {t!r}; one of "
                             f"{', '.join(_TRANSFORMS)}") from None
    if int(t) not in (TRANSFORM_NONE, TRANSFORM_HADAMARD):
        raise ValueError(f"gift: unknown transform {t!r}")
    return int(t)


def _device_index(device):
    """None for host memory, else the CUDA device ordinal of `device`: None,
    "cpu", "cuda", "cuda:N", an int N, or a torch.device."""
    if device is None:
        return None
    if isinstance(device, int):
        return device
    kind = getattr(device, "type", None)
    index = getattr(device, "index", None)
    if kind is None:
        text = str(device)
        kind, _, idx = text.partition(":")
        index = int(idx) if idx else None
    if kind == "cpu":
        return None
    if kind != "cuda":
        raise ValueError(f"gift: unknown device {device!r} (cpu, cuda, cuda:N or an int)")
    if index is None:
        import torch
        index = torch.cuda.current_device()
    return int(index)


class Tensor:
    """One declared tensor: rows x cols float32 (a 1-D tensor is 1 x n).
    codec sets both directions unless pull_codec is given. device None or
    "cpu": the buffers given for it are host memory; "cuda", "cuda:N", N or
    a torch.device: CUDA device memory (torch CUDA tensors on that device),
    encoded and decoded on the GPU by libgiftclient (gift_tensor_desc_t's
    memory and device; needs a libgiftclient built with CUDA, else declare
    raises GiftError GIFT_ENODEV). The other fields are those of
    gift_tensor_desc_t (0 = the library's default). transform "hadamard"
    (issue 42) sends each row rotated by random signs and an orthonormal
    Walsh-Hadamard transform and rotates the pulled mean back (host memory,
    no geometry)."""

    def __init__(self, name, rows, cols, codec="f32", pull_codec=None, geometry=False, rank=0,
                 refresh=0, fp8_block=0, error_feedback=False, stochastic=False, priority=0,
                 device=None, pull_error_feedback=False, transform=None):
        self.name = str(name)
        self.rows, self.cols = int(rows), int(cols)
        self.push_codec = codec_of(codec)
        self.pull_codec = codec_of(pull_codec if pull_codec is not None else codec)
        self.geometry = bool(geometry)
        self.rank, self.refresh, self.fp8_block = int(rank), int(refresh), int(fp8_block)
        self.error_feedback, self.stochastic = bool(error_feedback), bool(stochastic)
        self.priority = int(priority)
        self.device = _device_index(device)
        self.pull_error_feedback = bool(pull_error_feedback)
        self.transform = transform_of(transform)

    @property
    def hadamard(self):
        return self.transform == TRANSFORM_HADAMARD

    @property
    def memory(self):
        return MEMORY_HOST if self.device is None else MEMORY_CUDA

    @property
    def numel(self):
        return self.rows * self.cols

    def __repr__(self):
        g = " gift" if self.geometry else " hadamard" if self.hadamard else ""
        d = "" if self.device is None else f", cuda:{self.device}"
        return (f"Tensor({self.name!r}, {self.rows}x{self.cols}, "
                f"{CODEC_NAMES.get(self.push_codec, self.push_codec)}{g}{d})")


def _pointer(x, n, writable, what, device=None):
    """(address, keepalive) of x's float32 data, checking n elements. A
    non-contiguous read-only input is copied; a writable one must be
    contiguous. device None: x must be in host memory; else a torch CUDA
    tensor on that device, passed straight through (the caller synchronises
    with its stream, see _sync_cuda)."""
    if hasattr(x, "data_ptr") and hasattr(x, "is_contiguous"):  # torch.Tensor
        if str(x.dtype) != "torch.float32":
            raise TypeError(f"{what}: needs float32, got {x.dtype}")
        if device is None and x.device.type != "cpu":
            raise TypeError(f"{what}: the tensor was declared in host memory, got one on "
                            f"{x.device} (declare it with device=...)")
        if device is not None and (x.device.type != "cuda" or x.device.index != device):
            raise TypeError(f"{what}: the tensor was declared on cuda:{device}, got one on "
                            f"{x.device}")
        if x.numel() != n:
            raise ValueError(f"{what}: {x.numel()} elements for a tensor of {n}")
        if not x.is_contiguous():
            if writable:
                raise ValueError(f"{what}: the output must be contiguous")
            x = x.contiguous()
        return x.data_ptr(), x
    if device is not None:
        raise TypeError(f"{what}: the tensor was declared on cuda:{device}: needs a torch CUDA "
                        f"tensor, got {type(x).__name__}")
    if hasattr(x, "__array_interface__"):  # numpy
        import numpy as np
        if x.dtype != np.float32:
            raise TypeError(f"{what}: needs float32, got {x.dtype}")
        if x.size != n:
            raise ValueError(f"{what}: {x.size} elements for a tensor of {n}")
        if not x.flags.c_contiguous:
            if writable:
                raise ValueError(f"{what}: the output must be C-contiguous")
            x = np.ascontiguousarray(x)
        if writable and not x.flags.writeable:
            raise ValueError(f"{what}: the output is read-only")
        return x.ctypes.data, x
    raise TypeError(f"{what}: needs a float32 numpy array or torch tensor, got {type(x).__name__}")


def _sync_cuda(bufs):
    """libgiftclient reads and writes device buffers on its own CUDA stream
    and does not wait on PyTorch's (gift/client.h, "Device tensors"): finish
    the work of the current stream of every device involved first, so that
    the gradient is written and nothing still touches the output."""
    seen = set()
    for x in bufs:
        dev = getattr(x, "device", None)
        if dev is not None and getattr(dev, "type", None) == "cuda" and dev.index not in seen:
            import torch
            seen.add(dev.index)
            torch.cuda.current_stream(dev).synchronize()


# Operations with a Python callback, by token (the C callback's arg).
_pending = {}
_tokens = itertools.count(1)


def _trampoline(op, status, arg):
    """The C completion callback of every op started with a callback: runs
    on the client's I/O thread. Frees the op, then calls the user's function."""
    entry = _pending.pop(arg, None)
    _lib.lib.gift_op_free(op)
    if entry is None:
        return
    entry._finish(status)


_TRAMPOLINE = _lib.OP_CB(_trampoline)


class Op:
    """An operation in flight. wait() returns once it has completed and
    raises GiftError if it failed; done() tests without waiting. The buffers
    given to the call are held until completion."""

    def __init__(self, call, keep, callback=None, client=None):
        self._client = client  # for gift_client_last_error when it fails
        self._call = call
        self._keep = keep
        self._ptr = None
        self._callback = callback
        self._event = threading.Event() if callback is not None else None
        self.status = None

    def _finish(self, status):  # callback ops only, on the I/O thread
        self.status = status
        self._keep = None
        cb = self._callback
        self._callback = None
        try:
            cb(status)
        except BaseException:  # never unwind into C
            traceback.print_exc(file=sys.stderr)
        finally:
            self._event.set()

    def wait(self):
        """Waits for completion (up to the client's timeout). Returns 0 or
        raises GiftError."""
        if self._event is not None:
            self._event.wait()
        elif self._ptr is not None:
            self.status = _lib.lib.gift_op_wait(self._ptr)
            _lib.lib.gift_op_free(self._ptr)
            self._ptr = None
            self._keep = None
        if self.status is not None and self.status < 0:
            h = getattr(self._client, "_h", None)
            why = _lib.last_error(h) if h is not None and h.value else ""
            raise GiftError(self.status, self._call,
                            _lib.strerror(self.status) + (": " + why if why else ""))
        return 0

    def done(self):
        """True once the operation has completed."""
        if self._event is not None:
            return self._event.is_set()
        if self._ptr is None:
            return True
        st = ctypes.c_int(0)
        if _lib.lib.gift_op_test(self._ptr, ctypes.byref(st)):
            self.status = st.value
            return True
        return False

    def __del__(self):
        if getattr(self, "_ptr", None) is not None:
            _lib.lib.gift_op_free(self._ptr)  # waits for completion first
            self._ptr = None


class Client:
    """A libgiftclient client: gift_client_open with the given options; what
    is left None comes from the environment (GIFT_SERVERS; GIFT_RANK or RANK;
    GIFT_WORLD or WORLD_SIZE; GIFT_RUN_ID for run_id; GIFT_CODEC_THREADS for
    codec_threads: threads beside the I/O thread that transform and encode the
    pushes, 0 to 64, default 0). Use as a context manager or call close()."""

    def __init__(self, servers=None, rank=None, world_size=None, chunk_bytes=0, timeout_ms=0,
                 connect_timeout_ms=0, backoff_max_ms=0, seed=0, name=None, run_id=None,
                 codec_threads=None):
        o = _lib._ClientOpts()
        o.size = ctypes.sizeof(o)
        self._servers = servers.encode() if servers else None
        self._name = name.encode() if name else None
        o.servers = self._servers
        o.rank = -1 if rank is None else int(rank)
        o.world_size = 0 if world_size is None else int(world_size)
        o.chunk_bytes, o.timeout_ms = int(chunk_bytes), int(timeout_ms)
        o.connect_timeout_ms, o.backoff_max_ms = int(connect_timeout_ms), int(backoff_max_ms)
        o.seed, o.name = int(seed), self._name
        self._run_id = run_id.encode() if run_id is not None else None
        o.run_id = self._run_id
        o.codec_threads = -1 if codec_threads is None else int(codec_threads)
        h = ctypes.c_void_p()
        rc = _lib.lib.gift_client_open(ctypes.byref(o), ctypes.byref(h))
        if rc < 0:
            why = _lib.last_error(None)
            raise GiftError(rc, "gift_client_open",
                            _lib.strerror(rc) + (": " + why if why else ""))
        self._h = h
        self.tensors = []

    def close(self):
        """Waits for operations in flight, then closes the client."""
        h, self._h = getattr(self, "_h", None), None
        if h is not None and h.value:
            _lib.lib.gift_client_close(h)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self):
        if self._h is None:
            raise ValueError("gift: the client is closed")
        return self._h

    def declare(self, tensors):
        """Declares the whole list (the same on every rank); tensor i gets id i."""
        tensors = list(tensors)
        arr = (_lib._TensorDesc * len(tensors))()
        names = []
        for d, t in zip(arr, tensors):
            names.append(t.name.encode())
            d.size = ctypes.sizeof(_lib._TensorDesc)
            d.name = names[-1]
            d.rows, d.cols = t.rows, t.cols
            d.push_codec, d.pull_codec = t.push_codec, t.pull_codec
            d.fp8_block, d.geometry, d.rank, d.refresh = t.fp8_block, int(t.geometry), t.rank, \
                t.refresh
            d.error_feedback, d.stochastic, d.priority = int(t.error_feedback), \
                int(t.stochastic), t.priority
            d.memory = t.memory
            d.device = t.device if t.device is not None else 0
            d.pull_error_feedback = int(t.pull_error_feedback)
            d.transform = t.transform
        _lib.check(_lib.lib.gift_declare(self._handle(), arr, len(tensors)), "gift_declare")
        self.tensors = tensors

    def _numel(self, tid):
        if 0 <= tid < len(self.tensors):
            return self.tensors[tid].numel
        return None

    def _device(self, tid):
        if 0 <= tid < len(self.tensors):
            return self.tensors[tid].device
        return None

    def _start(self, call, fn, tid, step, bufs, callback):
        """Runs one of push / pull / push_pull: bufs is [(array, writable)]."""
        n = self._numel(tid)
        ptrs, keep = [], []
        for i, (x, writable) in enumerate(bufs):
            if n is None:  # unknown id: let the C side say so
                ptrs.append(None)
                continue
            p, k = _pointer(x, n, writable, f"{call} tensor {tid} buffer {i}", self._device(tid))
            ptrs.append(p)
            keep.append(k)
        _sync_cuda(keep)
        op = Op(call, keep, callback, self)
        h = ctypes.c_void_p()
        if callback is None:
            rc = fn(self._handle(), tid, step, *ptrs, _lib.NULL_CB, None, ctypes.byref(h))
            _lib.check(rc, call)
            op._ptr = h
            return op
        token = next(_tokens)
        _pending[token] = op
        rc = fn(self._handle(), tid, step, *ptrs, _TRAMPOLINE, ctypes.c_void_p(token),
                ctypes.byref(h))
        if rc < 0:  # the callback never fires
            _pending.pop(token, None)
            raise GiftError(rc, call)
        return op

    def push(self, tid, step, grad, callback=None):
        """gift_push: starts pushing tensor tid's gradient for step. callback,
        if given, is called as callback(status) on the I/O thread. For a
        tensor declared on a CUDA device, grad (and out below) are torch CUDA
        tensors passed straight through; the current stream of their device
        is synchronised first, and once the op completes the library's
        writes to out are done."""
        return self._start("gift_push", _lib.lib.gift_push, tid, step, [(grad, False)], callback)

    def pull(self, tid, step, out, callback=None):
        """gift_pull: starts pulling the mean of tensor tid for step into out."""
        return self._start("gift_pull", _lib.lib.gift_pull, tid, step, [(out, True)], callback)

    def push_pull(self, tid, step, grad, out=None, callback=None):
        """gift_push_pull: push grad, pull the mean into out (default: grad,
        in place)."""
        if out is None:
            out = grad
        return self._start("gift_push_pull", _lib.lib.gift_push_pull, tid, step,
                           [(grad, False), (out, True)], callback)

    def sketch_inputs(self, tid, step, X):
        """gift_sketch_inputs: X holds n rows of the layer's inputs (n x cols
        float32); returns once X is no longer needed."""
        cols = self.tensors[tid].cols if 0 <= tid < len(self.tensors) else None
        n = 0
        if cols is not None:
            total = X.numel() if hasattr(X, "numel") and callable(X.numel) else X.size
            if total % cols:
                raise ValueError(f"gift_sketch_inputs: {total} values are not rows of {cols}")
            n = total // cols
            p, keep = _pointer(X, total, False, "gift_sketch_inputs X", self._device(tid))
            _sync_cuda([keep])
        else:
            p, keep = None, None
        _lib.check(_lib.lib.gift_sketch_inputs(self._handle(), tid, step, p, n),
                   "gift_sketch_inputs")
        del keep

    def stats(self):
        """The client's counters as a dict (bytes_out/in are wire bytes)."""
        s = _lib._ClientStats()
        _lib.lib.gift_client_stats(self._handle(), ctypes.byref(s))
        return {f: getattr(s, f) for f, _ in s._fields_}
