"""
gift.torch: PyTorch integration of libgiftclient.

Two ways in, sharing one GiftState (the client, the declared tensor list, the
step counter and the sketch hooks):

  DDP (gloo process group for DDP's own set-up; gradients go through giftd):
      state = gift.torch.GiftState(model, comm="fp8-gift")
      ddp = DistributedDataParallel(model)
      ddp.register_comm_hook(state, gift.torch.comm_hook)

  No DDP:
      reducer = gift.torch.GiftReducer(model, comm="nvfp4-gift")
      loss.backward(); reducer.synchronize(); opt.step()

Every parameter that requires a gradient is declared as one giftd tensor
(rows = shape[0], cols = the rest; 1-D: 1 x n), in named_parameters()
order, so every rank declares the same list. A Policy chooses each tensor's
codec and whether it is sent in the GIFT geometry: by default GIFT on the
weights of nn.Linear layers with at least min_cols inputs and min_numel
elements, Euclidean elsewhere; `overrides` (fnmatch pattern -> fields)
changes any of it per name. For each GIFT tensor a forward hook on its
nn.Linear submits the layer's inputs for sketching on refresh steps
(training mode, gradients enabled, once per step).

Steps: the state counts steps from start_step; the DDP hook ends a step
after the last bucket, the reducer after synchronize(). Gradients are
float32. A parameter on a CUDA device is declared as a device tensor
(device_tensors="auto", the default): its gradient, the DDP bucket and the
sketched inputs go to libgiftclient as CUDA pointers, encoded and decoded on
the GPU, and only the compressed bytes cross PCIe (the current stream is
synchronised before each hand-over; the library needs CUDA built in, else
the declaration fails with GIFT_ENODEV: pass device_tensors=False to copy
through host memory instead). The DDP hook's future is completed from the
client's I/O thread (holding the GIL): DDP only waits on it; a .then()
added to it would run there too.
"""
import fnmatch
import threading

import torch
import torch.nn as nn

import gift

__all__ = ["COMMS", "Policy", "GiftState", "GiftReducer", "comm_hook"]

# --comm names: (codec, treatment of the eligible weights: False Euclidean,
# True the GIFT geometry, "hadamard" random signs and a Walsh-Hadamard
# rotation, issue 42)
COMMS = {
    "f32": ("f32", False),
    "bf16": ("bf16", False),
    "fp8": ("fp8-e4m3", False),
    "fp8-gift": ("fp8-e4m3", True),
    "fp8-hadamard": ("fp8-e4m3", "hadamard"),
    "nvfp4": ("nvfp4", False),
    "nvfp4-gift": ("nvfp4", True),
    "nvfp4-hadamard": ("nvfp4", "hadamard"),
}


def _shape2d(p):
    if p.dim() <= 1:
        return 1, p.numel()
    return p.shape[0], p.numel() // p.shape[0]


class Policy:
    """Per-tensor settings. codec applies to every tensor (push and pull);
    gift turns the geometry on for nn.Linear weights with cols >= min_cols
    and numel >= min_numel; gift="hadamard" gives those same weights the
    Hadamard treatment instead (transform "hadamard": random signs and an
    orthonormal Walsh-Hadamard rotation along the inputs, no geometry; host
    memory only: GiftState refuses it on a CUDA parameter unless
    device_tensors=False). error_feedback None means on for fp8 and nvfp4;
    pull_error_feedback (the shards' residual of the pulled mean) None means
    the same, by the pull codec.
    overrides: {pattern: {field: value}} with the fields of gift.Tensor
    (codec, pull_codec, geometry, rank, refresh, fp8_block, error_feedback,
    stochastic, priority, pull_error_feedback, transform), applied in order to names matching pattern."""

    def __init__(self, codec="f32", gift=False, min_numel=16384, min_cols=64, rank=0,
                 refresh=50, fp8_block=0, error_feedback=None, stochastic=False,
                 overrides=None, pull_error_feedback=None):
        self.codec = codec
        self.gift = gift
        self.min_numel, self.min_cols = min_numel, min_cols
        self.rank, self.refresh, self.fp8_block = rank, refresh, fp8_block
        if error_feedback is None:
            error_feedback = _lossy(codec)
        self.error_feedback = error_feedback
        self.pull_error_feedback = pull_error_feedback
        self.stochastic = stochastic
        self.overrides = dict(overrides or {})

    @classmethod
    def from_comm(cls, comm, **kw):
        """A policy from a --comm name (see COMMS)."""
        if comm not in COMMS:
            raise ValueError(f"unknown comm {comm!r}; one of {', '.join(COMMS)}")
        codec, g = COMMS[comm]
        return cls(codec=codec, gift=g, **kw)

    def __call__(self, name, param, module):
        """The gift.Tensor fields (a dict) for parameter `name` of `module`."""
        rows, cols = _shape2d(param)
        eligible = (bool(self.gift) and isinstance(module, nn.Linear) and param is module.weight
                    and cols >= self.min_cols and rows * cols >= self.min_numel)
        hadamard = eligible and self.gift == "hadamard"
        geometry = eligible and not hadamard
        d = dict(codec=self.codec, geometry=geometry, rank=self.rank if geometry else 0,
                 refresh=self.refresh if geometry else 0, fp8_block=self.fp8_block,
                 error_feedback=self.error_feedback, stochastic=self.stochastic)
        if hadamard:
            d["transform"] = "hadamard"
        for pattern, fields in self.overrides.items():
            if fnmatch.fnmatchcase(name, pattern):
                d.update(fields)
        if "pull_error_feedback" not in d:
            pef = self.pull_error_feedback
            d["pull_error_feedback"] = (_lossy(d.get("pull_codec") or d["codec"])
                                        if pef is None else pef)
        return d


