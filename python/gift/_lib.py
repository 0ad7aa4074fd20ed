"""
gift._lib: the ctypes layer over libgiftclient (client/include/gift/client.h).

Only this module touches ctypes. It finds the shared library, declares the
prototypes and the two structs, and turns negative return codes into
GiftError exceptions carrying gift_strerror's sentence and the code.

_TensorDesc must match gift_tensor_desc_t field for field (the C side reads
as many bytes as its size field says); tests/python/test_binding.py compares
its size and offsets with the header, compiled.

The library is found, in order:
  1. at $GIFT_LIBRARY, the path of libgiftclient.so.0 (giftrun sets it to the
     library installed beside it, when unset);
  2. next to this package (gift/libgiftclient.so.0), for a copy shipped with it;
  3. in the build folders of the source tree this package sits in
     (build*/client/libgiftclient.so.0), when it runs from python/;
  4. through the system loader: libgiftclient.so.0 on LD_LIBRARY_PATH or in
     ldconfig's cache (an install to /usr, or to /usr/local after ldconfig),
     then ctypes.util.find_library("giftclient").
A package installed with `pip install ./python` runs from site-packages, so
(3) does not apply there: install the library to a system prefix, or set
GIFT_LIBRARY (PREFIX/lib/libgiftclient.so.0 after `cmake --install build
--prefix PREFIX`).
"""
import ctypes
import ctypes.util
import glob
import os

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class GiftError(RuntimeError):
    """An error reported by libgiftclient: .code is the negative code of
    gift_error.h, .message gift_strerror's sentence, .call the C function."""

    def __init__(self, code, call=None, message=None):
        self.code = int(code)
        self.call = call
        self.message = message if message is not None else strerror(code)
        where = f"{call}: " if call else ""
        super().__init__(f"{where}{self.message} (gift error {self.code})")


class _ClientOpts(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("servers", ctypes.c_char_p),
        ("rank", ctypes.c_int),
        ("world_size", ctypes.c_int),
        ("chunk_bytes", ctypes.c_uint64),
        ("timeout_ms", ctypes.c_uint32),
        ("connect_timeout_ms", ctypes.c_uint32),
        ("backoff_max_ms", ctypes.c_uint32),
        ("seed", ctypes.c_uint64),
        ("name", ctypes.c_char_p),
        ("auth_key_file", ctypes.c_char_p),  # None: $GIFT_AUTH_KEY_FILE
        ("run_id", ctypes.c_char_p),  # None: $GIFT_RUN_ID
        ("codec_threads", ctypes.c_int),  # -1: $GIFT_CODEC_THREADS, else 0
    ]


class _TensorDesc(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("name", ctypes.c_char_p),
        ("rows", ctypes.c_uint32),
        ("cols", ctypes.c_uint32),
        ("push_codec", ctypes.c_int),
        ("pull_codec", ctypes.c_int),
        ("fp8_block", ctypes.c_uint32),
        ("geometry", ctypes.c_int),
        ("rank", ctypes.c_uint32),
        ("refresh", ctypes.c_uint32),
        ("error_feedback", ctypes.c_int),
        ("stochastic", ctypes.c_int),
        ("priority", ctypes.c_int),
        ("memory", ctypes.c_int),  # GIFT_MEMORY_HOST (0) or GIFT_MEMORY_CUDA (1)
        ("device", ctypes.c_int),  # the CUDA device ordinal of a GIFT_MEMORY_CUDA tensor
        ("pull_error_feedback", ctypes.c_int),  # the shards keep the pulled mean's residual
        ("transform", ctypes.c_int),  # GIFT_TRANSFORM_NONE (0) or GIFT_TRANSFORM_HADAMARD (1)
    ]


# gift_tensor_desc_t.transform
TRANSFORM_NONE = 0
TRANSFORM_HADAMARD = 1


# gift_tensor_desc_t.memory
MEMORY_HOST = 0
MEMORY_CUDA = 1


class _ClientStats(ctypes.Structure):
    _fields_ = [
        ("frames_out", ctypes.c_uint64),
        ("frames_in", ctypes.c_uint64),
        ("bytes_out", ctypes.c_uint64),
        ("bytes_in", ctypes.c_uint64),
        ("reconnects", ctypes.c_uint64),
        ("replays", ctypes.c_uint64),
        ("epochs_switched", ctypes.c_uint32),
    ]


# void (*gift_op_cb)(gift_op_t *op, int status, void *arg)
OP_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)


def _candidates():
    env = os.environ.get("GIFT_LIBRARY")
    if env:
        yield env
        return
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libgiftclient.so.0")
    if os.path.exists(here):
        yield here
    for pattern in ("build/client/libgiftclient.so*", "build*/client/libgiftclient.so*"):
        for p in sorted(glob.glob(os.path.join(_REPO, pattern))):
            if not p.endswith(".a"):
                yield p
    yield "libgiftclient.so.0"  # the system loader: LD_LIBRARY_PATH, ldconfig's cache
    found = ctypes.util.find_library("giftclient")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError(
        "gift: cannot load libgiftclient; build it (cmake --build build), or set "
        "GIFT_LIBRARY to its path (PREFIX/lib/libgiftclient.so.0 after cmake --install). "
        "Tried: " + ("; ".join(tried) or "nothing found"))


lib, path = _load()

_P = ctypes.c_void_p
_proto = {
    "gift_version": (ctypes.c_char_p, []),
    "gift_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "gift_client_open": (ctypes.c_int, [ctypes.POINTER(_ClientOpts), ctypes.POINTER(_P)]),
    "gift_client_close": (None, [_P]),
    "gift_declare": (ctypes.c_int, [_P, ctypes.POINTER(_TensorDesc), ctypes.c_size_t]),
    "gift_push": (ctypes.c_int, [_P, ctypes.c_uint32, ctypes.c_uint64, _P, OP_CB, _P,
                                 ctypes.POINTER(_P)]),
    "gift_pull": (ctypes.c_int, [_P, ctypes.c_uint32, ctypes.c_uint64, _P, OP_CB, _P,
                                 ctypes.POINTER(_P)]),
    "gift_push_pull": (ctypes.c_int, [_P, ctypes.c_uint32, ctypes.c_uint64, _P, _P, OP_CB, _P,
                                      ctypes.POINTER(_P)]),
    "gift_sketch_inputs": (ctypes.c_int, [_P, ctypes.c_uint32, ctypes.c_uint64, _P,
                                          ctypes.c_uint32]),
    "gift_op_wait": (ctypes.c_int, [_P]),
    "gift_op_test": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_int)]),
    "gift_op_free": (None, [_P]),
    "gift_client_stats": (None, [_P, ctypes.POINTER(_ClientStats)]),
    "gift_client_last_error": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_size_t]),
}
for _name, (_res, _args) in _proto.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args

# A NULL callback for the op functions.
NULL_CB = ctypes.cast(None, OP_CB)


def strerror(code):
    """gift_strerror(code) as a str."""
    return lib.gift_strerror(int(code)).decode("utf-8", "replace")


def check(rc, call):
    """Returns rc when it is >= 0, else raises GiftError(rc)."""
    if rc < 0:
        raise GiftError(rc, call)
    return rc


def last_error(h=None):
    """gift_client_last_error(h) as a str: what explained the client's last
    failure (the shard, its address, the numbers); with h None, the calling
    thread's last failed gift_client_open. "" when there is nothing."""
    buf = ctypes.create_string_buffer(512)
    lib.gift_client_last_error(h, buf, len(buf))
    return buf.value.decode("utf-8", "replace")


def version():
    return lib.gift_version().decode()
