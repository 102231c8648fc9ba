"""CUDA-like op behaviour on CPU for the probes: CUDA autocast's op lists and fused dropout.

CPU autocast uses different op lists than CUDA autocast (on CUDA pow, layer_norm, rsqrt run in fp32 and
softmax returns fp32), and CPU dropout saves a full-precision noise tensor where CUDA saves a bool mask.
``CudaLike(amp_dtype)`` is a TorchFunctionMode that reproduces CUDA's choices; sdpa dropout is set to 0
because CUDA's flash kernels save only an RNG seed.
"""

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