def _lossy(codec):
    return gift.codec_of(codec) in (gift.FP8_E4M3, gift.FP8_E5M2, gift.NVFP4)


class _Bucket:
    """Counts the push_pulls of one DDP bucket; the last completion (or the
    launch guard) completes the future."""

    def __init__(self, n, fut, buf):
        self.left = n + 1  # +1: the launching thread's guard
        self.fut, self.buf = fut, buf
        self.err = None
        self.lock = threading.Lock()

    def done(self, status):
        with self.lock:
            self.left -= 1
            if status < 0 and self.err is None:
                self.err = gift.GiftError(status, "gift_push_pull")
            last = self.left == 0
        if last:
            if self.err is not None:
                self.fut.set_exception(self.err)
            else:
                self.fut.set_result(self.buf)

    def fail(self, exc):
        with self.lock:
            if self.err is None:
                self.err = exc
            self.left -= 1


class GiftState:
    """The client, the declared tensors and the step counter for one model.

    module: the model (a DistributedDataParallel is unwrapped). comm: a
    COMMS name, or policy: a Policy (or any callable(name, param, module) ->
    dict of gift.Tensor fields). client: an open gift.Client, else one is
    opened with servers/rank/world_size (None: from the environment) and
    closed by close(); chunk_bytes and timeout_ms go to that client (0: the
    library's default or GIFT_CHUNK_BYTES / GIFT_TIMEOUT_MS). sketch_rows
    caps the input rows sent per sketch.
    grad_tap, if set, is called as grad_tap(name, local_grad, step) before
    each gradient is pushed (the tensor is the buffer that is about to be
    overwritten with the mean: copy it to keep it). device_tensors: "auto"
    declares each CUDA parameter on its device (see the module's comment),
    False declares every tensor in host memory (CUDA gradients are then
    copied to the host and back)."""

    def __init__(self, module, comm="f32", policy=None, client=None, servers=None, rank=None,
                 world_size=None, start_step=0, sketch_rows=4096, seed=0, timeout_ms=0,
                 device_tensors="auto", chunk_bytes=0):
        if hasattr(module, "module") and isinstance(
                module, nn.parallel.DistributedDataParallel):
            module = module.module
        self.module = module
        self.policy = policy if policy is not None else Policy.from_comm(comm)
        self.step = int(start_step)
        self.sketch_rows = int(sketch_rows)
        self.grad_tap = None
        owner = {}
        for mname, m in module.named_modules():
            for pname, p in m.named_parameters(recurse=False):
                owner.setdefault(id(p), m)
        self.names, self.params, self.tensors, self.ids = [], [], [], {}
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue
            rows, cols = _shape2d(p)
            fields = dict(self.policy(name, p, owner.get(id(p))))
            if device_tensors and p.device.type == "cuda" and "device" not in fields:
                if gift.transform_of(fields.get("transform")) == gift.TRANSFORM_HADAMARD:
                    raise ValueError(
                        f"gift: {name}: the Hadamard treatment has no device path yet; "
                        "pass device_tensors=False to send CUDA gradients through host memory")
                fields["device"] = p.device.index
            t = gift.Tensor(name, rows, cols, **fields)
            self.ids[id(p)] = len(self.tensors)
            self.names.append(name)
            self.params.append(p)
            self.tensors.append(t)
        self._own_client = client is None
        self.client = client if client is not None else gift.Client(
            servers=servers, rank=rank, world_size=world_size, seed=seed, timeout_ms=timeout_ms,
            chunk_bytes=chunk_bytes)
        self.client.declare(self.tensors)
        self._sketched = {}
        self._hooks = []
        for tid, (p, t) in enumerate(zip(self.params, self.tensors)):
            m = owner.get(id(p))
            if t.geometry and isinstance(m, nn.Linear):
                self._hooks.append(m.register_forward_hook(self._sketch_hook(tid, t)))
        self._bytes0 = self.wire_bytes()

    def _sketch_hook(self, tid, t):
        refresh = t.refresh or 50

        def hook(mod, inputs, output):
            step = self.step
            if not (mod.training and torch.is_grad_enabled()) or step % refresh != 0:
                return
            if self._sketched.get(tid) == step:
                return
            X = inputs[0].detach().reshape(-1, t.cols)
            if X.shape[0] > self.sketch_rows:
                X = X[: self.sketch_rows]
            dev = "cpu" if t.device is None else torch.device("cuda", t.device)
            X = X.to(dtype=torch.float32, device=dev).contiguous()
            self.client.sketch_inputs(tid, step, X)
            self._sketched[tid] = step

        return hook

    def wire_bytes(self):
        """Wire bytes (out + in, headers included) this client has moved."""
        s = self.client.stats()
        return s["bytes_out"] + s["bytes_in"]

    def stats(self):
        return self.client.stats()

    def describe(self):
        """One line per tensor: name, shape, codec, geometry."""
        return "\n".join(
            f"{t.name:40s} {t.rows:6d} x {t.cols:<6d} {gift.CODEC_NAMES[t.push_codec]:9s}"
            f"{' gift' if t.geometry else ' hadamard' if t.hadamard else ''}"
            for t in self.tensors)

    def end_step(self):
        self.step += 1

    def reduce_bucket(self, bucket):
        """The DDP hook's body: push_pull every gradient of the bucket in
        place and return a future completed with the bucket's buffer."""
        fut = torch.futures.Future()
        buf = bucket.buffer()
        params, grads = bucket.parameters(), bucket.gradients()
        devs = {self.tensors[self.ids[id(p)]].device for p in params}
        want = None if devs == {None} else (devs.pop() if len(devs) == 1 else -1)
        if (buf.dtype != torch.float32 or want == -1 or
                (want is None and buf.device.type != "cpu") or
                (want is not None and (buf.device.type != "cuda" or buf.device.index != want))):
            raise TypeError(f"gift: DDP bucket of {buf.dtype} on {buf.device}: gift.torch "
                            "handles float32 gradients on the device their tensors were "
                            "declared on (CPU, or one CUDA device)")
        step = self.step
        b = _Bucket(len(params), fut, buf)
        for p, g in zip(params, grads):
            tid = self.ids[id(p)]
            if self.grad_tap is not None:
                self.grad_tap(self.names[tid], g, step)
            try:
                self.client.push_pull(tid, step, g, g, callback=b.done)
            except Exception as e:  # nothing started for this one
                b.fail(e)
        b.done(0)
        if bucket.is_last():
            self.end_step()
        return fut

    def close(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self._own_client and self.client is not None:
            self.client.close()
        self.client = None


def comm_hook(state, bucket):
    """DDP communication hook: model.register_comm_hook(state, comm_hook)
    with a GiftState. Returns the future of the bucket's averaged buffer."""
    return state.reduce_bucket(bucket)


class GiftReducer(GiftState):
    """Gradient averaging through giftd without DDP: after backward(), call
    synchronize(); every registered parameter's .grad then holds the mean
    over the workers (a missing .grad is sent as zeros). Takes GiftState's
    arguments."""

    def synchronize(self):
        step = self.step
        ops, copies = [], []
        for tid, p in enumerate(self.params):
            g = p.grad
            if g is None:
                p.grad = g = torch.zeros_like(p)
            if self.grad_tap is not None:
                self.grad_tap(self.names[tid], g, step)
            t = self.tensors[tid]
            dev = "cpu" if t.device is None else torch.device("cuda", t.device)
            if g.dtype == torch.float32 and g.device == torch.device(dev) and g.is_contiguous():
                ops.append(self.client.push_pull(tid, step, g, g))  # CUDA: straight through
            else:
                tmp = g.detach().to(dtype=torch.float32, device=dev).contiguous()
                copies.append((g, tmp))
                ops.append(self.client.push_pull(tid, step, tmp, tmp))
        err = None
        for op in ops:
            try:
                op.wait()
            except gift.GiftError as e:
                err = err or e
        if err is not None:
            raise err
        for g, tmp in copies:
            g.copy_(tmp)
        self.end_step()
