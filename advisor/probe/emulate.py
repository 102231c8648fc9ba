"""CUDA's op choices on CPU, for probes whose stack trains on CUDA: autocast's op lists and fused dropout.

The one implementation (validation/probes/cuda_like.py, which the shipped hf-trainer numbers were measured with,
calls this one): CPU autocast uses other op lists than CUDA autocast (on CUDA pow, layer_norm, rsqrt run in fp32
and softmax returns fp32), and CPU dropout saves a full-precision noise tensor where CUDA saves a bool mask.
``CudaLike(amp_dtype)`` is a TorchFunctionMode that reproduces CUDA's choices; SDPA's dropout is set to 0 because
CUDA's flash kernels save only an RNG seed. torch is imported only when cuda_like() is called.
"""


def cuda_like(amp_dtype=None, cache: bool = True):
    """A TorchFunctionMode that makes CPU ops behave as CUDA's would (module docstring); ``amp_dtype`` None: no
    autocast, dropout only."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    LOWP = {F.linear, torch.addmm, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
            torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.baddbmm, torch.Tensor.baddbmm,
            F.scaled_dot_product_attention}
    FP32 = {torch.pow, torch.Tensor.pow, torch.Tensor.__pow__, torch.rsqrt, torch.Tensor.rsqrt, torch.exp,
            torch.Tensor.exp, torch.log, torch.Tensor.log, F.layer_norm, torch.layer_norm, F.group_norm,
            F.cross_entropy, F.nll_loss, torch.logsumexp, torch.Tensor.logsumexp, F.mse_loss, torch.norm,
            torch.Tensor.norm, torch.reciprocal, torch.Tensor.reciprocal}
    FP32_OPT_DTYPE = {F.softmax, torch.softmax, torch.Tensor.softmax, F.log_softmax, torch.log_softmax,
                      torch.Tensor.log_softmax, torch.sum, torch.Tensor.sum, torch.cumsum, torch.prod}

    class CudaLike(TorchFunctionMode):
        def __init__(self, amp_dtype=None, cache=True):
            super().__init__()
            self.amp = amp_dtype
            self.use_cache = cache
            self.cache = {}

        def _cast(self, x, dt):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dt:
                if self.use_cache and x.is_leaf and x.requires_grad:  # CUDA autocast caches casts of leaf params
                    k = id(x)
                    if k not in self.cache:
                        self.cache[k] = x.to(dt)
                    return self.cache[k]
                return x.to(dt)
            if isinstance(x, (list, tuple)):
                return type(x)(self._cast(y, dt) for y in x)
            return x

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is F.dropout:
                x = args[0]
                p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
                training = args[2] if len(args) > 2 else kwargs.get("training", True)
                if training and 0 < p < 1 and x.requires_grad:
                    return torch.native_dropout(x, p, True)[0]
                return x if not training or p == 0 else func(*args, **kwargs)
            if func is F.scaled_dot_product_attention:
                kwargs["dropout_p"] = 0.0
                if len(args) > 4:
                    args = args[:4]
            if self.amp is not None:
                if func in LOWP:
                    args = self._cast(args, self.amp)
                    kwargs = {k: self._cast(v, self.amp) for k, v in kwargs.items()}
                elif func in FP32:
                    args = self._cast(args, torch.float32)
                    kwargs = {k: self._cast(v, torch.float32) for k, v in kwargs.items()}
                elif func in FP32_OPT_DTYPE:
                    if kwargs.get("dtype") is None and not (len(args) > 2 and func in (F.softmax, F.log_softmax)
                                                            and args[2] is not None):
                        x = args[0]
                        if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16):
                            kwargs["dtype"] = torch.float32
            return func(*args, **kwargs)

    return CudaLike(amp_dtype, cache)


_FUSED: dict = {}


def fused_rms_norm():
    """A TorchFunctionMode routing F.rms_norm to one op forward and one backward that save what CUDA's fused kernel
    saves (the input and the fp32 rstd; torch's FusedRmsNormBackward0): on CUDA torch.rms_norm runs
    aten._fused_rms_norm, on CPU it decomposes into casts and products that save fp32 copies. The op computes with
    the CPU decomposition (the values do not matter to the probe)."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    if not _FUSED:
        @torch.library.custom_op("advisor_probe::rms_norm", mutates_args=())
        def rms(x: torch.Tensor, shape: list[int], weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
            with torch.no_grad():
                y, rstd = torch.ops.aten._fused_rms_norm(x, shape, weight, eps)
            return y.clone(), rstd.clone()

        @torch.library.custom_op("advisor_probe::rms_norm_backward", mutates_args=())
        def rms_backward(g: torch.Tensor, x: torch.Tensor, shape: list[int], weight: torch.Tensor,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor]:
            xf = x.float()  # the gradient of x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps), over the last dimension
            rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            xhat, gy = xf * rstd, g.float() * weight.float()
            gx = rstd * (gy - xhat * (gy * xhat).mean(-1, keepdim=True))
            gw = (g.float() * xhat).reshape(-1, x.shape[-1]).sum(0)
            return gx.to(x.dtype), gw.to(weight.dtype)

        def setup(ctx, inputs, output):
            x, shape, weight, eps = inputs
            ctx.save_for_backward(x, output[1], weight)
            ctx.shape, ctx.eps = shape, eps

        def backward(ctx, g, _grstd):
            x, _rstd, weight = ctx.saved_tensors
            gx, gw = rms_backward(g, x, ctx.shape, weight, ctx.eps)
            return gx, None, gw, None

        rms.register_autograd(backward, setup_context=setup)
        _FUSED["op"] = rms

    class FusedRMSNorm(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.rms_norm:
                x, shape = args[0], list(args[1])
                weight, eps = (list(args[2:]) + [kwargs.get("weight"), kwargs.get("eps")])[:2] if len(args) > 2 else \
                    (kwargs.get("weight"), kwargs.get("eps"))
                eps = torch.finfo(x.dtype).eps if eps is None else eps
                return _FUSED["op"](x, shape, weight, eps)[0]
            return func(*args, **kwargs)

    return FusedRMSNorm()
